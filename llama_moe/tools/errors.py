"""The tools' errors: input they cannot use, said plainly (the CLI prints the message and exits 1)."""
from __future__ import annotations

from ..errors import LlamaMoeError


class ToolInputError(LlamaMoeError, ValueError):
    """A file, a text or an option the tools cannot use: missing, too short, or contradicting another."""


class CacheBudgetError(ToolInputError):
    """The budget cannot hold one expert slot per cached layer (the engine would turn the cache off)."""
