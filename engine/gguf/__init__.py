"""GGUF checkpoints (llama.cpp's format), read with llama.cpp's own `gguf` package and written
out as an ordinary Hugging Face folder that the engine loads like any other:

    baton import-gguf FILE.gguf DIR       config.json, model.safetensors, tokenizer.json,
                                          tokenizer_config.json, generation_config.json
    baton serve --model FILE.gguf         imported once into a cache folder (`resolve_model`)
    LLM("FILE.gguf")

`config.py` maps the file's metadata to config.json (llama, mistral, qwen2, qwen3),
`tensors.py` its tensors to the Hugging Face names, dequantized to float32 (every GGUF type's
values are float32 products of its scales and codes, so nothing is rounded on the way),
`tokenizer.py` its vocabulary to tokenizer.json. A type, architecture or tokenizer not handled
is a `GGUFError` naming it.
"""

from engine.gguf.importer import GGUFError, import_gguf, is_gguf, resolve_model

__all__ = ["GGUFError", "import_gguf", "is_gguf", "resolve_model"]
