"""ggml tensor types and their (de)quantizers: gguf-py's, plus what it lacks.

The type ids, block sizes and quantizers come from gguf-py (``gguf.constants``, ``gguf.quants``), whose
Q8_0, Q4_0, MXFP4, BF16 and F16 conversions are ggml's reference (``*_ref``) ones bit for bit (checked
against libggml-base in the tests). Kept here: the type Q2_0, which the base's ggml has and the published
gguf-py of the same version does not (the reader must size every tensor a model may hold), and
``random_quantized``, which writes random codes and scales directly (gguf-py only quantizes floats, ~50x
slower for multi-GB expert tensors).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as _gq

from llama_moe.errors import GgufError

# ggml_type (ggml/include/ggml.h at llama.cpp 0c1e57098): gguf-py's enum and Q2_0, which only the base has
_MISSING = {"Q2_0": (42, (64, 18))}
GgmlType = IntEnum("GgmlType", {**{t.name: t.value for t in GGMLQuantizationType},
                                **{name: v for name, (v, _) in _MISSING.items()}})


@dataclass(frozen=True)
class TypeInfo:
    """How many elements one block holds and how many bytes it takes."""

    block_size: int
    type_size: int


# Every type a GGUF file may hold, so the reader can size tensors of any real model file.
TYPE_INFO: dict[GgmlType, TypeInfo] = {
    **{GgmlType[t.name]: TypeInfo(*GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES},
    **{GgmlType[name]: TypeInfo(*sizes) for name, (_, sizes) in _MISSING.items()},
}

QK = 32  # block size of Q4_0, Q8_0 and MXFP4
KVALUES_MXFP4 = np.array(_gq.MXFP4.kvalues, dtype=np.int8)  # E2M1 values, doubled (ggml's kvalues_mxfp4)
# the types quantize/dequantize take: gguf-py's bit-exact ones the synthesizer and the tests use
QUANTIZABLE = (GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.MXFP4)


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


def _gguf_type(t: GgmlType | int | str, what: str) -> GGMLQuantizationType:
    t = ggml_type(t)
    if t not in QUANTIZABLE:
        raise GgufError(f"{what} {t.name} is not supported (only {', '.join(q.name for q in QUANTIZABLE)})")
    return GGMLQuantizationType(int(t))


def quantize(x: np.ndarray, t: GgmlType | int | str) -> np.ndarray:
    """Float array -> the raw bytes (flat uint8 array) of a ggml tensor of type ``t``; row = last axis."""
    gt = _gguf_type(t, "quantizing to")
    x = np.ascontiguousarray(x, dtype=np.float32)
    info = type_info(t)
    if x.ndim == 0 or x.shape[-1] % info.block_size:
        raise GgufError(f"row length {x.shape[-1] if x.ndim else 0} is not a multiple of {info.block_size}")
    rows = x.reshape(-1, x.shape[-1])
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # zero blocks, huge magnitudes
        out = _gq.quantize(rows, gt)
    return np.ascontiguousarray(out).reshape(-1).view(np.uint8)


def dequantize(data: np.ndarray | bytes, t: GgmlType | int | str) -> np.ndarray:
    """Raw tensor bytes of type ``t`` -> flat float32 array."""
    gt = _gguf_type(t, "dequantizing")
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
        else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    info = type_info(t)
    if raw.size % info.type_size:
        raise GgufError(f"{raw.size} bytes are not whole {ggml_type(t).name} blocks of {info.type_size} bytes")
    if info.block_size > 1:
        raw = raw.reshape(-1, info.type_size)
    return np.asarray(_gq.dequantize(raw, gt), dtype=np.float32).reshape(-1)


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
    out[:, 1:] = _random_bytes(rng, nb * QK // 2).reshape(nb, QK // 2)
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
