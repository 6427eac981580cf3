"""A CPU engine's freed activations kept in the process heap for its next step, instead of
handed back to the kernel and faulted in again.

A step allocates its activations afresh (a 2,048-token prefill step's gate / up output alone
is 16 MB in bfloat16). glibc serves blocks past its mmap threshold by mmap and unmaps them on
free, and trims the heap's free top past its trim threshold, so each step's large tensors
came back as new pages, faulted in and zeroed one at a time: ~10% of a prefill step's
samples were in the kernel's page-fault path (perf, 8 x 256-token prompts a step, small
preset, bf16, 2 threads). Both thresholds raised (either alone turns off glibc's own
adjustment of the other, and was slower than neither), same process kind, alternating:
such a step 282 / 296 -> 247 / 248 ms.

Why glibc's knobs and not jemalloc or tcmalloc (vLLM's CPU docs advise one by LD_PRELOAD):
a preload must be set before the process starts (Ray and `baton serve` start the workers)
and needs a system package; these two calls, at engine start, remove what the profile showed.
The price is the heap's high-water mark held for reuse: the peak of one step's activations.

Not covered: a served worker steps its engine on a thread of its own, whose per-thread arena
these thresholds do not keep (~4,700-6,300 faults a step there). One arena for the process
(M_ARENA_MAX) does not help: in a process whose other threads already hold arenas (a Ray
worker, the test suite) the engine's thread can still be handed one of theirs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
"""glibc's largest allowed value (64-bit): blocks this large and larger are still mapped
apart (a whole prompt's logits for its log-probs), the rest come from the heap."""
TRIM_THRESHOLD = 2**31 - 1
"""Never give the heap's free top back while the engine runs."""


@functools.cache
def keep_freed_memory() -> bool:
    """Set the thresholds once a process; False (and a debug line) where the C library is
    not glibc or refuses them: allocation then works as before."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        logger.debug("no mallopt in %s: the heap keeps its default thresholds", name)
        return False
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    if not done:
        logger.debug("mallopt refused the heap thresholds: the defaults stay")
    return done
