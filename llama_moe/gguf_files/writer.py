"""GGUF writing: gguf-py's GGUFWriter, with tensor data streamed in chunks and the file renamed into place.

gguf-py writes the header (keys, their types, the tensor table) and the padding. What it lacks, added here:

- streaming: its ``write_tensor_data`` takes a whole tensor; a layer's experts of a large model are hundreds
  of MB, so ``write_tensor_data`` here takes an iterable of chunks (one expert each) in declaration order;
- a file that is whole or absent: it is written under a temporary name next to the target and renamed only
  when every declared tensor has been written, so a crash never leaves a half-written model;
- refusals instead of warnings: a duplicate key (gguf-py overwrites it with a warning), a tensor name ggml
  would reject, data of the wrong size or out of order; each a GgufError naming the file.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from llama_moe.errors import GgufError
from llama_moe.gguf_files.quants import GgmlType, ggml_type, quantize, tensor_nbytes
from llama_moe.gguf_files.reader import GGML_MAX_DIMS, GGML_MAX_NAME, align

Chunk = bytes | bytearray | memoryview | np.ndarray


class GgufWriter(gguf.GGUFWriter):
    """``GgufWriter(path, arch)``; the ``add_*`` methods of gguf-py for metadata, ``declare_tensor`` for
    each tensor, ``write_header()``, then ``write_tensor_data`` for each tensor in declaration order.

    Use as a context manager: it finishes the file, or on an exception removes the temporary one.
    """

    def __init__(self, path: str | os.PathLike[str], arch: str) -> None:
        self.final_path = Path(path)
        self._tmp = self.final_path.with_name(f".{self.final_path.name}.tmp-{os.getpid()}")
        self._declared: list[tuple[str, GgmlType, int]] = []
        self._next = 0  # index of the tensor whose data comes next
        self._finished = False
        self.bytes_written = 0
        self.total_bytes = 0  # known once the header is written
        super().__init__(self._tmp, arch)

    # --- metadata: gguf-py's add_* methods, refusing a duplicate --------------------------------

    def add_key_value(self, key: str, val: Any, vtype: gguf.GGUFValueType,
                      sub_type: gguf.GGUFValueType | None = None) -> None:
        if self.state is not gguf.WriterState.NO_FILE:
            raise GgufError(f"{self.final_path}: cannot add key {key!r}: the header was already written")
        if not key:
            raise GgufError(f"{self.final_path}: GGUF keys must not be empty")
        if any(key in kv for kv in self.kv_data):
            raise GgufError(f"{self.final_path}: duplicate GGUF key {key!r}")
        super().add_key_value(key, val, vtype, sub_type)

    def add_string(self, key: str, val: str) -> None:
        # gguf-py leaves an empty string out without a word; GGUF holds it
        self.add_key_value(key, val, gguf.GGUFValueType.STRING)

    def add_typed_array(self, key: str, values: Sequence[Any], elem_type: gguf.GGUFValueType) -> None:
        """An array of one element type given (gguf-py infers INT32 for ints, and takes no numpy scalars)."""
        self.add_key_value(key, [v.item() if isinstance(v, np.generic) else v for v in values],
                           gguf.GGUFValueType.ARRAY, elem_type)

    # --- tensors ----------------------------------------------------------------------------

    def declare_tensor(self, name: str, ne: Iterable[int], type: GgmlType | int | str) -> None:
        """Declare a tensor: ``ne`` is the ggml shape, fastest-varying dimension first."""
        if self.state is not gguf.WriterState.NO_FILE:
            raise GgufError(f"{self.final_path}: cannot declare tensor {name!r}: the header was already written")
        ne_t = tuple(int(d) for d in ne)
        t = ggml_type(type)
        if any(name == d[0] for d in self._declared):
            raise GgufError(f"{self.final_path}: duplicate tensor name {name!r}")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise GgufError(f"tensor name {name!r} is {len(name.encode())} bytes; ggml allows < {GGML_MAX_NAME}")
        if not 1 <= len(ne_t) <= GGML_MAX_DIMS or any(d < 0 for d in ne_t):
            raise GgufError(f"tensor {name!r} has invalid shape {ne_t}")
        nbytes = tensor_nbytes(t, ne_t)
        try:
            raw_dtype = gguf.GGMLQuantizationType(int(t))
        except ValueError:
            raise GgufError(f"{self.final_path}: tensor {name!r}: gguf-py cannot write type {t.name}") from None
        # gguf-py takes numpy's order (slowest dimension first), the element type as raw_dtype
        super().add_tensor_info(name, ne_t[::-1], np.dtype(np.float32), nbytes, raw_dtype=raw_dtype)
        self._declared.append((name, t, nbytes))

    def write_header(self) -> None:
        """The header, the key-value pairs and the tensor table (gguf-py's), padded to the data section."""
        if self.state is not gguf.WriterState.NO_FILE:
            raise GgufError(f"{self.final_path}: write_header() was already called")
        self.final_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.write_header_to_file()
            self.write_kv_data_to_file()
            self.write_ti_data_to_file()
        except (struct.error, ValueError, OverflowError) as e:
            raise GgufError(f"{self.final_path}: cannot write the header: {e}") from None
        assert self.fout is not None
        fout = self.fout[0]
        self.write_padding(fout, fout.tell())
        self.bytes_written = fout.tell()
        self.total_bytes = self.bytes_written + sum(align(n, self.data_alignment) for _, _, n in self._declared)

    def write_tensor_data(self, name: str, data: Chunk | Iterable[Chunk]) -> None:  # type: ignore[override]
        """Write one tensor's data, whole or as an iterable of consecutive chunks.

        Float arrays are converted to the declared type (quantized if need be); uint8/int8
        arrays and bytes-likes are taken as raw tensor bytes.
        """
        if self.state not in (gguf.WriterState.TI_DATA, gguf.WriterState.WEIGHTS) or self.fout is None:
            raise GgufError(f"{self.final_path}: call write_header() before write_tensor_data()")
        if self._next >= len(self._declared):
            raise GgufError(f"tensor {name!r}: every declared tensor has already been written")
        decl_name, t, nbytes = self._declared[self._next]
        if name != decl_name:
            raise GgufError(f"tensor data must come in declaration order: expected {decl_name!r}, got {name!r}")
        fout = self.fout[0]
        chunks = [data] if isinstance(data, (bytes, bytearray, memoryview, np.ndarray)) else data
        written = 0
        for chunk in chunks:
            raw = _raw(name, t, chunk)
            if written + len(raw) > nbytes:
                raise GgufError(f"tensor {name!r}: got more than its {nbytes} bytes")
            fout.write(raw)
            written += len(raw)
        if written != nbytes:
            raise GgufError(f"tensor {name!r}: got {written} bytes, its type {t.name} and shape need {nbytes}")
        self.write_padding(fout, nbytes)
        self.bytes_written += align(nbytes, self.data_alignment)
        self._next += 1
        self.state = gguf.WriterState.WEIGHTS

    def finish(self) -> Path:
        """Check every tensor was written, flush, and move the file to its final name."""
        if self._finished:
            return self.final_path
        if self.state is gguf.WriterState.NO_FILE:
            self.write_header()
        if self._next != len(self._declared):
            missing = self._declared[self._next][0]
            raise GgufError(f"{self.final_path}: tensor {missing!r} and {len(self._declared) - self._next - 1} more "
                            "were declared but not written")
        assert self.fout is not None
        for fout in self.fout:
            fout.flush()
            os.fsync(fout.fileno())
        self.close()
        os.replace(self._tmp, self.final_path)
        self._finished = True
        return self.final_path

    def abort(self) -> None:
        """Drop the temporary file (called on errors by the context manager)."""
        for fout in self.fout or []:
            if not fout.closed:
                fout.close()
        if not self._finished:
            try:
                self._tmp.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> GgufWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
            _name_write_error(exc, self.final_path)
            return
        try:
            self.finish()
        except BaseException as e:
            self.abort()
            _name_write_error(e, self.final_path)
            raise


def _raw(name: str, t: GgmlType, chunk: Chunk) -> memoryview:
    if isinstance(chunk, np.ndarray):
        if chunk.dtype.kind == "f":
            chunk = quantize(chunk, t)
        elif chunk.dtype not in (np.uint8, np.int8):
            raise GgufError(f"tensor {name!r}: pass float arrays or raw uint8 bytes, not {chunk.dtype}")
        return memoryview(np.ascontiguousarray(chunk)).cast("B")
    return memoryview(chunk).cast("B")


def _name_write_error(exc: object, path: Path) -> None:
    """A write's OSError names no file ("No space left on device"): raised again naming the model's path."""
    if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None
