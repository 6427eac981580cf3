"""`baton import-gguf` and a GGUF file wherever a command takes a model."""

from __future__ import annotations

import json

import pytest

from router.cli.main import main
from router.cli.model_dir import resolve_model
from tests.support.gguf_files import write_gguf


def test_import_gguf_writes_a_folder_every_command_loads(tiny_model_dir, tmp_path, capsys):
    src = write_gguf(tiny_model_dir("llama", rope_scaling=None), tmp_path / "m.gguf")
    assert main(["import-gguf", str(src), str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "llama" and "imported" in capsys.readouterr().out
    assert resolve_model(str(tmp_path / "out"), "serve") == tmp_path / "out"


def test_a_gguf_model_resolves_to_its_imported_folder(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src = write_gguf(tiny_model_dir("llama", rope_scaling=None), tmp_path / "chat.gguf")
    folder = resolve_model(str(src), "serve")
    assert folder.name == "chat" and (folder / "model.safetensors").is_file()


def test_what_is_neither_a_folder_nor_gguf_is_refused_by_name(tmp_path) -> None:
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"\0" * 16)
    with pytest.raises(SystemExit, match="neither a Hugging Face checkpoint folder"):
        resolve_model(str(bad), "serve")
    with pytest.raises(SystemExit, match=r"import-gguf: .*not a GGUF file"):
        main(["import-gguf", str(bad), str(tmp_path / "out")])
