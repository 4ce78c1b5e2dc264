"""Running CMake and ninja with a one-line progress bar and the whole log kept in a file."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence, TextIO

from ..errors import BuildError

_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


class ProgressLine:
    """Draws ``[#####-----] 120/222  2m31s  what ninja does now`` on one terminal line."""

    def __init__(self, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.start = time.monotonic()
        self.tty = stream.isatty()
        self._last_pct = -1

    def update(self, done: int, total: int, what: str) -> None:
        elapsed = int(time.monotonic() - self.start)
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"[{bar}] {done}/{total} {elapsed // 60}m{elapsed % 60:02d}s {what}"
        if self.tty:
            cols = shutil.get_terminal_size((100, 20)).columns
            self.stream.write("\r" + line[: cols - 1].ljust(cols - 1))
            self.stream.flush()
        else:
            # Not a terminal (CI logs): a line each 10%, so the log shows progress without flooding.
            pct = 100 * done // max(total, 1)
            if pct // 10 != self._last_pct // 10 or done == total:
                self._last_pct = pct
                self.stream.write(f"  {done}/{total} ({pct}%) after {elapsed // 60}m{elapsed % 60:02d}s\n")
                self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def run_logged(cmd: Sequence[str], cwd: Path, log_file: TextIO, verbose: bool,
               progress: ProgressLine | None = None, env: dict[str, str] | None = None) -> None:
    """Runs a command, appending all its output to ``log_file``; streams it when verbose, else
    turns ninja's [n/N] lines into the progress bar. Raises BuildError with the log's tail on failure."""
    log_file.write(f"\n$ {' '.join(cmd)}\n")
    log_file.flush()
    tail: list[str] = []
    try:
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", env=env)
    except OSError as exc:
        raise BuildError(f"could not run {cmd[0]}: {exc}") from exc
    assert proc.stdout is not None
    for line in proc.stdout:
        log_file.write(line)
        tail.append(line)
        del tail[:-60]
        if verbose:
            sys.stderr.write(line)
        elif progress is not None:
            m = _STEP.match(line)
            if m:
                progress.update(int(m.group(1)), int(m.group(2)), line[m.end():].strip().rsplit(" ", 1)[-1])
    rc = proc.wait()
    log_file.flush()
    if progress is not None:
        progress.finish()
    if rc != 0:
        errors = [l for l in tail if "error" in l.lower() or "FAILED" in l]
        shown = "".join(errors[-15:] or tail[-25:])
        raise BuildError(f"{Path(cmd[0]).name} failed (exit {rc}); the end of the log ({log_file.name}):\n{shown}")
