"""How well a layer's experts can be guessed before its router runs, from the previous layer's routing of
the same token: a co-occurrence predictor ranked on the first traces and scored on the others (on the first
half of a single trace and scored on its second), against the layer's most frequent experts (what a static
profile knows)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ToolInputError
from .heldout import document_split
from .routes import Routes
from .tracefiles import TraceRoutes, token_blocks

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
    held_out: str = ""       # how: "trained on traces 1-2 of 4, scored on traces 3-4", ...

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


def _cooccur(co: np.ndarray, prev: np.ndarray, cur: np.ndarray, n_expert: int) -> None:
    """Adds to ``co`` [n_expert * n_expert] how often expert q was selected in the layer with p in the
    previous one, per token; a chunk of tokens at a time."""
    for a in range(0, len(prev), _CHUNK):
        p = prev[a:a + _CHUNK].astype(np.int64)
        c = cur[a:a + _CHUNK].astype(np.int64)
        co += np.bincount((p[:, :, None] * n_expert + c[:, None, :]).ravel(), minlength=n_expert * n_expert)


def predict_routes(model: str, routes: Routes | TraceRoutes, n_expert: int, top: int | None = None,
                   progress: Callable[[int, int], None] | None = None) -> PredictReport:
    """Per MoE layer: train on the first traces, score on the others (``heldout.document_split``: the edge
    between trace files nearest the middle; a single trace at its middle, likely optimistic). The predictor guesses the
    ``top`` experts (default k) with the highest sum, over the previous layer's selected experts p, of
    P(expert | p) counted on the train half; ties go to the more frequent expert. The baseline guesses the
    layer's ``top`` most frequent experts. One pass over the tokens (trace files streamed): the train half
    adds to counts per layer (frequencies, and co-occurrences with the previous layer: n_layers x n_expert^2
    int64, 6 MiB at 48 x 128), which become guesses when the test half begins; nothing grows with the
    routing's length. ``progress(done, total)`` as it reads."""
    k = routes.k
    top = k if top is None else top
    if not 1 <= top <= n_expert:
        raise ToolInputError(f"--top must be from 1 to {n_expert}, got {top}")
    half, held_out = document_split(routes)
    if half < 2 or routes.n_tokens - half < 1:
        raise ToolInputError(f"{routes.n_tokens} tokens: too few to train on one half and score the other")
    n_layers = len(routes.layers)
    freq = np.zeros((n_layers, n_expert), dtype=np.int64)
    co = np.zeros((n_layers, n_expert * n_expert), dtype=np.int64)  # [j]: layer j against layer j - 1
    popular: np.ndarray | None = None
    cond: list[np.ndarray | None] = []
    tie: list[np.ndarray] = []
    found_base = np.zeros(n_layers, dtype=np.int64)
    size_base = np.zeros(n_layers, dtype=np.int64)
    found_pred = np.zeros(n_layers, dtype=np.int64)
    size_pred = np.zeros(n_layers, dtype=np.int64)
    n_test = np.zeros(n_layers, dtype=np.int64)
    for t, block in token_blocks(routes, [half], _CHUNK, progress):
        ok = block[:, :, 0] >= 0  # the layer computed the token
        if t < half:
            for j in range(n_layers):
                freq[j] += np.bincount(block[ok[:, j], j].ravel(), minlength=n_expert)[:n_expert]
                if j > 0:
                    both = ok[:, j] & ok[:, j - 1]
                    _cooccur(co[j], block[both, j - 1], block[both, j], n_expert)
            continue
        if popular is None:  # the train half is counted: the guesses
            f = freq.astype(np.float64)
            popular = np.argsort(-f, axis=1, kind="stable")[:, :top]
            for j in range(n_layers):
                c = co[j].reshape(n_expert, n_expert).astype(np.float64)
                # P(expert | previous expert)
                cond.append(c / np.maximum(c.sum(axis=1, keepdims=True), 1.0) if j > 0 else None)
                tie.append(f[j] / (f[j].max() + 1.0) * 1e-6)  # below any real difference: only breaks ties
            del co
        for j in range(n_layers):
            cur = block[ok[:, j], j]
            found_base[j] += _found(np.broadcast_to(popular[j], (len(cur), top)), cur)
            size_base[j] += cur.size
            n_test[j] += int(ok[:, j].sum())
            if j > 0:
                both = ok[:, j] & ok[:, j - 1]
                prev_t, cur_t = block[both, j - 1], block[both, j]
                scores = cond[j][prev_t].sum(axis=1) + tie[j]
                guess = np.argsort(-scores, axis=1, kind="stable")[:, :top]
                found_pred[j] += _found(guess, cur_t)
                size_pred[j] += cur_t.size
    layers = []
    for j, il in enumerate(routes.layers):
        predictor = int(found_pred[j]) / max(int(size_pred[j]), 1) if j > 0 else None
        layers.append(LayerPrediction(il, routes.layers[j - 1] if j > 0 else None, predictor,
                                      int(found_base[j]) / max(int(size_base[j]), 1), int(n_test[j])))
    return PredictReport(model, routes.n_tokens, half, routes.n_tokens - half, k, top, tuple(layers), held_out)
