"""Where llama_moe keeps its builds, downloads and generated models."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

PACKAGE_DIR = Path(__file__).resolve().parent


def cache_dir() -> Path:
    """The root of everything llama_moe caches; ``LLAMA_MOE_CACHE_DIR`` overrides it."""
    override = os.environ.get("LLAMA_MOE_CACHE_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir("llama_moe"))


def patches_dir() -> Path:
    """The patch series: the checkout's ``patches/`` when running from one, else the copy shipped in the wheel."""
    checkout = PACKAGE_DIR.parent / "patches"
    if (checkout / "series").is_file():
        return checkout
    return PACKAGE_DIR / "_patches"


def models_dir() -> Path:
    return cache_dir() / "models"


def library_manifest() -> Path:
    """The build's record of the libraries it made from this package's patches, which the loader reads
    (``python -m llama_moe build`` writes it; it is no part of the sources)."""
    return PACKAGE_DIR / "_native" / "library.json"
