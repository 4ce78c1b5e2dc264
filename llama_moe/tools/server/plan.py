"""Serving a MoE model with llama-server, the cache sized to the GPU's free memory (``python -m llama_moe serve``).

The plan: everything but the experts on the GPU (-ngl 999), the experts in RAM (--cpu-moe), and as much of
them cached as fits next to the dense weights, the KV cache of the requested context, the compute buffers
and a margin. By default llama-server measures that size itself when it makes its context
(``--moe-cache-mib auto``), and the cache runs the fastest mode measured (``--moe-cache-mode auto``: the hybrid
admitting its misses); the plan's own figures are an estimate, to refuse at once what cannot fit.
"""
from __future__ import annotations

import ipaddress
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ServePlanError
from ..experts import expert_layout
from ...gguf_files.reader import read_gguf

MiB = 2**20
# llama-server reads its key from this variable (its --api-key's environment name): a key on a command line is
# visible to every user of the machine in ps
API_KEY_ENV = "LLAMA_API_KEY"


@dataclass(frozen=True)
class ServePlan:
    gpu: str | None
    gpu_free_mib: float | None
    dense_mib: float           # non-expert weights, on the GPU
    experts_mib: float         # all experts, in RAM
    kv_mib: float              # K and V for n_ctx tokens, f16
    compute_mib: float         # an estimate of llama.cpp's compute buffers for the ubatch
    margin_mib: float
    cache_mib: float           # what the MoE cache gets
    cache_pct: float           # of the experts
    n_ubatch: int
    command: tuple[str, ...]
    cache_where: str = ""          # where the cache is, or why there is none ("off: ...")
    notes: tuple[str, ...] = ()    # what the plan did not do as asked, and why
    api_key_env: bool = False      # the key goes to llama-server in $LLAMA_API_KEY (never in the command)
    warnings: tuple[str, ...] = ()  # what the server will do that its user may not want (listening without a key)
    cache_auto: bool = False       # llama-server measures the size at load (--moe-cache-mib auto); cache_mib estimates it
    mode: str = ""                 # --moe-cache-mode, "flags" when the cache's flags decide, "" without a cache

    @property
    def cache_on(self) -> bool:
        return (self.cache_mib > 0 or self.cache_auto) and not self.cache_where.startswith("off")

    def describe(self) -> str:
        size = f"{self.cache_mib:.0f}" if self.cache_mib >= 100 else f"{self.cache_mib:.3g}"  # 1.5 MiB, not 2
        if self.cache_auto:
            estimate = (f", about {size} MiB now ({self.cache_pct:.0f}% of them)" if self.cache_mib > 0 else "")
            cache = (f"MoE cache auto: what the device has free once llama-server has loaded the model, the KV cache and "
                     f"the compute buffers, less the margin, measured at load{estimate}, {self.cache_where}")
        elif self.cache_on:
            cache = f"MoE cache {size} MiB ({self.cache_pct:.0f}% of them), {self.cache_where}"
        else:
            cache = f"MoE cache {self.cache_where}"
        lines = [f"GPU          {self.gpu or 'none'}" + (f", {self.gpu_free_mib:.0f} MiB free" if self.gpu_free_mib is not None else ""),
                 f"dense        {self.dense_mib:9.0f} MiB on the GPU",
                 f"KV cache     {self.kv_mib:9.0f} MiB",
                 f"compute      {self.compute_mib:9.0f} MiB (ubatch {self.n_ubatch})",
                 f"margin       {self.margin_mib:9.0f} MiB",
                 f"experts      {self.experts_mib:9.0f} MiB in RAM; {cache}"]
        if self.cache_on and self.mode:
            lines.append(f"mode         {MODE_WORDS.get(self.mode, self.mode)}")
        lines += [f"note         {n}" for n in self.notes]
        lines += [f"warning      {w}" for w in self.warnings]
        env = f"{API_KEY_ENV}=(the key, hidden) " if self.api_key_env else ""
        lines.append("command      " + env + " ".join(shlex.quote(c) for c in self.command))
        return "\n".join(lines)


# what each --moe-cache-mode does, as the plan says it
MODE_WORDS = {
    "auto": "auto: the hybrid admitting its misses, the fastest mode measured (docs/benchmarks.md); llama-server leaves "
            "admission out (the profile's hybrid, or no cache without one) where it measures the link too slow for uploads",
    "upload": "upload: every miss uploaded",
    "hybrid": "hybrid: the CPU computes the misses; the profile's experts stay",
    "adaptive": "adaptive: the hybrid, swapping the hottest experts in while generating",
    "admit": "admit: the hybrid admitting its misses between decodes",
    "flags": "from the cache's flags (--hybrid, or those after --)",
}
MODES = ("auto", "upload", "hybrid", "adaptive", "admit")
# the flags that choose the mode without a word: after "--", they decide it instead of --moe-cache-mode
_MODE_FLAGS = ("--moe-cache-hybrid", "--moe-cache-adaptive", "--moe-cache-admit")


