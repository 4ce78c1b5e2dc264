"""What the tool commands share: reading inputs with errors that say what is wrong, the --json and
--quiet options, and printing a report as text or JSON."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from ..experts import ExpertLayout, expert_layout
from . import jsonout
from .errors import ToolInputError
from .progress import Progress
from .tracefiles import TraceRoutes


def model_layout(path: str | os.PathLike[str]) -> ExpertLayout:
    if not Path(path).is_file():
        raise ToolInputError(f"{path}: no such model file")
    layout = expert_layout(path)
    if not layout.layers:
        raise ToolInputError(f"{path}: no MoE expert tensors: the tools are for MoE models")
    return layout


def read_text(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ToolInputError(f"{path}: {exc.strerror or exc}") from None


def check_files(paths: list[str]) -> None:
    for p in paths:
        if not Path(p).is_file():
            raise ToolInputError(f"{p}: no such trace file")


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
