"""How well a layer's experts can be guessed before its router runs, from the previous layer's routing of
the same token: a co-occurrence predictor ranked on the first half of a trace and scored on the second,
against the layer's most frequent experts (what a static profile knows)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .errors import ToolInputError
from .routes import Routes

_CHUNK = 2048  # tokens counted or scored at a time: [chunk, k, n_expert] scores stay a few MiB


@dataclass(frozen=True)
class LayerPrediction:
    il: int
    prev_il: int | None      # the layer whose routing predicts; None for the first MoE layer
    predictor: float | None  # share of the layer's selected experts among the top guesses from prev_il's
    baseline: float          # share among the layer's most frequent experts (train half)
    n_test: int              # tokens scored

    @property
    def lift(self) -> float | None:
        return None if self.predictor is None else self.predictor - self.baseline


@dataclass(frozen=True)
class PredictReport:
    model: str
    n_tokens: int
    n_train: int
    n_test: int
    k: int
    top: int                 # guesses per token and layer
    layers: tuple[LayerPrediction, ...]

    @property
    def mean_predictor(self) -> float | None:
        vals = [l.predictor for l in self.layers if l.predictor is not None]
        return float(np.mean(vals)) if vals else None

    @property
    def mean_baseline(self) -> float:
        return float(np.mean([l.baseline for l in self.layers]))


def _found(guess: np.ndarray, actual: np.ndarray) -> int:
    """How many of each row's actual experts are among its guesses, summed."""
    return int((guess[:, :, None] == actual[:, None, :]).any(axis=1).sum())


def _cooccurrence(prev: np.ndarray, cur: np.ndarray, n_expert: int) -> np.ndarray:
    """[n_expert, n_expert]: how often expert q was selected in the layer with p in the previous one, per
    token; counted a chunk of tokens at a time."""
    co = np.zeros(n_expert * n_expert, dtype=np.int64)
    for a in range(0, len(prev), _CHUNK):
        p = prev[a:a + _CHUNK].astype(np.int64)
        c = cur[a:a + _CHUNK].astype(np.int64)
        co += np.bincount((p[:, :, None] * n_expert + c[:, None, :]).ravel(), minlength=n_expert * n_expert)
    return co.reshape(n_expert, n_expert).astype(np.float64)


def predict_routes(model: str, routes: Routes, n_expert: int, top: int | None = None,
                   progress: Callable[[int, int], None] | None = None) -> PredictReport:
    """Per MoE layer: train on the first half of the tokens, score on the second. The predictor guesses the
    ``top`` experts (default k) with the highest sum, over the previous layer's selected experts p, of
    P(expert | p) counted on the train half; ties go to the more frequent expert. The baseline guesses the
    layer's ``top`` most frequent experts. Memory: a layer's tokens at a time (two columns of the routing)
    and chunks of them; ``progress(layers done, layers)``."""
    k = routes.k
    top = k if top is None else top
    if not 1 <= top <= n_expert:
        raise ToolInputError(f"--top must be from 1 to {n_expert}, got {top}")
    half = routes.n_tokens // 2
    if half < 2:
        raise ToolInputError(f"{routes.n_tokens} tokens: too few to train on one half and score the other")
    train, test = routes.experts[:half], routes.experts[half:]
    ok_train, ok_test = routes.computed[:half], routes.computed[half:]
    layers = []
    for j, il in enumerate(routes.layers):
        cur_train = train[ok_train[:, j], j]
        cur_test = test[ok_test[:, j], j]
        freq = np.bincount(cur_train.ravel(), minlength=n_expert)[:n_expert].astype(np.float64)
        popular = np.argsort(-freq, kind="stable")[:top]
        found = sum(_found(np.broadcast_to(popular, (len(cur_test[a:a + _CHUNK]), top)), cur_test[a:a + _CHUNK])
                    for a in range(0, len(cur_test), _CHUNK))
        baseline = found / max(cur_test.size, 1)
        del cur_train, cur_test
        predictor = None
        if j > 0:
            both_train = ok_train[:, j] & ok_train[:, j - 1]
            both_test = ok_test[:, j] & ok_test[:, j - 1]
            co = _cooccurrence(train[both_train, j - 1], train[both_train, j], n_expert)
            cond = co / np.maximum(co.sum(axis=1, keepdims=True), 1.0)  # P(expert | previous expert)
            tie = freq / (freq.max() + 1.0) * 1e-6  # below any real difference: only breaks ties
            prev_t, cur_t = test[both_test, j - 1], test[both_test, j]
            found = 0
            for a in range(0, len(prev_t), _CHUNK):
                scores = cond[prev_t[a:a + _CHUNK]].sum(axis=1) + tie
                guess = np.argsort(-scores, axis=1, kind="stable")[:, :top]
                found += _found(guess, cur_t[a:a + _CHUNK])
            predictor = found / max(cur_t.size, 1)
        layers.append(LayerPrediction(il, routes.layers[j - 1] if j > 0 else None, predictor, baseline,
                                      int(ok_test[:, j].sum())))
        if progress:
            progress(j + 1, len(routes.layers))
    return PredictReport(model, routes.n_tokens, half, routes.n_tokens - half, k, top, tuple(layers))
