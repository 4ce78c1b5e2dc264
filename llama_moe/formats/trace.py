"""Routing traces: which experts the router selected, per ubatch and MoE layer, from the engine itself.

On disk the routing trace format of docs/formats.md (Strata's --dump-routing layout): one record per token and MoE layer,
``int32 layer, int32 k, k x int32 expert id, k x float32 weight``; the weights are written as 0.

``iter_trace_chunks`` reads a trace of any size in chunks of a fixed number of records (memory: one chunk,
4.5 MiB at k=8 by default), validating as it goes: every error names the record and its byte offset.
``read_trace`` returns every record as a ``RoutingRecord`` (small traces, and traces whose k varies).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from .atomic import atomic_writer
from ..errors import TraceError


@dataclass(frozen=True)
class RoutingRecord:
    """The experts one ubatch selected in one MoE layer: ``experts[token, i]``."""

    il: int
    experts: np.ndarray  # int32 [n_tokens, k]

    @property
    def n_tokens(self) -> int:
        return int(self.experts.shape[0])


def parse_stream(data: np.ndarray) -> list[RoutingRecord]:
    """Splits the engine's int32 stream ({il, n_tokens, k, ids...} per ubatch and layer) into records."""
    records = []
    i, n = 0, len(data)
    while i < n:
        if i + 3 > n:
            raise TraceError(f"trace stream ends inside a record header at value {i}")
        il, n_tokens, k = (int(v) for v in data[i:i + 3])
        if n_tokens < 0 or k < 0 or i + 3 + n_tokens * k > n:
            raise TraceError(f"trace record at value {i} (layer {il}, {n_tokens} tokens x {k}) runs past the end")
        ids = np.asarray(data[i + 3:i + 3 + n_tokens * k], dtype=np.int32).reshape(n_tokens, k).copy()
        records.append(RoutingRecord(il, ids))
        i += 3 + n_tokens * k
    return records


def write_trace(path: str | os.PathLike[str], records: Iterable[RoutingRecord]) -> int:
    """Writes records in the routing trace format, one per token and layer (token-major within a ubatch's
    layers is not kept: records are written in engine order, token by token). Returns the records written."""
    n = 0
    with atomic_writer(path, "wb") as f:  # whole or not at all: a failure (or Ctrl-C) mid-trace leaves no file
        for rec in records:
            n_tokens, k = rec.experts.shape
            rows = np.zeros((n_tokens, 2 + 2 * k), dtype="<i4")  # the weights' zeros are float32 zeros too
            rows[:, 0], rows[:, 1], rows[:, 2:2 + k] = rec.il, k, rec.experts
            f.write(rows.tobytes())
            n += n_tokens
    return n


TRACE_CHUNK_RECORDS = 1 << 16  # records read at a time: 4.5 MiB at k=8


def record_bytes(k: int) -> int:
    """The size of one record of ``k`` experts: layer, k, k ids, k weights."""
    return 8 + 8 * k


@dataclass(frozen=True)
class TraceHeader:
    """What the first record and the file size say: every record of a routing trace has the same k."""

    path: str
    k: int
    file_bytes: int

    @property
    def record_bytes(self) -> int:
        return record_bytes(self.k)

    @property
    def n_records(self) -> int:
        """Whole records in the file (a truncated last one is not counted: reading it raises)."""
        return self.file_bytes // self.record_bytes

    def where(self, i: int) -> str:
        """Names record ``i`` and its byte offset, for errors."""
        return f"{self.path}: record {i} (byte {i * self.record_bytes})"


def trace_header(path: str | os.PathLike[str]) -> TraceHeader:
    """Reads the first record's header: the trace's k. Raises TraceError for a missing, empty or foreign file."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    if not head:
        raise TraceError(f"{path}: empty: no routing records")
    if len(head) < 8:
        raise TraceError(f"{path}: truncated: {size} bytes, less than one record header (8 bytes)")
    il, k = (int(v) for v in np.frombuffer(head, dtype="<i4"))
    if il < 0 or not 0 < k <= 1024:
        raise TraceError(f"{path}: record 0 (byte 0) has layer {il} and k {k}; not a routing trace?")
    return TraceHeader(str(path), k, size)


@dataclass(frozen=True)
class TraceChunk:
    """Records ``first .. first + len(layer) - 1`` of a trace, validated: every one has the trace's k, a
    layer >= 0 and expert ids >= 0 (and below n_expert when it was given). The arrays are views of the
    reader's buffer: valid until the next chunk is read."""

    first: int
    layer: np.ndarray    # int32 [m]
    experts: np.ndarray  # int32 [m, k]


