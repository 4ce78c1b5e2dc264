"""Model and context parameters as dataclasses, validated in Python and turned into llama.cpp's structs."""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Literal

from ._native.ffi import ffi
from .cache_params import MoeCacheMode, cache_setting, check_mib, mib_to_bytes, to_native as cache_to_native  # noqa: F401
from .cache_params import check as check_cache_setting, settings as cache_settings
from .errors import ParameterError

# llama.cpp's own patterns (common/common.h, LLM_FFN_EXPS_REGEX): the expert tensors of every MoE architecture.
EXPERTS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
MiB = 2**20
LLAMA_MAX_SEQ = 256  # llama.cpp's src/llama-cparams.h


def check_whole(name: str, value: Any, low: int, high: int, what: str = "") -> int:
    """``value`` as an int from ``low`` to ``high`` (the range of the C field it goes to, or less), or a
    ParameterError that names the field. A bool is no number here (True would pass as 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        raise ParameterError(f"{name} must be {what or 'a whole number'} from {low} to {high}, got {value!r}")
    return int(value)


def check_real(name: str, value: Any, low: float, high: float = math.inf, *, low_open: bool = False) -> float:
    """``value`` as a finite float in [low, high] (or (low, high] with ``low_open``), or a ParameterError."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
          and (low < value if low_open else low <= value) and value <= high)
    if not ok:
        interval = (f"{'>' if low_open else '>='} {low:g}" if high == math.inf else
                    f"in {'(' if low_open else '['}{low:g}, {high:g}]")
        raise ParameterError(f"{name} must be a finite number {interval}, got {value!r}")
    return float(value)


def check_sampling(sampling: Any) -> None:
    """Sampling's fields: the floats and int32_t/uint32_t the sampler chain's constructors take."""
    check_real("temperature", sampling.temperature, 0)
    check_real("top_p", sampling.top_p, 0, 1, low_open=True)
    check_whole("top_k", sampling.top_k, 0, INT32_MAX, "a whole number (0: off)")
    check_whole("seed", sampling.seed, 0, UINT32_MAX)


