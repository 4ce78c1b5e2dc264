"""Routing as the tools use it: every token's experts in every MoE layer, in one array, with the ubatches
the engine ran them in. Read from reference-format trace files (validated against the model) or taken
from the engine's own records (``Context.stop_trace()``)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..cache_sim import MAX_UBATCH
from ..experts import ExpertLayout
from ..trace import RoutingRecord, TraceError, read_trace


@dataclass(frozen=True)
class Routes:
    """``experts[t, j, :]``: the experts token ``t`` selected in MoE layer ``layers[j]``, or -1 where that layer
    did not compute the token (llama.cpp's last layer computes only the tokens whose logits are wanted: the
    last of a prompt). Ubatch ``u`` is tokens ``starts[u]:starts[u + 1]``. A trace file keeps no ubatches:
    each of its tokens is one ubatch, as in generation."""

    layers: tuple[int, ...]
    experts: np.ndarray  # int32 [n_tokens, n_layers, k]
    starts: np.ndarray   # int64 [n_ubatch + 1], from 0 to n_tokens

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def k(self) -> int:
        return int(self.experts.shape[2])

    @property
    def ubatch_sizes(self) -> np.ndarray:
        return np.diff(self.starts)

    @cached_property
    def computed(self) -> np.ndarray:
        """[n_tokens, n_layers] bool: the layer computed the token."""
        return self.experts[:, :, 0] >= 0

    @cached_property
    def layer_tokens(self) -> np.ndarray:
        """[n_ubatch, n_layers]: tokens each layer computed in each ubatch (the n_tokens the cache sees)."""
        return np.add.reduceat(self.computed.astype(np.int64), self.starts[:-1], axis=0)

    @cached_property
    def counted(self) -> np.ndarray:
        """[n_ubatch, n_layers] bool: the lookups the cache makes (up to 32 tokens); larger ones keep
        llama.cpp's path. The last layer of a prompt, down to its last token, is looked up."""
        return (self.layer_tokens > 0) & (self.layer_tokens <= MAX_UBATCH)

    @cached_property
    def ubatch_of_token(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.starts) - 1), self.ubatch_sizes)

    @cached_property
    def distinct(self) -> np.ndarray:
        """[n_ubatch, n_layers, m] int32: each ubatch's distinct experts per layer, padded with -1. The cache
        counts a hit or a miss once per distinct expert of a ubatch."""
        if len(self.starts) - 1 == self.n_tokens:  # one token per ubatch: top-k experts are distinct already
            return self.experts
        sets = [[np.unique(block[block >= 0]) for block in np.moveaxis(self.experts[a:b], 1, 0)]
                for a, b in zip(self.starts[:-1], self.starts[1:])]
        m = max((len(s) for row in sets for s in row), default=self.k)
        out = np.full((len(sets), len(self.layers), m), -1, dtype=np.int32)
        for u, row in enumerate(sets):
            for j, s in enumerate(row):
                out[u, j, :len(s)] = s
        return out

    def per_token(self) -> "Routes":
        """The same routing with every token its own ubatch: how generation meets the cache (and what a
        trace file holds). Tracing feeds a text 32 tokens at a time only because it is faster."""
        return Routes(self.layers, self.experts, np.arange(self.n_tokens + 1, dtype=np.int64))

    def tokens(self, a: int, b: int) -> "Routes":
        """Tokens ``a:b`` (a < b); a ubatch cut by an edge keeps its part inside."""
        s = self.starts
        inner = s[(s > a) & (s < b)]
        return Routes(self.layers, self.experts[a:b], np.concatenate(([a], inner, [b])).astype(np.int64) - a)


def concat_routes(parts: Sequence[Routes]) -> Routes:
    """Several traces (or pieces) one after another, for ranking or replay."""
    if not parts:
        raise TraceError("no routing to concatenate")
    first = parts[0]
    for p in parts[1:]:
        if p.layers != first.layers or p.k != first.k:
            raise TraceError(f"traces disagree: layers {list(p.layers)} x k={p.k} against {list(first.layers)} x k={first.k}")
    starts, offset = [np.zeros(1, dtype=np.int64)], 0
    for p in parts:
        starts.append(p.starts[1:] + offset)
        offset += p.n_tokens
    return Routes(first.layers, np.concatenate([p.experts for p in parts]), np.concatenate(starts))


