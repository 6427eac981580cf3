"""Function calling, shared by the HTTP and gRPC front doors: tools into the prompt
(`prompt.py`), the grammar that forces a call (`constraint.py`), calls out of the model's text
(`parsers.py`, `reader.py`). Torch-free plain data."""