def check_flags(obj: Any, names: tuple[str, ...], none_ok: tuple[str, ...] = ()) -> None:
    """Each of ``names`` is True or False (or None, for those in ``none_ok``): a C bool takes nothing else."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, bool) and not (value is None and name in none_ok):
            allowed = "True, False or None" if name in none_ok else "True or False"
            raise ParameterError(f"{name} must be {allowed}, got {value!r}")


LLAMA_MAX_DEVICES = 16  # llama_max_devices(): the length of llama_model_params.tensor_split


def check_tensor_split(shares: Any) -> tuple[float, ...]:
    """``tensor_split`` as llama.cpp takes it: up to 16 finite shares >= 0, not all zero (an empty tuple is the
    default split); ParameterError otherwise."""
    if isinstance(shares, (str, bytes)) or not isinstance(shares, (tuple, list)):
        raise ParameterError(f"tensor_split must be a tuple of numbers (each device's share of the layers), got {shares!r}")
    if len(shares) > LLAMA_MAX_DEVICES:
        raise ParameterError(f"tensor_split: llama.cpp takes at most {LLAMA_MAX_DEVICES} devices' shares, got {len(shares)}")
    for x in shares:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) or x < 0:
            raise ParameterError(f"tensor_split: each share must be a finite number >= 0, got {x!r}")
    if shares and not any(shares):
        raise ParameterError("tensor_split: every share is 0 (leave it empty for llama.cpp's split by free memory)")
    return tuple(float(x) for x in shares)


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
    # ggml rpc-servers ("host:port") whose devices take layers, first, as llama.cpp's --rpc puts them; the
    # machine's own GPUs follow (llama_moe.rpc)
    rpc: tuple[str, ...] = ()
    # llama.cpp's --tensor-split: each device's share of the layers, in the order of the model's devices (the
    # rpc servers' first); () splits them by the devices' free memory, as llama.cpp does
    tensor_split: tuple[float, ...] = ()
    # the MoE experts mapped from the file untouched and kept on the CPU (llama.cpp's --lazy-mode experts): the load
    # reads none of them, and the RAM tier (ContextParams.moe_ram_mib) reads them on demand
    lazy_experts: bool = False

    def validate(self) -> None:
        """Raises ParameterError naming the field for any value llama.cpp's struct cannot take or would misread."""
        # int32_t n_gpu_layers: -1 (or any negative, to llama.cpp) is every layer; -1 is the one spelling taken here
        check_whole("n_gpu_layers", self.n_gpu_layers, -1, INT32_MAX, "a whole number of layers (-1: all)")
        # n_cpu_moe becomes one tensor pattern per layer: no model has 65536 layers (a profile's u16 cannot count them)
        check_whole("n_cpu_moe", self.n_cpu_moe, 0, 65535, "a whole number of layers")
        check_whole("main_gpu", self.main_gpu, 0, INT32_MAX, "a device index")
        check_flags(self, ("cpu_moe", "use_mmap", "check_tensors", "repack", "lazy_experts"))
        patterns = self.cpu_tensor_patterns
        if isinstance(patterns, (str, bytes)) or not isinstance(patterns, (tuple, list)):
            raise ParameterError(f"cpu_tensor_patterns must be a tuple of regex strings, got {patterns!r}")
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern or "\0" in pattern:
                raise ParameterError(f"cpu_tensor_patterns: each pattern must be a non-empty string without NUL, "
                                     f"got {pattern!r}")
        if isinstance(self.rpc, (str, bytes)) or not isinstance(self.rpc, (tuple, list)):
            raise ParameterError(f"rpc must be a tuple of 'host:port' strings, got {self.rpc!r}")
        from .rpc import parse_endpoint

        endpoints = [parse_endpoint(e) for e in self.rpc]
        if len(set(endpoints)) != len(endpoints):
            raise ParameterError(f"rpc names a server twice: {list(self.rpc)!r}")
        check_tensor_split(self.tensor_split)
        if self.cpu_moe and self.n_cpu_moe:
            raise ParameterError("cpu_moe already keeps every layer's experts in RAM; n_cpu_moe would contradict it")

    def override_patterns(self, n_layer: int | None = None) -> list[str]:
        """The tensor patterns placed in RAM, in the order llama.cpp's common library would add them; with the
        model's ``n_layer``, none for the layers it does not have (they would match no tensor)."""
        patterns = list(self.cpu_tensor_patterns)
        if self.cpu_moe:
            patterns.append(EXPERTS_REGEX)
        n_cpu_moe = int(self.n_cpu_moe) if n_layer is None else min(int(self.n_cpu_moe), max(n_layer, 0))
        patterns += [rf"blk\.{i}{EXPERTS_REGEX}" for i in range(n_cpu_moe)]
        return patterns

    def _to_native(self, lib: Any, n_layer: int | None = None) -> tuple[Any, list[Any]]:
        """The struct, and the cdata that must outlive the load (strings and the override array)."""
        self.validate()
        p = lib.llama_model_default_params()
        p.n_gpu_layers = int(self.n_gpu_layers)
        p.main_gpu = int(self.main_gpu)
        p.check_tensors = self.check_tensors
        p.use_extra_bufts = self.repack
        p.load_mode = lib.LLAMA_LOAD_MODE_MMAP if self.use_mmap else lib.LLAMA_LOAD_MODE_NONE
        if self.lazy_experts:
            p.lazy_mode = lib.LLAMA_LAZY_MODE_EXPERTS
        keep: list[Any] = []
        patterns = self.override_patterns(n_layer)
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
        if self.rpc:
            from .rpc import rpc_devices

            # llama.cpp's default order with --rpc: the servers' devices, then the machine's own GPUs
            devs = rpc_devices(lib, tuple(self.rpc))
            for i in range(lib.ggml_backend_dev_count()):
                dev = lib.ggml_backend_dev_get(i)
                if int(lib.ggml_backend_dev_type(dev)) in (lib.GGML_BACKEND_DEVICE_TYPE_GPU, lib.GGML_BACKEND_DEVICE_TYPE_IGPU):
                    devs.append(dev)
            arr = ffi.new("ggml_backend_dev_t[]", devs + [ffi.NULL])
            keep.append(arr)
            p.devices = arr
        if self.tensor_split:
            n_dev = len(devs) if self.rpc else sum(
                int(lib.ggml_backend_dev_type(lib.ggml_backend_dev_get(i))) in (lib.GGML_BACKEND_DEVICE_TYPE_GPU, lib.GGML_BACKEND_DEVICE_TYPE_IGPU)
                for i in range(lib.ggml_backend_dev_count()))
            if len(self.tensor_split) > n_dev:
                raise ParameterError(f"tensor_split gives {len(self.tensor_split)} shares, but the model has {n_dev} device(s) "
                                     f"to split its layers across: llama.cpp would ignore the rest")
            # llama.cpp reads one share per device of the model's, from an array of llama_max_devices()
            shares = ffi.new("float[]", [float(x) for x in self.tensor_split] + [0.0] * (LLAMA_MAX_DEVICES - len(self.tensor_split)))
            keep.append(shares)
            p.tensor_split = shares
        return p, keep


