"""The lifetime rules every native object follows: close() twice is fine, use after close raises ClosedError,
``with`` closes, and a finalizer frees what the user forgot (with a ResourceWarning).

An object whose native memory refers to another's (a context to its model's weights and vocabulary) holds that
other's memory: closing the other, or its being collected first, only marks it closed, and its memory is freed
when the last object holding it is freed. So no order of close() calls or of garbage collection frees a model
under a context, and every order ends with everything freed."""
from __future__ import annotations

import logging
import threading
import warnings
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..errors import ClosedError

log = logging.getLogger(__name__)

# One lock for every count; frees run outside it.
_COUNTS = threading.Lock()


class NativeMemory:
    """One native pointer, its free function and the memory of others it holds. Freed once its owner has let
    go of it (close() or the garbage collector) and nothing holds it, then it lets go of what it holds."""

    __slots__ = ("kind", "_ptr", "_free", "_holds", "_held_by", "_let_go")

    def __init__(self, kind: str, ptr: Any, free: Callable[[], None], holds: tuple["NativeMemory", ...]) -> None:
        self.kind = kind
        self._ptr = ptr
        self._free = free
        self._holds = holds    # taken by the caller before the pointer was made (see NativeHandle._hold)
        self._held_by = 0
        self._let_go = False

    @property
    def ptr(self) -> Any:
        return self._ptr

    @property
    def freed(self) -> bool:
        return self._ptr is None

    @property
    def held_by(self) -> int:
        """How many live objects hold this memory (the contexts of a model)."""
        return self._held_by

    def hold(self) -> "NativeMemory":
        with _COUNTS:
            if self._ptr is None or self._let_go:
                raise ClosedError(f"this {self.kind} is closed")
            self._held_by += 1
            return self

    def release(self) -> None:
        with _COUNTS:
            self._held_by -= 1
            unused = self._take_if_unused()
        if unused:
            self._run_free()

    def let_go(self) -> None:
        """The owner is done with it: freed now, or when the last holder releases it."""
        with _COUNTS:
            self._let_go = True
            if self._held_by and self._ptr is not None:
                # why a model's memory outlives its close(): a context still computes with it
                log.debug("%s closed while %d object(s) hold it: freed when the last is closed", self.kind,
                          self._held_by)
            unused = self._take_if_unused()
        if unused:
            self._run_free()

    def _take_if_unused(self) -> bool:
        """Under the lock: True once, for the caller that is to free it (the free itself runs outside the
        lock: a context's free joins native threads)."""
        if not self._let_go or self._held_by or self._ptr is None:
            return False
        self._ptr = None
        return True

    def _run_free(self) -> None:
        try:
            self._free()
        finally:
            for other in self._holds:  # only after our own free: it may still read theirs
                other.release()


def _free_forgotten(memory: NativeMemory) -> None:
    warnings.warn(f"{memory.kind} was not closed; freed by the garbage collector (use close() or 'with')",
                  ResourceWarning, stacklevel=2)
    memory.let_go()


class NativeHandle:
    """Owns one native pointer; subclasses call ``_adopt`` once the pointer exists."""

    _kind = "native object"

    def __init__(self) -> None:
        self._ptr: Any = None
        self._memory: NativeMemory | None = None
        self._finalizer: weakref.finalize | None = None
        # One native call at a time per object: llama.cpp contexts are not thread-safe.
        self._lock = threading.RLock()

    def _adopt(self, ptr: Any, free: Callable[[], None], holds: tuple[NativeMemory, ...] = ()) -> None:
        """``holds``: the memory of others this pointer refers to, already held (``_hold``); released after
        ``free`` runs."""
        self._ptr = ptr
        self._memory = NativeMemory(self._kind, ptr, free, holds)
        # the finalizer refers to the memory, never to self: it must not keep the object alive
        self._finalizer = weakref.finalize(self, _free_forgotten, self._memory)

    def _hold(self) -> NativeMemory:
        """This object's memory, held for an object about to refer to it: it stays allocated until the holder
        releases it, whatever happens to this object."""
        with self._lock:
            self._live()
            assert self._memory is not None
            return self._memory.hold()

    @contextmanager
    def _using(self) -> Iterator[Any]:
        """The pointer, held for the length of one call: a close() from another thread meanwhile takes effect
        at once, but the free waits for the call to return."""
        memory = self._hold()
        try:
            yield memory.ptr
        finally:
            memory.release()

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
                # Detach and let go directly: closing on purpose warns about nothing.
                detached = self._finalizer.detach()
                if detached is not None:
                    _, _, (memory,), _ = detached
                    memory.let_go()
            self._ptr = None

    def __enter__(self) -> Any:
        self._live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
