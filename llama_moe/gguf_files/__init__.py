"""GGUF files through gguf-py (the published ``gguf`` package of the base's version): its writer, type
tables and quantizers, with what it lacks kept here: chunked, all-or-nothing writing (writer.py), a
validating header reader fast enough for every model load (reader.py), the base's Q2_0 type and random
quantized tensors (quants.py)."""
from __future__ import annotations

from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_VERSION
from gguf import GGUFValueType as GgufValueType

from llama_moe.gguf_files.quants import (
    GgmlType,
    TypeInfo,
    dequantize,
    ggml_type,
    quantize,
    random_quantized,
    tensor_nbytes,
    type_info,
)
from llama_moe.gguf_files.reader import GgufFile, GgufTensorInfo, read_gguf, read_tensor_bytes
from llama_moe.gguf_files.writer import GgufWriter

__all__ = [
    "GGUF_DEFAULT_ALIGNMENT",
    "GGUF_VERSION",
    "GgmlType",
    "GgufFile",
    "GgufTensorInfo",
    "GgufValueType",
    "GgufWriter",
    "TypeInfo",
    "dequantize",
    "ggml_type",
    "quantize",
    "random_quantized",
    "read_gguf",
    "read_tensor_bytes",
    "tensor_nbytes",
    "type_info",
]
