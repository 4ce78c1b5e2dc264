"""The package's exception hierarchy: every error llama_moe raises derives from LlamaMoeError."""
from __future__ import annotations


class LlamaMoeError(Exception):
    """Base class of every error raised by llama_moe."""


class NativeLibraryError(LlamaMoeError, OSError):
    """The patched libllama could not be found or loaded."""


class AbiMismatchError(LlamaMoeError, ImportError):
    """The loaded libllama is not the build this package's declarations describe."""


class NativeCallError(LlamaMoeError, RuntimeError):
    """A call into libllama failed; ``func`` names it and ``code`` is what it returned."""

    def __init__(self, func: str, code: int | None, message: str) -> None:
        super().__init__(f"{func}: {message}" + (f" (returned {code})" if code is not None else ""))
        self.func = func
        self.code = code


class ModelLoadError(LlamaMoeError, ValueError):
    """A model file is missing, unreadable or not a GGUF llama.cpp accepts."""


class BuildError(LlamaMoeError, RuntimeError):
    """Fetching, patching or compiling the native library failed."""


class GgufError(LlamaMoeError, ValueError):
    """A GGUF file is malformed or lacks what the caller needs."""


class ProfileError(LlamaMoeError, ValueError):
    """An STRP expert profile is malformed or made for another model."""


class ClosedError(LlamaMoeError, ValueError):
    """A model or context was used after close()."""


class MoeCacheWarning(UserWarning):
    """A MoE cache option that cannot take effect: the cache asked for is off (no device to hold it, no
    experts in RAM, a size too small for one expert per layer), or an option does nothing without another."""
