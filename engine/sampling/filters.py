"""Top-k, top-p (nucleus) and min-p filters over temperature-scaled logits.

Definitions (vLLM / Hugging Face); a filtered-out token gets logit -inf:

- top-k: keep the k highest logits (exactly k; ties at the k-th value are broken by `topk`).
- top-p: over the probabilities left by top-k, sorted descending, keep the smallest prefix whose
  cumulative probability reaches top_p: token j stays iff sum(p_0 .. p_{j-1}) < top_p, so the
  top token always stays.
- min-p: drop tokens with p < min_p * p_max, i.e. logit < max_logit + log(min_p). The ratio
  does not change when the survivors are renormalised, so it is checked on logits directly.

Cost: sorting a 152k vocabulary is the expensive step on CPU, and so is any full-vocabulary
pass. A row with top-k keeps only its k best tokens as *candidates* (one `topk`), and the
sampler then works on those few columns instead of the whole row. A top-p-only row looks at its
`TOP_P_CANDIDATES` best tokens first; only when its nucleus is wider does it sort its whole row
and stay a full-vocabulary row. Which form a row takes depends only on that row's own logits
and parameters, never on the rest of the batch, so a seeded request samples the same token
alone or in any batch.

Whether a nucleus is wider than its candidates is read on the host, and on CUDA that read
waits for the device: the step that samples could not overlap the next (engine/overlap.py).
There (`nucleus_on_device`) a top-p-only row stays a full row whose nucleus threshold a
Triton kernel finds (engine/kernels/nucleus.py: no sort, no read on the host), and which
form a row takes depends on its parameters alone.

    candidate form:  logits [n, C] best first (-inf past a row's width or filtered out),
                     token_ids [n, C], width[i] = the row's k, or TOP_P_CANDIDATES
    full form:       logits [m, vocab] (-inf where filtered out)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.device import host_to_device

TOP_P_CANDIDATES = 1024
"""Tokens a top-p-only row examines before falling back to a full sort of its row. A `topk`
of 1024 out of 152k costs ~1/3 of a sort; larger k costs nearly linearly more."""


@dataclass
class FilteredLogits:
    """The result of `filter_logits`: each input row is in exactly one of the two forms."""

    candidate_rows: list[int]
    candidate_logits: torch.Tensor
    candidate_token_ids: torch.Tensor
    candidate_widths: list[int]
    """Candidates each row owns (its k, or TOP_P_CANDIDATES); fixed by the row's params."""
    full_rows: list[int]
    full_logits: torch.Tensor

    def to_dense(self, num_rows: int, vocab_size: int) -> torch.Tensor:
        """All rows as [num_rows, vocab] logits with -inf where filtered (for tests)."""
        device = self.full_logits.device
        dense = torch.full((num_rows, vocab_size), -math.inf, device=device)
        if self.full_rows:
            dense[_index(self.full_rows, device)] = self.full_logits.float()
        if self.candidate_rows:
            sub = torch.full((len(self.candidate_rows), vocab_size), -math.inf, device=device)
            sub.scatter_(1, self.candidate_token_ids, self.candidate_logits.float())
            dense[_index(self.candidate_rows, device)] = sub
        return dense


def filter_logits(
    logits: torch.Tensor,
    top_k: Sequence[int],
    top_p: Sequence[float],
    min_p: Sequence[float],
    nucleus_on_device: bool | None = None,
) -> FilteredLogits:
    """Apply top-k, then top-p, then min-p to each row of `logits` ([rows, vocab], float32).

    `top_k[i] <= 0` or `>= vocab`, `top_p[i] >= 1` and `min_p[i] <= 0` disable a filter. May
    modify `logits` in place. `nucleus_on_device`: a top-p-only row's nucleus comes from the
    threshold kernel, with no read of the device's values on the host (None: on CUDA).
    """
    num_rows, vocab_size = logits.shape
    device = logits.device
    if nucleus_on_device is None:
        nucleus_on_device = logits.is_cuda
    ks = [k if 0 < k < vocab_size else 0 for k in top_k]
    ps = [min(float(p), 1.0) for p in top_p]
    on_device = [i for i in range(num_rows) if nucleus_on_device and ks[i] == 0 and ps[i] < 1.0]
    if on_device:
        return _with_device_nuclei(logits, ks, ps, min_p, on_device)
    filtered = [i for i in range(num_rows) if ks[i] > 0 or ps[i] < 1.0]
    full_rows = [i for i in range(num_rows) if ks[i] == 0 and ps[i] >= 1.0]
    if not filtered:
        apply_min_p(logits, min_p)
        return FilteredLogits([], logits[:0, :0], logits[:0, :0].long(), [], full_rows, logits)

    sub = logits if len(filtered) == num_rows else logits[_index(filtered, device)]
    values, token_ids, widths, unresolved = _candidates(
        sub, [ks[i] for i in filtered], [ps[i] for i in filtered]
    )
    unresolved_set = set(unresolved)
    kept = [j for j in range(len(filtered)) if j not in unresolved_set]
    candidate_rows = [filtered[j] for j in kept]
    if unresolved:
        index = _index(kept, device)
        values, token_ids = values[index], token_ids[index]
        widths = [widths[j] for j in kept]
    _min_p_sorted(values, [min_p[i] for i in candidate_rows])

    full_parts = []
    if full_rows:
        full_parts.append(logits if not filtered else logits[_index(full_rows, device)])
    if unresolved:
        index = _index(unresolved, device)
        p = host_to_device([ps[filtered[j]] for j in unresolved], torch.float32, device)
        full_parts.append(top_p_by_sort(sub[index], p))
        full_rows = full_rows + [filtered[j] for j in unresolved]
    full = torch.cat(full_parts) if len(full_parts) > 1 else (full_parts or [logits[:0]])[0]
    apply_min_p(full, [min_p[i] for i in full_rows])
    return FilteredLogits(candidate_rows, values, token_ids, widths, full_rows, full)


