"""Errors every component raises and every front door maps to a status (HTTP / gRPC).

They cross process boundaries (Ray pickles them), so they carry only a message."""

from __future__ import annotations


class BatonError(Exception):
    """Base class; `status` is the HTTP status a front door answers with."""

    status = 500
    code = "internal_error"


class InvalidRequestError(BatonError, ValueError):
    """The request itself is wrong: empty prompt, too long, bad parameter values."""

    status = 400
    code = "invalid_request_error"


class OverloadedError(BatonError):
    """No capacity now (queues full, no worker in a pool); retry after a while."""

    status = 429
    code = "overloaded"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DrainingError(OverloadedError):
    """The worker is draining (a scale-down): it finishes what it runs and takes nothing new;
    the front door routes the request to another worker."""


class KVCapacityError(OverloadedError):
    """A worker has no free KV blocks for the prompt right now (running requests will free
    some): the front door waits and retries before giving up with 429."""


class DeadlineExceededError(BatonError):
    """The request ran past its deadline; its blocks have been freed."""

    status = 504
    code = "deadline_exceeded"


class WorkerFailedError(BatonError):
    """A worker died or failed and the retries ran out."""

    status = 503
    code = "worker_failed"


class CancelledError(BatonError):
    """The request was cancelled (client went away, or an admin drained it)."""

    status = 499
    code = "cancelled"


def error_message(e: BaseException) -> str:
    """What a client is told. An error raised inside a worker actor arrives wrapped by Ray,
    whose text starts with the actor's repr and a traceback: give the worker's own message."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and cause is not e:
        e = cause
    return str(e) or type(e).__name__
