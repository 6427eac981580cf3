"""Error types: HTTP status per kind, and the message a client sees."""

from core.errors import BatonError, KVCapacityError, OverloadedError, error_message


class _Wrapped(RuntimeError):
    """What Ray raises for an actor's exception: its own text, the original as `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("ray::DecodeWorker.reserve() (pid=1, ip=127.0.0.1, actor_id=ab)\n...")
        self.cause = cause


def test_kv_capacity_is_an_overload_with_retry_after():
    e = KVCapacityError("decode-0: no room for 900 prompt tokens")
    assert isinstance(e, OverloadedError) and isinstance(e, BatonError)
    assert e.status == 429 and e.retry_after_s == 1.0


def test_client_sees_the_worker_message_not_the_actor_repr():
    inner = KVCapacityError("decode-0: no room for 900 prompt tokens (3 free blocks)")
    assert error_message(_Wrapped(inner)) == str(inner)
    assert error_message(OverloadedError("busy")) == "busy"
    assert error_message(OverloadedError("")) == "OverloadedError"
