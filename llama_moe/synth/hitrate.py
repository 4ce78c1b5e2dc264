"""Expert-cache hit rates of a routing trace: a static hot-expert profile and a per-layer LRU."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


def expert_counts(routes: Sequence[np.ndarray], n_expert: int) -> np.ndarray:
    """[n_layer, n_expert] how often each expert was selected in ``routes`` ([n_tok, n_layer, k] each)."""
    n_layer = routes[0].shape[1]
    counts = np.zeros((n_layer, n_expert), dtype=np.int64)
    for r in routes:
        for layer in range(n_layer):
            counts[layer] += np.bincount(r[:, layer, :].ravel(), minlength=n_expert)
    return counts


def static_hit_rate(train: Sequence[np.ndarray], test: Sequence[np.ndarray], n_expert: int,
                    fraction: float = 1 / 6) -> float:
    """Share of ``test`` selections that fall in each layer's ``fraction`` most selected
    experts on ``train`` (a static profile of round(fraction * n_expert) slots per layer)."""
    slots = max(1, round(fraction * n_expert))
    prof = expert_counts(train, n_expert)
    hot = np.zeros_like(prof, dtype=bool)
    # stable order: ties go to the lower expert id, so the profile is deterministic
    order = np.argsort(-prof, axis=1, kind="stable")[:, :slots]
    np.put_along_axis(hot, order, True, axis=1)
    test_counts = expert_counts(test, n_expert)
    return float(test_counts[hot].sum() / test_counts.sum())


def lru_hit_rate(routes: Sequence[np.ndarray], n_expert: int, fraction: float = 1 / 8) -> float:
    """Share of selections found in a per-layer LRU cache of round(fraction * n_expert) experts,
    replaying ``routes`` in order (cache state carries over between sequences). The experts a
    token uses are all touched together, so a token never evicts one of its own experts."""
    cap = max(1, round(fraction * n_expert))
    n_layer = routes[0].shape[1]
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n_layer)]
    hits = total = 0
    for r in routes:
        for tok in r.tolist():
            for layer, sel in enumerate(tok):
                cache = caches[layer]
                for e in sel:
                    if e in cache:
                        hits += 1
                        cache.move_to_end(e)
                for e in sel:
                    if e not in cache:
                        cache[e] = None
                while len(cache) > max(cap, len(sel)):
                    cache.popitem(last=False)
                total += len(sel)
    return hits / total if total else 0.0
