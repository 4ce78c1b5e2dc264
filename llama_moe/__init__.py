"""llama_moe: run Mixture-of-Experts models whose experts live in RAM, with a VRAM expert cache.

``import llama_moe`` never loads the native library; the first Model does (see ``llama_moe._loader``).
"""
from __future__ import annotations

import logging

from .context import GREEDY, Completion, Context, Perf, Sampling
from .errors import (AbiMismatchError, BuildError, ClosedError, GgufError, LlamaMoeError, ModelLoadError,
                     MoeCacheWarning, NativeCallError, NativeLibraryError, ProfileError)
from .model import MoeGeometry, Model
from .params import ContextParams, ModelParams, ParameterError

__version__ = "0.1.0"

logging.getLogger("llama_moe").addHandler(logging.NullHandler())


def native_version() -> dict:
    """What the loaded native library is: its path, ABI version and build manifest."""
    from . import _loader

    lib = _loader.get_lib()
    return {"path": str(_loader.library_path()), "abi_version": int(lib.llama_moe_abi_version()),
            "system_info": _ffi_string(lib.llama_print_system_info()), **_loader.manifest()}


def _ffi_string(ptr: object) -> str:
    from ._ffi import ffi

    return ffi.string(ptr).decode("utf-8", "replace")


__all__ = [
    "AbiMismatchError", "BuildError", "ClosedError", "Completion", "Context", "ContextParams", "GREEDY",
    "GgufError", "LlamaMoeError", "Model", "ModelLoadError", "ModelParams", "MoeCacheWarning", "MoeGeometry",
    "NativeCallError", "NativeLibraryError", "ParameterError", "Perf", "ProfileError", "Sampling", "native_version",
]
