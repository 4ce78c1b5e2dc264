"""Environment variables the native library reads when a context is made, set for a block and restored."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Variables the library reads when a context is made (None removes one), restored afterwards."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            _set_env(k, v)
        yield
    finally:
        for k, v in old.items():
            _set_env(k, v)
