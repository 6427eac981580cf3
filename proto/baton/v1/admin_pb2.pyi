from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_STARTING: _ClassVar[WorkerState]
    WORKER_STATE_READY: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
    WORKER_STATE_DEAD: _ClassVar[WorkerState]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_STARTING: WorkerState
WORKER_STATE_READY: WorkerState
WORKER_STATE_DRAINING: WorkerState
WORKER_STATE_DEAD: WorkerState

class Worker(_message.Message):
    __slots__ = ("worker_id", "role", "state", "num_running", "num_waiting", "kv_usage", "prefix_hit_rate", "num_prompt_tokens", "num_cached_prompt_tokens", "adapters")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: str
    state: WorkerState
    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_hit_rate: float
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., prefix_hit_rate: _Optional[float] = ..., num_prompt_tokens: _Optional[int] = ..., num_cached_prompt_tokens: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ("name", "desired_size", "workers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESIRED_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    desired_size: int
    workers: _containers.RepeatedCompositeFieldContainer[Worker]
    def __init__(self, name: _Optional[str] = ..., desired_size: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[Worker, _Mapping]]] = ...) -> None: ...

class ClusterState(_message.Message):
    __slots__ = ("pools", "refused")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    refused: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ..., refused: _Optional[_Iterable[str]] = ...) -> None: ...

class GetClusterStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScalePoolRequest(_message.Message):
    __slots__ = ("pool", "size")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    size: int
    def __init__(self, pool: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...
