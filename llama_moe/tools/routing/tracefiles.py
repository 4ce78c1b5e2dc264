"""Routing read from trace files: streamed (``TraceRoutes``), or into one compact array (``load_traces``).

``TraceRoutes`` is what the tools work on: trace files of one model, one after another, read again as a stream
of blocks of whole tokens (``[tokens, layers, k]``) every time a tool needs them, and never held. Memory: the
reader's chunk (4.5 MiB at k=8 by default) and one block, whatever the files' size. A file whose layers are
interleaved token by token (what the trace command writes, in any layer order) is streamed in that bound; in a
file whose layers come apart (a layer's records far ahead of another's) the records of the layers ahead wait
in memory until the others catch up, so such a file takes memory as far as its layers are apart (at worst
its whole routing, compact, as ``load_traces`` holds it).

``load_traces`` / ``read_routes`` read the same stream into one ``Routes`` (1 byte per expert id up to 128
experts: 12.5% of the file at k=8; a ``FileRoutes``, which keeps each file's tokens), for small traces and for
what needs every token at once. Both validate
every record as they read (``trace.iter_trace_chunks``): errors name the file, the record and its byte
offset; whole records missing (layers with different token counts) are found at the end of the file.
"""
from __future__ import annotations

import copy
import os
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from ..experts import ExpertLayout
from ...errors import TraceError
from ...formats.trace import TRACE_CHUNK_RECORDS, TraceHeader, iter_trace_chunks, trace_header
from .routes import Routes, _span, expert_dtype

Progress = Callable[[int, int], None]


