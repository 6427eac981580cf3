"""One performance model of a worker, written once: the router's policies price a prefill
with it, `baton profile` fits it, `baton plan` and the cluster simulator replay it.

    prefill(U, C)       = per_step * steps(U) + per_token * U + per_kpair * area(U, C) / 1000
    area(U, C)          = U * (C + U / 2)                    the attention's query-key pairs
    steps(U)            = max(1, ceil(U / chunk_tokens))     (1 where no chunk size is known)
    decode_step(B, L)   = per_step + per_row * B + per_krow_token * B * L / 1000
    transfer(K)         = latency + K * kv_bytes_per_token / bytes_per_s

U new prompt tokens after C cached ones (a hit saves its own tokens, not the attention of
the new ones over it); B running requests of L tokens of context each; K tokens of KV moved
between workers. `model.py` holds the formulas (unit-free: milliseconds in a profile,
seconds in the router's online estimates), `fit.py` fits their coefficients to measured
samples, `profile.py` reads and writes a profile.
"""

from core.perf.model import (
    DecodeCost,
    PrefillCost,
    attention_area,
    attention_pairs,
    decode_terms,
    num_prefill_steps,
    prefill_terms,
)
from core.perf.profile import DecodeProfile, WorkerProfile

__all__ = [
    "DecodeCost",
    "DecodeProfile",
    "PrefillCost",
    "WorkerProfile",
    "attention_area",
    "attention_pairs",
    "decode_terms",
    "num_prefill_steps",
    "prefill_terms",
]