def routes_from_records(records: Iterable[RoutingRecord]) -> Routes:
    """The engine's records (one per ubatch and MoE layer, layers ascending within a ubatch), keeping the
    ubatches, so that a replay counts exactly like the engine. A layer that computed fewer tokens than the
    ubatch holds (the last layer of a prompt) is taken to have computed its last ones, the outputs."""
    ubatches: list[list[RoutingRecord]] = []
    for rec in records:
        if not ubatches or rec.il <= ubatches[-1][-1].il:  # layers restart: a new ubatch
            ubatches.append([])
        ubatches[-1].append(rec)
    if not ubatches:
        raise TraceError("the trace is empty: no routing was recorded")
    layers = tuple(r.il for r in ubatches[0])
    k = ubatches[0][0].experts.shape[1]
    blocks, sizes = [], []
    for u, ub in enumerate(ubatches):
        n = max(r.n_tokens for r in ub)
        if tuple(r.il for r in ub) != layers or any(r.experts.shape[1] != k for r in ub):
            raise TraceError(f"ubatch {u} has layers {[r.il for r in ub]} with k {[r.experts.shape[1] for r in ub]}; "
                             f"the first had layers {list(layers)} with k {k}: records are missing or out of order")
        block = np.full((n, len(layers), k), -1, dtype=np.int32)
        for j, r in enumerate(ub):
            block[n - r.n_tokens:, j] = r.experts
        blocks.append(block)
        sizes.append(n)
    return Routes(layers, np.concatenate(blocks), np.concatenate(([0], np.cumsum(sizes))).astype(np.int64))


def _rows(path: Path) -> np.ndarray:
    """The file's records as [n, 2 + 2k] int32 rows; a file whose records are not all alike goes through
    read_trace, which says where it breaks."""
    raw = path.read_bytes()
    if not raw:
        raise TraceError(f"{path}: empty: no routing records")
    if len(raw) >= 8 and len(raw) % 4 == 0:
        data = np.frombuffer(raw, dtype="<i4")
        k = int(data[1])
        width = 2 + 2 * k
        if 0 < k <= 1024 and data.size % width == 0:
            rows = data.reshape(-1, width)
            if (rows[:, 1] == k).all() and (rows[:, 0] >= 0).all():
                return rows
    records = read_trace(path)  # raises with the byte offset of what is wrong
    ks = sorted({r.experts.shape[1] for r in records})
    raise TraceError(f"{path}: records select different numbers of experts ({ks}); a routing trace has one k")


def read_routes(path: str | os.PathLike[str], layout: ExpertLayout | None = None) -> Routes:
    """Reads a reference-format trace into per-token routing (one token per ubatch) and, given the model's
    layout, checks that it was made for that model."""
    path = Path(path)
    rows = _rows(path)
    k = int(rows[0, 1])
    layers = tuple(int(il) for il in np.unique(rows[:, 0]))
    # records run layer by layer within each ubatch: the i-th record of a layer is token i
    per_layer = [rows[rows[:, 0] == il, 2:2 + k] for il in layers]
    counts = {il: len(p) for il, p in zip(layers, per_layer)}
    if len(set(counts.values())) != 1:
        short = min(counts, key=counts.__getitem__)
        raise TraceError(f"{path}: layer {short} holds {counts[short]} tokens, layer {max(counts, key=counts.__getitem__)} "
                         f"{max(counts.values())}: the trace is truncated, mixes models, or was recorded without "
                         f"every token's logits (llama.cpp's last layer then computes only the outputs; "
                         f"'python -m llama_moe trace' asks for all of them)")
    n = len(per_layer[0])
    if any((p < 0).any() for p in per_layer):
        raise TraceError(f"{path}: negative expert ids: not a routing trace")
    routes = Routes(layers, np.ascontiguousarray(np.stack(per_layer, axis=1), dtype=np.int32),
                    np.arange(n + 1, dtype=np.int64))
    if layout is not None:
        check_routes(routes, layout, str(path))
    return routes


def check_routes(routes: Routes, layout: ExpertLayout, source: str) -> None:
    """Refuses routing made for another model: other MoE layers, another k, experts out of range."""
    model_layers = tuple(l.il for l in layout.layers)
    if routes.layers != model_layers:
        raise TraceError(f"{source}: routing of layers {_span(routes.layers)}, but the model's MoE layers are "
                         f"{_span(model_layers)}: a trace of another model?")
    if routes.k != layout.n_expert_used:
        raise TraceError(f"{source}: {routes.k} experts per token, but the model uses {layout.n_expert_used}: "
                         f"a trace of another model?")
    lo, hi = int(routes.experts[routes.computed].min(initial=0)), int(routes.experts.max(initial=0))
    if lo < 0 or hi >= layout.n_expert:
        raise TraceError(f"{source}: selects expert {hi if hi >= layout.n_expert else lo}, outside the model's "
                         f"0..{layout.n_expert - 1}: a trace of another model?")


def load_traces(paths: Sequence[str | os.PathLike[str]], layout: ExpertLayout) -> Routes:
    """Several trace files of one model, one after another."""
    return concat_routes([read_routes(p, layout) for p in paths])


def _span(layers: Sequence[int]) -> str:
    if layers and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return str(list(layers))
