"""The decode worker: reserves blocks for prompts prefilled elsewhere, receives their KV,
and decodes in a continuous batch; it can also prefill short prompts itself."""
