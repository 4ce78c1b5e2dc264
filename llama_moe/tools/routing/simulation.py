"""Cache sizes against policies: each size's engine slots, every policy replayed on held-out routing (a
test trace, k-fold, or both), and the in-sample figure only beside them, for contrast. Trace files are
streamed: every size, policy and fold is replayed from shared passes over them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..experts import ExpertLayout
from .budget import engine_slots, mib_to_bytes
from ..errors import ToolInputError
from .heldout import Folds, KFoldResult, choose_folds, fold_counts, policy_kfold, trace_lengths
from .policies import POLICIES, Job, PolicyResult, Meter, replay_jobs
from .routes import Routes
from .tracefiles import TraceRoutes


@dataclass(frozen=True)
class SizeResult:
    cache_mib: float
    slots: int                 # per cached layer: the engine gives every layer the same
    n_layers: int
    whole: bool                # every layer holds all its experts: nothing to look up
    heldout: dict[str, PolicyResult] | None   # profile ranked on the train routing, replayed on the test
    kfold: dict[str, KFoldResult] | None      # k-fold over the train routing (folds too short for a policy left out)
    in_sample: PolicyResult | None            # static, scored on the routing it was ranked on: optimistic


@dataclass(frozen=True)
class SimulateReport:
    model: str
    hybrid: bool
    n_expert: int
    n_expert_used: int
    train_tokens: int
    test_tokens: int | None
    folds: int | None
    policies: tuple[str, ...]
    sizes: tuple[SizeResult, ...]
    held_out_test: str | None = None   # how the test figures are held out
    held_out_kfold: str | None = None  # how the k-fold figures are: "leave one of 4 traces out", ...


def simulate_sizes(model: str, layout: ExpertLayout, sizes_mib: Sequence[float], train: Routes | TraceRoutes,
                   test: Routes | TraceRoutes | None = None, folds: int | str | Folds | None = None, hybrid: bool = False,
                   policies: Sequence[str] = POLICIES,
                   progress: Callable[[int, int], None] | None = None) -> SimulateReport:
    """Every size's slots as the engine computes them, and every policy on held-out routing: ``test`` (the
    profile ranked on ``train``) and/or k-fold over ``train``: ``folds`` as ``heldout.choose_folds`` takes them
    (``"auto"``: one per trace with two or more trace files, else 10 contiguous blocks; K: K contiguous
    blocks; None: no k-fold); adaptive's estimate leaves out folds too short for it
    (``heldout.min_fold_tokens``). Profiles fill lru, static and adaptive
    at the start, as --moe-cache-profile does. Streamed trace files (``TraceRoutes``) are read: once to count
    the folds' selections (profiles), once for the test replays of every size and policy, once for the
    k-fold and in-sample replays of every size and policy, and for belady once per group of layers (test and
    train); memory does not grow with their length but for belady's layers (``policies.replay_jobs``)."""
    if test is None and not folds:
        raise ToolInputError("a held-out hit rate needs a test trace or k-fold: an in-sample one alone misleads")
    n_expert = layout.n_expert
    n = train.n_tokens
    scheme = choose_folds(train, folds) if folds is not None else None
    folds = scheme.k if scheme else None
    bounds = list(scheme.bounds) if scheme else [(0, n)]
    n_sizes, n_policies = len(sizes_mib), len(policies)
    # progress: reading the counts, the test replays, the train replays (k-fold and in-sample), by tokens
    w_count = n // 8 + 1
    w_test = (test.n_tokens if test is not None else 0) * n_sizes * n_policies
    w_train = n * n_sizes * ((n_policies if folds else 0) + 1)
    meter = Meter(w_count + w_test + w_train, progress)
    counts = fold_counts(train, bounds, n_expert, meter.part(w_count))
    profile = counts.profile()
    fold_profiles = counts.fold_profiles() if folds else []
    slot_maps = [engine_slots(layout, mib_to_bytes(mib), hybrid) for mib in sizes_mib]
    test_results: list[PolicyResult] = []
    if test is not None:
        test_jobs = [Job(0, test.n_tokens, name, slots, profile) for slots in slot_maps for name in policies]
        test_results = replay_jobs(test, test_jobs, n_expert, meter.part(w_test))
    train_jobs = [Job(0, n, "static", slots, profile) for slots in slot_maps]  # in-sample, for contrast
    if folds:
        train_jobs += [Job(a, b, name, slots, fp) for slots in slot_maps for name in policies
                       for (a, b), fp in zip(bounds, fold_profiles)]
    train_results = replay_jobs(train, train_jobs, n_expert, meter.part(w_train))
    out = []
    for i, (mib, slots) in enumerate(zip(sizes_mib, slot_maps)):
        per_layer = next(iter(slots.values()))
        heldout = kfolds = None
        if test is not None:
            heldout = dict(zip(policies, test_results[i * n_policies:(i + 1) * n_policies]))
        if folds:
            kfolds = {}
            for p, name in enumerate(policies):
                at = n_sizes + (i * n_policies + p) * folds
                kfolds[name] = policy_kfold(name, train_results[at:at + folds], scheme)
        out.append(SizeResult(mib, per_layer, len(slots), all(v == n_expert for v in slots.values()), heldout,
                              kfolds, train_results[i]))
    held_test = None
    if test is not None:
        n_train, n_test = len(trace_lengths(train)), len(trace_lengths(test))
        held_test = (f"the profile ranked on the train routing ({n_train} trace{'s' * (n_train > 1)}), scored on the "
                     f"test routing ({n_test} trace{'s' * (n_test > 1)})")
    return SimulateReport(model, hybrid, n_expert, layout.n_expert_used, n,
                          test.n_tokens if test is not None else None, folds, tuple(policies), tuple(out), held_test,
                          scheme.describe() if scheme else None)
