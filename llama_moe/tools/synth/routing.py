"""Expert routing of a synthetic model, computed in numpy from token ids.

See config.RoutingConfig for the logit formula, design.py for how the weights realise it and
recency.py for the recency head. router_logits() follows the model's forward pass in float64,
leaving out only the MoE blocks' small outputs (down projections are ~1% of the residual) and
quantization; tests/test_synth.py and tests/test_synth_gpt_oss.py check it against llama.cpp's
own routing trace. The calibration against published measurements of real routing is in
calibrate.py and docs/synthetic-models.md.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from llama_moe.tools.synth.config import RoutingConfig
from llama_moe.tools.synth.corpus import load_corpus, paragraphs
from llama_moe.tools.synth.design import Design, build_design
from llama_moe.tools.synth.shapes import Shape, get_shape

__all__ = ["RoutingConfig", "corpus_routes", "next_token_logits", "route", "router_logits", "sample_routes"]


def _contexts(ids: np.ndarray, design: Design, mem: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per layer: (ctx [n, r_t], rho [n]) after that layer's attention. ``ctx`` is the C columns
    over g_t: layer l adds ``gamma[l] * mean_{s<=t} tau(s) / rho_in(s)``, where rho_in is the
    RMS of the layer's input; ``rho`` is the RMS of the residual the router sees, which holds
    the M columns ``mem`` from layer 0's attention on. With gpt-oss's sliding windows the mean
    runs over the window's tokens only, and an attention sink adds ``exp(sink)`` to the count
    it divides by."""
    d = design.shape.n_embd
    tau = design.tau[ids].astype(np.float64)
    pos = np.arange(1, ids.size + 1, dtype=np.float64)[:, None]
    ctx = np.zeros_like(tau)
    g2 = design.g_t**2
    m2 = np.sum(mem * mem, axis=1, keepdims=True) / d
    sink = design.sink_weight()
    for layer in range(design.shape.n_layer):
        rho_in = np.sqrt(1.0 + g2 * np.sum(ctx * ctx, axis=1, keepdims=True) / d + (m2 if layer else 0.0))
        total = np.cumsum(tau / rho_in, axis=0)
        count = pos
        w = design.window(layer)
        if w and ids.size > w:
            total[w:] -= total[:-w].copy()  # sum over s in (t - w, t]
            count = np.minimum(pos, float(w))
        if sink[layer]:
            count = count + sink[layer]
        ctx = ctx + design.gamma[layer] * total / count
        yield ctx, np.sqrt(1.0 + g2 * np.sum(ctx * ctx, axis=1) / d + m2[:, 0])


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
    mem = design.memory(ids, r)
    mem_scaled = mem / design.memory_scale(r)
    depth = r.depth(design.shape.n_layer)
    out = np.empty((ids.size, design.shape.n_layer, design.shape.n_expert), dtype=np.float64)
    for layer, (ctx, rho) in enumerate(_contexts(ids, design, mem)):
        p = depth[layer]
        topic = (tau + ctx) @ design.topic_w[layer].T
        recent = mem_scaled @ design.mem_w[layer].T
        z = r.token * tok[layer] + p * (r.topic * topic + r.recency * recent)
        if design.router_has_bias:  # gpt-oss: the hot-expert term is the router's bias, after the norm
            out[:, layer, :] = z / rho[:, None] + p * r.skew * design.bias[layer][None, :]
        else:
            out[:, layer, :] = (p * r.skew * design.bias[layer][None, :] + z) / rho[:, None]
    return out


def next_token_logits(tokens: Sequence[int] | np.ndarray, design: Design) -> np.ndarray:
    """[n_tokens, n_vocab_used] the model's output logits after each position (same
    approximation as router_logits), over the real tokens; padding tokens sit far below."""
    ids = _ids(tokens, design)
    ctx, rho = list(_contexts(ids, design, design.memory(ids)))[-1]
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


def corpus_routes(design: Design, routing: RoutingConfig | None = None) -> list[np.ndarray]:
    """route() of every paragraph of the embedded corpus, each as one prompt from position 0, in
    corpus order (topics as corpus.TOPICS, paragraphs as written)."""
    enc = design.tokenizer.encode
    return [route(enc(p), design, routing) for text in load_corpus().values() for p in paragraphs(text)]


def sample_routes(shape: str | Shape, seed: int = 0) -> list[np.ndarray]:
    """The experts a synthetic model of ``shape`` (a preset name, ``k=v,...`` or a Shape) made with
    ``seed`` selects for the embedded corpus, each paragraph one prompt: a list of int32 arrays
    [n_tokens, n_layer, k], best expert first. Numpy only; the same routing llama.cpp computes
    on the model ``python -m llama_moe synth --shape SHAPE --seed SEED`` writes."""
    return corpus_routes(build_design(get_shape(shape), seed))
