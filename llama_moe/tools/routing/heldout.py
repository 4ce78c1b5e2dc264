"""Held-out hit rates: a profile is ranked on some routing and scored on other routing, never on its own
(the Strata lesson: 0.6573 in-sample against 0.6447 held out). Two designs: train traces against test
traces, and k-fold (each fold scored with a profile ranked on the others), reported as the mean of the
folds with a Student t 95% interval.

The folds (``choose_folds``): with two or more traces, one per trace (leave one trace out: each document is
scored with a profile from the other documents, as a profile meets new text); with one trace, k contiguous
blocks of its tokens, which share their document with the blocks the profile was ranked on, so the estimate
is likely optimistic on new text (on the synthetic Qwen3-30B-A3B routing of the corpus's eight topics, 10
contiguous folds put a static profile 2-5 points above leave-one-topic-out: docs/tools.md). Every estimate
carries how it was held out (``Folds.describe``). A policy that needs a warm-up (adaptive: its heats halve
over the engine's half-life, ``policy_replay.adaptive_half_life()``) is not estimated on folds shorter than that (``min_fold_tokens``): they
are reported as too short and left out of its estimate.

Streamed: a fold's profile needs only the counts of the other folds, so one pass over trace files counts
every fold (``fold_counts``: the train side of a fold is everything less its own block), and one more
replays every fold at once, each with a fresh cache from its own profile (``policies.replay_jobs``); no
token is kept."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..errors import ToolInputError
from ...policy_replay import adaptive_half_life
from .policies import PolicyResult, merge_results, run_policy
from .ranking import pair_counts, rank_counts, rank_pairs, segment_counts
from .routes import JoinedRoutes, Routes
from .tracefiles import FileRoutes, TraceRoutes

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
    Folds by trace are documents; contiguous folds are parts of one text, not independent: read the interval
    as the spread of the figure over documents (or parts of the text), not as an exact coverage guarantee."""

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


DEFAULT_FOLDS = 10  # contiguous folds of a single trace, when none are asked for


@dataclass(frozen=True)
class Folds:
    """How a k-fold estimate is held out: its test blocks (token ranges of the routing, in order, from 0 to
    the end) and what they are: one per trace (``by_trace``: leave one trace out) or contiguous blocks of the
    tokens (of one trace, or across ``n_traces``)."""

    bounds: tuple[tuple[int, int], ...]
    by_trace: bool
    n_traces: int

    @property
    def k(self) -> int:
        return len(self.bounds)

    @property
    def optimistic(self) -> bool:
        """The folds share documents with the routing their profiles are ranked on."""
        return not self.by_trace

    def lengths(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.bounds)

    def describe(self) -> str:
        """How the estimate was held out, for a report: "leave one of 4 traces out", "10 contiguous folds of
        one trace: within one document, likely optimistic on new text"."""
        if self.by_trace:
            return f"leave one of {self.k} traces out"
        if self.n_traces == 1:
            return f"{self.k} contiguous folds of one trace: within one document, likely optimistic on new text"
        return f"{self.k} contiguous folds over {self.n_traces} traces: they share documents, likely optimistic on new text"


def trace_lengths(routes: Routes | JoinedRoutes | TraceRoutes) -> tuple[int, ...]:
    """The tokens of each trace the routing holds, in order: the files of a ``TraceRoutes`` or of what
    ``load_traces`` read (``FileRoutes``), within the view; any other routing in memory is one trace (give
    ``trace_folds`` its documents' lengths to fold it by document)."""
    if isinstance(routes, (TraceRoutes, FileRoutes)):
        return routes.trace_tokens()
    return (routes.n_tokens,)


def trace_folds(lengths: Sequence[int]) -> Folds:
    """One fold per trace (leave one trace out), from the traces' token counts in order."""
    lengths = [int(n) for n in lengths]
    if len(lengths) < 2:
        raise ToolInputError(f"leave-one-trace-out needs at least 2 traces, got {len(lengths)}")
    if min(lengths) < 1:
        raise ToolInputError(f"a trace of {min(lengths)} tokens cannot be a fold")
    edges = np.concatenate(([0], np.cumsum(lengths))).tolist()
    return Folds(tuple(zip(edges[:-1], edges[1:])), True, len(lengths))


