"""Routing traces: which experts the router selected, per ubatch and MoE layer, from the engine itself.

On disk the reference format (Strata's --dump-routing layout): one record per token and MoE layer,
``int32 layer, int32 k, k x int32 expert id, k x float32 weight``; the weights are written as 0.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from .errors import LlamaMoeError


class TraceError(LlamaMoeError, ValueError):
    """A routing trace is malformed."""


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
    """Writes records in the reference format, one per token and layer (token-major within a ubatch's
    layers is not kept: records are written in engine order, token by token). Returns the records written."""
    n = 0
    tmp = Path(path).with_name(Path(path).name + ".part")
    with open(tmp, "wb") as f:
        for rec in records:
            k = rec.experts.shape[1]
            for row in rec.experts:
                f.write(np.array([rec.il, k], dtype="<i4").tobytes())
                f.write(row.astype("<i4").tobytes())
                f.write(np.zeros(k, dtype="<f4").tobytes())
                n += 1
    tmp.replace(path)
    return n


def read_trace(path: str | os.PathLike[str], n_expert: int | None = None) -> list[RoutingRecord]:
    """Reads a reference-format trace: one single-token record per token and layer, validated."""
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
