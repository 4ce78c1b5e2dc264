"""The tools' own errors: each derives from the binding's LlamaMoeError (``except LlamaMoeError`` catches them
all) and from the built-in exception a caller would expect. The binding never raises these."""
from __future__ import annotations

from ..errors import LlamaMoeError

# -- the routing tools --------------------------------------------------------------------------------------


class ToolInputError(LlamaMoeError, ValueError):
    """A file, a text or an option the tools cannot use: missing, too short, or contradicting another."""


class CacheBudgetError(ToolInputError):
    """The budget cannot hold one expert slot per cached layer (the engine would turn the cache off)."""


# -- benchmarks ---------------------------------------------------------------------------------------------

class PlotUnavailableError(LlamaMoeError, ImportError):
    """matplotlib, which the benchmark's plot needs, is not installed."""


# -- serving ------------------------------------------------------------------------------------------------

class ServerStartError(LlamaMoeError, RuntimeError):
    """llama-server is missing, exited, or did not become healthy in time (the message ends with its log)."""


class ServerError(LlamaMoeError, ConnectionError):
    """A llama-server that cannot be reached, or that does not serve /metrics."""


class MetricsError(LlamaMoeError, ValueError):
    """/metrics text that is not the Prometheus format llama-server writes, or lacks a series."""


class ServePlanError(LlamaMoeError, ValueError):
    """The model and the requested context cannot be served on this GPU."""


class MonitorError(LlamaMoeError, OSError):
    """The monitor cannot listen on its port."""


class CodeEvalError(LlamaMoeError, RuntimeError):
    """The model could not be served or asked."""


class CheckAuditError(LlamaMoeError, ValueError):
    """The inputs cannot make the check (a missing model or profile, a size that is no size)."""


__all__ = [
    "CacheBudgetError", "CheckAuditError", "CodeEvalError", "MetricsError", "MonitorError", "PlotUnavailableError",
    "ServePlanError", "ServerError", "ServerStartError", "ToolInputError",
]
