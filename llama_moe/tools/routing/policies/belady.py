"""``belady``: per layer, the most hits a cache of that size could have, knowing the future (the ceiling)."""
from __future__ import annotations

import heapq

import numpy as np

from ..ranking import CHUNK_TOKENS
from ..routes import Routes
from .base import PolicyResult, Progress, _large, _looked_up


def belady_routes(routes: Routes, slots: dict[int, int], n_expert: int, progress: Progress | None = None,
                   chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
    looked = _looked_up(routes.layers, slots, n_expert)
    hits = misses = token_layers = all_in = n_resident = 0
    per_layer: dict[int, tuple[int, int]] = {}
    one_token = routes.one_token_ubatches
    for done, j in enumerate(looked):
        il, n = routes.layers[j], slots[routes.layers[j]]
        col = routes.counted[:, j]
        if one_token and col.all():  # every token looked up (a trace file): the column itself, no index
            lookups, n_lookups, d = None, len(col), routes.distinct[:, j]
        else:
            lookups = np.flatnonzero(col)
            n_lookups, d = len(lookups), routes.distinct[lookups, j]
        del col
        valid = d >= 0
        if valid.all():  # every lookup has its full width: its ids are at fixed steps
            width, ends = d.shape[1], None
            flat = np.ascontiguousarray(d).reshape(-1)  # the layer's lookups one after another
        else:
            width, ends = 0, np.concatenate(([0], np.cumsum(valid.sum(axis=1))))
            flat = d[valid]
        del valid, d
        pos_type = np.int32 if flat.size < np.iinfo(np.int32).max else np.int64
        never = int(np.iinfo(pos_type).max)
        next_use, first_pos = _next_uses(flat, n_expert, never, pos_type, chunk_tokens * routes.k)
        seen = np.flatnonzero(first_pos != never)
        soonest = seen[np.argsort(first_pos[seen], kind="stable")[:n]]  # the experts needed first, soonest first
        when = dict(zip(soonest.tolist(), first_pos[soonest].tolist()))  # resident expert -> its next use
        heap = [(-pos, e) for e, pos in when.items()]  # (-next use, expert): the one needed last on top
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        lh = lm = 0
        step = max(1, chunk_tokens)
        for c0 in range(0, n_lookups, step):  # Python lists for a chunk of lookups at a time
            c1 = min(c0 + step, n_lookups)
            if ends is None:
                p0, p1 = c0 * width, c1 * width
                bounds = list(range(0, p1 - p0 + 1, width))
            else:
                p0, p1 = int(ends[c0]), int(ends[c1])
                bounds = (ends[c0:c1 + 1] - p0).tolist()
            ids_c, uses_c = flat[p0:p1].tolist(), next_use[p0:p1].tolist()
            for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
                if one_token:  # the step is the token's row: all resident before it <=> all of it hits
                    token_layers += 1
                else:
                    u = int(lookups[c0 + s])
                    for row in routes.experts[routes.starts[u]:routes.starts[u + 1], j].tolist():
                        if row[0] >= 0:
                            token_layers += 1
                            all_in += all(e in when for e in row)
                h = 0
                for e, nu in zip(ids_c[a:b], uses_c[a:b]):
                    if e in when:
                        h += 1
                    elif len(when) >= n:
                        while when.get(heap[0][1]) != -heap[0][0]:  # entries a later use has replaced
                            pop(heap)
                        if -heap[0][0] <= nu:  # the newcomer is needed last: bypass it
                            continue
                        del when[pop(heap)[1]]
                    when[e] = nu
                    push(heap, (-nu, e))
                lh += h
                lm += b - a - h
                if one_token:
                    all_in += h == b - a
                if len(heap) > 4 * n + 64:  # drop the replaced entries: the heap stays O(slots)
                    heap = [(-pos, e) for e, pos in when.items()]
                    heapq.heapify(heap)
        del flat, next_use
        hits, misses = hits + lh, misses + lm
        per_layer[il] = (lh, lm)
        n_resident += len(when)
        if progress:
            progress(done + 1, len(looked))
    return PolicyResult("belady", hits, 0, misses, token_layers, all_in, 0,
                        sum(slots[routes.layers[j]] for j in looked), n_resident, per_layer,
                        n_large=_large(routes, looked))


def _next_uses(flat: np.ndarray, n_expert: int, never: int, pos_type: type, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(next use of every position: the next position holding the same expert, or ``never``; each expert's
    first position, or ``never``), computed a chunk at a time from the end: temporaries of a chunk."""
    next_use = np.empty(flat.size, dtype=pos_type)
    after = np.full(n_expert + 1, never, dtype=pos_type)  # each expert's first position past the chunk
    chunk = max(1, chunk)
    for b in range(flat.size, 0, -chunk):
        a = max(0, b - chunk)
        f = flat[a:b]
        order = np.argsort(f, kind="stable")
        fs = f[order]
        same = fs[1:] == fs[:-1]
        nu = np.empty(b - a, dtype=pos_type)
        nu[order] = after[fs]  # by default the expert's next position past the chunk ...
        nu[order[:-1][same]] = order[1:][same] + a  # ... unless it comes again within it
        next_use[a:b] = nu
        first = np.concatenate(([True], ~same))
        after[fs[first]] = order[first] + a
    return next_use, after[:n_expert]