def _with_device_nuclei(
    logits: torch.Tensor,
    ks: list[int],
    ps: list[float],
    min_p: Sequence[float],
    rows: list[int],
) -> FilteredLogits:
    """`filter_logits` where the top-p-only rows `rows` are full rows, each masked below its
    nucleus threshold: the rest go through `filter_logits` as before (none is top-p only)."""
    from engine.kernels.nucleus import nucleus_threshold  # Triton: only where it is used

    device = logits.device
    on_device = set(rows)
    others = [i for i in range(len(ks)) if i not in on_device]
    rest = filter_logits(
        logits[_index(others, device)] if others else logits[:0],
        [ks[i] for i in others],
        [ps[i] for i in others],
        [min_p[i] for i in others],
        nucleus_on_device=False,
    )
    nuclei = logits if len(rows) == len(ks) else logits[_index(rows, device)]
    p = host_to_device([ps[i] for i in rows], torch.float32, device)
    nuclei.masked_fill_(nuclei < nucleus_threshold(nuclei, p)[:, None], -math.inf)
    apply_min_p(nuclei, [min_p[i] for i in rows])
    return FilteredLogits(
        [others[j] for j in rest.candidate_rows],
        rest.candidate_logits,
        rest.candidate_token_ids,
        rest.candidate_widths,
        [others[j] for j in rest.full_rows] + rows,
        torch.cat([rest.full_logits, nuclei]) if rest.full_rows else nuclei,
    )


def _candidates(
    logits: torch.Tensor, ks: list[int], ps: list[float]
) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Top-k / top-p in candidate form for rows that all have at least one of them on.
    Returns (values, token ids, widths, rows whose nucleus is wider than their candidates)."""
    vocab_size = logits.shape[1]
    device = logits.device
    num_p_candidates = min(vocab_size, TOP_P_CANDIDATES)
    k = host_to_device(ks, torch.long, device)
    p = host_to_device(ps, torch.float32, device)
    has_k, has_p = k > 0, p < 1.0
    p_only = has_p & ~has_k
    # Read on the host from the lists: `bool()` of a device tensor waits for the device.
    any_p = any(pp < 1.0 for pp in ps)
    any_p_only = any(pp < 1.0 and kk <= 0 for kk, pp in zip(ks, ps, strict=True))
    widths = [kk if kk > 0 else num_p_candidates for kk in ks]

    # One topk as wide as the widest row; positions past a row's own width are masked, so the
    # batch's width does not change any row's result.
    values, token_ids = logits.topk(max(widths), dim=-1)
    position = torch.arange(values.shape[1], device=device)
    past_width = position[None, :] >= host_to_device(widths, torch.long, device)[:, None]
    values.masked_fill_(past_width, -math.inf)

    unresolved: list[int] = []
    if any_p:
        # A top-k row renormalises over its k survivors, a top-p-only row over its whole row.
        # Both use the row-wise softmax kernel, so a row's probabilities do not depend on the
        # rest of the batch.
        probs = values.softmax(dim=-1)
        if any_p_only:
            whole_row = logits[p_only].softmax(dim=-1)
            probs[p_only] = whole_row.gather(1, token_ids[p_only])
            probs.masked_fill_(past_width, 0.0)
        cumulative = probs.cumsum(dim=-1)
        mass_before = cumulative - probs
        threshold = torch.where(has_p, p, torch.full_like(p, math.inf))
        values.masked_fill_(mass_before >= threshold[:, None], -math.inf)
        if any_p_only and num_p_candidates < vocab_size:
            # The nucleus may extend past the candidates only if they hold less than top_p.
            unresolved = torch.nonzero(p_only & (cumulative[:, -1] < p)).flatten().tolist()
    return values, token_ids, widths, unresolved


def top_p_by_sort(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-p by sorting whole rows: the reference algorithm (vLLM's without FlashInfer), used
    when a nucleus is wider than its candidates."""
    values, indices = logits.sort(dim=-1, descending=True)
    probs = values.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    values.masked_fill_(mass_before >= top_p[:, None], -math.inf)
    return torch.full_like(logits, -math.inf).scatter_(1, indices, values)


def _min_p_sorted(values: torch.Tensor, min_p: Sequence[float]) -> None:
    """min-p on candidate rows, whose best logit is in column 0."""
    if any(m > 0.0 for m in min_p):
        ratios = [_log_or_neg_inf(m) for m in min_p]
        log_ratio = host_to_device(ratios, torch.float32, values.device)
        values.masked_fill_(values < (values[:, :1] + log_ratio[:, None]), -math.inf)


def apply_min_p(logits: torch.Tensor, min_p: Sequence[float]) -> None:
    """Drop, in place, tokens whose probability is below min_p[i] times the row's top one."""
    rows = [i for i, m in enumerate(min_p) if m > 0.0]
    if not rows:
        return
    device = logits.device
    log_ratio = host_to_device([math.log(min_p[i]) for i in rows], torch.float32, device)
    if len(rows) == logits.shape[0]:
        threshold = logits.amax(dim=-1) + log_ratio
        logits.masked_fill_(logits < threshold[:, None], -math.inf)
        return
    index = _index(rows, device)
    sub = logits[index]
    threshold = sub.amax(dim=-1) + log_ratio
    logits[index] = sub.masked_fill_(sub < threshold[:, None], -math.inf)


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return host_to_device(rows, torch.long, device)


def _log_or_neg_inf(x: float) -> float:
    return math.log(x) if x > 0.0 else -math.inf