def iter_trace_chunks(path: str | os.PathLike[str], n_expert: int | None = None,
                      chunk_records: int = TRACE_CHUNK_RECORDS,
                      progress: Callable[[int], None] | None = None) -> Iterator[TraceChunk]:
    """Yields a trace's records ``chunk_records`` at a time, in file order, in bounded memory (one chunk).
    Raises TraceError naming the record and its byte offset for: a record whose k differs from the first
    record's, a negative layer, an expert id < 0 or >= ``n_expert``, and a file that ends inside a record.
    ``progress(bytes)`` is called with the bytes read after each chunk."""
    head = trace_header(path)
    k, rec = head.k, head.record_bytes
    width = 2 + 2 * k
    chunk_records = max(1, min(int(chunk_records), head.n_records))
    buf = np.empty(chunk_records * width, dtype="<i4")
    first = 0
    with open(path, "rb") as f:
        while first < head.n_records:
            m = min(chunk_records, head.n_records - first)
            view = memoryview(buf).cast("B")[:m * rec]
            got = f.readinto(view)
            if got != m * rec:  # the file shrank while being read
                raise TraceError(f"{head.where(first + got // rec)} runs past the end of the file: it changed while being read")
            rows = buf[:m * width].reshape(m, width)
            bad = np.flatnonzero(rows[:, 1] != k)
            if bad.size:
                i = int(bad[0])
                raise TraceError(f"{head.where(first + i)} has k {int(rows[i, 1])}, but the first record has k {k}: "
                                 f"a routing trace has one k (a damaged or concatenated file?)")
            bad = np.flatnonzero(rows[:, 0] < 0)
            if bad.size:
                i = int(bad[0])
                raise TraceError(f"{head.where(first + i)} has layer {int(rows[i, 0])}: not a routing trace?")
            ids = rows[:, 2:2 + k]
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or (n_expert is not None and hi >= n_expert):
                out = (ids < 0) if n_expert is None else (ids < 0) | (ids >= n_expert)
                i = int(np.flatnonzero(out.any(axis=1))[0])
                e = int(ids[i][out[i]][0])
                if e < 0:
                    raise TraceError(f"{head.where(first + i)} selects expert {e}: not a routing trace?")
                raise TraceError(f"{head.where(first + i)} selects expert {e}, outside the model's 0..{n_expert - 1}: "
                                 f"a trace of another model?")
            yield TraceChunk(first, rows[:, 0], ids)
            first += m
            if progress:
                progress(first * rec)
    tail = head.file_bytes - head.n_records * rec
    if tail:
        pos = head.n_records * rec
        if tail < 8:
            raise TraceError(f"{head.path}: truncated record header at byte {pos} (record {head.n_records}): the file "
                             f"ends {tail} bytes into it")
        raise TraceError(f"{head.where(head.n_records)} runs past the end of the file ({head.file_bytes} bytes; "
                         f"a record of k={k} takes {rec}): the trace is truncated")


def read_trace(path: str | os.PathLike[str], n_expert: int | None = None) -> list[RoutingRecord]:
    """Reads a reference-format trace: one single-token record per token and layer, validated. Every record
    becomes an object: for large traces use ``iter_trace_chunks`` or ``routing.TraceRoutes`` (streamed)."""
    raw = Path(path).read_bytes()
    records = []
    pos = 0
    while pos < len(raw):
        if pos + 8 > len(raw):
            raise TraceError(f"{path}: truncated record header at byte {pos}")
        il, k = np.frombuffer(raw, dtype="<i4", count=2, offset=pos)
        if il < 0 or not 0 < k <= 1024:
            raise TraceError(f"{path}: record at byte {pos} has layer {il} and k {k}; not a routing trace?")
        end = pos + 8 + 8 * int(k)
        if end > len(raw):
            raise TraceError(f"{path}: record at byte {pos} (k={k}) runs past the end of the file ({len(raw)} bytes)")
        ids = np.frombuffer(raw, dtype="<i4", count=int(k), offset=pos + 8).astype(np.int32)
        if n_expert is not None and (ids.min() < 0 or ids.max() >= n_expert):
            raise TraceError(f"{path}: record at byte {pos} selects expert {int(ids.max())}, outside 0..{n_expert - 1}")
        records.append(RoutingRecord(int(il), ids.reshape(1, int(k))))
        pos = end
    return records
