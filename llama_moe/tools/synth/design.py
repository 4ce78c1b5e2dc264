"""The weights of a synthetic model that matter, computed in numpy before anything is written.

The residual stream is laid out in an unrotated basis, then every weight is rotated by one
random orthogonal matrix (rmsnorm with unit weights is rotation invariant, so the model computes
the same thing, while its tensors look dense and quantization error spreads evenly):

====  ==========================================================================================
col   meaning
====  ==========================================================================================
0     a constant ``c0`` in every embedding: carries the output bias (unigram part of the logits,
      -big for tokens never to be sampled) and the router's per-expert bias (hot experts)
T     the token's topic profile over the eight corpus topics (scaled by ``g_t``)
C     empty in embeddings; attention writes the mean topic profile of the context here
M     empty in embeddings; layer 0's recency head writes the recency memory here (recency.py)
A     language-model features: a low-rank fit (SVD, then cross-entropy refinement when
      n_embd limits the rank) of the corpus log-bigram matrix
F     filler: random per token, so every embedding has exactly unit RMS (rmsnorm is then a
      no-op and the logit scale is the same for every token)
====  ==========================================================================================

Attention is made uniform over the causal prefix (zero queries give equal scores), V reads
the T columns and the output projection writes them into C, so after layer l the C columns hold
``Gamma_l * mean(topic profile of the tokens so far)``. One head of layer 0, the recency head
(recency.py), has a constant query and key, so RoPE alone makes its scores fall with distance:
it averages a random projection of the recent tokens' embeddings into the M columns. Experts' down projections are small, so
the MoE blocks add only a little noise. Hence the router input of every layer is, up to that
noise, computable in numpy from the token ids alone (see routing.py).

gpt-oss (``shape.arch == "gpt-oss"``) differs where its graph does: it has no q/k norms, so the
query weights themselves are tiny; every head has an attention sink, a logit that joins the
softmax as one more key with no value, so head 0's context is ``sum / (n_keys + exp(sink))``;
layers 0, 2, 4, ... see only the last ``n_swa`` tokens, so their context is the mean over that
window; and the router has a bias, which carries the hot-expert term ``skew * b`` (not divided
by the residual's RMS, unlike the constant column's). routing.py follows all of this.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from llama_moe.tools.synth.bigram import BigramStats, corpus_bigrams, log_probs, topic_profile
from llama_moe.tools.synth.config import RoutingConfig, routing_for
from llama_moe.tools.synth.corpus import load_corpus, paragraphs
from llama_moe.tools.synth.recency import R_M, SINK, mix
from llama_moe.tools.synth import recency
from llama_moe.tools.synth.shapes import Shape
from llama_moe.tools.synth.tokenizer import SPECIAL_TOKENS, BpeTokenizer, train_bpe

PAD_LOGIT_GAP = 30.0  # tokens never to be generated sit this far below the least likely real one
OUTPUT_TOPIC_BOOST = 3.0  # eta: how much the context's topic raises on-topic words' logits
MAX_MERGES_PER_DIM = 8  # learned vocabulary ~ 8 * n_embd: a small model gets a smaller vocabulary


@dataclass(frozen=True)
class Layout:
    """Column ranges of the unrotated residual stream."""

    n_embd: int
    r_t: int
    r_a: int
    r_m: int = R_M

    @property
    def t(self) -> slice:
        return slice(1, 1 + self.r_t)

    @property
    def c(self) -> slice:
        return slice(1 + self.r_t, 1 + 2 * self.r_t)

    @property
    def m(self) -> slice:
        return slice(1 + 2 * self.r_t, 1 + 2 * self.r_t + self.r_m)

    @property
    def a(self) -> slice:
        start = self.m.stop
        return slice(start, start + self.r_a)

    @property
    def f(self) -> slice:
        return slice(self.a.stop, self.n_embd)

    @property
    def af(self) -> slice:
        """A and F together: the token-identity part."""
        return slice(self.m.stop, self.n_embd)


@dataclass(frozen=True, eq=False)
class Design:
    shape: Shape
    seed: int
    routing: RoutingConfig
    tokenizer: BpeTokenizer
    layout: Layout
    c0: float
    g_t: float
    emb: np.ndarray  # [n_real, n_embd] unrotated embeddings of the real tokens, unit RMS rows
    out: np.ndarray  # [n_real, n_embd] unrotated output rows of the real tokens
    pad_logit: float  # bias logit of tokens never to be generated
    tau: np.ndarray  # [n_real, r_t] topic profiles
    bias: np.ndarray  # [n_layer, n_expert] per-expert router bias (before * skew)
    topic_w: np.ndarray  # [n_layer, n_expert, r_t] expert topic affinities (before * locality)
    tok_w: np.ndarray  # [n_layer, n_expert, n_embd] token-identity router rows (A and F columns)
    mem_w: np.ndarray  # [n_layer, n_expert, r_m] recency router rows (M columns), N(0, 1)
    phi_w: np.ndarray  # [r_m, n_embd] the recency head's values: orthonormal rows over A and F
    gamma: np.ndarray  # [n_layer] context each attention layer adds to the C columns
    rot: np.ndarray  # [n_embd, n_embd] orthogonal: stored = unrotated @ rot
    sinks: np.ndarray  # [n_layer, n_head] attention sink logits (gpt-oss); [n_layer, 0] without sinks
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def n_real(self) -> int:
        return self.emb.shape[0]

    @property
    def router_has_bias(self) -> bool:
        """The hot-expert term is the router's bias (gpt-oss), not a weight on the constant column."""
        return self.shape.arch == "gpt-oss"

    def sink_weight(self) -> np.ndarray:
        """[n_layer] exp(sink logit) of head 0, the head that carries the context; 0 without sinks."""
        if self.sinks.shape[1] == 0:
            return np.zeros(self.shape.n_layer)
        return np.exp(self.sinks[:, 0].astype(np.float64))

    def window(self, layer: int) -> int:
        """How many tokens (the current one included) ``layer``'s attention sees; 0: all of them."""
        return self.shape.n_swa if self.shape.is_swa(layer) else 0

    def router(self, layer: int, routing: RoutingConfig | None = None) -> np.ndarray:
        """[n_expert, n_embd] unrotated router matrix of ``layer``."""
        r = routing or self.routing
        lay = self.layout
        p = float(r.depth(self.shape.n_layer)[layer])
        w = r.token * self.tok_w[layer].astype(np.float64)
        w[:, 0] = 0.0 if self.router_has_bias else p * r.skew * self.bias[layer] / self.c0
        w[:, lay.t] = p * r.topic * self.topic_w[layer] / self.g_t
        w[:, lay.c] = p * r.topic * self.topic_w[layer] / self.g_t
        w[:, lay.m] = p * r.recency * self.mem_w[layer] / self.memory_scale(r)
        return w

    def router_bias(self, layer: int, routing: RoutingConfig | None = None) -> np.ndarray:
        """[n_expert] the router's bias (gpt-oss: the hot-expert term; zeros where it is a weight)."""
        if not self.router_has_bias:
            return np.zeros(self.shape.n_expert)
        r = routing or self.routing
        return float(r.depth(self.shape.n_layer)[layer]) * r.skew * self.bias[layer]

    def memory(self, ids: np.ndarray, routing: RoutingConfig | None = None) -> np.ndarray:
        """[n, r_m] the M columns after layer 0's attention for a sequence of real token ids
        starting at position 0 (layer 0's input is the embedding itself, of unit RMS)."""
        r = routing or self.routing
        values = self.emb[ids].astype(np.float64) @ self.phi_w.T
        sink = SINK if self.sinks.shape[1] else None
        return mix(values, self.shape, r.recency_tokens, self.window(0), sink)

    def memory_scale(self, routing: RoutingConfig | None = None) -> float:
        """RMS of the norm of M over the corpus's tokens (each paragraph its own sequence), so the
        router's N(0, 1) rows over M, divided by it, give a term of RMS ``recency``."""
        tokens = (routing or self.routing).recency_tokens
        key = f"mem_scale:{tokens}"
        if key not in self._cache:
            sq = n = 0.0
            for text in load_corpus().values():
                for para in paragraphs(text):
                    ids = np.asarray(self.tokenizer.encode(para), dtype=np.int64)
                    m = self.memory(ids, replace(self.routing, recency_tokens=tokens))
                    sq += float(np.sum(m * m))
                    n += m.shape[0]
            self._cache[key] = np.array(np.sqrt(sq / max(n, 1.0)))
        return float(self._cache[key])

    def tok_logits(self) -> np.ndarray:
        """[n_layer, n_real, n_expert]: the token-identity term of every router for every token."""
        if "tok" not in self._cache:
            af = self.layout.af
            e = self.emb[:, af]
            tok = np.stack([e @ w[:, af].T for w in self.tok_w])
            tok.setflags(write=False)
            self._cache["tok"] = tok
        return self._cache["tok"]


