"""Every check of an installation (``python -m llama_moe check-all [MODEL] [--cpu-only]``), CPU then GPU, on MODEL (default: the embedded tiny model).

CPU (the cache in RAM, moe_cache_device="CPU"): the native library and its ABI; upload, hybrid and adaptive
caches decode what no cache decodes; a llama-server run through the mailbox and through the scheduler gives the
same text and audit logs that pass ``audit check``. GPU (skipped with ``--cpu-only`` or without one): the same
decoding with the cache in VRAM (hybrid with and without the mailbox), and the server run with CUDA's mailbox.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..equivalence import DEVICE_TOLERANCE, TOLERANCE, Mode, compare_mode, reference
from ...errors import LlamaMoeError, ParameterError

MAX_TOKENS = 768  # greedy tokens after a 200-character prompt in equivalence's n_ctx=1024


@dataclass(frozen=True)
class Check:
    name: str
    status: str    # PASS, FAIL or SKIP
    detail: str
    seconds: float


def _timed(name: str, fn: Callable[[], tuple[bool, str]]) -> Check:
    t0 = time.monotonic()
    try:
        ok, detail = fn()
    except (LlamaMoeError, OSError) as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return Check(name, "PASS" if ok else "FAIL", detail, time.monotonic() - t0)


def _library() -> tuple[bool, str]:
    import llama_moe

    v = llama_moe.native_version()
    return True, f"ABI {v.get('abi_version')}, {v.get('path')}"


def _decoding(model_path: Path, n: int, modes: dict[str, Mode], tolerance: float = TOLERANCE) -> tuple[bool, str]:
    from ..default_model import default_prompt
    from ..experts import expert_layout
    from ...model import Model
    from ...params import ModelParams

    half = expert_layout(model_path).total_expert_bytes / 2**20 / 2 + 1
    prompt = default_prompt()[:200]
    parts, ok = [], True
    with Model(model_path, ModelParams(cpu_moe=True, use_mmap=False, repack=False)) as model:
        ref = reference(model, prompt, n)
        for name, mode in modes.items():
            c = compare_mode(model, ref, mode, half, prompt, tolerance)
            ok &= c.ok and c.stats is not None and c.stats.n_hit + c.stats.n_miss > 0
            parts.append(f"{name}: {c.describe()}" + ("" if c.stats else " (no cache: it stayed off)"))
    return ok, f"{n} greedy tokens against no cache; " + "; ".join(parts)


def _server(model_path: Path, profile: Path, on_cpu: bool, work: Path) -> tuple[bool, str]:
    from .check_audit import check_audit_run

    r = check_audit_run(model_path, profile, cache_mib=2 if on_cpu else 256, n_predict=24, workdir=work,
                        log=lambda s: None, on_cpu=on_cpu)
    records = ", ".join(f"{'mailbox' if run.mailbox else 'scheduler'} {run.n_records} records {len(run.errors)} errors"
                        for run in r.runs)
    return r.ok, f"same text {r.same_text}, mailbox ran {r.mailbox_used}; audit logs: {records}"


def _modes(profile: Path, device: str | None) -> dict[str, Mode]:
    where = {"moe_cache_device": device}
    return {"upload": Mode(where), "hybrid": Mode({**where, "moe_cache_hybrid": True, "moe_cache_profile": profile}),
            "adaptive": Mode({**where, "moe_cache_hybrid": True, "moe_cache_adaptive": True})}


def check_all(model: str | Path | None = None, cpu_only: bool = False, n: int = 48,
              log: Callable[[str], None] = lambda s: None) -> list[Check]:
    from ..bench.corpus_profile import train_profile
    from ..default_model import default_model_path
    from ...devices import gpus

    if not 1 <= n <= MAX_TOKENS:
        raise ParameterError(f"-n must be from 1 to {MAX_TOKENS} (the decoding checks' context is 1024 tokens, "
                             f"with the prompt), got {n}")
    model_path = Path(model) if model else default_model_path()
    work = Path(tempfile.mkdtemp(prefix="check-all-"))
    checks: list[Check] = []

    def add(check: Check) -> None:
        checks.append(check)
        log(f"{check.status}  {check.name}: {check.detail} ({check.seconds:.1f} s)")

    add(_timed("the native library", _library))
    if checks[-1].status != "PASS":
        return checks
    profile = train_profile(model_path, work / "profile.strp", log=lambda s: None, n_ctx=512, stride=3)
    add(_timed("decoding, the cache in RAM", lambda: _decoding(model_path, n, _modes(profile, "CPU"))))
    add(_timed("llama-server, the mailbox on the CPU", lambda: _server(model_path, profile, True, work / "cpu")))
    if cpu_only:
        return checks
    if not gpus():
        for name in ("decoding, the cache in VRAM", "llama-server, the mailbox on the GPU"):
            add(Check(name, "SKIP", "no GPU", 0.0))
        return checks
    on_gpu = _modes(profile, None)
    on_gpu["hybrid without the mailbox"] = Mode({**on_gpu["hybrid"].cache, "moe_cache_mailbox": False})
    add(_timed("decoding, the cache in VRAM", lambda: _decoding(model_path, n, on_gpu, DEVICE_TOLERANCE)))
    add(_timed("llama-server, the mailbox on the GPU", lambda: _server(model_path, profile, False, work / "gpu")))
    return checks
