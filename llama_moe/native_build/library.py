"""The manifest the loader finds the library by: for each variant built (cuda, cpu), the library's path, the
build's patch hash and ABI version, and the sha256 of every file of the patch series it was built from, so that
the loader can tell a build of other patches without hashing the series the build's way."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from .. import paths
from ..errors import BuildError
from ..formats.atomic import write_text
from .patches import PatchSeries

log = logging.getLogger(__name__)

LIB_NAME = "libllama.so"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_library(install: Path, variant: str, series: PatchSeries, build_manifest: dict) -> Path:
    """Writes (or updates) the variant's entry of ``paths.library_manifest()``; returns the manifest's path."""
    path = paths.library_manifest()
    try:
        entries = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        entries = {}  # a damaged manifest is rewritten, not trusted
    entries[variant] = {
        "library": str((install / LIB_NAME).absolute()),
        "patch_hash": build_manifest.get("patch_hash"),
        "abi_version": build_manifest.get("abi_version"),
        "inputs": {rel: _sha256(series.root / rel) for rel in series.inputs()},
    }
    try:
        write_text(path, json.dumps(entries, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise BuildError(f"the build is installed in {install}, but its manifest {path} cannot be written ({exc}): "
                         f"the loader finds the library by it; set LLAMA_MOE_LIB={install / LIB_NAME} instead") from exc
    log.info("library manifest: %s (%s)", path, variant)
    return path
