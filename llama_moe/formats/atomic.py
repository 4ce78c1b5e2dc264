"""Files written whole or not at all: the bytes go to ``NAME.part`` beside the target, which replaces the target
only once everything is written; on any failure (a full disk, a directory where the file should be, Ctrl-C) the
``.part`` is removed and the target is left as it was."""
from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import IO, Iterator

_WRITE_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO)


def part_path(path: str | os.PathLike[str]) -> Path:
    """The temporary a file is written to before it replaces ``path``."""
    p = Path(path)
    return p.with_name(p.name + ".part")


@contextlib.contextmanager
def _named(path: Path) -> Iterator[None]:
    """A write's OSError names no file (``No space left on device``): it names ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno in _WRITE_ERRORS:
            raise type(exc)(exc.errno, exc.strerror, str(path)) from None
        raise


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb", **open_kw) -> Iterator[IO]:
    """``with atomic_writer(path) as f: f.write(...)``: ``path`` appears, complete, when the block ends. A symlink
    keeps pointing where it did (the file it names is replaced); a device or a pipe (``/dev/stdout``) is written in
    place, there being no file to replace."""
    asked = Path(path)
    if asked.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(asked))
    if asked.exists() and not asked.is_file():
        with _named(asked), open(asked, mode, **open_kw) as f:
            yield f
        return
    target = Path(os.path.realpath(asked))
    tmp = part_path(target)
    try:
        f = open(tmp, mode, **open_kw)
    except OSError as exc:  # said of the file asked for, not of its temporary
        raise type(exc)(exc.errno, exc.strerror, str(asked)) from None
    try:
        with _named(asked), f:
            yield f
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_writer(path, "wb") as f:
        f.write(data)


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    with atomic_writer(path, "w", encoding=encoding) as f:
        f.write(text)
