"""The cache size, in MiB as ContextParams takes it, that gives a test an exact number of slots per layer."""
from __future__ import annotations

from pathlib import Path

from llama_moe.tools.experts import expert_layout
from llama_moe.tools.routing.budget import cache_bytes_for_slots


def mib_for_slots(path: Path, slots: int, hybrid: bool = False) -> float:
    layout = expert_layout(path)
    half_a_slot = sum(l.bytes_per_expert for l in layout.layers) // 2  # slack for the MiB -> bytes rounding
    return (cache_bytes_for_slots(layout, slots, hybrid) + half_a_slot) / 2**20
