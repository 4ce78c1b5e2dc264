"""llama.cpp's log, routed into the ``llama_moe.native`` logger."""
from __future__ import annotations

import collections
import logging
from typing import Any

from .ffi import ffi

native_log = logging.getLogger("llama_moe.native")

_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_CONT = 5
_pending: list[str] = []
_pending_level = logging.INFO
# The last warnings and errors, so that a failed call can say what llama.cpp said about it.
_recent: collections.deque[str] = collections.deque(maxlen=8)


def recent_problems() -> list[str]:
    return list(_recent)


def clear_recent_problems() -> None:
    _recent.clear()


def _emit(level: int, text: str) -> None:
    global _pending_level
    # llama.cpp writes a line in pieces: CONT pieces continue the previous level; a newline ends the line.
    if level != _CONT:
        _pending_level = _LEVELS.get(level, logging.DEBUG)
    _pending.append(text)
    joined = "".join(_pending)
    if joined.endswith("\n"):
        _pending.clear()
        for line in joined.rstrip("\n").split("\n"):
            native_log.log(_pending_level, "%s", line)
            if _pending_level >= logging.WARNING:
                _recent.append(line.strip())


@ffi.callback("void(enum ggml_log_level, const char *, void *)")
def _log_callback(level: int, text: Any, user_data: Any) -> None:  # cffi keeps this alive as a module global
    try:
        _emit(int(level), ffi.string(text).decode("utf-8", "replace"))
    except Exception:  # an exception must never cross back into C
        pass


def install_log_callback(lib: Any) -> None:
    lib.llama_log_set(_log_callback, ffi.NULL)
