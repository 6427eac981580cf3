"""The OpenAI-compatible HTTP front door (FastAPI): `create_app(backend, admin, ...)`."""
