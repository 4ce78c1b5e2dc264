"""GGUF header reader: metadata and tensor table, validated, without touching tensor data.

The file is memory-mapped and only the header pages are read, so checking a 60 GB model is
cheap. Every inconsistency raises GgufError naming the file, what is wrong and where, since
this is what stands between a user and an opaque abort inside llama.cpp.

Why not gguf-py's GGUFReader (whose constants this uses): it does not validate (a truncated file or a
damaged count gives an IndexError, or garbage fields, not a message), and it makes a numpy view of every
element of every array, which takes 4.8 s on a 152k-token vocabulary where this reader takes 0.15 s;
every Model() runs this check before llama.cpp loads the file. The tests check that both readers agree
on the files the synthesizer writes.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUFValueType, Keys

from llama_moe.errors import GgufError
from llama_moe.gguf_files.quants import TYPE_INFO, GgmlType

GgufValueType = GGUFValueType
GGUF_MAGIC = b"GGUF"
GGML_MAX_DIMS = 4  # ggml.h (the published gguf-py of the base's version does not export it)
GGML_MAX_NAME = 64  # a tensor name must be shorter than this (terminating NUL included in ggml)
ALIGNMENT_KEY = Keys.General.ALIGNMENT

# numpy dtype of each fixed-size scalar type (little-endian): one value or a whole array in one read
NUMPY_DTYPE: dict[GgufValueType, str] = {
    GgufValueType.UINT8: "<u1", GgufValueType.INT8: "<i1", GgufValueType.UINT16: "<u2", GgufValueType.INT16: "<i2",
    GgufValueType.UINT32: "<u4", GgufValueType.INT32: "<i4", GgufValueType.FLOAT32: "<f4", GgufValueType.BOOL: "<u1",
    GgufValueType.UINT64: "<u8", GgufValueType.INT64: "<i8", GgufValueType.FLOAT64: "<f8",
}
SCALAR_FORMAT: dict[GgufValueType, str] = {
    GgufValueType.UINT8: "<B", GgufValueType.INT8: "<b", GgufValueType.UINT16: "<H", GgufValueType.INT16: "<h",
    GgufValueType.UINT32: "<I", GgufValueType.INT32: "<i", GgufValueType.FLOAT32: "<f", GgufValueType.BOOL: "<?",
    GgufValueType.UINT64: "<Q", GgufValueType.INT64: "<q", GgufValueType.FLOAT64: "<d",
}


def align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


_MAX_STRING = 1 << 30  # same limits as ggml's gguf.cpp
_MAX_ARRAY = 1 << 30


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    type: GgmlType
    ne: tuple[int, ...]  # ggml order: fastest-varying dimension first
    offset: int  # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


@dataclass(frozen=True)
class GgufFile:
    path: str
    version: int
    metadata: dict[str, Any]
    metadata_types: dict[str, GgufValueType]  # for arrays: the element type
    tensors: tuple[GgufTensorInfo, ...]
    data_offset: int
    alignment: int
    file_size: int
    _by_name: dict[str, GgufTensorInfo] = field(default_factory=dict, repr=False, compare=False)

    def tensor(self, name: str) -> GgufTensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise GgufError(f"{self.path}: no tensor named {name!r}") from None

    def has_tensor(self, name: str) -> bool:
        return name in self._by_name

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GgufError(f"{self.path}: required key {key!r} is missing")
        return self.metadata[key]

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")


class _Cursor:
    """Bounds-checked little-endian reads from a buffer, with error messages that say where."""

    def __init__(self, buf: Any, size: int, label: str) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0
        self.label = label

    def fail(self, what: str, pos: int | None = None) -> GgufError:
        return GgufError(f"{self.label}: {what} (at byte {self.pos if pos is None else pos})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} needs {n} bytes but the file ends at byte {self.size} (truncated?)")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def unpack_many(self, fmt: str, what: str) -> tuple[Any, ...]:
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return tuple(v)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.unpack("<Q", f"length of {what}")
        if n > _MAX_STRING:
            raise self.fail(f"{what} claims a length of {n} bytes (limit {_MAX_STRING}); the file is corrupt", start)
        self.need(n, f"{what} ({n} bytes)")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")


def _value_type(cur: _Cursor, raw: int, key: str) -> GgufValueType:
    try:
        return GgufValueType(raw)
    except ValueError:
        raise cur.fail(f"key {key!r} has unknown value type {raw}", cur.pos - 4) from None


def _read_array(cur: _Cursor, key: str) -> tuple[list[Any], GgufValueType]:
    et = _value_type(cur, cur.unpack("<I", f"array type of {key!r}"), key)
    start = cur.pos
    n = cur.unpack("<Q", f"array length of {key!r}")
    if n > _MAX_ARRAY:
        raise cur.fail(f"array {key!r} claims {n} elements (limit {_MAX_ARRAY}); the file is corrupt", start)
    if et == GgufValueType.ARRAY:
        raise cur.fail(f"key {key!r} is an array of arrays, which GGUF readers do not support")
    if et == GgufValueType.STRING:
        # each string takes at least its 8-byte length: reject absurd counts before looping
        if n * 8 > cur.size - cur.pos:
            raise cur.fail(f"array {key!r} claims {n} strings but only {cur.size - cur.pos} bytes remain (truncated?)", start)
        return [cur.string(f"element {i} of {key!r}") for i in range(n)], et
    dt = np.dtype(NUMPY_DTYPE[et])
    cur.need(n * dt.itemsize, f"array {key!r} of {n} {et.name}")
    # copy out rather than view the map, so no buffer export outlives the parse
    arr = np.frombuffer(bytes(cur.buf[cur.pos : cur.pos + n * dt.itemsize]), dtype=dt)
    cur.pos += n * dt.itemsize
    values = arr.astype(bool).tolist() if et == GgufValueType.BOOL else arr.tolist()
    return values, et


def _read_kv(cur: _Cursor, index: int, n_kv: int) -> tuple[str, Any, GgufValueType]:
    key = cur.string(f"key of key-value pair {index} of {n_kv}")
    if not key:
        raise cur.fail(f"key-value pair {index} has an empty key")
    vt = _value_type(cur, cur.unpack("<I", f"value type of {key!r}"), key)
    if vt == GgufValueType.ARRAY:
        values, et = _read_array(cur, key)
        return key, values, et
    if vt == GgufValueType.STRING:
        return key, cur.string(f"value of {key!r}"), vt
    value = cur.unpack(SCALAR_FORMAT[vt], f"value of {key!r}")
    return key, value, vt


def read_gguf(path: str | os.PathLike[str]) -> GgufFile:
    """Read and validate a GGUF file's header and tensor table; tensor data is never read."""
    p = Path(path)
    label = str(p)
    try:
        fh = open(p, "rb")
    except OSError as e:
        raise GgufError(f"{label}: cannot open: {e.strerror or e}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise GgufError(f"{label}: only {size} bytes, too short for a GGUF header (24 bytes)")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _parse(memoryview(mm), size, label)
        finally:
            mm.close()


def _parse(buf: memoryview, size: int, label: str) -> GgufFile:
    try:
        return _parse_inner(buf, size, label)
    finally:
        buf.release()


def _parse_inner(buf: memoryview, size: int, label: str) -> GgufFile:
    cur = _Cursor(buf, size, label)
    magic = bytes(buf[0:4])
    if magic != GGUF_MAGIC:
        raise cur.fail(f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}")
    cur.pos = 4
    version = cur.unpack("<I", "version")
    if version & 0xFFFF == 0 and version != 0:
        raise cur.fail(f"version {version} looks byte-swapped: big-endian GGUF files are not supported", 4)
    if version == 1:
        raise cur.fail("GGUF version 1 is no longer supported (llama.cpp reads versions 2 and 3)", 4)
    if version not in (2, 3):
        raise cur.fail(f"unsupported GGUF version {version} (expected 2 or 3)", 4)
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "key-value count")
    # every pair takes >= 13 bytes (key length, 1-byte key, type); every tensor >= 29 bytes
    if n_kv * 13 > size - cur.pos:
        raise cur.fail(f"header claims {n_kv} key-value pairs, more than the {size} byte file can hold (truncated or corrupt?)", 16)
    if n_tensors * 29 > size - cur.pos:
        raise cur.fail(f"header claims {n_tensors} tensors, more than the {size} byte file can hold (truncated or corrupt?)", 8)

    metadata: dict[str, Any] = {}
    types: dict[str, GgufValueType] = {}
    for i in range(n_kv):
        start = cur.pos
        key, value, vt = _read_kv(cur, i, n_kv)
        if key in metadata:
            raise cur.fail(f"duplicate key {key!r}", start)
        metadata[key] = value
        types[key] = vt

    alignment = GGUF_DEFAULT_ALIGNMENT
    if ALIGNMENT_KEY in metadata:
        if types[ALIGNMENT_KEY] != GgufValueType.UINT32:
            raise cur.fail(f"{ALIGNMENT_KEY} must be UINT32 but is {types[ALIGNMENT_KEY].name}")
        alignment = metadata[ALIGNMENT_KEY]
        if alignment == 0 or alignment & (alignment - 1):
            raise cur.fail(f"{ALIGNMENT_KEY} = {alignment} is not a power of two")

    raw_infos: list[tuple[str, GgmlType, tuple[int, ...], int, int]] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        start = cur.pos
        name = cur.string(f"name of tensor {i} of {n_tensors}")
        if len(name.encode("utf-8", errors="surrogateescape")) >= GGML_MAX_NAME:
            raise cur.fail(f"tensor {i} name {name!r} is too long (ggml allows < {GGML_MAX_NAME} bytes)", start)
        if name in seen:
            raise cur.fail(f"duplicate tensor name {name!r}", start)
        seen.add(name)
        n_dims = cur.unpack("<I", f"dimension count of tensor {name!r}")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (must be 1..{GGML_MAX_DIMS})")
        ne = cur.unpack_many(f"<{n_dims}q", f"shape of tensor {name!r}")
        if any(d < 0 for d in ne):
            raise cur.fail(f"tensor {name!r} has a negative dimension in shape {ne}")
        traw = cur.unpack("<I", f"type of tensor {name!r}")
        try:
            ttype = GgmlType(traw)
        except ValueError:
            raise cur.fail(f"tensor {name!r} has unknown ggml type {traw}") from None
        info = TYPE_INFO[ttype]
        if ne[0] % info.block_size:
            raise cur.fail(f"tensor {name!r}: row length {ne[0]} is not a multiple of the {ttype.name} block size {info.block_size}")
        rel = cur.unpack("<Q", f"data offset of tensor {name!r}")
        n = 1
        for d in ne[1:]:
            n *= d
        nbytes = n * (ne[0] // info.block_size) * info.type_size
        raw_infos.append((name, ttype, ne, rel, nbytes))

    data_offset = align(cur.pos, alignment) if n_tensors else cur.pos
    tensors: list[GgufTensorInfo] = []
    expected = 0
    for name, ttype, ne, rel, nbytes in raw_infos:
        if rel != expected:
            raise GgufError(f"{label}: tensor {name!r} has data offset {rel}, expected {expected} (tensors must be packed in order)")
        end = data_offset + rel + nbytes
        if end > size:
            raise GgufError(f"{label}: tensor {name!r} data ends at byte {end} but the file has {size} bytes (truncated?)")
        tensors.append(GgufTensorInfo(name, ttype, ne, data_offset + rel, nbytes))
        expected += align(nbytes, alignment)

    return GgufFile(
        path=label,
        version=version,
        metadata=metadata,
        metadata_types=types,
        tensors=tuple(tensors),
        data_offset=data_offset,
        alignment=alignment,
        file_size=size,
        _by_name={t.name: t for t in tensors},
    )


def read_tensor_bytes(path: str | os.PathLike[str], info: GgufTensorInfo) -> bytes:
    """Read one tensor's raw data (a seek and a read; for small tensors and tests)."""
    with open(path, "rb") as fh:
        fh.seek(info.offset)
        data = fh.read(info.nbytes)
    if len(data) != info.nbytes:
        raise GgufError(f"{path}: tensor {info.name!r} data is truncated: read {len(data)} of {info.nbytes} bytes")
    return data