class TraceRoutes:
    """Trace files of one model as per-token routing (every token its own ubatch, as a trace file is read),
    streamed: ``blocks()`` and ``chunks()`` read the files again at every call, a chunk at a time. Within a
    file the i-th record of a layer is that layer's token i. ``tokens(a, b)`` is a view of tokens a..b-1
    (read from the start of the files, skipping what comes before). Given the model's layout every record is
    checked against it as it is read; without one the files are read once here, to find their layers and
    largest expert id. Counts per (layer, expert) are kept once counted (``segment_counts``): ``scan()``
    reads every file whole, validating it, and counts the selections."""

    one_token_ubatches = True

    def __init__(self, paths: Sequence[str | os.PathLike[str]], layout: ExpertLayout | None = None,
                 chunk_records: int | None = None, progress: Progress | None = None) -> None:
        if not paths:
            raise TraceError("no trace files")
        heads = [trace_header(p) for p in paths]
        if layout is not None:
            layers = tuple(l.il for l in layout.layers)
            n_expert = layout.n_expert
            for h in heads:
                if h.k != layout.n_expert_used:
                    raise TraceError(f"{h.path}: {h.k} experts per token (record 0), but the model uses "
                                     f"{layout.n_expert_used}: a trace of another model?")
        else:
            layers, n_expert = _find_layers(heads, chunk_records, progress)
        if not layers:
            raise TraceError(f"{heads[0].path}: no routing records")
        self.heads: tuple[TraceHeader, ...] = tuple(heads)
        self.layers: tuple[int, ...] = layers
        self.k = heads[0].k
        self.n_expert = n_expert  # the model's, or (without a layout) the largest id seen + 1
        self.dtype = expert_dtype(n_expert)
        self.chunk_records = chunk_records
        self._model_layers = layout is not None
        self._check = n_expert if layout is not None else None
        self.file_tokens = tuple(h.n_records // len(layers) for h in heads)  # what a valid file holds
        self.start, self.stop = 0, sum(self.file_tokens)
        self._counts: dict[tuple, np.ndarray] = {}

    @property
    def n_tokens(self) -> int:
        return self.stop - self.start

    @property
    def file_bytes(self) -> int:
        return sum(h.file_bytes for h in self.heads)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(h.path for h in self.heads)

    def trace_tokens(self) -> tuple[int, ...]:
        """The tokens of each trace file within this view, in order (files the view does not reach left out):
        the documents a leave-one-trace-out estimate folds by."""
        return _cut_lengths(self.file_tokens, self.start, self.stop)

    def tokens(self, a: int, b: int) -> "TraceRoutes":
        """Tokens ``a:b`` (a < b) of this routing, streamed from the same files."""
        if not 0 <= a < b <= self.n_tokens:
            raise ValueError(f"tokens {a}:{b} of {self.n_tokens}")
        view = copy.copy(self)
        view.start, view.stop = self.start + a, self.start + b
        view._counts = {}
        return view

    def blocks(self, cuts: Sequence[int] = (), progress: Progress | None = None,
               chunk_tokens: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """``(t, experts)``: tokens ``t .. t + len(experts) - 1`` (numbered within this view) as ``[tokens,
        layers, k]``, in order, in blocks of whole tokens that do not cross ``cuts`` (nor, given
        ``chunk_tokens``, hold more). A block may be a view of the reader's buffer: valid until the next one.
        ``progress(bytes read, bytes of the files read)`` after every chunk read."""
        n = self.n_tokens
        cuts = sorted({int(c) for c in cuts if 0 < c < n})
        full = self.start == 0 and self.stop == sum(self.file_tokens)
        spans, f0 = [], 0
        for h, ft in zip(self.heads, self.file_tokens):
            if full or (f0 + ft > self.start and f0 < self.stop):
                spans.append((h, f0, f0 + ft > self.stop))  # the last: stop reading past self.stop
            f0 += ft
        total = sum(h.file_bytes for h, _, _ in spans)
        base = 0
        shown = [-1]

        def report(done: int) -> None:
            shown[0] = done
            progress(done, total)  # type: ignore[misc]

        for h, f0, ends_inside in spans:
            reporter = None if progress is None else (lambda d, b=base: report(b + d))
            for t, block in _file_blocks(h, self.layers, self._check, self._model_layers, self.chunk_records,
                                         reporter, self.dtype):
                g0, g1 = f0 + t, f0 + t + len(block)
                lo, hi = max(g0, self.start), min(g1, self.stop)
                if lo < hi:
                    for x, y in _pieces(lo - self.start, hi - self.start, cuts, chunk_tokens):
                        yield x, block[x + self.start - g0:y + self.start - g0]
                if ends_inside and g1 >= self.stop:
                    break
            base += h.file_bytes
        if progress and shown[0] != total:  # stopped inside a file
            progress(total, total)

    def chunks(self, cuts: Sequence[int] = (), progress: Progress | None = None,
               chunk_tokens: int | None = None) -> Iterator[tuple[int, Routes]]:
        """``blocks()`` as ``Routes`` (one token per ubatch): what the policies replay."""
        for t, block in self.blocks(cuts, progress, chunk_tokens):
            yield t, Routes(self.layers, block, np.arange(len(block) + 1, dtype=np.int64))

    def segment_counts(self, edges: Sequence[int], n_expert: int | None = None,
                       progress: Progress | None = None) -> np.ndarray:
        """``[len(edges) - 1, n_layers, n_expert]`` int64: how many tokens of ``edges[i]:edges[i + 1]`` selected
        each (layer, expert), from one pass (kept: asked again, no pass)."""
        n_expert = self.n_expert if n_expert is None else n_expert
        edges = [int(e) for e in edges]
        key = (tuple(edges), n_expert)
        if key not in self._counts:
            n_layers = len(self.layers)
            width = max(n_expert, self.n_expert)
            out = np.zeros((len(edges) - 1, n_layers * width), dtype=np.int64)
            base = (np.arange(n_layers, dtype=np.int64) * width)[None, :, None]
            for t, block in self.blocks(edges, progress):
                s = int(np.searchsorted(edges, t, side="right")) - 1
                if 0 <= s < len(edges) - 1:
                    out[s] += np.bincount((block + base).ravel(), minlength=n_layers * width)
            self._counts[key] = out.reshape(len(edges) - 1, n_layers, width)[:, :, :n_expert]
        return self._counts[key]

    def pair_counts(self, n_expert: int | None = None, progress: Progress | None = None) -> np.ndarray:
        """``[n_layers, n_expert]``: the selections of every (layer, expert), as ``ranking.pair_counts``."""
        return self.segment_counts([0, self.n_tokens], n_expert, progress)[0]

    def scan(self, progress: Progress | None = None) -> "TraceRoutes":
        """Reads every file whole (validating every record, and the token counts of the layers) and counts
        the selections; returns self."""
        self.pair_counts(progress=progress)
        return self

    def columns(self, js: Sequence[int], progress: Progress | None = None) -> Routes:
        """The routing of the layers at indices ``js`` only, in memory: ``len(js)`` x k ids per token."""
        js = list(js)
        out = np.empty((self.n_tokens, len(js), self.k), dtype=self.dtype)
        for t, block in self.blocks(progress=progress):
            out[t:t + len(block)] = block[:, js]
        return Routes(tuple(self.layers[j] for j in js), out, np.arange(self.n_tokens + 1, dtype=np.int64))


def _cut_lengths(lengths: Sequence[int], a: int, b: int) -> tuple[int, ...]:
    """The parts of consecutive runs of ``lengths`` tokens that fall in tokens a..b-1."""
    out, f0 = [], 0
    for n in lengths:
        m = min(f0 + n, b) - max(f0, a)
        if m > 0:
            out.append(m)
        f0 += n
    return tuple(out)


@dataclass(frozen=True)
class FileRoutes(Routes):
    """Routing read from trace files into memory (``load_traces``), one token per ubatch, with the tokens of each
    file in order (``file_tokens``): the documents a leave-one-trace-out estimate folds by, as for a
    ``TraceRoutes`` of the same files."""

    file_tokens: tuple[int, ...] = ()

    def trace_tokens(self) -> tuple[int, ...]:
        return self.file_tokens or (self.n_tokens,)

    def tokens(self, a: int, b: int) -> "FileRoutes":
        view = Routes.tokens(self, a, b)
        return FileRoutes(view.layers, view.experts, view.starts, _cut_lengths(self.trace_tokens(), a, b))


def _pieces(lo: int, hi: int, cuts: Sequence[int], chunk: int | None) -> Iterator[tuple[int, int]]:
    """[lo, hi) cut at ``cuts`` and every ``chunk``."""
    edges = [lo] + [c for c in cuts if lo < c < hi] + [hi]
    for x, y in zip(edges[:-1], edges[1:]):
        step = y - x if not chunk else max(1, chunk)
        for a in range(x, y, step):
            yield a, min(a + step, y)


def _find_layers(heads: Sequence[TraceHeader], chunk_records: int | None,
                 progress: Progress | None) -> tuple[tuple[int, ...], int]:
    """A first pass: the layers every file holds and the largest expert id (+1)."""
    found = []
    n_expert = 1
    total, done = sum(h.file_bytes for h in heads), 0
    for h in heads:
        seen: set[int] = set()
        reporter = None if progress is None else (lambda d, b=done: progress(b + d, total))
        for ch in iter_trace_chunks(h.path, None, chunk_records or TRACE_CHUNK_RECORDS, reporter):
            seen.update(np.unique(ch.layer).tolist())
            n_expert = max(n_expert, int(ch.experts.max()) + 1)
        done += h.file_bytes
        found.append((h, tuple(sorted(seen))))
    layers = found[0][1]
    for h, got in found[1:]:
        if got != layers or h.k != heads[0].k:
            raise TraceError(f"traces disagree: {h.path} has layers {list(got)} x k={h.k} against "
                             f"{list(layers)} x k={heads[0].k} in {heads[0].path}")
    return layers, n_expert


def _take(pieces: deque, n: int, out: np.ndarray) -> None:
    """Moves the first ``n`` rows of a layer's waiting records into ``out``."""
    i = 0
    while i < n:
        p = pieces[0]
        t = min(len(p), n - i)
        out[i:i + t] = p[:t]
        if t == len(p):
            pieces.popleft()
        else:
            pieces[0] = p[t:]
        i += t


def _file_blocks(head: TraceHeader, layers: tuple[int, ...], n_expert: int | None, model_layers: bool,
                 chunk_records: int | None, progress: Callable[[int], None] | None,
                 dtype: np.dtype) -> Iterator[tuple[int, np.ndarray]]:
    """One trace's tokens in order, as ``(first token, [tokens, layers, k])``: the i-th record of a layer is
    its token i. A chunk of whole tokens in the layers' order is yielded as it was read (a view of the
    reader's buffer); otherwise each layer's records wait until every layer has them (copies, ``dtype``).
    Refuses records of other layers as they come, and at the end layers with different token counts."""
    n_layers, k = len(layers), head.k
    cap = head.n_records // n_layers
    if chunk_records is None:  # whole tokens per chunk: a well-formed trace takes the first path below
        chunk_records = max(n_layers, TRACE_CHUNK_RECORDS // n_layers * n_layers)
    chunk_records = max(1, min(chunk_records, head.n_records))
    by_layer = np.argsort(np.array(layers, dtype=np.int64), kind="stable")  # layer -> its index by binary search
    sorted_layers = np.array(layers, dtype=np.int64)[by_layer]
    pattern = np.tile(np.arange(n_layers), -(-chunk_records // n_layers))
    count = np.zeros(n_layers, dtype=np.int64)    # records of each layer read
    waiting = np.zeros(n_layers, dtype=np.int64)  # of them, not yet yielded
    pending: list[deque] = [deque() for _ in range(n_layers)]
    done = 0  # tokens yielded
    for ch in iter_trace_chunks(head.path, n_expert, chunk_records, progress):
        at = np.minimum(np.searchsorted(sorted_layers, ch.layer), n_layers - 1)
        bad = np.flatnonzero(sorted_layers[at] != ch.layer)
        j = by_layer[at]
        if bad.size:
            il = int(ch.layer[bad[0]])
            raise TraceError(f"{head.where(ch.first + int(bad[0]))} is for layer {il}, but the "
                             f"{'model' if model_layers else 'first trace'}'s MoE layers are {_span(layers)}: "
                             f"a trace of another model?")
        m = len(j)
        if (m % n_layers == 0 and done + m // n_layers <= cap and not waiting.any()
                and np.array_equal(j, pattern[:m])):
            yield done, ch.experts.reshape(m // n_layers, n_layers, k)  # layer by layer, token by token
            count += m // n_layers
            done += m // n_layers
            continue
        cnt = np.bincount(j, minlength=n_layers)
        order = np.argsort(j, kind="stable")
        grouped = ch.experts[order]
        ends = np.cumsum(cnt)
        for l in np.flatnonzero(cnt).tolist():
            pending[l].append(grouped[ends[l] - cnt[l]:ends[l]].astype(dtype))
        count += cnt
        waiting += cnt
        ready = min(int(waiting.min()), cap - done)  # past cap: a layer with more records than the others, refused below
        if ready > 0:
            block = np.empty((ready, n_layers, k), dtype=dtype)
            for l in range(n_layers):
                _take(pending[l], ready, block[:, l])
            waiting -= ready
            yield done, block
            done += ready
    if (count == cap).all():
        return
    if model_layers and (count == 0).any():
        present = tuple(il for il, c in zip(layers, count) if c)
        raise TraceError(f"{head.path}: routing of layers {_span(present)}, but the model's MoE layers are "
                         f"{_span(layers)}: a trace of another model?")
    short, long = int(np.argmin(count)), int(np.argmax(count))
    raise TraceError(f"{head.path}: layer {layers[short]} holds {int(count[short])} tokens, layer {layers[long]} "
                     f"{int(count[long])}: the trace is truncated, mixes models, or was recorded without "
                     f"every token's logits (llama.cpp's last layer then computes only the outputs; "
                     f"'python -m llama_moe trace' asks for all of them)")


def read_routes(path: str | os.PathLike[str], layout: ExpertLayout | None = None,
                progress: Progress | None = None, chunk_records: int | None = None) -> FileRoutes:
    """Reads a reference-format trace into per-token routing in memory (one token per ubatch) and, given the
    model's layout, checks that it was made for that model. For large traces the tools stream
    (``TraceRoutes``) instead."""
    return load_traces([path], layout, progress, chunk_records)


def load_traces(paths: Sequence[str | os.PathLike[str]], layout: ExpertLayout | None = None,
                progress: Progress | None = None, chunk_records: int | None = None) -> FileRoutes:
    """Several trace files of one model, one after another, read chunk by chunk into one compact array
    (``expert_dtype``): 1 byte per expert id up to 128 experts, with each file's tokens (``FileRoutes``). Validated as ``TraceRoutes`` validates;
    without the model's layout the files are read twice. ``progress(bytes read, bytes in all)`` after every
    chunk; ``chunk_records`` (default 64Ki, rounded down to whole tokens) bounds what is read at once."""
    heads = [trace_header(p) for p in paths] if paths else []
    size = sum(h.file_bytes for h in heads)
    total = size * (1 if layout is not None else 2)
    first = None if progress is None else (lambda d, t: progress(d, total))
    routes = TraceRoutes(paths, layout, chunk_records, first)
    experts = np.empty((routes.n_tokens, len(routes.layers), routes.k), dtype=routes.dtype)
    done = total - size
    for t, block in routes.blocks(progress=None if progress is None else (lambda d, _: progress(done + d, total))):
        experts[t:t + len(block)] = block
    return FileRoutes(routes.layers, experts, np.arange(len(experts) + 1, dtype=np.int64), routes.trace_tokens())


def token_blocks(source: Routes | TraceRoutes, cuts: Sequence[int] = (), chunk_tokens: int = 2048,
                 progress: Progress | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Any routing's tokens in order as ``(t, experts[tokens, layers, k])`` blocks that do not cross ``cuts``:
    views of a ``Routes``, or a ``TraceRoutes`` read a chunk at a time."""
    if isinstance(source, TraceRoutes):
        yield from source.blocks(cuts, progress, chunk_tokens)
        return
    n = source.n_tokens
    for a, b in _pieces(0, n, sorted(cuts), chunk_tokens):
        yield a, source.experts[a:b]
        if progress:
            progress(b, n)
