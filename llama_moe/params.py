"""Model and context parameters as dataclasses, validated in Python and turned into llama.cpp's structs."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from ._ffi import ffi
from .errors import LlamaMoeError, MoeCacheWarning

# llama.cpp's own patterns (common/common.h, LLM_FFN_EXPS_REGEX): the expert tensors of every MoE architecture.
EXPERTS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


class ParameterError(LlamaMoeError, ValueError):
    """A parameter is out of range or contradicts another."""


def default_threads() -> int:
    """Physical-ish cores: llama.cpp decodes fastest with one thread per core, not per hyperthread."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, n // 2) if n > 4 else n


@dataclass
class ModelParams:
    """How a model is loaded.

    ``cpu_moe`` keeps every layer's experts in RAM (llama.cpp's ``--cpu-moe``); ``n_cpu_moe`` the experts of
    the first N layers (``--n-cpu-moe N``); ``cpu_tensor_patterns`` adds regexes of tensors to keep in RAM (``-ot PATTERN=CPU``).
    """

    n_gpu_layers: int = -1
    cpu_moe: bool = False
    n_cpu_moe: int = 0
    cpu_tensor_patterns: tuple[str, ...] = ()
    use_mmap: bool = True
    main_gpu: int = 0
    check_tensors: bool = False
    # llama.cpp may repack CPU weights for faster kernels; the MoE cache cannot slice experts out of a
    # repacked tensor, so on a machine without a GPU host buffer it needs repack=False (--no-repack)
    repack: bool = True

    def validate(self) -> None:
        if self.n_cpu_moe < 0:
            raise ParameterError(f"n_cpu_moe must be >= 0, got {self.n_cpu_moe}")
        if self.cpu_moe and self.n_cpu_moe:
            raise ParameterError("cpu_moe already keeps every layer's experts in RAM; n_cpu_moe would contradict it")
        if self.main_gpu < 0:
            raise ParameterError(f"main_gpu must be >= 0, got {self.main_gpu}")

    def override_patterns(self) -> list[str]:
        """The tensor patterns placed in RAM, in the order llama.cpp's common library would add them."""
        patterns = list(self.cpu_tensor_patterns)
        if self.cpu_moe:
            patterns.append(EXPERTS_REGEX)
        patterns += [rf"blk\.{i}{EXPERTS_REGEX}" for i in range(self.n_cpu_moe)]
        return patterns

    def _to_native(self, lib: Any) -> tuple[Any, list[Any]]:
        """The struct, and the cdata that must outlive the load (strings and the override array)."""
        self.validate()
        p = lib.llama_model_default_params()
        p.n_gpu_layers = self.n_gpu_layers
        p.main_gpu = self.main_gpu
        p.check_tensors = self.check_tensors
        p.use_extra_bufts = self.repack
        p.load_mode = lib.LLAMA_LOAD_MODE_MMAP if self.use_mmap else lib.LLAMA_LOAD_MODE_NONE
        keep: list[Any] = []
        patterns = self.override_patterns()
        if patterns:
            overrides = ffi.new("struct llama_model_tensor_buft_override[]", len(patterns) + 1)
            cpu = lib.ggml_backend_cpu_buffer_type()
            for i, pattern in enumerate(patterns):
                s = ffi.new("char[]", pattern.encode())
                keep.append(s)
                overrides[i].pattern = s
                overrides[i].buft = cpu
            overrides[len(patterns)].pattern = ffi.NULL  # the list ends with a NULL pattern
            keep.append(overrides)
            p.tensor_buft_overrides = overrides
        return p, keep


@dataclass
class ContextParams:
    """How a context runs. ``None`` for a thread count means one thread per core."""

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    flash_attn: bool | None = None  # None: llama.cpp decides
    offload_kqv: bool = True
    op_offload: bool = True
    no_perf: bool = False
    # the MoE expert cache (patch 0002): size in MiB (0 = off), a profile to fill it from, and its modes
    moe_cache_mib: float = 0
    moe_cache_profile: str | os.PathLike[str] | None = None
    moe_cache_hybrid: bool = False
    moe_cache_adaptive: bool = False

    def validate(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0 or value > 1 << 24:
                raise ParameterError(f"{name} must be a whole number from 0 to {1 << 24}, got {value!r}")
        if self.n_batch == 0 or self.n_ubatch == 0:
            raise ParameterError("n_batch and n_ubatch must be at least 1")
        if self.n_ubatch > self.n_batch:
            raise ParameterError(f"n_ubatch ({self.n_ubatch}) cannot exceed n_batch ({self.n_batch})")
        mib = self.moe_cache_mib
        if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not 0 <= mib <= 1 << 24:
            raise ParameterError(f"moe_cache_mib must be a number of MiB from 0 to {1 << 24}, got {mib!r}")
        if self.moe_cache_adaptive and not self.moe_cache_hybrid and mib:
            # ignored, as llama.cpp's --moe-cache-adaptive without --moe-cache-hybrid is (the reference's rule)
            warnings.warn("moe_cache_adaptive is ignored without moe_cache_hybrid=True: the upload cache is an LRU, "
                          "which already follows the text", MoeCacheWarning, stacklevel=4)
        if mib == 0:
            given = [name for name in ("moe_cache_profile", "moe_cache_hybrid", "moe_cache_adaptive")
                     if getattr(self, name) not in (None, False)]
            if given:
                warnings.warn(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} nothing without moe_cache_mib: "
                              f"there is no MoE cache", MoeCacheWarning, stacklevel=4)
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1 or value > 1024):
                raise ParameterError(f"{name} must be from 1 to 1024 or None, got {value!r}")

    def _to_native(self, lib: Any) -> tuple[Any, list[Any]]:
        self.validate()
        p = lib.llama_context_default_params()
        p.n_ctx = self.n_ctx
        p.n_batch = self.n_batch
        p.n_ubatch = self.n_ubatch
        threads = self.n_threads or default_threads()
        p.n_threads = threads
        p.n_threads_batch = self.n_threads_batch or threads
        p.flash_attn_type = {None: lib.LLAMA_FLASH_ATTN_TYPE_AUTO, True: lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                             False: lib.LLAMA_FLASH_ATTN_TYPE_DISABLED}[self.flash_attn]
        p.offload_kqv = self.offload_kqv
        p.op_offload = self.op_offload
        p.no_perf = self.no_perf
        keep: list[Any] = []
        p.moe_cache_size = int(self.moe_cache_mib * 2**20)
        if self.moe_cache_profile is not None:
            profile = ffi.new("char[]", os.fsencode(self.moe_cache_profile))
            keep.append(profile)
            p.moe_cache_profile = profile
        p.moe_cache_hybrid = self.moe_cache_hybrid
        p.moe_cache_adaptive = self.moe_cache_adaptive
        return p, keep
