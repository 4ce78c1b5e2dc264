"""llama_moe: run Mixture-of-Experts models whose experts live in RAM, with a VRAM expert cache.

``import llama_moe`` never loads the native library; the first Model does (see ``llama_moe._native.loader``).
"""
from __future__ import annotations

import logging

from .batch import BatchResult, BatchStream
from .chat import ChatMessage, ChatResult, ChatStream
from .compat import Llama
from .context import GREEDY, Completion, Context, Perf, Sampling
from .errors import (AbiMismatchError, AuditError, BuildError, ChatTemplateError, ClosedError, GgufError, LlamaMoeError,
                     ModelLoadError, MoeCacheWarning, NativeCallError, NativeLibraryError, ParameterError, ProfileError,
                     RpcServerError, SessionError, TraceError)
from .model import MoeGeometry, Model
from .params import ContextParams, ModelParams
from .session import SessionInfo
from .stats import CacheDevice, HitRate, LayerStats, MoeCacheStats, MoeCacheStatus, SeqStats
from .structured import json_schema_to_grammar
from .formats.trace import RoutingRecord

__version__ = "0.1.0"

logging.getLogger("llama_moe").addHandler(logging.NullHandler())


def native_version() -> dict:
    """What the loaded native library is: its path, ABI version and build manifest."""
    from ._native import loader as _loader

    lib = _loader.get_lib()
    return {"path": str(_loader.library_path()), "abi_version": int(lib.llama_moe_abi_version()),
            "system_info": _ffi_string(lib.llama_print_system_info()), **_loader.manifest()}


def _ffi_string(ptr: object) -> str:
    from ._native.ffi import ffi

    return ffi.string(ptr).decode("utf-8", "replace")


__all__ = [
    # the API: a model, a context over it, and their parameters
    "Context", "ContextParams", "GREEDY", "Model", "ModelParams", "Sampling", "native_version",
    # structured output (llama_moe.structured), and a llama-cpp-python-shaped front (llama_moe.compat)
    "Llama", "json_schema_to_grammar",
    # what its methods return
    "BatchResult", "BatchStream", "CacheDevice", "ChatMessage", "ChatResult", "ChatStream", "Completion", "HitRate", "LayerStats",
    "MoeCacheStats", "MoeCacheStatus", "MoeGeometry", "Perf", "RoutingRecord", "SeqStats", "SessionInfo",
    # every error and warning the binding raises (llama_moe.errors; the tools' own: llama_moe.tools.errors)
    "AbiMismatchError", "AuditError", "BuildError", "ChatTemplateError", "ClosedError", "GgufError", "LlamaMoeError",
    "ModelLoadError", "MoeCacheWarning", "NativeCallError", "NativeLibraryError", "ParameterError", "ProfileError",
    "RpcServerError", "SessionError", "TraceError",
]
