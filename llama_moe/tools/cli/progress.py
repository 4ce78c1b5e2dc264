"""A one-line progress bar on stderr for the long tools (the build's ProgressLine, throttled)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

from ...native_build.ninja import ProgressLine


class Progress:
    """``progress(done, total)`` redraws at most every 0.2 s (a terminal) or at each tenth (a log);
    ``close()`` ends the line. ``enabled=False`` draws nothing; ``delay`` seconds: nothing is drawn for a
    run that ends sooner (a bar only on long runs); ``percent``: drawn as a percentage of the total (work
    counted in units of its own: bytes, tokens)."""

    def __init__(self, what: str, enabled: bool = True, stream: TextIO = sys.stderr, delay: float = 0.0,
                 percent: bool = False) -> None:
        self.what = what
        self.percent = percent
        self.line = ProgressLine(stream) if enabled else None
        self._last = 0.0
        self._show_after = time.monotonic() + delay
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        if self.line is None:
            return
        now = time.monotonic()
        if now < self._show_after or (done < total and now - self._last < 0.2):
            return
        self._last = now
        self._drawn = True
        if self.percent:
            done, total = 100 * done // max(total, 1), 100
        self.line.update(done, total, self.what)

    def close(self) -> None:
        if self.line is not None and self._drawn:
            self.line.finish()
