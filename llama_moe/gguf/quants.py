"""ggml tensor types: ids and block sizes, plus numpy (de)quantizers for the few we write.

Ids and block layouts follow ggml/include/ggml.h and ggml/src/ggml-common.h at llama.cpp
commit 0c1e57098. The quantizers reproduce ggml's reference (``*_ref``) quantization bit for
bit, so a file we write is what ``llama-quantize`` would have written from the same floats.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from llama_moe.errors import GgufError


class GgmlType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


@dataclass(frozen=True)
class TypeInfo:
    """How many elements one block holds and how many bytes it takes."""

    block_size: int
    type_size: int


# Every type a GGUF file may hold, so the reader can size tensors of any real model file.
TYPE_INFO: dict[GgmlType, TypeInfo] = {
    GgmlType.F32: TypeInfo(1, 4),
    GgmlType.F16: TypeInfo(1, 2),
    GgmlType.Q4_0: TypeInfo(32, 18),
    GgmlType.Q4_1: TypeInfo(32, 20),
    GgmlType.Q5_0: TypeInfo(32, 22),
    GgmlType.Q5_1: TypeInfo(32, 24),
    GgmlType.Q8_0: TypeInfo(32, 34),
    GgmlType.Q8_1: TypeInfo(32, 36),
    GgmlType.Q2_K: TypeInfo(256, 84),
    GgmlType.Q3_K: TypeInfo(256, 110),
    GgmlType.Q4_K: TypeInfo(256, 144),
    GgmlType.Q5_K: TypeInfo(256, 176),
    GgmlType.Q6_K: TypeInfo(256, 210),
    GgmlType.Q8_K: TypeInfo(256, 292),
    GgmlType.IQ2_XXS: TypeInfo(256, 66),
    GgmlType.IQ2_XS: TypeInfo(256, 74),
    GgmlType.IQ3_XXS: TypeInfo(256, 98),
    GgmlType.IQ1_S: TypeInfo(256, 50),
    GgmlType.IQ4_NL: TypeInfo(32, 18),
    GgmlType.IQ3_S: TypeInfo(256, 110),
    GgmlType.IQ2_S: TypeInfo(256, 82),
    GgmlType.IQ4_XS: TypeInfo(256, 136),
    GgmlType.I8: TypeInfo(1, 1),
    GgmlType.I16: TypeInfo(1, 2),
    GgmlType.I32: TypeInfo(1, 4),
    GgmlType.I64: TypeInfo(1, 8),
    GgmlType.F64: TypeInfo(1, 8),
    GgmlType.IQ1_M: TypeInfo(256, 56),
    GgmlType.BF16: TypeInfo(1, 2),
    GgmlType.TQ1_0: TypeInfo(256, 54),
    GgmlType.TQ2_0: TypeInfo(256, 66),
    GgmlType.MXFP4: TypeInfo(32, 17),
    GgmlType.NVFP4: TypeInfo(64, 36),
    GgmlType.Q1_0: TypeInfo(128, 18),
    GgmlType.Q2_0: TypeInfo(64, 18),
}

QK = 32  # block size of Q4_0 and Q8_0


def ggml_type(value: GgmlType | int | str) -> GgmlType:
    """Accept a GgmlType, its id or its name ("q8_0", "Q4_0", "f16") and return the GgmlType."""
    if isinstance(value, GgmlType):
        return value
    if isinstance(value, str):
        try:
            return GgmlType[value.upper()]
        except KeyError:
            raise GgufError(f"unknown ggml type name {value!r}") from None
    try:
        return GgmlType(int(value))
    except ValueError:
        raise GgufError(f"unknown ggml type id {value}") from None


def type_info(t: GgmlType | int | str) -> TypeInfo:
    return TYPE_INFO[ggml_type(t)]


def tensor_nbytes(t: GgmlType | int | str, ne: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor of ggml shape ``ne`` (fastest-varying dimension first)."""
    info = type_info(t)
    if not ne:
        raise GgufError("a tensor needs at least one dimension")
    if ne[0] % info.block_size:
        raise GgufError(
            f"row length {ne[0]} is not a multiple of the {ggml_type(t).name} block size {info.block_size}"
        )
    n = 1
    for d in ne[1:]:
        n *= int(d)
    return n * (int(ne[0]) // info.block_size) * info.type_size


# --- F16 / BF16 -------------------------------------------------------------------------------


def to_f16(x: np.ndarray) -> np.ndarray:
    # numpy rounds to nearest even, as ggml's fp32->fp16 conversion does.
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits (uint16), round to nearest even; NaN stays a quiet NaN (as ggml does)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# --- Q8_0 / Q4_0 ------------------------------------------------------------------------------

_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (QK,))])
_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])
assert _Q8_0.itemsize == 34 and _Q4_0.itemsize == 18