def build_tokenizer(shape: Shape, corpus: dict[str, str]) -> BpeTokenizer:
    """The shape's tokenizer: BPE trained on the corpus, ~8 * n_embd merges at most (the corpus
    supports ~1,600), padded with unused tokens to n_vocab."""
    limit = min(shape.n_vocab - 256 - len(SPECIAL_TOKENS), MAX_MERGES_PER_DIM * shape.n_embd)
    merges = train_bpe(corpus.values(), limit)
    return BpeTokenizer.build(merges, shape.n_vocab)


def _rng(seed: int, *tag: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *tag]))


def random_rotation(n: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * np.sign(np.diag(r))[None, :]).astype(np.float32)  # Haar-distributed


def _fit_lm(stats: BigramStats, r_a: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Low-rank factors of the doubly centered log-bigram matrix.

    Returns (a [n_real, r_a], o [n_real, r_a], bias [n_real], pad_logit) such that
    ``bias[v] + a[u] . o[v]`` ~ log P(v | u) + const(u) for emittable v.
    """
    lp = log_probs(stats)
    em = stats.emittable
    lv = lp[:, em]
    row = lv.mean(axis=1, keepdims=True)
    col = lv.mean(axis=0, keepdims=True)
    grand = float(lv.mean())
    resid = lv - row - col + grand
    u, s, vt = np.linalg.svd(resid, full_matrices=False)
    r = min(r_a, len(s))
    root = np.sqrt(s[:r])
    a = u[:, :r] * root
    oe = vt[:r].T * root
    be = (col - grand).ravel()
    if r < len(s) and s[r] > 1e-6 * s[0]:
        # rank-limited: the SVD spreads its error over every entry, but sampling needs the
        # likely successors right, so refine by minimising cross-entropy to P(v | u)
        a, oe, be = _refine_cross_entropy(np.exp(lv), stats.counts.sum(axis=1), a, oe, be)
    o = np.zeros((stats.n_real, r_a))
    o[em, :r] = oe
    a_full = np.zeros((stats.n_real, r_a))
    a_full[:, :r] = a
    bias = np.full(stats.n_real, np.nan)
    bias[em] = be - be.mean()
    pad_logit = float(np.nanmin(bias)) - PAD_LOGIT_GAP
    bias[~em] = pad_logit
    return a_full, o, bias, pad_logit


def _refine_cross_entropy(p: np.ndarray, row_counts: np.ndarray, a: np.ndarray, o: np.ndarray,
                          b: np.ndarray, iters: int = 100, lr: float = 0.05) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adam on sum_u w_u * CE(P(.|u), softmax(b + a_u . o)), rows weighted by how often u occurs."""
    w = (row_counts + 0.5) / (row_counts + 0.5).sum()
    params = [a.copy(), o.copy(), b.copy()]
    m1 = [np.zeros_like(x) for x in params]
    m2 = [np.zeros_like(x) for x in params]
    b1, b2 = 0.9, 0.999
    for it in range(1, iters + 1):
        pa, po, pb = params
        z = pa @ po.T + pb
        z -= z.max(axis=1, keepdims=True)
        q = np.exp(z)
        q /= q.sum(axis=1, keepdims=True)
        g = (q - p) * w[:, None]
        grads = (g @ po, g.T @ pa, g.sum(axis=0))
        for x, gr, v1, v2 in zip(params, grads, m1, m2):
            v1 *= b1
            v1 += (1 - b1) * gr
            v2 *= b2
            v2 += (1 - b2) * gr * gr
            x -= lr * (v1 / (1 - b1**it)) / (np.sqrt(v2 / (1 - b2**it)) + 1e-8)
    return params[0], params[1], params[2]


def _hot_bias(g: np.ndarray) -> np.ndarray:
    """Map N(0,1) draws to Exp(1) - 1 (same rank order): a few experts get large positive biases
    (hot) while the rest stay close together, so no expert is starved outright."""
    upper = np.array([0.5 * math.erfc(x / math.sqrt(2.0)) for x in g])  # P(N > x)
    return -np.log(np.maximum(upper, 1e-300)) - 1.0


_CACHE: dict[tuple[Shape, int, RoutingConfig], Design] = {}
_CACHE_SIZE = 2


def build_design(shape: Shape, seed: int = 0, routing: RoutingConfig | None = None,
                 corpus: dict[str, str] | None = None) -> Design:
    """The design of a model; deterministic in (shape, seed, routing, corpus). Designs of the
    embedded corpus are cached (they take seconds), so their arrays are read-only."""
    routing = routing or routing_for(shape)
    if corpus is not None:
        return _build(shape, seed, routing, corpus)
    key = (shape, seed, routing)
    if key not in _CACHE:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = _build(shape, seed, routing, load_corpus())
    return _CACHE[key]


def _build(shape: Shape, seed: int, routing: RoutingConfig, corpus: dict[str, str]) -> Design:
    tok = build_tokenizer(shape, corpus)
    stats = corpus_bigrams(tok, corpus)
    d = shape.n_embd
    n_real = tok.n_real

    tau = topic_profile(stats)
    r_t = tau.shape[1]
    n_f_min = max(8, d // 16)
    r_a = d - 1 - 2 * r_t - R_M - n_f_min
    if r_a < 8:
        raise ValueError(f"n_embd {d} leaves no room for the language model")
    lay = Layout(d, r_t, r_a)
    if shape.n_head < 2:
        raise ValueError("a synthetic model needs at least 2 attention heads (topic and recency)")
    if recency.value_offset(shape, r_t) + R_M > shape.head_dim:
        raise ValueError(f"head_dim {shape.head_dim} cannot hold the topic profile and the recency memory "
                         f"({r_t} + {R_M} values in one kv head)")

    # norms, as shares of the unit-RMS embedding (squared norm = n_embd)
    c0 = float(np.sqrt(0.05 * d))
    g_t = float(np.sqrt(0.04 * d))
    a, o, bias_out, pad_logit = _fit_lm(stats, r_a)
    t_norm2 = (g_t * np.linalg.norm(tau, axis=1)) ** 2
    budget = d - c0 * c0 - t_norm2  # left for A and F
    a_norm2 = np.sum(a * a, axis=1)
    # scale A so its largest row takes at most 85% of its budget; o gets the inverse scale
    scale = float(np.sqrt(np.min(0.85 * budget / np.maximum(a_norm2, 1e-12))))
    a *= scale
    o /= scale
    f_norm = np.sqrt(np.maximum(budget - np.sum(a * a, axis=1), 0.0))

    rng = _rng(seed, 1)
    emb = np.zeros((n_real, d))
    emb[:, 0] = c0
    emb[:, lay.t] = g_t * tau
    emb[:, lay.a] = a
    fdir = rng.standard_normal((n_real, lay.f.stop - lay.f.start))
    emb[:, lay.f] = fdir / np.linalg.norm(fdir, axis=1, keepdims=True) * f_norm[:, None]

    gamma = np.zeros(shape.n_layer)
    if shape.n_layer == 1:
        gamma[0] = routing.context
    else:
        gamma[0] = routing.context / 2
        gamma[1:] = routing.context / 2 / (shape.n_layer - 1)

    out = np.zeros((n_real, d))
    out[:, 0] = bias_out / c0
    out[:, lay.a] = o
    # context topic boost: C holds Gamma_final * g_t * mean(tau); emittable tokens only
    boost = OUTPUT_TOPIC_BOOST * tau / (g_t * max(float(gamma.sum()), 1e-6))
    out[:, lay.c] = np.where(stats.emittable[:, None], boost, 0.0)
    out[:, lay.f] = rng.standard_normal((n_real, lay.f.stop - lay.f.start)) * (0.01 / np.sqrt(d))

    # routers
    n_l, n_e = shape.n_layer, shape.n_expert
    rrng = _rng(seed, 2)
    af_dim = d - lay.af.start
    tok_scale = 1.0 / np.sqrt(float(np.mean(budget)))
    bias = np.zeros((n_l, n_e))
    topic_w = np.zeros((n_l, n_e, r_t))
    tok_w = np.zeros((n_l, n_e, d), dtype=np.float32)
    mem_w = np.zeros((n_l, n_e, R_M))
    mrng = _rng(seed, 5)  # a draw of its own, so the other routers' draws stay as they were
    prev: tuple[np.ndarray, ...] | None = None
    for layer in range(n_l):
        fb = rrng.standard_normal(n_e)
        ft = rrng.standard_normal((n_e, r_t))
        fw = rrng.standard_normal((n_e, af_dim))
        fm = mrng.standard_normal((n_e, R_M))
        if prev is not None:
            perm = rrng.permutation(n_e)
            c = routing.layer_corr
            k = np.sqrt(1.0 - c * c)
            fb = c * prev[0][perm] + k * fb
            ft = c * prev[1][perm] + k * ft
            fw = c * prev[2][perm] + k * fw
            fm = c * prev[3][perm] + k * fm
        prev = (fb, ft, fw, fm)
        bias[layer] = _hot_bias(fb)
        topic_w[layer] = ft
        tok_w[layer][:, lay.af] = fw * tok_scale
        mem_w[layer] = fm
    # the recency head's values: orthonormal directions within A and F
    q, _ = np.linalg.qr(_rng(seed, 6).standard_normal((af_dim, R_M)))
    phi_w = np.zeros((R_M, d))
    phi_w[:, lay.af] = q.T

    rot = random_rotation(d, _rng(seed, 3))
    if shape.arch == "gpt-oss":
        # attention sinks, N(0, 1) per head and layer (a draw of their own: qwen3moe designs are unchanged)
        sinks = _rng(seed, 4).standard_normal((n_l, shape.n_head)).astype(np.float32)
        sinks[0, recency.HEAD] = SINK  # the recency head gives its sink no weight
    else:
        sinks = np.zeros((n_l, 0), dtype=np.float32)
    arrays = dict(emb=emb.astype(np.float32), out=out.astype(np.float32), tau=tau.astype(np.float32),
                  bias=bias, topic_w=topic_w, tok_w=tok_w, mem_w=mem_w, phi_w=phi_w, gamma=gamma, rot=rot, sinks=sinks)
    for a in arrays.values():
        a.setflags(write=False)
    return Design(shape=shape, seed=seed, routing=routing, tokenizer=tok, layout=lay, c0=c0, g_t=g_t,
                  pad_logit=pad_logit, **arrays)
