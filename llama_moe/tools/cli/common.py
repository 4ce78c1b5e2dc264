"""What the commands share: reading inputs with errors that say what is wrong, the files a command writes
checked before it runs, the --json and --quiet options, and printing a report as text or JSON."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from ...errors import ProfileError
from ..errors import ToolInputError
from ..experts import ExpertLayout, expert_layout
from . import jsonout
from .progress import Progress
from ..routing.tracefiles import TraceRoutes


def _not_a_file(path: str | os.PathLike[str], what: str) -> str:
    p = Path(path)
    return f"{path}: a directory, not a {what}" if p.is_dir() else f"{path}: no such {what}"


def model_layout(path: str | os.PathLike[str]) -> ExpertLayout:
    if not Path(path).is_file():
        raise ToolInputError(_not_a_file(path, "model file"))
    layout = expert_layout(path)
    if not layout.layers:
        raise ToolInputError(f"{path}: no MoE expert tensors: the tools are for MoE models")
    return layout


def read_text(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file's text; ToolInputError for a file that cannot be read, or that is not UTF-8 (naming the
    first byte that does not decode, its offset and its line)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ToolInputError(f"{path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ToolInputError(f"{path}: not UTF-8 text: byte {exc.start} (0x{data[exc.start]:02x}, line {line}) is "
                             f"not valid UTF-8; convert the file (iconv -f ENCODING -t UTF-8)") from None


def check_files(paths: list[str]) -> None:
    for p in paths:
        if not Path(p).is_file():
            raise ToolInputError(_not_a_file(p, "trace file"))


def check_profile_file(path: str | os.PathLike[str] | None, option: str, model: str | os.PathLike[str] | None = None) -> None:
    """Refuses a profile a command hands to llama.cpp, which would only warn and start the cache empty: a
    missing file, a damaged one, or (given the model, when it exists) one made for another model."""
    from ...formats.profile import read_profile

    if path is None:
        return
    if not Path(path).is_file():
        raise ToolInputError(f"{_where(option, _not_a_file(path, 'file'))}")
    layout = expert_layout(model) if model is not None and Path(model).is_file() else None
    try:
        read_profile(path, *((layout.n_layer, layout.n_expert) if layout is not None and layout.layers else ()))
    except ProfileError as exc:
        raise ToolInputError(_where(option, str(exc))) from None


def _where(option: str, path: str | os.PathLike[str]) -> str:
    return f"{option} {path}" if option else str(path)


def check_output_file(path: str | os.PathLike[str] | None, option: str = "") -> None:
    """Refuses a file a command is to write, before it starts: a directory there, a folder that does not exist,
    a place it cannot write (tried: its temporary is made and removed). The file itself is written whole or not
    at all (llama_moe._atomic)."""
    from ...formats.atomic import part_path

    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ToolInputError(f"{_where(option, path)}: a directory; give the file to write")
    if p.exists() and not p.is_file():  # a device, a pipe: not every writer could write it in place
        raise ToolInputError(f"{_where(option, path)}: not a regular file")
    if not p.parent.is_dir():
        state = "is not a folder" if p.parent.exists() else "does not exist"
        raise ToolInputError(f"{_where(option, path)}: the folder {p.parent} {state}")
    tmp = part_path(os.path.realpath(p))  # where the writer puts it: beside the file a symlink names
    if not tmp.exists():
        try:
            tmp.open("xb").close()
            tmp.unlink()
        except OSError as exc:
            raise ToolInputError(f"{_where(option, path)}: cannot write there ({exc.strerror or exc})") from None


def check_output_dir(path: str | os.PathLike[str] | None, option: str = "") -> None:
    """Refuses a folder a command is to write into (and make, if need be): a file there, or a place where it
    cannot be made or written."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ToolInputError(f"{_where(option, path)}: not a folder")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ToolInputError(f"{_where(option, path)}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ToolInputError(f"{_where(option, path)}: cannot write in {existing} (permission denied)")


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar on stderr")


def progress(args: argparse.Namespace, what: str, percent: bool = False) -> Progress:
    return Progress(what, enabled=not args.quiet, percent=percent)


def read_traces(args: argparse.Namespace, paths: Sequence[str], layout: ExpertLayout) -> TraceRoutes:
    """The traces streamed (``TraceRoutes``), read through once first: every record validated (so that a bad
    trace is refused before any replay) and the selections counted, with a progress line in MiB (drawn only
    when reading takes over a second). Nothing of them stays in memory but the counts."""
    check_files(list(paths))
    bar = Progress("MiB of traces read", enabled=not args.quiet, delay=1.0)
    try:
        return TraceRoutes(paths, layout).scan(lambda done, total: bar(-(-done >> 20), -(-total >> 20)))
    finally:
        bar.close()


def emit(args: argparse.Namespace, report: Any, text: Callable[[Any], str]) -> None:
    if args.json:
        jsonout.dump(report, sys.stdout)
    else:
        print(text(report))


def rate(x: float | None) -> str:
    """A hit rate, or "n/a" where there is none (no routing, or nothing looked up)."""
    return "   n/a" if x is None else f"{x:6.4f}"


def kfold_arg(text: str) -> int | str:
    """``--kfold``'s value: a number of contiguous folds, or ``trace`` / ``auto``."""
    if text in ("trace", "auto"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of folds, 'trace' or 'auto', got {text!r}") from None
