"""The cffi declarations (ABI mode): decl/*.h, concatenated in the order their types depend on."""
from __future__ import annotations

from pathlib import Path

import cffi

ABI_VERSION = 10  # the LLAMA_MOE_ABI_VERSION these declarations describe

_DECL_ORDER = ("ggml.h", "llama.h", "llama_moe.h", "llama_moe_common.h")  # order matters: later files use earlier types


def _declarations() -> str:
    here = Path(__file__).resolve().parent / "decl"
    return "\n".join((here / name).read_text() for name in _DECL_ORDER)


ffi = cffi.FFI()
ffi.cdef(_declarations())


def enum_names(ctype: str, prefix: str) -> dict[int, str]:
    """An enum of the declarations (the headers' own), value -> name without ``prefix``, in lower case."""
    return {v: k.removeprefix(prefix).lower() for k, v in ffi.typeof(ctype).relements.items()}