@dataclass
class ContextParams:
    """How a context runs. ``None`` for a thread count means one thread per core.

    The ``moe_cache_*`` fields are the MoE expert cache's settings, one for each field of the engine's
    ``llama_moe_cache_params`` (llama_moe.cache_params): ``None`` leaves the engine's default. Python checks
    their types and ranges; what cannot apply with the others the engine refuses, with a ``MoeCacheWarning``
    that says why, and ``Context.cache_status()`` keeps every reason."""

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    flash_attn: bool | None = None  # None: llama.cpp decides
    offload_kqv: bool = True
    op_offload: bool = True
    no_perf: bool = False
    # the MoE expert cache: size in MiB (0 = off; "auto": what the device has free once the model, the KV cache and
    # the compute buffers are in, less moe_cache_margin_mib), a profile to fill it from, and its modes
    moe_cache_mib: float | Literal["auto"] = 0
    moe_cache_profile: str | os.PathLike[str] | None = cache_setting("path")
    moe_cache_hybrid: bool = cache_setting("flag", default=False)
    moe_cache_adaptive: bool = cache_setting("flag", default=False)
    # the hybrid uploads at most this many of each layer's missed experts between two decodes (0 = none; "auto":
    # as many as the engine measures its copies to fit in half a decode, up to 4)
    moe_cache_admit: int | Literal["auto"] = cache_setting("admit", 0, 9999, "a whole number of experts (0: no admission)", default=0)
    # with admission: every this many decodes the engine moves slots between layers, to where the miss curves it
    # observes gain most (0 = never: each layer keeps the slots it was sized with)
    moe_cache_repartition: int = cache_setting("whole", 0, 999999, "a whole number of decodes (0: never)", default=0)
    # with the hybrid: a second device (by ggml's name, e.g. "CUDA1", "RPC1") that holds experts the cache lacks and
    # computes them: the profile's next ranked after the cache's, and with admission the ones the cache evicts
    # (None: no peer tier)
    moe_cache_peer: str | None = cache_setting("name")
    # the device that holds the whole cache (e.g. "CUDA1"; "CPU": in RAM, which speeds nothing up but runs every
    # lookup, upload and counter); None: the GPUs of the model's layers
    moe_cache_device: str | None = cache_setting("name")
    # prompts copy the experts the cache holds from it rather than from RAM (False: as without a cache, for comparing)
    moe_cache_copy: bool | None = cache_setting("flag")
    # admission's uploads in the background on a stream of their own (True) or between decodes (False); None: in
    # the background on a GPU, between decodes with the cache in RAM
    moe_cache_admit_async: bool | None = cache_setting("tristate")
    # the hybrid's mailbox (one-token decoding hands each layer over between the GPU and the CPU; CUDA). None: on,
    # unless LLAMA_MOE_CACHE_NO_MAILBOX=1 (the engine's default)
    moe_cache_mailbox: bool | None = cache_setting("flag")
    # with moe_cache_device="CPU": the mailbox runs with the CPU as the device (its protocol, not its CUDA kernels)
    moe_cache_mailbox_on_cpu: bool | None = cache_setting("flag")
    # the mailbox's send writes the device's input rows, its recv adds the CPU's (False: unfused, for measuring)
    moe_cache_mailbox_fuse: bool | None = cache_setting("flag")
    # CPU threads for the mailbox's part of a layer (0 or None: the context's threads minus one)
    moe_cache_mailbox_threads: int | None = cache_setting("whole", 0, 1024, "a whole number of threads (0: auto)")
    # how long the GPU waits for the CPU's part of a layer before the decode fails (None: 10000 ms)
    moe_cache_mailbox_timeout_ms: int | None = cache_setting("whole", 1, 3600 * 1000, "a whole number of milliseconds")
    # bytes of expert rows each of the mailbox's threads prefetches ahead of its products (None: 4096; 0: none)
    moe_cache_mailbox_prefetch: int | None = cache_setting("whole", 0, 1 << 30, "a whole number of bytes")
    # of a layer's misses in one token, the share the GPU reads from the page-locked host copy itself (None: 0)
    moe_cache_mailbox_gpu_share: float | None = cache_setting("share", 0, 1, "a share")
    # sequences decoded together (generate_batch); each has n_ctx // n_seq_max positions of its own
    n_seq_max: int = 1
    # the cache's mode in one word (llama.cpp's --moe-cache-mode): "auto" (the hybrid admitting its misses with the
    # engine's budget, the fastest measured; on a link too slow for uploads the profile's hybrid, or no cache),
    # "upload", "hybrid", "adaptive" or "admit"; None: the flags above decide (upload mode without them), and
    # moe_cache_mib="auto" without them is "auto"
    moe_cache_mode: MoeCacheMode | None = cache_setting("mode")
    # with moe_cache_mib="auto" (the device's free memory once the model, the KV cache and the compute buffers are
    # in): the MiB left free beside the cache (None: the engine's 400)
    moe_cache_margin_mib: int | None = cache_setting("whole", 0, 1 << 20, "a whole number of MiB")
    # the RAM tier (llama.cpp's --moe-ram-mib): slots in locked RAM for the experts kept on the CPU, filled from the
    # model's file by direct reads, an LRU per layer, for a model whose experts do not fit in RAM (0 = none; "auto":
    # what the machine can spare). Without a device cache (moe_cache_mib 0): the tier is then the cache. Load the
    # model with ModelParams(lazy_experts=True), or the load reads every expert through the page cache once
    moe_ram_mib: float | Literal["auto"] = 0

    @property
    def moe_cache_on(self) -> bool:
        """Whether a cache is asked for: a size above 0 MiB, or "auto"."""
        mib = self.moe_cache_mib
        return mib == "auto" or (isinstance(mib, numbers.Real) and not isinstance(mib, bool) and mib > 0)

    def validate(self) -> None:
        """Raises ParameterError naming the field for any value llama.cpp's struct cannot take or would misread
        (uint32_t sizes, int32_t thread counts, C bools, each cache setting's type and range)."""
        check_whole("n_ctx", self.n_ctx, 0, 1 << 24, "a whole number (0: the model's own context size)")
        check_whole("n_batch", self.n_batch, 1, 1 << 24)
        check_whole("n_ubatch", self.n_ubatch, 1, 1 << 24)
        if self.n_ubatch > self.n_batch:
            raise ParameterError(f"n_ubatch ({self.n_ubatch}) cannot exceed n_batch ({self.n_batch})")
        check_whole("n_seq_max", self.n_seq_max, 1, LLAMA_MAX_SEQ, "a whole number of sequences")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                                      or not 1 <= value <= 1024):
                raise ParameterError(f"{name} must be from 1 to 1024 or None, got {value!r}")
        check_flags(self, ("flash_attn", "offload_kqv", "op_offload", "no_perf"), none_ok=("flash_attn",))
        check_mib(self.moe_cache_mib)
        check_mib(self.moe_ram_mib, "moe_ram_mib")
        for name, spec in cache_settings(self):
            check_cache_setting(name, spec, getattr(self, name))

    def _to_native(self, lib: Any) -> tuple[Any, list[Any]]:
        self.validate()
        p = lib.llama_context_default_params()
        p.n_ctx = int(self.n_ctx)
        p.n_batch = int(self.n_batch)
        p.n_ubatch = int(self.n_ubatch)
        p.n_seq_max = int(self.n_seq_max)
        threads = int(self.n_threads or default_threads())
        p.n_threads = threads
        p.n_threads_batch = int(self.n_threads_batch or threads)
        p.flash_attn_type = {None: lib.LLAMA_FLASH_ATTN_TYPE_AUTO, True: lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                             False: lib.LLAMA_FLASH_ATTN_TYPE_DISABLED}[self.flash_attn]
        p.offload_kqv = self.offload_kqv
        p.op_offload = self.op_offload
        p.no_perf = self.no_perf
        keep: list[Any] = []
        cache_to_native(self, p.moe_cache, keep)
        return p, keep