def _passed_value(extra: tuple[str, ...], flag: str) -> str | None:
    """The value of ``flag`` given after "--" (llama-server takes the last one), or None."""
    value = None
    for i, a in enumerate(extra):
        if a == flag:
            if i + 1 >= len(extra):
                raise ServePlanError(f"-- {flag} needs a value")
            value = extra[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _passed_cache_mib(extra: tuple[str, ...]) -> float | str | None:
    """The --moe-cache-mib given after "--" (llama-server takes the last one): MiB, "auto", or None."""
    value = _passed_value(extra, "--moe-cache-mib")
    if value is None or value == "auto":
        return value
    try:
        mib = float(value)
    except ValueError:
        raise ServePlanError(f"-- --moe-cache-mib {value}: not a number of MiB") from None
    if not math.isfinite(mib) or mib < 0:
        raise ServePlanError(f"-- --moe-cache-mib {value}: must be a finite number >= 0")
    return mib


def _passed_cache_device(extra: tuple[str, ...]) -> str | None:
    """The --moe-cache-device given after "--" (llama-server takes the last one), or None."""
    value = None
    for i, a in enumerate(extra):
        if a == "--moe-cache-device":
            if i + 1 >= len(extra):
                raise ServePlanError("-- --moe-cache-device needs a device's name")
            value = extra[i + 1]
        elif a.startswith("--moe-cache-device="):
            value = a.split("=", 1)[1]
    return value


def _cache_device_note(device: str | None) -> str:
    """Where llama-server puts the cache when a device is named (--moe-cache-device): "" when none is."""
    if device and device.upper() == "CPU":
        return "in RAM (--moe-cache-device CPU: it checks the cache, it makes nothing faster)"
    if device:
        return f"on {device} (--moe-cache-device)"
    return ""


def is_loopback(host: str) -> bool:
    """Whether llama-server's --host reaches this machine alone: a loopback address (127.0.0.0/8, ::1), localhost,
    or a UNIX socket (a path ending in .sock). Any other name or address (0.0.0.0 listens on every interface)
    is reachable from the network."""
    if host.lower() == "localhost" or host.endswith(".sock"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, port: int, api_key: str | None) -> str:
    """A warning when the server listens beyond this machine without a key ("" otherwise)."""
    if api_key or is_loopback(host):
        return ""
    return (f"--host {host} listens beyond this machine and no API key is set: anyone who reaches port {port} can use "
            f"the server; set {API_KEY_ENV} (or --api-key), or listen on 127.0.0.1")


def _kv_mib(path: Path, n_ctx: int) -> float:
    g = read_gguf(path)
    arch = g.architecture or ""
    n_layer = int(g.get(f"{arch}.block_count", 0))
    n_head = int(g.get(f"{arch}.attention.head_count", 1) or 1)
    n_head_kv = int(g.get(f"{arch}.attention.head_count_kv", n_head) or n_head)
    n_embd = int(g.get(f"{arch}.embedding_length", 0))
    k = int(g.get(f"{arch}.attention.key_length", n_embd // max(n_head, 1)))
    v = int(g.get(f"{arch}.attention.value_length", k))
    return n_layer * n_ctx * n_head_kv * (k + v) * 2 / MiB


def plan_serve(model: Path, server: Path, *, gpu_free_mib: float | None, gpu_name: str | None, n_ctx: int = 32768,
               parallel: int = 1, favor: str = "generation", ubatch: int | None = None, cache_mib: float | None = None,
               min_cache_mib: float = 1500, margin_mib: float = 400, profile: str | None = None, hybrid: bool = False,
               api_key: str | None = None, alias: str | None = None, host: str = "127.0.0.1", port: int = 8080,
               threads: int | None = None, cache_device: str | None = None, extra: tuple[str, ...] = (),
               mode: str | None = None, cache_auto: bool | None = None) -> ServePlan:
    """The plan. ``cache_mib`` None, with ``cache_auto`` None, is the default: on a GPU (or the device
    ``cache_device`` names) llama-server sizes the cache itself (``--moe-cache-mib auto``), which the plan
    estimates; ``cache_auto=True`` asks for that outright. ``mode`` None is --moe-cache-mode auto, unless --hybrid
    or the cache's flags after "--" choose the mode."""
    if n_ctx < 256 or parallel < 1:
        raise ServePlanError(f"--ctx must be >= 256 and --parallel >= 1, got {n_ctx} and {parallel}")
    if n_ctx > 1 << 24 or parallel > 1024:
        raise ServePlanError(f"--ctx must be at most {1 << 24} and --parallel at most 1024, got {n_ctx} and {parallel}")
    for flag, value in (("--cache-mib", cache_mib), ("--min-cache-mib", min_cache_mib), ("--margin-mib", margin_mib)):
        if value is not None and not value >= 0:  # also NaN
            raise ServePlanError(f"{flag} must be >= 0, got {value:g}")
        if value is not None and not value <= 1 << 24:  # also infinity
            raise ServePlanError(f"{flag} must be at most {1 << 24} (16 TiB), got {value:g}")
    if cache_mib == 0:
        raise ServePlanError("--cache-mib 0 turns the cache off: serve the model with llama-server directly, or leave "
                             "--cache-mib out to fit the cache to the GPU")
    if cache_auto and cache_mib is not None:
        raise ServePlanError(f"--cache-mib auto and --cache-mib {cache_mib:g} conflict: give one")
    if margin_mib is not None and margin_mib != int(margin_mib):
        raise ServePlanError(f"--margin-mib must be a whole number of MiB, got {margin_mib:g}")
    if mode is not None and mode not in MODES:
        raise ServePlanError(f"--mode {mode}: not a mode: {', '.join(MODES)}")
    if hybrid and mode not in (None, "hybrid"):
        raise ServePlanError(f"--hybrid and --mode {mode} conflict: --hybrid is --mode hybrid")
    passed_mode = _passed_value(extra, "--moe-cache-mode")
    if passed_mode is not None and (mode is not None or hybrid):
        raise ServePlanError(f"-- --moe-cache-mode {passed_mode} and {'--mode ' + mode if mode else '--hybrid'} conflict: "
                             f"give one")
    mode_flags = [f for f in _MODE_FLAGS if any(a == f or a.startswith(f + "=") for a in extra)]
    if mode is not None and mode_flags:
        raise ServePlanError(f"--mode {mode} and -- {' '.join(mode_flags)} conflict: give the mode in one word or by the flags")
    # the mode the command asks for: the word, or the flags (--hybrid, those after --), else auto
    chosen = passed_mode or mode or ("flags" if hybrid or mode_flags else "auto")
    if ubatch is not None and not 1 <= ubatch <= 1 << 16:
        raise ServePlanError(f"--ubatch must be from 1 to {1 << 16} or auto, got {ubatch}")
    if threads is not None and threads < 1:
        raise ServePlanError(f"--threads must be >= 1 or auto, got {threads}")
    if threads is not None and threads > 1024:
        raise ServePlanError(f"--threads must be at most 1024 or auto, got {threads}")
    if not 0 < port < 65536:
        raise ServePlanError(f"--port must be from 1 to 65535, got {port}")
    if profile and not Path(profile).is_file():
        raise ServePlanError(f"--profile {profile}: no such file")
    layout = expert_layout(model)
    if not layout.layers:
        raise ServePlanError(f"{model}: has no expert tensors; it is not a MoE model, serve it with llama-server directly")
    experts = layout.total_expert_bytes / MiB
    dense = (model.stat().st_size - layout.total_expert_bytes) / MiB
    kv = _kv_mib(model, n_ctx)
    # bigger ubatches process prompts faster and need bigger compute buffers
    n_ubatch = ubatch or (2048 if favor == "prompt" else 512)
    compute = 0.5 * n_ubatch + 300  # llama.cpp's compute buffers grow about linearly with the ubatch
    passed_mib = _passed_cache_mib(extra)
    auto = cache_mib is None  # llama-server sizes the cache (--moe-cache-mib auto), the default
    if (cache_auto and isinstance(passed_mib, float)) or (passed_mib == "auto" and cache_mib is not None):
        raise ServePlanError(f"--cache-mib {'auto' if auto else f'{cache_mib:g}'} and -- --moe-cache-mib "
                             f"{passed_mib if isinstance(passed_mib, str) else f'{passed_mib:g}'} conflict: give one")
    notes: list[str] = []
    if cache_device is not None and (not cache_device or "\0" in cache_device):
        raise ServePlanError(f"--cache-device must name a device (llama-server --list-devices), or CPU; got {cache_device!r}")
    device = _cache_device_note(_passed_cache_device(extra) or cache_device)
    where = device or (f"on {gpu_name}" if gpu_name else "")
    if gpu_free_mib is None:
        cache = 0.0
        if (cache_mib or cache_auto) and not device:
            raise ServePlanError(f"--cache-mib {'auto' if auto else f'{cache_mib:g}'} needs a GPU, and none is visible (the "
                                 f"experts stay in RAM without a cache; --cache-device CPU runs the cache in RAM, "
                                 f"for testing)")
        if device and passed_mib is None:  # the cache on the device --cache-device names (CPU: in RAM)
            cache, where = (0.0 if auto else cache_mib), device
        elif device and cache_mib:
            notes.append(f"-- --moe-cache-mib {passed_mib:g} replaces --cache-mib {cache_mib:g}")
            cache, where, auto = passed_mib, device, False
        elif passed_mib is not None:
            cache, auto = (0.0, True) if passed_mib == "auto" else (passed_mib, False)
            where = (device or "off: no GPU is visible, and llama-server turns a cache without one off "
                               "(--moe-cache-device CPU runs it in RAM, for testing)")
        else:
            where = "off: no GPU is visible, so the experts are read from RAM for every token"
        where = "off: -- --moe-cache-mib 0" if passed_mib == 0 else where
    else:
        room = gpu_free_mib - dense - kv - compute - margin_mib
        if room < 0:
            raise ServePlanError(
                f"{model.name} does not fit {gpu_name}: {gpu_free_mib:.0f} MiB free, but the dense weights need {dense:.0f}, "
                f"the KV cache of {n_ctx} tokens {kv:.0f}, compute {compute:.0f} and the margin {margin_mib:.0f} MiB. "
                f"Ask for a smaller --ctx")
        cache = min(room, experts) if auto else cache_mib  # auto: the plan's estimate of what llama-server will measure
        if not auto and cache_mib > room:
            raise ServePlanError(f"--cache-mib {cache_mib:.0f} does not fit: {room:.0f} MiB are left on {gpu_name} "
                                 f"after the dense weights, the KV cache, compute and the margin")
        if cache < min_cache_mib and cache < experts:
            raise ServePlanError(f"only {cache:.0f} MiB are left for the MoE cache on {gpu_name}, less than --min-cache-mib "
                                 f"{min_cache_mib:.0f}; lower --ctx or --min-cache-mib")
        if isinstance(passed_mib, float):
            notes.append(f"-- --moe-cache-mib {passed_mib:g} replaces the " +
                         ("size llama-server would measure" if auto else f"--cache-mib {cache:g}"))
            cache, auto = passed_mib, False
            where = where if passed_mib > 0 else "off: -- --moe-cache-mib 0"
    cache_on = (cache > 0 or auto) and not where.startswith("off")
    if not cache_on:
        dropped = [f for f, on in (("--profile", profile), ("--hybrid", hybrid)) if on]
        if dropped:
            notes.append(f"{' and '.join(dropped)} not passed: they need the MoE cache, which is off")
    cmd = [str(server), "-m", str(model), "-ngl", "999", "-fit", "off", "--cpu-moe", "-c", str(n_ctx), "-np", str(parallel),
           "-ub", str(n_ubatch), "-b", str(max(n_ubatch, 2048)), "--host", host, "--port", str(port), "--metrics"]
    if cache_on:
        if passed_mib is None:  # a size asked for as it is (fractions of a MiB too), or measured by llama-server
            cmd += ["--moe-cache-mib", "auto" if auto else f"{cache_mib:g}"]
        if auto:
            cmd += ["--moe-cache-margin-mib", str(int(margin_mib))]
        if chosen in MODES and passed_mode is None:
            cmd += ["--moe-cache-mode", chosen]
        if profile:
            cmd += ["--moe-cache-profile", profile]
        if hybrid:
            cmd += ["--moe-cache-hybrid"]
        if cache_device:
            cmd += ["--moe-cache-device", cache_device]
    if threads:
        cmd += ["-t", str(threads)]
    if alias:
        cmd += ["--alias", alias]
    cmd += list(extra)
    if any(a == "--api-key" or a.startswith("--api-key=") for a in extra):
        raise ServePlanError("-- --api-key would show the key to every user in ps: set LLAMA_API_KEY (or --api-key "
                             "of serve), which reaches llama-server through its environment")
    exposed = exposure_warning(host, port, api_key)
    return ServePlan(gpu_name, gpu_free_mib, dense, experts, kv, compute, margin_mib, cache,
                     100 * cache / experts if experts else 0.0, n_ubatch, tuple(cmd), where, tuple(notes),
                     bool(api_key), (exposed,) if exposed else (), cache_on and auto, chosen if cache_on else "")


def plan_for_gpu(model: Path, **options: Any) -> ServePlan:
    """``plan_serve`` for the first GPU the library sees (none: no cache) and the llama-server built with it."""
    from ...devices import gpus
    from .process import server_binary

    server = server_binary()
    g = gpus()
    return plan_serve(model, server, gpu_free_mib=g[0].mib_free if g else None, gpu_name=g[0].name if g else None,
                      **options)
