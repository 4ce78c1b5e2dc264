"""The package's replays driven directly, for tests that hold one of them to another."""
from __future__ import annotations

from typing import Sequence

from llama_moe.tools.routing.policies import LruLoopReplay, PolicyResult
from llama_moe.tools.routing.policies.base import drive
from llama_moe.tools.routing.ranking import CHUNK_TOKENS
from llama_moe.tools.routing.routes import Routes


def lru_slot_by_slot(routes: Routes, slots: dict[int, int], n_expert: int,
                     profile: Sequence[tuple[int, int]]) -> PolicyResult:
    """``lru`` slot by slot, layer by layer, ubatch by ubatch (llama_moe_cache::lookup_split in Python), whatever the
    ubatches: what the fast one-token replay must count alike."""
    return drive(LruLoopReplay(routes.layers, routes.k, slots, n_expert, profile), routes, CHUNK_TOKENS, None)
