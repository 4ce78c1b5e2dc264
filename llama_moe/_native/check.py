"""One way to turn a failed native call into an error: what it returned, what that code means, and what
llama.cpp logged about it (its last warnings and errors, kept by the log callback)."""
from __future__ import annotations

from typing import Any, Mapping

from . import log as _log
from .ffi import ffi
from ..errors import NativeCallError

# llama_decode's return codes (llama.h), and -3 of the patches: the hybrid's mailbox, or the RAM tier's reads
DECODE_CODES: Mapping[int, str] = {
    1: "no KV cache slot for the batch",
    2: "aborted",
    -1: "invalid batch",
    -3: "the MoE cache's CPU part did not answer a hand-over in time, or failed (the mailbox), or the RAM tier "
        "could not read an expert from the model's file",
}


def begin() -> None:
    """Forgets what llama.cpp said before a call, so that its failure is explained by its own lines."""
    _log.clear_recent_problems()


def said(default: str = "") -> str:
    """What llama.cpp warned about or reported as errors lately, on one line (``default`` when nothing)."""
    return "; ".join(_log.recent_problems()) or default


def check(rc: int, func: str, codes: Mapping[int, str] = DECODE_CODES) -> None:
    """Raises NativeCallError for a non-zero ``rc`` of ``func``: the code's meaning and llama.cpp's own words."""
    if rc == 0:
        return
    reason = said()
    meaning = codes.get(rc, "failed")
    raise NativeCallError(func, rc, meaning + (f": {reason}" if reason else ""))


def check_ptr(ptr: Any, func: str, what: str) -> Any:
    """``ptr``, or NativeCallError when ``func`` returned NULL: ``what`` failed, and llama.cpp's own words."""
    if ptr == ffi.NULL:
        raise NativeCallError(func, None, f"{what}: {said('no reason given')}")
    return ptr
