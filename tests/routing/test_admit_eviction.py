"""The admitting hybrid's LRFU victims (admitN-lrfu, a simulator variant): equal to a replay that sums every
expert's faded selections from scratch, and better than LRU eviction where a few experts recur among one-offs."""
from __future__ import annotations

import numpy as np

from llama_moe.tools.routing.policies import LRFU_HALF_LIFE, run_policy
from llama_moe.tools.routing.routes import Routes


def _reference(x: np.ndarray, slots: int, admit: int, half_life: float) -> tuple[int, int]:
    """(hits, misses): per layer, after each token up to ``admit`` misses replace the held expert whose
    selections so far, each weighted 0.5 ** (age / half_life), sum least (then the least recently used, then
    the lowest slot); free slots first, and never one the token used or the round admitted (none left: the
    round stops). Nothing held at the start."""
    hits = misses = 0
    for j in range(x.shape[1]):
        held: list[int] = []
        last: dict[int, int] = {}
        uses: dict[int, list[int]] = {}
        for t, row in enumerate(x[:, j].tolist(), start=1):
            missed = []
            for e in dict.fromkeys(row):
                uses.setdefault(e, []).append(t)
                if e in held:
                    hits += 1
                    last[e] = 2 * t - 1
                else:
                    misses += 1
                    missed.append(e)
            for e in missed[:admit]:
                if len(held) < slots:
                    held.append(e)
                else:
                    def key(i: int) -> tuple[float, int, int]:
                        return sum(0.5 ** ((t - s) / half_life) for s in uses[held[i]]), last[held[i]], i
                    older = [i for i in range(slots) if last[held[i]] < 2 * t - 1]
                    if not older:
                        break
                    held[min(older, key=key)] = e
                last[e] = 2 * t
    return hits, misses


def test_lrfu_victims_are_the_least_weighted() -> None:
    rng = np.random.default_rng(3)
    x = np.stack([np.stack([rng.choice(20, 3, replace=False) for _ in range(2)]) for _ in range(300)]).astype(np.int8)
    r = Routes((0, 1), x, np.arange(301, dtype=np.int64))
    for slots, admit in ((4, 1), (6, 2), (9, 4)):
        got = run_policy(f"admit{admit}-lrfu", r, {0: slots, 1: slots}, 20, ())
        h, m = _reference(x, slots, admit, LRFU_HALF_LIFE)
        assert (got.n_hit, got.n_miss) == (h, m) and got.policy == f"admit{admit}-lrfu"
        assert got.n_hit + got.n_miss == x.size  # hits / selections: nothing refused


def test_lrfu_keeps_recurring_experts_that_lru_lets_one_offs_evict() -> None:
    # each token: one of 4 recurring experts and 3 one-offs from 60; 6 slots
    rng = np.random.default_rng(0)
    rows = [[[int(rng.integers(4)), *(4 + rng.choice(60, 3, replace=False))]] for _ in range(400)]
    r = Routes((0,), np.array(rows, dtype=np.int8), np.arange(401, dtype=np.int64))
    lru = run_policy("admit4", r, {0: 6}, 64, ())
    lrfu = run_policy("admit4-lrfu", r, {0: 6}, 64, ())
    assert lrfu.hit_rate > lru.hit_rate + 0.05
