"""Builds the patched llama.cpp: ``python build_native.py`` / ``python -m llama_moe build``.

Steps: find the pinned source, apply ``patches/``, configure with CMake, build with ninja, and install
the libraries and tools into ``<cache>/<base>-<patch hash>-<cpu|cuda>/`` with a ``manifest.json``, and record
the library in ``library.json`` in ``llama_moe/_native/`` (library.py), where the loader finds it.
"""
from __future__ import annotations

import filecmp
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..errors import BuildError
from . import cuda as cuda_probe
from .library import record_library
from .ninja import ProgressLine, run_logged
from .patches import PatchSeries, apply_series, export_dev_tree, make_dev_tree
from .source import BasePin, pristine_tree, write_bundle

log = logging.getLogger(__name__)

TOOL_TARGETS = ("llama-server", "llama-cli", "llama-bench", "llama-completion", "ggml-rpc-server")
# llama-common carries llama_moe_json_schema_to_grammar, common's JSON-schema converter behind a C entry point
LIB_TARGETS = ("llama", "llama-common")
COMMON_LIBRARY = "libllama-common.so"
TEST_TARGETS = ("test-backend-ops",)
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class BuildResult:
    install_dir: Path
    variant: str
    patch_hash: str
    rebuilt: bool
    seconds: float
    manifest: dict = field(default_factory=dict)


def install_dir_for(pin: BasePin, patch_hash: str, variant: str) -> Path:
    return paths.cache_dir() / f"{pin.commit}-{patch_hash}-{variant}"


def _sync_tree(src: Path, dest: Path) -> int:
    """Makes ``dest`` a copy of ``src`` touching only files whose bytes differ, so that ninja rebuilds
    only what a patch edit changed. Returns how many files changed."""
    changed = 0
    seen: set[str] = set()
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        seen.add(rel.as_posix())
        target = dest / rel
        if path.is_dir() and not path.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if target.is_file() and not target.is_symlink() and filecmp.cmp(path, target, shallow=False):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        # a fresh mtime, not the source's: a file back to the pristine bytes has the pristine tree's old mtime,
        # which ninja would take for older than its object and not rebuild
        shutil.copy(path, target, follow_symlinks=False)
        changed += 1
    if dest.is_dir():
        for path in sorted(dest.rglob("*"), reverse=True):
            rel = path.relative_to(dest).as_posix()
            if rel not in seen:
                path.unlink() if (path.is_file() or path.is_symlink()) else shutil.rmtree(path)
                changed += 1
    return changed


def _skip_top_level(directory: str, names: list[str]) -> set[str]:
    """The big top-level folders no build reads (vocab models, docs); src/models must stay."""
    if Path(directory).joinpath("include", "llama.h").is_file():
        return {n for n in names if n in (".git", "models", "docs", "media")}
    return set()


def _cmake_args(variant: str, cuda_archs: str | None, extra: list[str], build_id: str, tests: bool = False) -> list[str]:
    args = [
        # llama.cpp's build info (llama-server --version, the audit log's params.build) names our patches
        f"-DLLAMA_BUILD_COMMIT={build_id}", "-DLLAMA_BUILD_NUMBER=0",
        "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja', 'ninja')}", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=OFF",
        # Everything lands in build/bin; $ORIGIN lets the copied libraries and tools find each other.
        "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON", "-DCMAKE_BUILD_RPATH=$ORIGIN",
        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=ON",
        # ggml's RPC backend and rpc-server: layers on other hosts (scale-out), and on loopback in the tests
        "-DGGML_RPC=ON",
    ]
    if tests:
        # the engine's test switches (docs/configuration.md, "For tests"): environment variables that make it
        # misbehave on purpose, compiled into the tests' build only
        args.append("-DLLAMA_MOE_TEST_SWITCHES=ON")
    if shutil.which("ccache"):
        args.append("-DGGML_CCACHE=ON")
    else:
        args.append("-DGGML_CCACHE=OFF")
    if variant == "cuda":
        args += ["-DGGML_CUDA=ON", "-DGGML_CUDA_NCCL=OFF", "-DGGML_CUDA_COMPRESSION_MODE=none",
                 "-DGGML_CUDA_FA_QUANTS=f16-f16"]
        if cuda_archs:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={cuda_archs}")
    return args + extra


