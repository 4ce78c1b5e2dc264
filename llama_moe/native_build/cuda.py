"""Deciding whether to build for CUDA, and saying why."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CudaToolkit:
    nvcc: Path
    version: str
    found_by: str  # which rule found it: CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda


@dataclass(frozen=True)
class CudaProbe:
    toolkit: CudaToolkit | None
    gpus: tuple[str, ...]        # "NVIDIA H200 (9.0)" per visible GPU
    archs: tuple[str, ...]       # compute capabilities of the visible GPUs, as CMake wants them ("90")

    def describe(self) -> str:
        if self.toolkit is None:
            for var in ("CUDA_HOME", "CUDA_PATH"):
                if os.environ.get(var):
                    return f"no CUDA toolkit: {var}={os.environ[var]} has no working bin/nvcc"
            return "no CUDA toolkit (looked in $CUDA_HOME, $CUDA_PATH, PATH and /usr/local/cuda)"
        tk = self.toolkit
        gpus = ", ".join(self.gpus) if self.gpus else "no NVIDIA GPU visible (nvidia-smi lists none)"
        return f"nvcc {tk.version} at {tk.nvcc} (found by {tk.found_by}); {gpus}"


def _nvcc_version(nvcc: Path) -> str | None:
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def find_toolkit() -> CudaToolkit | None:
    """The first nvcc of $CUDA_HOME, $CUDA_PATH, PATH, /usr/local/cuda. A set CUDA_HOME or CUDA_PATH is
    taken as the user's choice: when it holds no nvcc, no other place is tried."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            nvcc = Path(os.environ[var]) / "bin" / "nvcc"
            version = _nvcc_version(nvcc) if nvcc.is_file() else None
            return CudaToolkit(nvcc.resolve(), version, var) if version else None
    candidates: list[tuple[str, Path]] = []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(("PATH", Path(on_path)))
    candidates.append(("/usr/local/cuda", Path("/usr/local/cuda/bin/nvcc")))
    for found_by, nvcc in candidates:
        if nvcc.is_file():
            version = _nvcc_version(nvcc)
            if version:
                return CudaToolkit(nvcc.resolve(), version, found_by)
    return None


def visible_gpus() -> tuple[tuple[str, ...], tuple[str, ...]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return (), ()
    try:
        proc = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return (), ()
    gpus, archs = [], []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        name, _, cap = line.rpartition(",")
        if name.strip() and cap.strip():
            gpus.append(f"{name.strip()} ({cap.strip()})")
            archs.append(cap.strip().replace(".", ""))
    return tuple(gpus), tuple(sorted(set(archs)))


def probe() -> CudaProbe:
    toolkit = find_toolkit()
    gpus, archs = visible_gpus() if toolkit else ((), ())
    return CudaProbe(toolkit, gpus, archs)
