"""What a request carries when it moves to another worker mid-stream (a resumed stream is
byte-identical to one that never moved).

A worker that dies takes the request's engine state with it: the detokenizer's held-back
bytes of an incomplete UTF-8 character, the stop checker's window of recent text, the
output tokens the penalties count, and the sampler's place in the seeded random stream.
All of it is a pure function of what the client has already been sent, so that is all
`ResumeState` holds; the new worker's engine replays it (`engine.resume`):

    prompt + output_token_ids  -> KV (prefill covers both; the prefix cache may hit)
    output_token_ids           -> OUTPUT for penalties, max_tokens and stop checking
    prompt, output_token_ids   -> detokenizer and stop-checker state, replayed token by token
    text                       -> checks the replay: the new worker continues the text the
                                  client has, or refuses the request (it never forks it)
    len(output_token_ids)      -> the sampling position: a seeded request draws its token
                                  at output position i from a generator seeded by (seed, i)

Plain types only: it crosses to workers inside `EngineRequest` (pickled by Ray).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class SentDelta(Protocol):
    """What a retry needs of a `core.request.OutputDelta` the client got (a protocol, as
    core.request imports this module)."""

    @property
    def new_token_ids(self) -> Sequence[int]: ...
    @property
    def new_text(self) -> str: ...


@dataclass(frozen=True)
class ResumeState:
    output_token_ids: tuple[int, ...] = ()
    """Every output token the client has been sent, in order."""
    text: str = ""
    """The concatenated `new_text` of those deltas: what the client has been shown (text
    still held back, an incomplete character or a possible stop string, is not in it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_token_ids", tuple(int(t) for t in self.output_token_ids))

    @property
    def num_output_tokens(self) -> int:
        """Also the sampling position of the next token."""
        return len(self.output_token_ids)

    def __bool__(self) -> bool:
        return bool(self.output_token_ids)

    @classmethod
    def from_deltas(cls, deltas: Iterable[SentDelta]) -> ResumeState:
        """The state after the client received `deltas` (one request's, in order)."""
        token_ids: list[int] = []
        text: list[str] = []
        for delta in deltas:
            token_ids.extend(delta.new_token_ids)
            text.append(delta.new_text)
        return cls(tuple(token_ids), "".join(text))
