"""A generation with its routing trace and what the cache counted, as the engine tests compare them."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llama_moe import Context, Sampling
from llama_moe.formats.trace import RoutingRecord
from llama_moe.stats import LayerStats, MoeCacheStats


@dataclass(frozen=True)
class TracedRun:
    tokens: list[int]
    records: list[RoutingRecord]
    logits: np.ndarray          # the last token's
    stats: MoeCacheStats | None
    layers: dict[int, LayerStats]


def traced_generation(ctx: Context, prompt: str, n: int, sampling: Sampling) -> TracedRun:
    ctx.start_trace()
    tokens = list(ctx.generate(prompt, n, sampling, stop_at_eog=False))
    records = ctx.stop_trace()
    return TracedRun(tokens, records, ctx.logits().copy(), ctx.moe_cache_stats(), {l.il: l for l in ctx.layer_stats()})
