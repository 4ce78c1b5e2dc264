"""Held-out hit rates: a profile is ranked on some routing and scored on other routing, never on its own
(the Strata lesson: 0.6573 in-sample against 0.6447 held out). Two designs: a train trace against a test
trace, and k-fold over one trace cut into k contiguous blocks of tokens (each block scored with a profile
ranked on the others), reported as the mean of the folds with a Student t 95% interval.

Streamed: a fold's profile needs only the counts of the other folds, so one pass over trace files counts
every fold (``fold_counts``: the train side of a fold is everything less its own block), and one more
replays every fold at once, each with a fresh cache from its own profile (``policies.replay_jobs``); no
token is kept."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .errors import ToolInputError
from .policies import PolicyResult, merge_results, run_policy
from .ranking import pair_counts, rank_counts, rank_pairs, segment_counts
from .routes import JoinedRoutes, Routes
from .tracefiles import TraceRoutes

# Student t 0.975 quantiles for 1..30 degrees of freedom (two-sided 95%)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (a table to 30, then the
    Cornish-Fisher expansion around the normal's 1.95996, good to 1e-3)."""
    if df < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Estimate:
    """A held-out figure over k folds: their mean and a 95% Student t interval (mean +- t * sd / sqrt(k)).
    The folds are contiguous blocks of one text, so they are not independent: read the interval as the
    spread of the figure over parts of the text, not as an exact coverage guarantee."""

    mean: float
    low: float
    high: float
    folds: tuple[float, ...]
    method: str = "student-t 95%"


def t_interval(values: Sequence[float]) -> Estimate:
    k = len(values)
    if k < 2:
        raise ToolInputError(f"an interval needs at least 2 folds, got {k}")
    mean = sum(values) / k
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    half = t975(k - 1) * sd / math.sqrt(k)
    return Estimate(mean, mean - half, mean + half, tuple(values))


def fold_bounds(n_tokens: int, k: int) -> list[tuple[int, int]]:
    """k contiguous blocks of tokens, as even as can be."""
    if k < 2:
        raise ToolInputError(f"k-fold needs k >= 2, got {k}")
    if n_tokens < 2 * k:
        raise ToolInputError(f"{n_tokens} tokens are too few for {k} folds (at least {2 * k} needed)")
    edges = [n_tokens * i // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


def kfold_splits(routes: Routes, k: int) -> list[tuple[JoinedRoutes, Routes]]:
    """(train, test) per fold: the test is one block, the train the others. Neither is a copy: the blocks
    are views of ``routes``, and the train side is a ``JoinedRoutes`` that ranking reads in place (its pair
    counts are kept with it, so a fold is ranked once however many sizes and policies replay it)."""
    n = routes.n_tokens
    out = []
    for a, b in fold_bounds(n, k):
        rest = [routes.tokens(x, y) for x, y in ((0, a), (b, n)) if x < y]
        out.append((JoinedRoutes(rest), routes.tokens(a, b)))
    return out


@dataclass(frozen=True)
class KFoldResult:
    """One policy over k folds: the per-fold hit rate and h_layer as estimates, and the folds' counts pooled
    (per layer too). An estimate is None when fewer than two folds looked anything up (every layer held whole):
    there is no rate to estimate."""

    hit_rate: Estimate | None
    h_layer: Estimate | None
    pooled: PolicyResult
    folds: tuple[PolicyResult, ...] = field(default=(), repr=False)


def ranked_replay(policy: str, slots: dict[int, int], n_expert: int) -> Callable[[Routes | JoinedRoutes, Routes], PolicyResult]:
    """A fold's replay: the profile ranked on the fold's train routing, the policy run on its test routing."""
    def replay(train: Routes | JoinedRoutes, test: Routes) -> PolicyResult:
        return run_policy(policy, test, slots, n_expert, rank_pairs(train, n_expert))
    return replay


def kfold(splits: Sequence[tuple[Routes | JoinedRoutes, Routes]], replay: Callable[[Routes | JoinedRoutes, Routes], PolicyResult],
          after_fold: Callable[[], None] | None = None) -> KFoldResult:
    """``replay(train, test)`` on every fold; ``after_fold()`` after each (a progress bar)."""
    results = []
    for train, test in splits:
        results.append(replay(train, test))
        if after_fold:
            after_fold()
    return kfold_result(results)


def _estimate(values: Sequence[float | None]) -> Estimate | None:
    """The folds that have a rate (something was looked up), as an estimate; None with fewer than two."""
    rates = [v for v in values if v is not None]
    return t_interval(rates) if len(rates) >= 2 else None


def kfold_result(results: Sequence[PolicyResult]) -> KFoldResult:
    """The folds' results as estimates, and pooled."""
    return KFoldResult(_estimate([r.hit_rate for r in results]), _estimate([r.h_layer for r in results]),
                       merge_results(results), tuple(results))


@dataclass(frozen=True)
class FoldCounts:
    """Selections per (layer, expert): of each block (``test``), of everything but each block (``train``, what
    its profile is ranked on) and of the whole routing (``total``)."""

    bounds: tuple[tuple[int, int], ...]
    test: np.ndarray         # [folds, n_layers, n_expert]
    train: tuple[np.ndarray, ...]
    total: np.ndarray        # [n_layers, n_expert]
    layers: tuple[int, ...]

    def profile(self) -> tuple[tuple[int, int], ...]:
        """Every pair, ranked on the whole routing."""
        return rank_counts(self.total, self.layers)

    def fold_profiles(self) -> list[tuple[tuple[int, int], ...]]:
        """Each fold's profile, ranked on the other folds (as ``ranked_replay`` ranks a split's train side)."""
        return [rank_counts(c, self.layers) for c in self.train]


def fold_counts(routes: Routes | TraceRoutes, bounds: Sequence[tuple[int, int]], n_expert: int,
                progress: Callable[[int, int], None] | None = None) -> FoldCounts:
    """The counts of contiguous blocks ``bounds`` (from 0 to the end), from one pass over trace files. With
    one token per ubatch a block's train side is the total less the block; a routing in memory with larger
    ubatches counts each train side as ``kfold_splits`` joins it (a ubatch cut by an edge is counted whole
    on that side)."""
    edges = [a for a, _ in bounds] + [bounds[-1][1]]
    test = segment_counts(routes, edges, n_expert, progress)
    if routes.one_token_ubatches:
        total = test.sum(axis=0)
        train = tuple(total - c for c in test)
    else:
        total = pair_counts(routes, n_expert)
        n = routes.n_tokens
        train = tuple(pair_counts(JoinedRoutes([routes.tokens(x, y) for x, y in ((0, a), (b, n)) if x < y]), n_expert)
                      for a, b in bounds)
    return FoldCounts(tuple(bounds), test, train, total, tuple(routes.layers))
