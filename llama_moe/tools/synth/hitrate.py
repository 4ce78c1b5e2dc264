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


# --- measured as the published traces of real routing were (per prompt, per layer) -------------

def lru_per_prompt(routes: Sequence[np.ndarray], n_expert: int, slots: int) -> tuple[int, int]:
    """(hits, selections) of a per-layer LRU of ``slots`` experts, emptied at every prompt (each
    array one prompt, [n_tok, n_layer, k]). A token's experts are looked up together and never
    evict each other: the layer holds max(slots, k) while the token runs."""
    hits = total = 0
    for r in routes:
        n, n_layer, k = r.shape
        stamp = np.full((n_layer, n_expert), -np.inf)  # last use; larger is more recent
        rows = np.arange(n_layer)[:, None]
        for t in range(n):
            sel = r[t]
            mine = stamp[rows, sel]
            # held iff fewer than `slots` experts were used more recently
            newer = (stamp[:, None, :] > mine[:, :, None]).sum(axis=2)
            hit = (newer < slots) & np.isfinite(mine)
            hits += int(hit.sum())
            total += sel.size
            # the order the OrderedDict replay touches them: hits first, then misses
            order = np.where(hit, np.cumsum(hit, axis=1) - 1, hit.sum(axis=1, keepdims=True) + np.cumsum(~hit, axis=1) - 1)
            stamp[rows, sel] = t + order / (k + 1.0)
    return hits, total


def belady_per_prompt(routes: Sequence[np.ndarray], n_expert: int, slots: int) -> tuple[int, int]:
    """(hits, selections) of the optimal per-layer cache of ``slots`` experts (Belady, knowing the
    future), emptied at every prompt: after each token it keeps the experts of (held | selected)
    whose next use comes soonest. A miss need not be admitted, as in the published oracle."""
    hits = total = 0
    never = np.iinfo(np.int64).max
    for r in routes:
        n, n_layer, _ = r.shape
        rows = np.arange(n_layer)[:, None]
        nxt = np.empty((n, n_layer, n_expert), dtype=np.int64)
        last = np.full((n_layer, n_expert), never, dtype=np.int64)
        for t in range(n - 1, -1, -1):
            nxt[t] = last
            last[rows, r[t]] = t
        held = np.zeros((n_layer, n_expert), dtype=bool)
        for t in range(n):
            sel = r[t]
            hits += int(held[rows, sel].sum())
            total += sel.size
            pool = held.copy()
            pool[rows, sel] = True
            key = np.where(pool, nxt[t], never)
            keep = np.argsort(key, axis=1, kind="stable")[:, :slots]
            held[:] = False
            held[rows, keep] = True
            held &= key < never  # an expert never used again is not worth a slot
    return hits, total


def adjacent_overlap(routes: Sequence[np.ndarray]) -> np.ndarray:
    """[n_layer] mean |S_t & S_t-1| / k over adjacent tokens of each prompt."""
    acc: np.ndarray | None = None
    pairs = 0
    for r in routes:
        if r.shape[0] < 2:
            continue
        common = (r[1:, :, :, None] == r[:-1, :, None, :]).any(axis=3).sum(axis=2)  # [n-1, n_layer]
        s = common.sum(axis=0) / r.shape[2]
        acc = s if acc is None else acc + s
        pairs += r.shape[0] - 1
    if acc is None:
        raise ValueError("adjacent_overlap: no prompt has two tokens")
    return acc / pairs


def prompt_concentration(routes: Sequence[np.ndarray], n_expert: int, top: int = 16) -> tuple[float, float]:
    """(share of a layer's picks in the prompt's ``top`` most picked experts, normalised entropy of
    the prompt's picks), averaged over prompts and layers."""
    shares, ents = [], []
    for r in routes:
        for layer in range(r.shape[1]):
            c = np.bincount(r[:, layer].ravel(), minlength=n_expert).astype(np.float64)
            shares.append(np.sort(c)[::-1][:top].sum() / c.sum())
            p = c[c > 0] / c.sum()
            ents.append(float(-(p * np.log(p)).sum() / np.log(n_expert)))
    return float(np.mean(shares)), float(np.mean(ents))


def shuffled(routes: Sequence[np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """Each prompt's tokens in a random order: the same selections, no order."""
    rng = np.random.default_rng(seed)
    return [r[rng.permutation(r.shape[0])] for r in routes]