def _read_abi(lib_dir: Path) -> dict:
    """The ABI numbers the built library reports, read in a child process so a bad build cannot crash us."""
    code = ("import cffi,json,sys; f=cffi.FFI(); f.cdef('int llama_moe_abi_version(void); size_t llama_moe_context_params_size(void);');"
            "l=f.dlopen(sys.argv[1]); print(json.dumps({'abi_version': l.llama_moe_abi_version(),"
            "'context_params_size': l.llama_moe_context_params_size()}))")
    proc = subprocess.run([sys.executable, "-c", code, str(lib_dir / "libllama.so")], capture_output=True, text=True)
    if proc.returncode != 0:
        log.warning("could not read the ABI numbers from the new build: %s", proc.stderr.strip()[-400:])
        return {}
    return json.loads(proc.stdout)


def _tool(name: str, package: str) -> str:
    """A build tool from PATH or from this Python's own bin folder (where 'pip install ninja' puts it)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise BuildError(f"{name} was not found on PATH; install it (pip install {package}, or your system's package)")
    return found


def build(source: str | None = None, variant_choice: str = "auto", cuda_archs: str | None = None,
          tools: bool = True, tests: bool = False, jobs: int | None = None, verbose: bool = False,
          force: bool = False, cmake_extra: list[str] | None = None) -> BuildResult:
    started = time.monotonic()
    series = PatchSeries(paths.patches_dir())
    pin = BasePin.read(series.root / "BASE")
    patch_hash = series.digest()

    probe = cuda_probe.probe() if variant_choice != "cpu" else None
    if variant_choice == "cuda":
        assert probe is not None
        if probe.toolkit is None:
            raise BuildError(f"--cuda: cannot build for CUDA: {probe.describe()}. Install the CUDA toolkit or set CUDA_HOME.")
        variant = "cuda"
    elif variant_choice == "cpu":
        variant = "cpu"
        log.info("CUDA: not looked for (--cpu)")
    else:
        assert probe is not None
        variant = "cuda" if probe.toolkit is not None and probe.gpus else "cpu"
        why = "building for CUDA" if variant == "cuda" else "building for the CPU"
        if probe.toolkit is not None and not probe.gpus:
            why += " (pass --cuda to build for CUDA anyway)"
        log.info("CUDA: %s: %s", probe.describe(), why)
    if variant == "cuda" and not cuda_archs:
        assert probe is not None
        cuda_archs = ";".join(f"{a}-real" for a in probe.archs) if probe.archs else None
        if cuda_archs is None:
            log.info("CUDA: no GPU to read the architecture from; using llama.cpp's default list (slow to build). "
                     "--cuda-arch 90-real builds for one.")

    targets = list(LIB_TARGETS) + (list(TOOL_TARGETS) if tools else []) + (list(TEST_TARGETS) if tests else [])
    install = install_dir_for(pin, patch_hash, variant)
    cmake_args = _cmake_args(variant, cuda_archs, cmake_extra or [], f"{pin.commit}+llama_moe.{patch_hash}", tests)
    manifest_path = install / MANIFEST
    if manifest_path.is_file() and not force:
        old = json.loads(manifest_path.read_text())
        if old.get("cmake_args") == cmake_args and set(targets) <= set(old.get("targets", [])):
            log.info("up to date: %s (patches %s)", install, patch_hash)
            record_library(install, variant, series, old)
            return BuildResult(install, variant, patch_hash, False, time.monotonic() - started, old)

    cache = paths.cache_dir()
    pristine = pristine_tree(pin, cache, source)
    work = cache / "work" / variant
    tree, build_dir = work / "llama.cpp", work / "build"
    work.mkdir(parents=True, exist_ok=True)
    # staged in the system's temp folder: a cache folder may sit inside a git checkout, where git apply
    # would resolve the patches' paths from that checkout's root
    with tempfile.TemporaryDirectory(prefix="llama_moe-stage-") as stage_root:
        stage = Path(stage_root) / "llama.cpp"
        shutil.copytree(pristine, stage, symlinks=True, ignore=_skip_top_level)
        apply_series(series, stage)
        changed = _sync_tree(stage, tree)
    log.info("patched tree: %s (%d files changed since the last build)", tree, changed)

    log_path = cache / "build.log"
    jobs = jobs or os.cpu_count() or 2
    with open(log_path, "a") as log_file:
        log_file.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {variant} patches {patch_hash} =====\n")
        stamp = build_dir / "llama_moe_cmake_args.json"
        if not (build_dir / "build.ninja").is_file() or not stamp.is_file() or json.loads(stamp.read_text()) != cmake_args:
            build_dir.mkdir(parents=True, exist_ok=True)  # a reconfigure keeps what still holds
            log.info("configuring (CMake, %s)", variant)
            run_logged([_tool("cmake", "cmake"), "-S", str(tree), "-B", str(build_dir), *cmake_args], work, log_file, verbose)
            stamp.write_text(json.dumps(cmake_args))
        log.info("building %s with %d jobs; log: %s", " ".join(targets), jobs, log_path)
        run_logged([_tool("ninja", "ninja"), "-C", str(build_dir), f"-j{jobs}", *targets], work, log_file, verbose, ProgressLine())

    built = build_dir / "bin"
    tmp_install = Path(tempfile.mkdtemp(prefix=install.name + ".", dir=install.parent if install.parent.exists() else cache))
    for item in built.iterdir():
        if item.is_file() or item.is_symlink():
            shutil.copy2(item, tmp_install / item.name, follow_symlinks=False)
    manifest = {
        "base": pin.commit, "source_package": pin.package, "source_sha256": pin.sha256,
        "patch_hash": patch_hash, "patches": series.names, "variant": variant,
        "common_library": COMMON_LIBRARY,
        "cmake_args": cmake_args, "targets": targets,
        "cuda_version": probe.toolkit.version if (probe and probe.toolkit and variant == "cuda") else None,
        "cuda_archs": cuda_archs if variant == "cuda" else None,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    from .._native.elf import links_libstdcxx_statically

    static_cxx = links_libstdcxx_statically(tmp_install / "libllama.so")
    if static_cxx:
        log.warning("warning: %s links libstdc++ statically; llama_moe will refuse to load it into Python (it would "
                    "crash next to numpy's libstdc++). Rebuild with CC=gcc CXX=g++ CUDAHOSTCXX=g++ and --force.",
                    os.environ.get("CXX", "the C++ compiler"))
    else:
        manifest.update(_read_abi(tmp_install))
    manifest["compiler"] = os.environ.get("CXX", "default")
    (tmp_install / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if install.exists():
        shutil.rmtree(install)
    tmp_install.rename(install)
    record_library(install, variant, series, manifest)
    elapsed = time.monotonic() - started
    log.info("installed %s in %.0f s", install, elapsed)
    return BuildResult(install, variant, patch_hash, True, elapsed, manifest)


def bundle(out: Path, source: str | None = None) -> int:
    """Writes a trimmed source bundle of the pinned base for a machine without network; returns its size."""
    series = PatchSeries(paths.patches_dir())
    pin = BasePin.read(series.root / "BASE")
    return write_bundle(pristine_tree(pin, paths.cache_dir(), source), pin, out)


def dev_tree(dest: Path, source: str | None = None) -> None:
    """A git tree at ``dest`` with one commit per patch, to edit the C++ in place."""
    series = PatchSeries(paths.patches_dir())
    pin = BasePin.read(series.root / "BASE")
    make_dev_tree(series, pristine_tree(pin, paths.cache_dir(), source), dest)


def export(dev: Path) -> tuple[list[str], int, Path]:
    """Writes ``patches/`` back from a dev tree's commits: (the patches, the number of new files, the folder)."""
    series = PatchSeries(paths.patches_dir())
    names = export_dev_tree(series, dev)
    return names, len(series.new_files()), series.root
