"""Whose request it is, for the fair share between tenants (core/fair_share.py): the value of
the header an operator names (`--tenant-header`, set by a gateway that knows the team),
else a hash of the API key the request brought (the key itself never leaves the door),
else "" (requests with neither share one tenant). The same rule on HTTP and gRPC."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from core.errors import InvalidRequestError

MAX_TENANT_CHARS = 128


def of_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()[:12] if api_key else ""


def bearer_token(authorization: str) -> str:
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def tenant_of(headers: Iterable[tuple[str, str]], header: str | None) -> str:
    """`headers`: (name, value) pairs, names in any case. A named header's value longer than
    MAX_TENANT_CHARS is the client's error, named."""
    by_name = {k.lower(): v for k, v in headers}
    if header and (named := by_name.get(header.lower(), "").strip()):
        if len(named) > MAX_TENANT_CHARS:
            raise InvalidRequestError(
                f"header {header}: a tenant name has at most {MAX_TENANT_CHARS} characters"
            )
        return named
    return of_api_key(bearer_token(by_name.get("authorization", "")))
