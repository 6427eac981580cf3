"""Speculative decoding: cheap guesses of a request's next tokens, checked in one step.

ngram.py       prompt lookup: the tokens that followed the latest earlier occurrence of
               the request's last n tokens (no second model; wins where the output
               repeats the prompt: editing code, quoting, extraction)
draft_model.py a smaller checkpoint with the same tokenizer drafts, batched over the
               requests, each draw coupled to the target's (the same noise); wins where
               the draft agrees with the target, prompt or no prompt
speculator.py  which requests speculate and how far (per-request back-off when guesses
               fail), and the acceptance rule after the step
"""

from engine.spec.ngram import propose_ngram
from engine.spec.speculator import SpecStats, Speculator, speculator_for

__all__ = ["SpecStats", "Speculator", "propose_ngram", "speculator_for"]
