"""Cache sizes against policies: each size's engine slots, every policy replayed on held-out routing (a
test trace, k-fold, or both), and the in-sample figure only beside them, for contrast."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..experts import ExpertLayout
from .budget import engine_slots, mib_to_bytes
from .errors import ToolInputError
from .heldout import KFoldResult, kfold, kfold_splits, ranked_replay
from .policies import POLICIES, PolicyResult, run_policy, static
from .ranking import rank_pairs
from .routes import Routes


@dataclass(frozen=True)
class SizeResult:
    cache_mib: float
    slots: int                 # per cached layer: the engine gives every layer the same
    n_layers: int
    whole: bool                # every layer holds all its experts: nothing to look up
    heldout: dict[str, PolicyResult] | None   # profile ranked on the train routing, replayed on the test
    kfold: dict[str, KFoldResult] | None      # k-fold over the train routing
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


def simulate_sizes(model: str, layout: ExpertLayout, sizes_mib: Sequence[float], train: Routes,
                   test: Routes | None = None, folds: int | None = None, hybrid: bool = False,
                   policies: Sequence[str] = POLICIES,
                   progress: Callable[[int, int], None] | None = None) -> SimulateReport:
    """Every size's slots as the engine computes them, and every policy on held-out routing: ``test`` (the
    profile ranked on ``train``) and/or ``folds``-fold over ``train``. Profiles fill lru, static and adaptive
    at the start, as --moe-cache-profile does."""
    if test is None and not folds:
        raise ToolInputError("a held-out hit rate needs a test trace or k-fold: an in-sample one alone misleads")
    n_expert = layout.n_expert
    splits = kfold_splits(train, folds) if folds else []
    profile = rank_pairs(train, n_expert)
    # progress in hundredths of a replay: one replay of a large held-out trace takes a while
    total = len(sizes_mib) * len(policies) * ((test is not None) + len(splits)) * 100
    done = 0

    def tick() -> None:
        nonlocal done
        done += 100
        if progress:
            progress(done, total)

    def within(d: int, t: int) -> None:
        if progress and t:
            progress(done + min(99, 100 * d // t), total)

    out = []
    for mib in sizes_mib:
        slots = engine_slots(layout, mib_to_bytes(mib), hybrid)
        per_layer = next(iter(slots.values()))
        heldout = kfolds = None
        if test is not None:
            heldout = {}
            for name in policies:
                heldout[name] = run_policy(name, test, slots, n_expert, profile, within)
                tick()
        if splits:
            kfolds = {}
            for name in policies:
                kfolds[name] = kfold(splits, ranked_replay(name, slots, n_expert), tick)
        out.append(SizeResult(mib, per_layer, len(slots), all(n == n_expert for n in slots.values()), heldout,
                              kfolds, static(train, slots, n_expert, profile)))
    return SimulateReport(model, hybrid, n_expert, layout.n_expert_used, train.n_tokens,
                          test.n_tokens if test is not None else None, folds, tuple(policies), tuple(out))
