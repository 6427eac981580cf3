"""The models a router hashes prompts for: each one's block size, root hash and hash extra
(core.hashing), and, where its decode pool's blocks are of another size than the pool
prompts run on first (worker/landing.py), that size's root too, so the decode workers'
cached prefixes are found by hashes of their own blocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from core.hashing import BlockHash, hash_prompt_blocks, model_root_hash
from router.routing.index.store import IndexStore, Prefixes


@dataclass(frozen=True, slots=True)
class ModelSpec:
    block_size: int
    root: BlockHash
    extra: bytes
    decode_block_size: int = 0
    """The decode pool's block size where it differs from `block_size` (0: it does not)."""
    decode_root: BlockHash = 0


class Models:
    def __init__(self, default_block_size: int) -> None:
        self.default_block_size = default_block_size
        self._specs: dict[str, ModelSpec] = {}

    def __contains__(self, model: str) -> bool:
        return model in self._specs

    def get(self, model: str) -> ModelSpec | None:
        return self._specs.get(model)

    def register(self, model: str, block_size: int | None = None, extra: bytes = b"") -> ModelSpec:
        """Hash `model`'s prompts by `block_size` (the decode pool's own size is kept)."""
        size = block_size or self.default_block_size
        spec = ModelSpec(size, model_root_hash(model, size), extra)
        old = self._specs.get(model)
        if old is not None and old.decode_block_size not in (0, size):
            spec = replace(
                spec, decode_block_size=old.decode_block_size, decode_root=old.decode_root
            )
        self._specs[model] = spec
        return spec

    def set_decode_block_size(self, model: str, block_size: int) -> None:
        """The decode pool of `model` has blocks of `block_size` tokens."""
        spec = self._specs.get(model) or self.register(model)
        if block_size == spec.block_size:
            self._specs[model] = replace(spec, decode_block_size=0, decode_root=0)
        else:
            root = model_root_hash(model, block_size)
            self._specs[model] = replace(spec, decode_block_size=block_size, decode_root=root)

    @staticmethod
    def hash(
        spec: ModelSpec, tokens: Sequence[int], known: Sequence[BlockHash] = (),
        extra: bytes = b"", decode: bool = False,
    ) -> list[BlockHash]:  # fmt: skip
        """The chained hashes of every full block of `tokens`, by `spec`'s block size or,
        with `decode`, its decode pool's (none when that is the same); `known` are the
        hashes of its leading blocks, not recomputed."""
        size, root = (
            (spec.decode_block_size, spec.decode_root) if decode else (spec.block_size, spec.root)
        )
        if not size:
            return []
        parent = known[-1] if known else None
        more = hash_prompt_blocks(tokens, size, root, extra or spec.extra, parent, len(known))
        return [*known, *more]


def decode_prefixes(
    store: IndexStore, model: str, spec: ModelSpec, prefixes: Prefixes, decode_hashes: Sequence[int]
) -> Prefixes:
    """`prefixes` (found by the prompt's hashes at the router's block size) with the decode
    workers' own, found by `decode_hashes` (the decode pool's block size) and counted in the
    router's blocks. Each worker's events carry hashes of its own block size, so a worker
    is in one of the two lookups only."""
    found = store.longest_prefixes(model, decode_hashes) if decode_hashes else None
    if found is None:
        return prefixes
    ratio = spec.decode_block_size, spec.block_size

    def merged(router_blocks: Mapping[str, int], decode_blocks: Mapping[str, int]) -> dict:
        out = dict(router_blocks)
        out.update((w, n * ratio[0] // ratio[1]) for w, n in decode_blocks.items())
        return out

    return Prefixes(
        merged(prefixes.reported, found.reported), merged(prefixes.cached, found.cached),
        prefixes.offloaded,
    )  # fmt: skip
