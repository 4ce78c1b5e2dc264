"""Routing: trace the engine's routing, plan a cache and its profile, simulate cache policies on held-out
routing, and measure how predictable a layer's experts are. Each module has one job: ``budget`` asks the engine
its slot arithmetic, ``policies`` replays the cache's policies (those the engine runs, by the engine itself:
``llama_moe.policy_replay``). The ``python -m llama_moe trace|profile|plan|simulate|predict`` commands
(llama_moe/tools/cli/) print what they return. Importing this package never loads the native library; a replay,
a size's slots and tracing do, when they run."""
from __future__ import annotations

from ..errors import CacheBudgetError, ToolInputError
from .budget import cache_bytes_for_slots, engine_slots
from .heldout import Estimate, KFoldResult, kfold, kfold_splits, t_interval
from .planning import Plan, plan_cache
from .policies import POLICIES, PolicyResult, adaptive, belady, lru, replay_jobs, run_policy, static
from .prediction import PredictReport, predict_routes
from .ranking import make_profile, prefill_resident, rank_pairs
from .routes import Routes, routes_from_records
from .simulation import SimulateReport, simulate_sizes
from .tracefiles import TraceRoutes, load_traces, read_routes
from .tracing import iter_trace, trace_text

__all__ = [
    "POLICIES", "CacheBudgetError", "Estimate", "KFoldResult", "Plan", "PolicyResult", "PredictReport", "Routes",
    "SimulateReport", "ToolInputError", "TraceRoutes", "adaptive", "belady", "cache_bytes_for_slots", "engine_slots",
    "iter_trace", "kfold", "kfold_splits", "load_traces", "lru", "make_profile", "plan_cache", "predict_routes",
    "prefill_resident", "rank_pairs", "read_routes", "replay_jobs", "routes_from_records", "run_policy",
    "simulate_sizes", "static", "t_interval", "trace_text",
]
