"""The MoE cache's counters as frozen dataclasses, copied out of the C structs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class HitRate:
    """hits / (hits + misses) for anything that counts both (the context's, a layer's, a server's)."""

    n_hit: int
    n_miss: int

    @property
    def n_lookup(self) -> int:
        return self.n_hit + self.n_miss

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses); 0.0 before the first lookup."""
        return self.n_hit / self.n_lookup if self.n_lookup else 0.0


@dataclass(frozen=True)
class MoeCacheStats(HitRate):
    """Counters since the context was created. Hits and misses count distinct experts per ubatch and layer,
    in ubatches of up to 32 tokens; layers held whole need no lookups and are not counted."""

    n_hit: int
    n_hit_profile: int
    n_miss: int
    n_bytes_upload: int
    n_bytes_cpu: int
    hybrid: bool
    n_copy: int
    n_bytes_copy: int
    n_slots: int
    n_prefilled: int
    n_bytes_cache: int
    n_swap: int

    @classmethod
    def _from_native(cls, s: Any) -> "MoeCacheStats":
        return cls(int(s.n_hit), int(s.n_hit_profile), int(s.n_miss), int(s.n_bytes_upload), int(s.n_bytes_cpu),
                   bool(s.hybrid), int(s.n_copy), int(s.n_bytes_copy), int(s.n_slots), int(s.n_prefilled),
                   int(s.n_bytes_cache), int(s.n_swap))


@dataclass(frozen=True)
class LayerStats(HitRate):
    il: int
    n_slots: int
    n_hit: int
    n_hit_profile: int
    n_miss: int
