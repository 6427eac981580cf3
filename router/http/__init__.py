"""The OpenAI-compatible HTTP front door (FastAPI): `create_app(backend, admin, ...)`."""

from router.http.app import create_app
from router.http.server import HTTPServerThread

__all__ = ["HTTPServerThread", "create_app"]
