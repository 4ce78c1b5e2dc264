"""The lifetime rules every native object follows: close() twice is fine, use after close raises,
``with`` closes, and a finalizer frees what the user forgot (with a ResourceWarning)."""
from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, Callable

from ..errors import ClosedError


def _free_forgotten(free: Callable[[], None], what: str) -> None:
    warnings.warn(f"{what} was not closed; freed by the garbage collector (use close() or 'with')",
                  ResourceWarning, stacklevel=2)
    free()


class NativeHandle:
    """Owns one native pointer; subclasses call ``_adopt`` once the pointer exists."""

    _kind = "native object"

    def __init__(self) -> None:
        self._ptr: Any = None
        self._finalizer: weakref.finalize | None = None
        # One native call at a time per object: llama.cpp contexts are not thread-safe.
        self._lock = threading.RLock()

    def _adopt(self, ptr: Any, free: Callable[[], None]) -> None:
        self._ptr = ptr
        self._finalizer = weakref.finalize(self, _free_forgotten, free, self._kind)

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def _live(self) -> Any:
        if self._ptr is None:
            raise ClosedError(f"this {self._kind} is closed")
        return self._ptr

    def close(self) -> None:
        with self._lock:
            if self._finalizer is not None and self._finalizer.alive:
                # Detach and call the free function directly: closing on purpose warns about nothing.
                detached = self._finalizer.detach()
                if detached is not None:
                    _, _, (free, _what), _ = detached
                    free()
            self._ptr = None

    def __enter__(self) -> Any:
        self._live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
