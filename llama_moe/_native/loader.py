"""Finding and loading the patched libllama, and refusing a build whose ABI is not the one declared."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from .. import paths
from .ffi import ABI_VERSION, ffi
from ..errors import AbiMismatchError, NativeLibraryError

log = logging.getLogger(__name__)

LIB_ENV = "LLAMA_MOE_LIB"
LIB_NAME = "libllama.so"

_lock = threading.Lock()
_lib: Any = None
_lib_path: Path | None = None


def _changed_input(inputs: dict[str, str]) -> str | None:
    """The first file of the patch series that is not what the build was made from, or None."""
    root = paths.patches_dir()
    for rel, digest in inputs.items():
        path = root / rel
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return rel
    return None


def _recorded() -> tuple[list[Path], list[str]]:
    """The libraries the build recorded for this package (``paths.library_manifest()``), CUDA before CPU, and why
    any recorded one is passed over."""
    manifest = paths.library_manifest()
    if not manifest.is_file():
        return [], []
    try:
        entries = json.loads(manifest.read_text())
        found, skipped = [], []
        for variant in ("cuda", "cpu"):
            entry = entries.get(variant)
            if entry is None:
                continue
            lib = Path(entry["library"])
            changed = _changed_input(entry["inputs"])
            if changed is None:
                found.append(lib)
            else:
                skipped.append(f"{lib}: built from other patches ({paths.patches_dir() / changed} changed since)")
        return found, skipped
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return [], [f"{manifest}: unreadable ({exc!r})"]


def candidate_paths() -> list[Path]:
    """Where the library is looked for, in order: $LLAMA_MOE_LIB, else the builds recorded in the build's manifest
    (``library.json`` in ``llama_moe/_native/``) whose patches are this package's, CUDA before CPU. Never a system
    libllama: its ABI is not ours."""
    env = os.environ.get(LIB_ENV)
    if env:
        p = Path(env).expanduser()
        return [p / LIB_NAME if p.is_dir() else p]
    return _recorded()[0]


def _check_abi(lib: Any, path: Path) -> None:
    try:
        abi = lib.llama_moe_abi_version()
        ctx_size = lib.llama_moe_context_params_size()
        model_size = lib.llama_moe_model_params_size()
    except AttributeError as exc:
        raise AbiMismatchError(f"{path} is not a llama_moe build (it lacks {exc}); build one with "
                               f"'python -m llama_moe build' or point {LIB_ENV} at one") from None
    problems = []
    if abi != ABI_VERSION:
        problems.append(f"ABI version {abi}, but this llama_moe was written for {ABI_VERSION}")
    if ctx_size != ffi.sizeof("struct llama_context_params"):
        problems.append(f"sizeof(llama_context_params) is {ctx_size}, declared {ffi.sizeof('struct llama_context_params')}")
    if model_size != ffi.sizeof("struct llama_model_params"):
        problems.append(f"sizeof(llama_model_params) is {model_size}, declared {ffi.sizeof('struct llama_model_params')}")
    try:
        status_size = lib.llama_moe_cache_status_size()
    except AttributeError:  # a library older than the call: its ABI version already says so
        status_size = ffi.sizeof("struct llama_moe_cache_status")
    if status_size != ffi.sizeof("struct llama_moe_cache_status"):
        problems.append(f"sizeof(llama_moe_cache_status) is {status_size}, declared {ffi.sizeof('struct llama_moe_cache_status')}")
    if problems:
        raise AbiMismatchError(f"{path}: " + "; ".join(problems) +
                               ". Rebuild it with 'python -m llama_moe build' (the library and the package must match)")


def load_library(path: Path) -> Any:
    """dlopens one library file and checks its ABI; used by get_lib and by tests."""
    if not path.is_file():
        raise NativeLibraryError(f"{path}: no such file")
    from .elf import links_libstdcxx_statically

    if links_libstdcxx_statically(path):
        raise NativeLibraryError(
            f"{path} carries its own copy of libstdc++ (its compiler links it statically); in a Python process, "
            f"which already uses the shared libstdc++ through numpy, the two copies mix and crash. Rebuild it with a "
            f"compiler that links libstdc++ dynamically, e.g. CC=gcc CXX=g++ CUDAHOSTCXX=g++ python -m llama_moe build --force")
    try:
        lib = ffi.dlopen(str(path))
    except OSError as exc:
        raise NativeLibraryError(f"{path}: cannot be loaded: {exc}") from exc
    _check_abi(lib, path)
    return lib


def get_lib() -> Any:
    """The loaded library, loaded on first use (so that ``import llama_moe`` works without a build)."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried = candidate_paths()
        for path in tried:
            if path.is_file():
                lib = load_library(path)
                from .log import install_log_callback

                install_log_callback(lib)
                lib.llama_backend_init()
                _lib, _lib_path = lib, path
                log.debug("loaded %s", path)
                return lib
        where = "\n  ".join([*(str(p) for p in tried), *([] if os.environ.get(LIB_ENV) else _recorded()[1])])
        if not where:
            where = f"(nothing: {paths.library_manifest()}, which the build writes, does not exist)"
        raise NativeLibraryError(
            f"the patched libllama was not found. Looked in:\n  {where}\n"
            f"Build it with 'python -m llama_moe build' (or 'python build_native.py'), or set {LIB_ENV} to a libllama.so "
            f"built from these patches.")


def library_path() -> Path | None:
    return _lib_path


BIN_ENV = "LLAMA_BIN"


def llama_binary(name: str) -> Path:
    """The llama.cpp program ``name`` (llama-server, llama-bench, ggml-rpc-server, ...) the tools run: in the folder
    ``$LLAMA_BIN`` names when it is set, else the one built next to the loaded libllama. A set ``$LLAMA_BIN`` that is
    not a folder, or lacks the program, is an error that names the variable and the path: never a silent fallback
    to another build."""
    env = os.environ.get(BIN_ENV)
    if env:
        folder = Path(env).expanduser()
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise NativeLibraryError(f"{BIN_ENV}={env}: {folder} {what}; set {BIN_ENV} to the folder of the llama.cpp "
                                     f"programs built from these patches, or unset it to use those next to the library")
        binary = folder / name
        if not binary.is_file() or not os.access(binary, os.X_OK):
            what = "not an executable file" if binary.exists() else "missing"
            raise NativeLibraryError(f"{BIN_ENV}={env}: {binary} is {what}; {BIN_ENV} must name a folder with {name} "
                                     f"(a build of these patches: python -m llama_moe build, without --lib-only)")
        return binary
    get_lib()
    assert _lib_path is not None
    binary = _lib_path.parent / name
    if not binary.is_file():
        raise NativeLibraryError(f"{binary} is missing: build the programs (python -m llama_moe build, without "
                                 f"--lib-only), or set {BIN_ENV} to a folder that has {name}")
    return binary


def manifest() -> dict:
    """The manifest.json beside the loaded library, or {} when there is none (a library from $LLAMA_MOE_LIB)."""
    if _lib_path is None:
        get_lib()
    assert _lib_path is not None
    path = _lib_path.parent / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}
