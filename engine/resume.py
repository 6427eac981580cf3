"""Restoring a request that moved from another worker (`core.resume.ResumeState`).

The engine state a dead worker lost is a pure function of the prompt and the output tokens
the client was sent, so it is rebuilt by replaying those tokens through a fresh
detokenizer and stop checker, exactly as `LLMEngine._process` fed them the first time:

    for each resumed token: detokenizer.append -> stop_checker.check   (never finished)
    num_sent_chars = stop_checker.visible_len(text)                    (== len(state.text))

Replaying costs one short decode per resumed token, once per move; carrying the
detokenizer's offsets instead would tie the wire format to its internals. The replayed
visible text must equal what the client has: if it does not (a worker with another
tokenizer, or a bug) the request is refused rather than continued into a forked stream.
"""

from __future__ import annotations

from core.errors import InvalidRequestError
from core.resume import ResumeState
from engine.request import Request


def restore(req: Request, state: ResumeState, vocab_size: int) -> None:
    """Make `req` (fresh: prompt only, detokenizer and stop checker set) continue after
    `state`: its resumed tokens are output for penalties, stop checking, max_tokens and
    detokenization, and part of the KV to compute. Raises InvalidRequestError if `state`
    does not fit the request (ids outside the vocabulary, a request that already ended,
    text the replay does not reproduce)."""
    token_ids = state.output_token_ids
    if not token_ids:
        if state.text:
            raise InvalidRequestError("resume state has text but no output tokens")
        return
    if min(token_ids) < 0 or max(token_ids) >= vocab_size:
        raise InvalidRequestError(f"resumed token ids outside the vocabulary [0, {vocab_size})")
    detok, checker = req.detokenizer, req.stop_checker
    for token_id in token_ids:
        req.append_token(token_id)
        detok.append(token_id)
        if checker.check(req.output_token_ids, detok.text).finished:
            raise InvalidRequestError(
                f"request {req.request_id!r} already ended after {len(req.output_token_ids)} "
                f"of its {len(token_ids)} resumed tokens"
            )
    req.num_resumed_tokens = len(token_ids)
    visible = checker.visible_len(detok.text, False)
    if detok.text[:visible] != state.text:
        raise InvalidRequestError(
            f"request {req.request_id!r}: replaying its {len(token_ids)} resumed tokens gives "
            f"text that differs from what the client was sent"
        )
    req.num_sent_chars = visible
