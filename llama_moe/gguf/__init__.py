"""Minimal GGUF v3 support: a validating header reader, a streaming writer, ggml quant types."""
from __future__ import annotations

from llama_moe.gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_VERSION, GgufValueType
from llama_moe.gguf.quants import (
    GgmlType,
    TypeInfo,
    dequantize,
    ggml_type,
    quantize,
    random_quantized,
    tensor_nbytes,
    type_info,
)
from llama_moe.gguf.reader import GgufFile, GgufTensorInfo, read_gguf, read_tensor_bytes
from llama_moe.gguf.writer import GgufWriter

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
