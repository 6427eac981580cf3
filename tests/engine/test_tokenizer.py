"""engine.tokenizer.Tokenizer must agree with transformers' AutoTokenizer on the same folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.tokenizer import ChatTemplateError, Tokenizer, TokenizerError

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
TEXTS = [
    "Hello, world!",
    "",
    " ",
    "  leading spaces\n\nand\ttabs  \r\n",
    "The year 2026 has 365 days; π ≈ 3.14159.",
    "café déjà vu — naïve façade",
    "e\u0301 vs \u00e9 (NFD vs NFC)",
    "東京 Москва القاهرة 🚀☕🙂",
    "<|eot|> in the middle <|begin_of_text|>and<|pad|>",
    "def f(x):\n    return x ** 2  # square\n",
    "I'm sure they'll say it's fine, isn't it?",
    "\x00\x7f odd bytes \ufeff",
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there! 👋"},
    {"role": "assistant", "content": "  Hello.  "},
    {"role": "user", "content": "What's 2+2?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <today> & tomorrow",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tiny_model_dir):
    from transformers import AutoTokenizer

    folder = tiny_model_dir(request.param)
    return Tokenizer.from_dir(folder), AutoTokenizer.from_pretrained(folder)


def test_encode_matches_transformers(pair) -> None:
    ours, hf = pair
    for text in TEXTS:
        assert ours.encode(text) == hf(text)["input_ids"], text
        plain = hf(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text, add_special_tokens=False) == plain, text


def test_decode_matches_transformers(pair) -> None:
    ours, hf = pair
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip
            )
    every_id = list(range(ours.vocab_size))
    assert ours.convert_ids_to_tokens(every_id) == hf.convert_ids_to_tokens(every_id)
    assert ours.decode(every_id, False) == hf.decode(every_id, skip_special_tokens=False)


def test_special_ids_match_transformers(pair) -> None:
    ours, hf = pair
    assert ours.vocab_size == len(hf) == 1024
    assert ours.bos_token_id == hf.bos_token_id == 0
    assert ours.pad_token_id == hf.pad_token_id
    assert ours.eos_token_ids[0] == hf.eos_token_id
    assert set(ours.eos_token_ids) == {1, 2}  # <|eot|> from the tokenizer, plus generation cfg
    assert set(hf.all_special_ids) <= ours.all_special_ids
    assert ours.all_special_ids == {0, 1, 2, 3, 4, 5}


def test_chat_template_matches_transformers(pair) -> None:
    ours, hf = pair
    for messages in (MESSAGES, MESSAGES[1:2]):
        for prompt in (True, False):
            expected = hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=prompt
            )
            assert ours.apply_chat_template(messages, add_generation_prompt=prompt) == expected
    expected = hf.apply_chat_template(
        MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert ours.apply_chat_template(MESSAGES, tools=TOOLS) == expected
    assert "Weather <today> & tomorrow" in expected  # tojson must not HTML-escape


def test_chat_template_errors(pair) -> None:
    ours, _ = pair
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        ours.apply_chat_template([{"role": "robot", "content": "beep"}])
    with pytest.raises(ChatTemplateError, match="dicts"):
        ours.apply_chat_template(["not a message"])  # type: ignore[list-item]


def test_encode_chat_matches_transformers(pair) -> None:
    """Chat -> ids is transformers' tokenize=True result: the template's one BOS, no second."""
    ours, hf = pair
    for messages, tools in ((MESSAGES, None), (MESSAGES[1:2], None), (MESSAGES, TOOLS)):
        expected = hf.apply_chat_template(
            messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        ids = ours.encode_chat(messages, tools=tools)
        assert ids == list(expected)
        assert ids[0] == ours.bos_token_id != ids[1]
        assert ours.decode(ids, skip_special_tokens=False).endswith(
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        )
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        ours.encode_chat([{"role": "robot", "content": "beep"}])
    with pytest.raises(ChatTemplateError, match="dicts"):
        ours.encode_chat(["not a message"])  # type: ignore[list-item]


CUSTOM_TEMPLATE = """{%- set ns = namespace(count=0) -%}
{%- for m in messages -%}
{%- if m.role == 'system' %}{% continue %}{% endif -%}
{%- set ns.count = ns.count + 1 -%}
[{{ ns.count }}|{{ m.role }}]{% generation %}{{ m.content }}{% endgeneration %}
{% endfor -%}
{%- if extra is defined %}{{ extra | tojson }}{% endif -%}
{%- if add_generation_prompt %}{{ eos_token }}>{% endif -%}
{{ dict(a=1) | tojson }}"""


def test_custom_template_file_and_kwargs(tmp_path: Path, tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    folder = shutil.copytree(tiny_model_dir("llama"), tmp_path / "m")
    (folder / "chat_template.jinja").write_text(CUSTOM_TEMPLATE)  # wins over the config's
    ours, hf = Tokenizer.from_dir(folder), AutoTokenizer.from_pretrained(folder)
    kwargs = {"extra": {"k": ["ü", 1]}}
    expected = hf.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert ours.apply_chat_template(MESSAGES, **kwargs) == expected
    assert expected.startswith("[1|user]Hi there!")
    # Caller kwargs override special-token variables, as in transformers.
    overridden = ours.apply_chat_template(MESSAGES, eos_token="<END>")
    assert overridden == hf.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True, eos_token="<END>"
    )


def test_named_templates_in_config(tmp_path: Path, tiny_model_dir) -> None:
    folder = shutil.copytree(tiny_model_dir("llama"), tmp_path / "m")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "D{{ messages | length }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours = Tokenizer.from_dir(folder)
    assert ours.apply_chat_template(MESSAGES) == "D4"
    assert ours.apply_chat_template(MESSAGES, tools=TOOLS) == "T1"
    assert ours.apply_chat_template(MESSAGES, chat_template="tool_use", tools=[]) == "T0"


def test_sandbox_blocks_unsafe_templates(tmp_path: Path, tiny_model_dir) -> None:
    ours = Tokenizer.from_dir(tiny_model_dir("llama"))
    with pytest.raises(ChatTemplateError):
        ours.apply_chat_template(MESSAGES, chat_template="{{ ''.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        ours.apply_chat_template(
            MESSAGES, chat_template="{% set ns = namespace() %}{% set ns._x = 1 %}"
        )
    with pytest.raises(ChatTemplateError, match="compile"):
        ours.apply_chat_template(MESSAGES, chat_template="{% for %}")


def test_missing_files(tmp_path: Path, tiny_model_dir) -> None:
    with pytest.raises(TokenizerError, match=str(tmp_path)):
        Tokenizer.from_dir(tmp_path)
    folder = shutil.copytree(tiny_model_dir("llama"), tmp_path / "m")
    (folder / "tokenizer_config.json").unlink()
    bare = Tokenizer.from_dir(folder)  # tokenizer.json alone still encodes
    assert bare.encode("hi", add_special_tokens=False) == Tokenizer.from_dir(
        tiny_model_dir("llama")
    ).encode("hi", add_special_tokens=False)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.apply_chat_template(MESSAGES)
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(TokenizerError, match="JSON object"):
        Tokenizer.from_dir(folder)
