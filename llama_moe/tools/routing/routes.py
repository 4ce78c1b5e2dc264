"""Routing in memory: every token's experts in every MoE layer, in one array, with the ubatches the engine
ran them in. Taken from the engine's own records (``Context.stop_trace()``), or read from trace files
(``tracefiles.load_traces``); the tools stream trace files instead (``tracefiles.TraceRoutes``), and replay
a ``Routes`` or a ``TraceRoutes`` alike, a chunk of ubatches at a time.

Memory: expert ids in the smallest integer type that holds them (1 byte per id up to 128 experts, 2 up to
32768), so routing of n records of k experts takes about n x (k + 1) bytes (the ids, and a byte for the
computed flag, which is also the looked-up flag when every ubatch is one token, as in a trace file): at
k = 8, 9 bytes for the 72 a record takes on disk, 12.5% of the file."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from ...errors import TraceError
from ...formats.trace import RoutingRecord
from ...policy_replay import max_ubatch


def expert_dtype(n_expert: int) -> np.dtype:
    """The smallest signed integer type that holds expert ids 0..n_expert-1 and the -1 of a layer that did
    not compute a token: int8 up to 128 experts, int16 up to 32768, else int32."""
    for t in (np.int8, np.int16, np.int32):
        if n_expert - 1 <= np.iinfo(t).max:
            return np.dtype(t)
    raise TraceError(f"{n_expert} experts: more than an int32 holds")


@dataclass(frozen=True)
class Routes:
    """``experts[t, j, :]``: the experts token ``t`` selected in MoE layer ``layers[j]``, or -1 where that layer
    did not compute the token (llama.cpp's last layer computes only the tokens whose logits are wanted: the
    last of a prompt). Ubatch ``u`` is tokens ``starts[u]:starts[u + 1]``. A trace file keeps no ubatches:
    each of its tokens is one ubatch, as in generation."""

    layers: tuple[int, ...]
    experts: np.ndarray  # [n_tokens, n_layers, k], a signed integer type (int8 for up to 128 experts: expert_dtype)
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

    @property
    def one_token_ubatches(self) -> bool:
        """Every ubatch is one token (a trace file, or ``per_token()``): the fast paths apply."""
        return len(self.starts) - 1 == self.n_tokens

    @cached_property
    def computed(self) -> np.ndarray:
        """[n_tokens, n_layers] bool: the layer computed the token."""
        return self.experts[:, :, 0] >= 0

    @cached_property
    def layer_tokens(self) -> np.ndarray:
        """[n_ubatch, n_layers]: tokens each layer computed in each ubatch (the n_tokens the cache sees)."""
        if self.one_token_ubatches:  # 0 or 1: the computed flags themselves, no copy
            return self.computed.view(np.uint8)
        if self.n_tokens == 0:
            return np.zeros((len(self.starts) - 1, len(self.layers)), dtype=np.int32)
        return np.add.reduceat(self.computed, self.starts[:-1], axis=0, dtype=np.int32)

    @cached_property
    def counted(self) -> np.ndarray:
        """[n_ubatch, n_layers] bool: the lookups the cache makes (up to ``max_ubatch()`` tokens, the engine's);
        larger ones keep llama.cpp's path. The last layer of a prompt, down to its last token, is looked up."""
        if self.one_token_ubatches:
            return self.computed
        return (self.layer_tokens > 0) & (self.layer_tokens <= max_ubatch())

    @cached_property
    def ubatch_of_token(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.starts) - 1), self.ubatch_sizes)

    @cached_property
    def distinct(self) -> np.ndarray:
        """[n_ubatch, n_layers, m] int32: each ubatch's distinct experts per layer, padded with -1. The cache
        counts a hit or a miss once per distinct expert of a ubatch."""
        if self.one_token_ubatches:  # one token per ubatch: top-k experts are distinct already
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
    _check_agree(parts)
    starts, offset = [np.zeros(1, dtype=np.int64)], 0
    for p in parts:
        starts.append(p.starts[1:] + offset)
        offset += p.n_tokens
    return Routes(first.layers, np.concatenate([p.experts for p in parts]), np.concatenate(starts))


class JoinedRoutes:
    """Routing pieces one after another, not copied (a k-fold's train side: the blocks around its test
    block). Ranking reads the pieces where they are (``ranking.pair_counts`` adds their counts up and keeps
    them here); any other use (a policy replay) joins them into one ``Routes``, a copy, on first use."""

    def __init__(self, parts: Sequence[Routes]) -> None:
        if not parts:
            raise TraceError("no routing to join")
        _check_agree(parts)
        self.parts = tuple(parts)
        self.counts_cache: dict[int, np.ndarray] = {}  # n_expert -> pair counts (ranking.pair_counts)

    @property
    def layers(self) -> tuple[int, ...]:
        return self.parts[0].layers

    @property
    def k(self) -> int:
        return self.parts[0].k

    @property
    def n_tokens(self) -> int:
        return sum(p.n_tokens for p in self.parts)

    @cached_property
    def joined(self) -> Routes:
        return concat_routes(self.parts)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("parts", "counts_cache"):
            raise AttributeError(name)
        return getattr(self.joined, name)


def _check_agree(parts: Sequence[Routes]) -> None:
    first = parts[0]
    for p in parts[1:]:
        if p.layers != first.layers or p.k != first.k:
            raise TraceError(f"traces disagree: layers {list(p.layers)} x k={p.k} against {list(first.layers)} x k={first.k}")


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


def _span(layers: Sequence[int]) -> str:
    if layers and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return str(list(layers))
