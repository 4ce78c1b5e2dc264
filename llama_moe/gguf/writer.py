"""Streaming GGUF v3 writer: metadata and tensor table first, then tensor data one at a time.

The file is written under a temporary name next to the target and renamed only when every
declared tensor has been written, so a crash never leaves a half-written file under the final
name. Tensor data must come in declaration order: GGUF requires each tensor's offset to be the
padded end of the previous one, and streaming in that order is what lets us never hold the
model in memory.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from llama_moe.errors import GgufError
from llama_moe.gguf.constants import (
    ALIGNMENT_KEY,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSION,
    NUMPY_DTYPE,
    SCALAR_FORMAT,
    GgufValueType,
    align,
)
from llama_moe.gguf.quants import GgmlType, ggml_type, quantize, tensor_nbytes

Chunk = bytes | bytearray | memoryview | np.ndarray


@dataclass(frozen=True)
class _Declared:
    name: str
    ne: tuple[int, ...]
    type: GgmlType
    offset: int  # relative to the start of the data section
    nbytes: int


def _infer_type(value: Any) -> GgufValueType:
    if isinstance(value, (bool, np.bool_)):
        return GgufValueType.BOOL
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return GgufValueType.UINT32  # llama.cpp reads hparams and token ids as u32
        if -(2**31) <= v < 0:
            return GgufValueType.INT32
        return GgufValueType.INT64 if v < 0 else GgufValueType.UINT64
    if isinstance(value, (float, np.floating)):
        return GgufValueType.FLOAT32
    if isinstance(value, str):
        return GgufValueType.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return GgufValueType.ARRAY
    raise GgufError(f"cannot infer a GGUF type for {type(value).__name__} value {value!r}")


def _infer_elem_type(values: Any) -> GgufValueType:
    if isinstance(values, np.ndarray):
        for vt, dt in NUMPY_DTYPE.items():
            if vt != GgufValueType.BOOL and np.dtype(dt) == values.dtype.newbyteorder("<"):
                return vt
        if values.dtype == np.bool_:
            return GgufValueType.BOOL
        raise GgufError(f"no GGUF array type for numpy dtype {values.dtype}")
    if len(values) == 0:
        raise GgufError("cannot infer the element type of an empty array; pass elem_type")
    first = values[0]
    if isinstance(first, (bool, np.bool_)):
        return GgufValueType.BOOL
    if isinstance(first, (int, np.integer)):
        return GgufValueType.INT32  # llama.cpp reads integer arrays (token types) as i32
    if isinstance(first, (float, np.floating)):
        return GgufValueType.FLOAT32
    if isinstance(first, str):
        return GgufValueType.STRING
    raise GgufError(f"cannot infer a GGUF array type for {type(first).__name__} elements")


def _encode_str(s: str) -> bytes:
    b = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _encode_scalar(vtype: GgufValueType, value: Any) -> bytes:
    if vtype == GgufValueType.STRING:
        return _encode_str(value)
    try:
        return struct.pack(SCALAR_FORMAT[vtype], value)
    except (struct.error, KeyError) as e:
        raise GgufError(f"value {value!r} does not fit GGUF type {vtype.name}: {e}") from None


def _encode_array(elem_type: GgufValueType, values: Any) -> bytes:
    if elem_type == GgufValueType.ARRAY:
        raise GgufError("nested GGUF arrays are not supported")
    head = struct.pack("<IQ", elem_type, len(values))
    if elem_type == GgufValueType.STRING:
        return head + b"".join(_encode_str(v) for v in values)
    arr = np.asarray(values)
    target = np.dtype(NUMPY_DTYPE[elem_type])
    # numpy would wrap out-of-range integers silently; a wrong token id must not slip through
    if elem_type != GgufValueType.BOOL and target.kind in "iu" and arr.size and arr.dtype.kind in "iu":
        info = np.iinfo(target)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise GgufError(f"array values out of range for {elem_type.name}")
    return head + np.ascontiguousarray(arr, dtype=target).tobytes()


class GgufWriter:
    """Write a GGUF file: ``add_*`` metadata, ``add_tensor_info`` each tensor, ``write_header()``,
    then ``write_tensor_data`` for each tensor in declaration order, then ``finish()``.

    Use as a context manager so an exception removes the temporary file.
    """

    def __init__(self, path: str | os.PathLike[str], alignment: int = GGUF_DEFAULT_ALIGNMENT) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise GgufError(f"alignment {alignment} is not a power of two")
        self.path = Path(path)
        self.alignment = alignment
        self._kv: dict[str, bytes] = {}
        self._tensors: list[_Declared] = []
        self._names: set[str] = set()
        self._data_size = 0
        self._fh: BinaryIO | None = None
        self._tmp: Path | None = None
        self._next = 0  # index of the tensor whose data comes next
        self._written_in_tensor = 0
        self._finished = False
        self.bytes_written = 0
        self.add_uint32(ALIGNMENT_KEY, alignment)

    # --- metadata ---------------------------------------------------------------------------

    def add(self, key: str, value: Any, vtype: GgufValueType | None = None,
            elem_type: GgufValueType | None = None) -> None:
        """Add one key; the GGUF type is inferred unless given (ints -> UINT32, int lists -> INT32)."""
        if self._fh is not None:
            raise GgufError(f"cannot add key {key!r}: the header was already written")
        if not key:
            raise GgufError("GGUF keys must not be empty")
        if key in self._kv and key != ALIGNMENT_KEY:
            raise GgufError(f"duplicate GGUF key {key!r}")
        vtype = GgufValueType(vtype) if vtype is not None else _infer_type(value)
        if vtype == GgufValueType.ARRAY:
            et = GgufValueType(elem_type) if elem_type is not None else _infer_elem_type(value)
            payload = _encode_array(et, value)
        else:
            payload = _encode_scalar(vtype, value)
        if key == ALIGNMENT_KEY and (vtype != GgufValueType.UINT32 or value != self.alignment):
            raise GgufError(f"{ALIGNMENT_KEY} must be the UINT32 passed as GgufWriter(alignment=...)")
        self._kv[key] = _encode_str(key) + struct.pack("<I", vtype) + payload

    def add_uint32(self, key: str, value: int) -> None:
        self.add(key, value, GgufValueType.UINT32)

    def add_int32(self, key: str, value: int) -> None:
        self.add(key, value, GgufValueType.INT32)

    def add_uint64(self, key: str, value: int) -> None:
        self.add(key, value, GgufValueType.UINT64)

    def add_float32(self, key: str, value: float) -> None:
        self.add(key, value, GgufValueType.FLOAT32)

    def add_bool(self, key: str, value: bool) -> None:
        self.add(key, value, GgufValueType.BOOL)

    def add_string(self, key: str, value: str) -> None:
        self.add(key, value, GgufValueType.STRING)

    def add_array(self, key: str, values: Any, elem_type: GgufValueType | None = None) -> None:
        self.add(key, values, GgufValueType.ARRAY, elem_type)

    # --- tensors ----------------------------------------------------------------------------

    def add_tensor_info(self, name: str, ne: Iterable[int], type: GgmlType | int | str) -> None:
        """Declare a tensor: ``ne`` is the ggml shape, fastest-varying dimension first."""
        if self._fh is not None:
            raise GgufError(f"cannot declare tensor {name!r}: the header was already written")
        ne_t = tuple(int(d) for d in ne)
        t = ggml_type(type)
        if name in self._names:
            raise GgufError(f"duplicate tensor name {name!r}")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise GgufError(f"tensor name {name!r} is {len(name.encode())} bytes; ggml allows < {GGML_MAX_NAME}")
        if not 1 <= len(ne_t) <= GGML_MAX_DIMS or any(d < 0 for d in ne_t):
            raise GgufError(f"tensor {name!r} has invalid shape {ne_t}")
        nbytes = tensor_nbytes(t, ne_t)
        self._tensors.append(_Declared(name, ne_t, t, self._data_size, nbytes))
        self._names.add(name)
        self._data_size += align(nbytes, self.alignment)

    @property
    def total_bytes(self) -> int:
        """Size the finished file will have (known once every tensor is declared)."""
        return align(len(self._header_bytes()), self.alignment) + self._data_size

    def _header_bytes(self) -> bytes:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(self._kv))]
        parts.extend(self._kv.values())
        for t in self._tensors:
            parts.append(_encode_str(t.name))
            parts.append(struct.pack(f"<I{len(t.ne)}QIQ", len(t.ne), *t.ne, t.type, t.offset))
        return b"".join(parts)

    def write_header(self) -> None:
        if self._fh is not None:
            raise GgufError("write_header() was already called")
        header = self._header_bytes()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self._fh = open(self._tmp, "wb")
        self._fh.write(header)
        self._fh.write(b"\0" * (align(len(header), self.alignment) - len(header)))
        self.bytes_written = align(len(header), self.alignment)

    def write_tensor_data(self, name: str, data: Chunk | Iterable[Chunk]) -> None:
        """Write one tensor's data, whole or as an iterable of consecutive chunks.

        Float arrays are converted to the declared type (quantized if need be); uint8/int8
        arrays and bytes-likes are taken as raw tensor bytes.
        """
        if self._fh is None:
            raise GgufError("call write_header() before write_tensor_data()")
        if self._next >= len(self._tensors):
            raise GgufError(f"tensor {name!r}: every declared tensor has already been written")
        decl = self._tensors[self._next]
        if name != decl.name:
            raise GgufError(f"tensor data must come in declaration order: expected {decl.name!r}, got {name!r}")
        chunks = [data] if isinstance(data, (bytes, bytearray, memoryview, np.ndarray)) else data
        written = 0
        for chunk in chunks:
            raw = self._raw(decl, chunk)
            if written + len(raw) > decl.nbytes:
                raise GgufError(f"tensor {name!r}: got more than its {decl.nbytes} bytes")
            self._fh.write(raw)
            written += len(raw)
        if written != decl.nbytes:
            raise GgufError(f"tensor {name!r}: got {written} bytes, its shape {decl.ne} and type {decl.type.name} need {decl.nbytes}")
        pad = align(decl.nbytes, self.alignment) - decl.nbytes
        self._fh.write(b"\0" * pad)
        self.bytes_written += decl.nbytes + pad
        self._next += 1

    @staticmethod
    def _raw(decl: _Declared, chunk: Chunk) -> memoryview:
        if isinstance(chunk, np.ndarray):
            if chunk.dtype.kind == "f":
                chunk = quantize(chunk, decl.type)
            elif chunk.dtype not in (np.uint8, np.int8):
                raise GgufError(f"tensor {decl.name!r}: pass float arrays or raw uint8 bytes, not {chunk.dtype}")
            return memoryview(np.ascontiguousarray(chunk)).cast("B")
        return memoryview(chunk).cast("B")

    def finish(self) -> Path:
        """Check every tensor was written, flush, and move the file to its final name."""
        if self._finished:
            return self.path
        if self._fh is None:
            self.write_header()
        assert self._fh is not None and self._tmp is not None
        if self._next != len(self._tensors):
            missing = self._tensors[self._next].name
            raise GgufError(f"{self.path}: tensor {missing!r} and {len(self._tensors) - self._next - 1} more were declared but not written")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.path)
        self._finished = True
        return self.path

    def abort(self) -> None:
        """Drop the temporary file (called on errors by the context manager)."""
        if self._fh is not None and not self._fh.closed:
            self._fh.close()
        if self._tmp is not None and not self._finished:
            try:
                self._tmp.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> GgufWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
            _name_write_error(exc, self.path)
            return
        try:
            self.finish()
        except BaseException as e:
            self.abort()
            _name_write_error(e, self.path)
            raise


def _name_write_error(exc: object, path: Path) -> None:
    """A write's OSError names no file ("No space left on device"): raised again naming the model's path."""
    if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
