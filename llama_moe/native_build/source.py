"""Finding, fetching and verifying the pinned llama.cpp source tree, and writing trimmed bundles of it."""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..formats.atomic import atomic_writer
from ..errors import BuildError

log = logging.getLogger(__name__)

SOURCE_ENV = "LLAMA_MOE_SOURCE"
BUNDLE_MARKER = "LLAMA_MOE_BUNDLE.json"

# Parts of the tree a CPU or CUDA build of the library, the tools and test-backend-ops never reads.
# Keeping them out is what brings a bundle under 16 MiB.
_BUNDLE_EXCLUDE = (
    ".git", "models", "docs", "media", "benches", "examples", "pocs", "scripts", "conversion",
    "gguf-py", "grammars", "requirements", "skills", "ci", ".github", ".devops",
    "tools/ui/src", "tools/ui/static", "tools/ui/tests", "tools/server/tests", "tools/server/public",
    "tools/server/public_legacy", "tools/server/webui",
    "ggml/src/ggml-sycl", "ggml/src/ggml-vulkan", "ggml/src/ggml-opencl", "ggml/src/ggml-hexagon",
    "ggml/src/ggml-metal", "ggml/src/ggml-cann", "ggml/src/ggml-webgpu", "ggml/src/ggml-openvino",
    "ggml/src/ggml-et", "ggml/src/ggml-virtgpu", "ggml/src/ggml-zdnn", "ggml/src/ggml-zendnn",
    "ggml/src/ggml-musa", "ggml/src/ggml-hip",
)


@dataclass(frozen=True)
class BasePin:
    """The contents of ``patches/BASE``: which upstream tree the series applies to."""

    commit: str
    package: str
    member: str
    sha256: str

    @classmethod
    def read(cls, path: Path) -> "BasePin":
        fields: dict[str, str] = {}
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        try:
            return cls(fields["commit"], fields["package"], fields["member"], fields["sha256"])
        except KeyError as exc:
            raise BuildError(f"{path}: missing the field {exc.args[0]!r}") from None

    @property
    def sdist_name(self) -> str:
        return self.member.split("/", 1)[0] + ".tar.gz"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _looks_like_llama_cpp(tree: Path) -> bool:
    return (tree / "include" / "llama.h").is_file() and (tree / "ggml" / "CMakeLists.txt").is_file()


def _extract_member(archive: Path, member: str, dest: Path) -> None:
    """Extracts the files under ``member/`` of a tarball into ``dest`` (without the prefix)."""
    prefix = member.rstrip("/") + "/"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="extract-", dir=dest.parent))
    try:
        with tarfile.open(archive) as tar:
            members = []
            for info in tar.getmembers():
                if not info.name.startswith(prefix) or not (info.isfile() or info.isdir() or info.issym()):
                    continue
                info.name = info.name[len(prefix):]
                if info.name:
                    members.append(info)
            if not members:
                raise BuildError(f"{archive}: has no {prefix} (is it the llama-cpp-python sdist or our bundle?)")
            tar.extractall(tmp, members=members, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _bundle_base(archive: Path) -> str | None:
    """The base commit a bundle of ours was made from, or None when the tarball is no bundle."""
    try:
        with tarfile.open(archive) as tar:
            marker = tar.extractfile(f"llama.cpp/{BUNDLE_MARKER}")
            return json.load(marker)["commit"] if marker else None
    except (KeyError, tarfile.TarError, ValueError):
        return None


def download_sdist(pin: BasePin, downloads: Path) -> Path:
    """The sdist from the download cache, fetched with pip when missing; its sha256 is checked either way."""
    downloads.mkdir(parents=True, exist_ok=True)
    cached = downloads / pin.sdist_name
    if not cached.is_file():
        log.info("fetching %s with pip (once; it is cached in %s)", pin.package, downloads)
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            # only this package as source: with ":all:", pip would also build its build tools (cmake) from source
            name = pin.package.split("==", 1)[0]
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", name, pin.package, "-d", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / pin.sdist_name
            if proc.returncode != 0 or not got.is_file():
                raise BuildError(
                    f"could not download {pin.package} with pip (exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}\n"
                    f"Without network, pass --source with a llama.cpp tree or a bundle made by --bundle "
                    f"(or set {SOURCE_ENV}).")
            got.rename(cached)
    actual = sha256_file(cached)
    if actual != pin.sha256:
        bad = cached.with_suffix(".bad")
        cached.rename(bad)
        raise BuildError(f"{cached}: sha256 is {actual}, expected {pin.sha256} (moved aside to {bad}; run again to refetch)")
    return cached


def pristine_tree(pin: BasePin, cache: Path, source: str | None) -> Path:
    """An unpatched llama.cpp tree at the pinned base, from --source / $LLAMA_MOE_SOURCE, else the cached sdist."""
    source = source or os.environ.get(SOURCE_ENV) or None
    if source:
        path = Path(source).expanduser().resolve()
        if path.is_dir():
            if not _looks_like_llama_cpp(path):
                raise BuildError(f"{path}: not a llama.cpp source tree (no include/llama.h or ggml/CMakeLists.txt)")
            log.info("source: the tree at %s (assumed to be llama.cpp %s)", path, pin.commit)
            return path
        if not path.is_file():
            raise BuildError(f"--source {source}: no such file or directory")
        tree = cache / "src" / f"pristine-{pin.commit}-{sha256_file(path)[:12]}"
        if not tree.is_dir():
            base = _bundle_base(path)
            if base is not None:
                if base != pin.commit:
                    raise BuildError(f"{path}: a bundle of llama.cpp {base}, but the patches need {pin.commit}")
                _extract_member(path, "llama.cpp", tree)
            else:
                actual = sha256_file(path)
                if actual != pin.sha256:
                    raise BuildError(f"{path}: sha256 is {actual}, but patches/BASE pins {pin.sha256} ({pin.package})")
                tree.parent.mkdir(parents=True, exist_ok=True)
                _extract_member(path, pin.member, tree)
        log.info("source: %s", path)
        return tree
    tree = cache / "src" / f"pristine-{pin.commit}"
    if not tree.is_dir():
        sdist = download_sdist(pin, cache / "downloads")
        tree.parent.mkdir(parents=True, exist_ok=True)
        log.info("extracting %s from %s", pin.member, sdist.name)
        _extract_member(sdist, pin.member, tree)
    return tree


# Files inside excluded folders that the build still reads.
_BUNDLE_KEEP = ("scripts/ui-assets.cmake",)


def _excluded(rel: str) -> bool:
    if rel in _BUNDLE_KEEP:
        return False
    return any(rel == e or rel.startswith(e + "/") for e in _BUNDLE_EXCLUDE)


def write_bundle(pristine: Path, pin: BasePin, out: Path) -> int:
    """Writes a trimmed tar.xz of the pristine tree for machines without network; returns its size."""
    out.parent.mkdir(parents=True, exist_ok=True)
    marker = json.dumps({"commit": pin.commit, "from": pin.package, "sha256": pin.sha256}).encode()
    with atomic_writer(out, "wb") as f, tarfile.open(fileobj=f, mode="w:xz", preset=9) as tar:  # whole or not at all
        for path in sorted(pristine.rglob("*")):
            rel = path.relative_to(pristine).as_posix()
            if _excluded(rel) or not (path.is_file() or path.is_symlink()):
                continue
            tar.add(path, arcname=f"llama.cpp/{rel}", recursive=False)
        info = tarfile.TarInfo(f"llama.cpp/{BUNDLE_MARKER}")
        info.size = len(marker)
        tar.addfile(info, io.BytesIO(marker))
    return out.stat().st_size
