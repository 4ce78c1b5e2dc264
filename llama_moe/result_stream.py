"""An iteration that ends with a result: the common part of ChatStream and BatchStream."""
from __future__ import annotations

from typing import Generator, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class ResultStream(Generic[T, R]):
    """Iterates over what a generator yields; ``result`` is what it returns, once the iteration ends.
    ``close()`` (or leaving a ``with`` block) stops it early."""

    def __init__(self, gen: Generator[T, None, R]) -> None:
        self._gen = gen
        self.result: R | None = None

    def __iter__(self) -> ResultStream[T, R]:
        return self

    def __next__(self) -> T:
        try:
            return next(self._gen)
        except StopIteration as done:
            self.result = done.value
            raise

    def close(self) -> None:
        self._gen.close()

    def __enter__(self) -> ResultStream[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