def choose_folds(routes: Routes | JoinedRoutes | TraceRoutes, folds: "int | str | Folds | None" = None) -> Folds:
    """The folds of a k-fold estimate. ``None`` or ``"auto"``: one per trace with two or more traces (leave one
    out), else ``DEFAULT_FOLDS`` contiguous blocks; ``"trace"``: one per trace (refused with one trace); an int
    K: K contiguous blocks of the tokens, as even as can be, across traces; a ``Folds``: as given (checked
    against the routing's tokens)."""
    lengths = trace_lengths(routes)
    n = routes.n_tokens
    if isinstance(folds, Folds):
        b = folds.bounds
        if (len(b) < 2 or b[0][0] != 0 or b[-1][1] != n or any(x >= y for x, y in b)
                or any(b[i][1] != b[i + 1][0] for i in range(len(b) - 1))):
            raise ToolInputError(f"the folds {list(folds.bounds)} do not cut {n} tokens into consecutive blocks")
        return folds
    if folds is None or folds == "auto":
        if len(lengths) >= 2:
            return trace_folds(lengths)
        folds = DEFAULT_FOLDS
    if folds == "trace":
        if len(lengths) < 2:
            raise ToolInputError("leave-one-trace-out needs two or more traces; one trace is folded in contiguous "
                                 "blocks (--kfold K)")
        return trace_folds(lengths)
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)):
        raise ToolInputError(f"folds: a number, 'auto' or 'trace', got {folds!r}")
    return Folds(tuple(fold_bounds(n, int(folds))), False, len(lengths))


def min_fold_tokens(policy: str) -> int:
    """The fewest tokens a fold needs for ``policy``'s figure to mean anything: the adaptive cache starts from
    the profile and follows the text through heats that halve over the engine's half-life
    (``policy_replay.adaptive_half_life()``), so on a shorter
    fold it has not yet adapted (on the synthetic Qwen3-30B-A3B routing its hit rate per token reaches its
    plateau after about 256-350 tokens: docs/tools.md). The others need no warm-up."""
    return math.ceil(adaptive_half_life()) if policy == "adaptive" else 0


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
    there is no rate to estimate. Folds shorter than the policy needs (``min_tokens``, ``min_fold_tokens``)
    are left out of the estimates and of ``pooled`` (their indices in ``too_short``; ``pooled`` is None when
    every fold is); ``folds`` keeps every fold's result."""

    hit_rate: Estimate | None
    h_layer: Estimate | None
    pooled: PolicyResult | None
    folds: tuple[PolicyResult, ...] = field(default=(), repr=False)
    too_short: tuple[int, ...] = ()
    min_tokens: int = 0

    def short_note(self) -> str:
        """What was left out and why, for a report ("" when nothing was)."""
        if not self.too_short:
            return ""
        n, k = len(self.too_short), len(self.folds)
        what = "every fold is" if n == k else f"{n} of {k} folds left out:"
        return (f"{what} under {self.min_tokens} tokens, too short to mean anything for this policy (the adaptive "
                f"cache's heats halve over {adaptive_half_life():g} tokens: a shorter fold measures its warm-up)")


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


def estimate(values: Sequence[float | None]) -> Estimate | None:
    """The folds that have a rate (something was looked up), as an estimate; None with fewer than two."""
    rates = [v for v in values if v is not None]
    return t_interval(rates) if len(rates) >= 2 else None


def kfold_result(results: Sequence[PolicyResult], lengths: Sequence[int] = (), min_tokens: int = 0) -> KFoldResult:
    """The folds' results as estimates, and pooled; given the folds' ``lengths`` in tokens, those under
    ``min_tokens`` are left out of both (``KFoldResult.too_short``)."""
    short = tuple(i for i, n in enumerate(lengths) if n < min_tokens) if min_tokens else ()
    kept = [r for i, r in enumerate(results) if i not in short]
    return KFoldResult(estimate([r.hit_rate for r in kept]), estimate([r.h_layer for r in kept]),
                       merge_results(kept) if kept else None, tuple(results), short, min_tokens if short else 0)


def policy_kfold(policy: str, results: Sequence[PolicyResult], folds: Folds) -> KFoldResult:
    """``kfold_result`` with the folds too short for ``policy`` left out (``min_fold_tokens``)."""
    return kfold_result(results, folds.lengths(), min_fold_tokens(policy))


def document_split(routes: Routes | JoinedRoutes | TraceRoutes) -> tuple[int, str]:
    """Where a train-then-score tool (predict) cuts the routing, and how that holds out: with two or more
    traces, at the edge between traces nearest the middle (whole documents on each side); with one trace, at
    its middle (one document on both sides: likely optimistic on new text)."""
    lengths = trace_lengths(routes)
    n = routes.n_tokens
    if len(lengths) >= 2:
        edges = np.cumsum(lengths)[:-1]
        i = int(np.argmin(np.abs(edges - n / 2)))  # ties: the earlier edge
        first = "trace 1" if i == 0 else f"traces 1-{i + 1}"
        last = f"trace {len(lengths)}" if i + 2 == len(lengths) else f"traces {i + 2}-{len(lengths)}"
        return int(edges[i]), f"trained on {first} of {len(lengths)}, scored on {last}"
    return n // 2, ("trained on the first half of one trace, scored on the second: within one document, likely "
                    "optimistic on new text")


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
