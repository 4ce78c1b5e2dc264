"""The binding's exception hierarchy, in one place: every error llama_moe raises derives from LlamaMoeError (the
tools' own errors too, which live in llama_moe.tools.errors).

Each class also derives from the built-in exception a caller would expect (ValueError for input that is wrong,
OSError for a file or a port, RuntimeError for a process or a call that failed), so ``except ValueError`` keeps
working for code that does not know llama_moe's classes."""
from __future__ import annotations


class LlamaMoeError(Exception):
    """Base class of every error raised by llama_moe."""


# -- the native library ------------------------------------------------------------------------------------

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


class BuildError(LlamaMoeError, RuntimeError):
    """Fetching, patching or compiling the native library failed."""


# -- the binding: models, contexts, parameters --------------------------------------------------------------

class ModelLoadError(LlamaMoeError, ValueError):
    """A model file is missing, unreadable or not a GGUF llama.cpp accepts."""


class ParameterError(LlamaMoeError, ValueError):
    """A parameter is out of range or contradicts another."""


class RpcServerError(LlamaMoeError, ConnectionError):
    """An RPC server (ggml's ``rpc-server``) named in ``ModelParams.rpc`` does not answer, or is not one."""


class ClosedError(LlamaMoeError, ValueError):
    """A model or context was used after close()."""


class ChatTemplateError(LlamaMoeError, ValueError):
    """A chat template the model lacks, a name llama.cpp does not know, or a template it cannot apply."""


class SessionError(LlamaMoeError, ValueError):
    """A session file that is damaged, truncated, of another model or of a context that cannot take it."""


class MoeCacheWarning(UserWarning):
    """A MoE cache option that cannot take effect: the cache asked for is off (no device to hold it, no
    experts in RAM, a size too small for one expert per layer), or an option does nothing without another."""


# -- file formats -----------------------------------------------------------------------------------------

class GgufError(LlamaMoeError, ValueError):
    """A GGUF file is malformed or lacks what the caller needs."""


class ProfileError(LlamaMoeError, ValueError):
    """An STRP expert profile is malformed or made for another model."""


class TraceError(LlamaMoeError, ValueError):
    """A routing trace is malformed."""


def problems_text(problems: list[tuple[str | None, str]]) -> str:
    """An audit record's problems as one text: ``field 'name': what`` for each, joined by "; "."""
    return "; ".join(f"field '{f}': {m}" if f else m for f, m in problems)


class AuditError(LlamaMoeError, ValueError):
    """An audit file that cannot be read, or a record that breaks the field list of docs/formats.md ("Audit log").
    ``line`` is the 1-based line number (0: the file as a whole), ``field`` the first offending field."""

    def __init__(self, line: int, problems: list[tuple[str | None, str]], path: str | None = None) -> None:
        where = f"{path}: " if path else ""
        text = problems_text(problems)
        super().__init__(f"{where}line {line}: {text}" if line else f"{where}{text}")
        self.line = line
        self.field = problems[0][0] if problems else None
        self.problems = tuple(problems)


__all__ = [
    "AbiMismatchError", "AuditError", "BuildError", "ChatTemplateError", "ClosedError", "GgufError", "LlamaMoeError",
    "ModelLoadError", "MoeCacheWarning", "NativeCallError", "NativeLibraryError", "ParameterError", "ProfileError",
    "RpcServerError", "SessionError", "TraceError",
]
