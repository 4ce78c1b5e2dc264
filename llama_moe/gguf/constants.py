"""GGUF file-format constants (see ggml/include/gguf.h and ggml/src/gguf.cpp)."""
from __future__ import annotations

from enum import IntEnum

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # a tensor name must be shorter than this (terminating NUL included in ggml)
ALIGNMENT_KEY = "general.alignment"


class GgufValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format and size of each fixed-size scalar type (little-endian)
SCALAR_FORMAT: dict[GgufValueType, str] = {
    GgufValueType.UINT8: "<B",
    GgufValueType.INT8: "<b",
    GgufValueType.UINT16: "<H",
    GgufValueType.INT16: "<h",
    GgufValueType.UINT32: "<I",
    GgufValueType.INT32: "<i",
    GgufValueType.FLOAT32: "<f",
    GgufValueType.BOOL: "<?",
    GgufValueType.UINT64: "<Q",
    GgufValueType.INT64: "<q",
    GgufValueType.FLOAT64: "<d",
}

# numpy dtype of each fixed-size scalar type, for reading/writing arrays in one go
NUMPY_DTYPE: dict[GgufValueType, str] = {
    GgufValueType.UINT8: "<u1",
    GgufValueType.INT8: "<i1",
    GgufValueType.UINT16: "<u2",
    GgufValueType.INT16: "<i2",
    GgufValueType.UINT32: "<u4",
    GgufValueType.INT32: "<i4",
    GgufValueType.FLOAT32: "<f4",
    GgufValueType.BOOL: "<u1",
    GgufValueType.UINT64: "<u8",
    GgufValueType.INT64: "<i8",
    GgufValueType.FLOAT64: "<f8",
}


def align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment
