"""Expert routing of a synthetic model, computed in numpy from token ids.

How the router works
--------------------
See config.RoutingConfig for the logit formula and design.py for how the weights realise it.
In short, the router logit of expert e for token u at position t of layer l is::

    (skew * b[l,e] + tok[l,e](u) + locality * v[l,e] . (topic(u) + ctx[l](t))) / rho

with hot-expert biases b (N(0,1) draws mapped to Exp(1) - 1, so a few experts are hot and
none is starved outright), a token-identity term from random router rows applied to the
token's embedding, expert-topic affinities v applied to the token's topic profile plus the
mean topic profile of the context so far (carried by uniform attention), and each layer's
router correlated with the previous layer's (0.5) through a random permutation of experts.

router_logits() follows the model's forward pass in float64, leaving out only the MoE blocks'
small outputs (down projections are ~1% of the residual) and quantization. Checked against
llama.cpp (CPU build of 0c1e57098, eval callback on ``ffn_moe_topk-*``) on all 72 corpus
paragraphs: 98.0% of selected experts agree on ``tiny`` and 98.9% on ``small``, and the hit
rates below agree to 0.001. Next-token probabilities agree to ~0.01. gpt-oss (sliding windows,
attention sinks, router bias; see design.py): 97.7% on ``gpt-oss-tiny`` over the 24 test
paragraphs, most of which overrun its 32-token window (95.2% if the windows are left out).

Calibration (``python -m llama_moe.synth.calibrate --shape SHAPE [--search]``)
-----------------------------------------------------------------------------
Targets: a static profile holding the hottest 1/6 of each layer's experts hits 0.6447 of the
selected experts (Strata, 4,105 of 24,576 slots), and a per-layer LRU holding 1/8 of each
layer's experts hits ~0.67 (llama.cpp PR #27861, LRU-64 of 512). Both come from 512-expert
models (24,576 = 48 layers x 512; presumably Qwen3-Next-80B-A3B, top-10).

Method: every corpus paragraph is routed as its own sequence (72 paragraphs, 7,510 tokens with
the 1,863-token vocabulary of the large shapes). The static profile keeps, per layer, the
round(E/6) experts most selected on the 48 train paragraphs and is scored on the 24 held-out
test paragraphs (every third paragraph of each topic). The LRU (round(E/8) experts per layer,
a token's own experts never evicted while it runs) replays the test paragraphs in order.
Everything is averaged over seeds 0, 1, 2. A coarse grid (skew 0.6..2.0, locality 1..7) and a
fine grid around the best point, then a few hand-picked points, gave the defaults
skew=1.08, locality=3.3 (context=2.0, layer_corr=0.5 fixed). Both targets are met at once on
the qwen3-30b-a3b shape:

    shape           E/k      static 1/6 (target 0.6447)   LRU 1/8 (target 0.67)   per seed (static, lru)
    qwen3-30b-a3b   128/8    0.6458 (21 slots)            0.6708 (16 slots)       (.6516 .6722) (.6533 .6811) (.6324 .6589)
    tiny            32/4     0.5121 (5 slots)             0.4486 (4 slots)        (.4881 .4248) (.4750 .4220) (.5733 .4990)
    small           64/8     0.5078 (11 slots)            0.4800 (8 slots)        (.5012 .4759) (.5324 .4917) (.4897 .4723)
    gpt-oss-120b    128/4    0.7852 (21 slots)            0.8380 (16 slots)       (.7652 .8198) (.7957 .8475) (.7947 .8467)
    gpt-oss-20b     32/4     0.4893 (5 slots)             0.4722 (4 slots)        (.4734 .4607) (.4974 .4760) (.4972 .4800)
    512 experts     512/10   0.8569 (85 slots)            0.9138 (64 slots)       (.8518 .9112) (.8626 .9156) (.8564 .9145)

(the last row is the custom shape
``qwen3-30b-a3b,n_expert=512,n_expert_used=10,n_ff_exp=512,n_head=16,n_head_kv=2,head_dim=256``;
the gpt-oss rows are the gpt-oss architecture, whose router bias is not divided by the residual's
RMS; gpt-oss-120b's sizes as qwen3moe, ``gpt-oss-120b,arch=qwen3moe``, give 0.7788 and 0.8391)

Caveat: hit rates at fixed fractions are not scale free. An LRU of E/8 holds 2 tokens' worth
of experts on qwen3-30b-a3b (16 vs top-8) but 6.4 on the source model (64 vs top-10) and only
1 on tiny and small (capacity == k), and a top-4 router concentrates more on its hot experts.
The defaults are calibrated on qwen3-30b-a3b as asked; on other shapes they give the numbers
above, not the targets. Calibrated instead on the targets' own 512-expert top-10 shape, the
closest point is skew=0.52, locality=2.0 (config.SOURCE_SHAPE_ROUTING: static 0.6540, LRU 0.6858
there, seeds 0-2), which on qwen3-30b-a3b gives only static 0.4823, LRU 0.4516 (gpt-oss-120b:
0.5904, 0.5921; tiny: 0.3858, 0.3019). Which reading is right for a 128-expert model is not
known; the defaults are the more cache-friendly one. ``--search`` finds per-shape settings
(``synth --skew/--locality``).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from llama_moe.synth.config import RoutingConfig
from llama_moe.synth.design import Design

__all__ = ["RoutingConfig", "next_token_logits", "route", "router_logits"]


def _contexts(ids: np.ndarray, design: Design) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per layer: (ctx [n, r_t], rho [n]) after that layer's attention. ``ctx`` is the C columns
    over g_t: layer l adds ``gamma[l] * mean_{s<=t} tau(s) / rho_in(s)``, where rho_in is the
    RMS of the layer's input; ``rho`` is the RMS of the residual the router sees. With gpt-oss's
    sliding windows the mean runs over the window's tokens only, and an attention sink adds
    ``exp(sink)`` to the count it divides by."""
    d = design.shape.n_embd
    tau = design.tau[ids].astype(np.float64)
    pos = np.arange(1, ids.size + 1, dtype=np.float64)[:, None]
    ctx = np.zeros_like(tau)
    g2 = design.g_t**2
    sink = design.sink_weight()
    for layer in range(design.shape.n_layer):
        rho_in = np.sqrt(1.0 + g2 * np.sum(ctx * ctx, axis=1, keepdims=True) / d)
        total = np.cumsum(tau / rho_in, axis=0)
        count = pos
        w = design.window(layer)
        if w and ids.size > w:
            total[w:] -= total[:-w].copy()  # sum over s in (t - w, t]
            count = np.minimum(pos, float(w))
        if sink[layer]:
            count = count + sink[layer]
        ctx = ctx + design.gamma[layer] * total / count
        yield ctx, np.sqrt(1.0 + g2 * np.sum(ctx * ctx, axis=1) / d)


def _ids(tokens: Sequence[int] | np.ndarray, design: Design) -> np.ndarray:
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("route: tokens must be a non-empty 1-d sequence")
    if ids.min() < 0 or ids.max() >= design.n_real:
        raise ValueError(f"route: token ids must be real tokens in [0, {design.n_real})")
    return ids


def router_logits(tokens: Sequence[int] | np.ndarray, design: Design,
                  routing: RoutingConfig | None = None) -> np.ndarray:
    """[n_tokens, n_layer, n_expert] router logits of one sequence starting at position 0.

    Follows the model's forward pass with the MoE blocks' small outputs left out (see
    design.py): the router of layer l sees the token's embedding plus the context columns
    written by attention layers 0..l, divided by the residual's RMS.
    """
    r = routing or design.routing
    ids = _ids(tokens, design)
    tau = design.tau[ids].astype(np.float64)
    tok = design.tok_logits()[:, ids, :]  # [n_layer, n, n_expert]
    out = np.empty((ids.size, design.shape.n_layer, design.shape.n_expert), dtype=np.float64)
    for layer, (ctx, rho) in enumerate(_contexts(ids, design)):
        topic = (tau + ctx) @ design.topic_w[layer].T
        if design.router_has_bias:  # gpt-oss: the hot-expert term is the router's bias, after the norm
            out[:, layer, :] = (tok[layer] + r.locality * topic) / rho[:, None] + r.skew * design.bias[layer][None, :]
        else:
            z = r.skew * design.bias[layer][None, :] + tok[layer] + r.locality * topic
            out[:, layer, :] = z / rho[:, None]
    return out


def next_token_logits(tokens: Sequence[int] | np.ndarray, design: Design) -> np.ndarray:
    """[n_tokens, n_vocab_used] the model's output logits after each position (same
    approximation as router_logits), over the real tokens; padding tokens sit far below."""
    ids = _ids(tokens, design)
    ctx, rho = list(_contexts(ids, design))[-1]
    x = design.emb[ids].astype(np.float64)
    x[:, design.layout.c] = design.g_t * ctx
    return (x @ design.out.T.astype(np.float64)) / rho[:, None]


def route(tokens: Sequence[int] | np.ndarray, design: Design, routing: RoutingConfig | None = None,
          k: int | None = None) -> np.ndarray:
    """[n_tokens, n_layer, k] int32: the experts each layer selects for each token (best first)."""
    k = design.shape.n_expert_used if k is None else k
    z = router_logits(tokens, design, routing)
    top = np.argpartition(-z, k - 1, axis=2)[:, :, :k]
    order = np.argsort(-np.take_along_axis(z, top, axis=2), axis=2, kind="stable")
    return np.take_along_axis(top, order, axis=2).astype(np.int32)