def _blocks(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape[-1] % QK:
        raise GgufError(f"row length {x.shape[-1]} is not a multiple of {QK}")
    return x.reshape(-1, QK)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Quantize float rows (last axis a multiple of 32) to Q8_0 bytes, like quantize_row_q8_0_ref."""
    b = _blocks(x)
    amax = np.max(np.abs(b), axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = b * inv[:, None]
    # C roundf: halves away from zero (numpy's round is half-to-even); v - trunc(v) is exact.
    t = np.trunc(v)
    q = t + np.sign(v) * (np.abs(v - t) >= np.float32(0.5))
    out = np.empty(b.shape[0], dtype=_Q8_0)
    out["d"] = d.astype(np.float16)
    out["qs"] = q.astype(np.int8)
    return out.view(np.uint8)


def dequantize_q8_0(data: np.ndarray | bytes, n: int | None = None) -> np.ndarray:
    blocks = np.frombuffer(data, dtype=_Q8_0) if isinstance(data, (bytes, bytearray, memoryview)) else np.asarray(data).view(_Q8_0).reshape(-1)
    out = blocks["d"].astype(np.float32)[:, None] * blocks["qs"].astype(np.float32)
    return out.reshape(-1)[:n] if n is not None else out.reshape(-1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """Quantize float rows (last axis a multiple of 32) to Q4_0 bytes, like quantize_row_q4_0_ref."""
    b = _blocks(x)
    idx = np.argmax(np.abs(b), axis=1)  # first index of the largest magnitude, as the C loop keeps
    mx = b[np.arange(b.shape[0]), idx]
    d = mx / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = b * inv[:, None] + np.float32(8.5)
    # (int8_t) cast truncates toward zero; values are >= ~0.5 here, so trunc == floor.
    q = np.minimum(np.trunc(v), 15).astype(np.uint8)
    out = np.empty(b.shape[0], dtype=_Q4_0)
    out["d"] = d.astype(np.float16)
    out["qs"] = q[:, : QK // 2] | (q[:, QK // 2 :] << 4)
    return out.view(np.uint8)


def dequantize_q4_0(data: np.ndarray | bytes, n: int | None = None) -> np.ndarray:
    blocks = np.frombuffer(data, dtype=_Q4_0) if isinstance(data, (bytes, bytearray, memoryview)) else np.asarray(data).view(_Q4_0).reshape(-1)
    qs = blocks["qs"]
    q = np.concatenate([(qs & 0x0F), (qs >> 4)], axis=1).astype(np.int8) - np.int8(8)
    out = blocks["d"].astype(np.float32)[:, None] * q.astype(np.float32)
    return out.reshape(-1)[:n] if n is not None else out.reshape(-1)


# --- MXFP4 -----------------------------------------------------------------------------------
# block_mxfp4 (ggml-common.h): one E8M0 scale byte ``e``, then 16 bytes of 4-bit E2M1 codes; byte j
# holds element j in its low nibble and element j + 16 in its high nibble. A code indexes
# kvalues_mxfp4, the E2M1 values doubled, so the scale is 2^(e - 128) (GGML_E8M0_TO_FP32_HALF).

QK_MXFP4 = 32
_MXFP4 = np.dtype([("e", "u1"), ("qs", "u1", (QK_MXFP4 // 2,))])
assert _MXFP4.itemsize == 17
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
_MXFP4_CHUNK = 1 << 16  # blocks per pass of the quantizer: bounds its temporaries to a few MB


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as float32, exact for every byte (e < 2 gives the denormals ggml builds bit by bit)."""
    return np.ldexp(np.float32(1), np.asarray(e, dtype=np.int32) - 128).astype(np.float32)


def _mxfp4_exponent(amax: np.ndarray) -> np.ndarray:
    """``(uint8_t)(floorf(log2f(amax)) - 2 + 127)``, 0 where amax == 0. log2f is taken as the float32
    rounding of a float64 log2 (glibc's log2f agrees on its floor, also just below powers of two)."""
    with np.errstate(divide="ignore"):
        l2 = np.log2(amax.astype(np.float64)).astype(np.float32)
    e = np.floor(np.where(amax > 0, l2, np.float32(0))) - 2 + 127
    # the C cast is undefined outside 0..255 (|x| < 2^-125 or >= 2^129); clip instead
    return np.where(amax > 0, np.clip(e, 0, 255), 0).astype(np.uint8)


def _mxfp4_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """best_index_mxfp4 for every element: the first of the 16 codes with the least float32
    ``fabsf(kvalues_mxfp4[i] * d - x)`` (k * d is exact, so the only rounding is the subtraction)."""
    best = np.abs(np.float32(0) * d - x)
    idx = np.zeros(x.shape, dtype=np.uint8)
    for i in range(1, 16):
        err = np.abs(np.float32(KVALUES_MXFP4[i]) * d - x)
        better = err < best
        idx[better] = i
        np.minimum(best, err, out=best)
    return idx


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """Quantize float rows (last axis a multiple of 32) to MXFP4 bytes, bit for bit like
    ggml's quantize_row_mxfp4_ref (ggml/src/ggml-quants.c)."""
    b = _blocks(x)
    out = np.empty(b.shape[0], dtype=_MXFP4)
    for start in range(0, b.shape[0], _MXFP4_CHUNK):
        blk = b[start : start + _MXFP4_CHUNK]
        e = _mxfp4_exponent(np.max(np.abs(blk), axis=1))
        d = e8m0_to_fp32_half(e)[:, None]
        q = _mxfp4_codes(blk, d)
        o = out[start : start + _MXFP4_CHUNK]
        o["e"] = e
        o["qs"] = q[:, : QK_MXFP4 // 2] | (q[:, QK_MXFP4 // 2 :] << 4)
    return out.view(np.uint8)


def dequantize_mxfp4(data: np.ndarray | bytes, n: int | None = None) -> np.ndarray:
    """MXFP4 bytes -> float32, like dequantize_row_mxfp4."""
    blocks = np.frombuffer(data, dtype=_MXFP4) if isinstance(data, (bytes, bytearray, memoryview)) else np.asarray(data).view(_MXFP4).reshape(-1)
    qs = blocks["qs"]
    q = KVALUES_MXFP4[np.concatenate([(qs & 0x0F), (qs >> 4)], axis=1)]
    out = e8m0_to_fp32_half(blocks["e"])[:, None] * q.astype(np.float32)
    return out.reshape(-1)[:n] if n is not None else out.reshape(-1)


# --- generic entry points ---------------------------------------------------------------------

# type -> (float array -> raw bytes, raw bytes -> flat float32)
_CODECS = {
    GgmlType.F32:   (lambda x: np.ascontiguousarray(x, dtype="<f4").reshape(-1).view(np.uint8),
                     lambda raw: raw.view("<f4").astype(np.float32)),
    GgmlType.F16:   (lambda x: to_f16(x).reshape(-1).view(np.uint8), lambda raw: raw.view("<f2").astype(np.float32)),
    GgmlType.BF16:  (lambda x: to_bf16(x).reshape(-1).view(np.uint8), lambda raw: from_bf16(raw.view("<u2"))),
    GgmlType.Q8_0:  (quantize_q8_0, dequantize_q8_0),
    GgmlType.Q4_0:  (quantize_q4_0, dequantize_q4_0),
    GgmlType.MXFP4: (quantize_mxfp4, dequantize_mxfp4),
}
QUANTIZABLE = tuple(_CODECS)


def quantize(x: np.ndarray, t: GgmlType | int | str) -> np.ndarray:
    """Float array -> the raw bytes (uint8 array) of a ggml tensor of type ``t``; row = last axis."""
    t = ggml_type(t)
    if t not in _CODECS:
        raise GgufError(f"quantizing to {t.name} is not supported (only {', '.join(q.name for q in QUANTIZABLE)})")
    return _CODECS[t][0](x)


def dequantize(data: np.ndarray | bytes, t: GgmlType | int | str) -> np.ndarray:
    """Raw tensor bytes of type ``t`` -> flat float32 array."""
    t = ggml_type(t)
    if t not in _CODECS:
        raise GgufError(f"dequantizing {t.name} is not supported (only {', '.join(q.name for q in QUANTIZABLE)})")
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else np.asarray(data).view(np.uint8).reshape(-1)
    return _CODECS[t][1](raw)


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    # raw 64-bit draws are ~10x faster than Generator.bytes and equally deterministic
    return rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n]


# a uniformly random E2M1 code has value k * d with E[k^2] = 2 * (0+1+4+9+16+36+64+144) / 16
_MXFP4_CODE_STD = float(np.sqrt(np.mean(KVALUES_MXFP4.astype(np.float64) ** 2)))  # ~5.85


def _random_mxfp4(rng: np.random.Generator, nb: int, scale: float) -> np.ndarray:
    """Random MXFP4 blocks: uniform codes, and per block one of the two E8M0 scales around
    ``scale / 5.85``, mixed so that the mean square value is ``scale**2`` (E8M0 scales are powers of
    two, so blocks differ by a factor 2 where Q8_0/Q4_0 blocks get a spread of fp16 scales)."""
    if scale <= 0:
        raise GgufError(f"scale must be positive, got {scale}")
    target = scale / _MXFP4_CODE_STD
    lo = int(np.floor(np.log2(target)))
    # P(lo) * 4^lo + (1 - P(lo)) * 4^(lo+1) = target^2
    p_lo = (4.0 - (target / 2.0**lo) ** 2) / 3.0
    e_lo = min(max(lo + 128, 0), 254)
    out = np.empty((nb, 17), dtype=np.uint8)
    out[:, 1:] = _random_bytes(rng, nb * QK_MXFP4 // 2).reshape(nb, QK_MXFP4 // 2)
    u = _random_bytes(rng, nb)
    out[:, 0] = np.where(u < round(p_lo * 256), e_lo, e_lo + 1).astype(np.uint8)
    return out.reshape(-1)


def random_quantized(
    t: GgmlType | int | str,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    scale: float,
) -> np.ndarray:
    """Valid random tensor bytes of type ``t`` whose values have standard deviation ~``scale``.

    ``shape`` is numpy order (last axis = ggml row). Quantized types get random integer quants
    and a per-block fp16 scale drawn directly, which is ~50x faster than quantizing floats and
    is what makes multi-GB synthetic expert tensors cheap to write.
    """
    t = ggml_type(t)
    n = int(np.prod(shape))
    if t in (GgmlType.F32, GgmlType.F16, GgmlType.BF16):
        x = rng.standard_normal(n, dtype=np.float32)
        x *= np.float32(scale)
        return quantize(x, t)
    if shape[-1] % QK:
        raise GgufError(f"row length {shape[-1]} is not a multiple of {QK}")
    nb = n // QK
    if t == GgmlType.Q8_0:
        # uniform int8 in [-128, 127] has std ~73.9
        out = np.empty((nb, 34), dtype=np.uint8)
        out[:, 2:] = _random_bytes(rng, nb * QK).reshape(nb, QK)
        base = scale / 73.9
    elif t == GgmlType.Q4_0:
        # any byte is two valid nibbles; (nibble - 8) uniform in [-8, 7] has std ~4.61
        out = np.empty((nb, 18), dtype=np.uint8)
        out[:, 2:] = _random_bytes(rng, nb * QK // 2).reshape(nb, QK // 2)
        base = scale / 4.61
    elif t == GgmlType.MXFP4:
        return _random_mxfp4(rng, nb, scale)
    else:
        raise GgufError(f"random {t.name} tensors are not supported")
    # per-block scales vary +-25% like real blocks do; picking from 256 precomputed fp16
    # values avoids a slow float16 conversion of every block
    table = (base * (0.75 + 0.5 * np.linspace(0.0, 1.0, 256, dtype=np.float32))).astype(np.float16)
    d = table[_random_bytes(rng, nb)]
    out[:, :2] = d.view(np.uint8).reshape(nb, 2)
    return out.reshape(-1)
