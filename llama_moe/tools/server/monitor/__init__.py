"""A live view of a llama-server's MoE cache: ``monitor.html``, served with a /metrics proxy by
``python -m llama_moe monitor --server URL``."""
from __future__ import annotations

from .server import MonitorServer, monitor_html

__all__ = ["MonitorServer", "monitor_html"]
