"""The recency head: attention that weights the last few tokens most, realised with RoPE alone.

Real routers reuse the experts of the previous tokens far more than chance (token-to-token
locality), and that is what makes an LRU beat a static profile. The synthetic model gets it
from one attention head of layer 0 whose query and key are the same constant vectors for every
token: with RoPE, the score between positions t and s is then a function of t - s alone,

    score(d) = kq_scale * mscale^2 * sum_i a_i cos(theta_i * d),   d = t - s >= 0,

a positive cosine series over the rotary frequencies, so d = 0 is its maximum at every distance
(no far token can outscore the near ones). The amplitudes a_i >= 0 are fitted so that
score(0) - score(d) rises about linearly for the first few ``tokens`` and then saturates: the
head averages its values over an exponentially fading window of the recent tokens. Its values
are a random projection of each token's embedding, written into the residual's M columns,
which every router reads; adjacent tokens then see nearly the same M and pick overlapping
experts, while a shuffled sequence would not.

Beyond a few thousand tokens the far tokens together weigh about as much as the near ones (the
series cannot suppress them all), so M fades toward a slowly moving average of the context.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from llama_moe.tools.synth.shapes import Shape

HEAD = 1  # the query head that carries recency (head 0 carries the topic context)
R_M = 16  # dims of the recency memory (M columns of the residual, values of the head)
SATURATION = 10.0  # score(0) - score(d) for far tokens: their weight is ~exp(-10) each
FIT_TOKENS = 4096  # distances the amplitudes are fitted over
SINK = -30.0  # gpt-oss: the recency head's attention sink, so it takes no weight

# RoPE of the architectures (synthesize.py writes these keys; values checked there)
QWEN3_FREQ_BASE = 1_000_000.0
GPT_OSS_FREQ_BASE = 150_000.0
GPT_OSS_YARN_FACTOR = 32.0
GPT_OSS_YARN_BETA = (32.0, 1.0)


def kv_head(shape: Shape) -> int:
    """The kv head the recency head reads (ggml broadcasts query head h to kv head h // group)."""
    return HEAD // (shape.n_head // shape.n_head_kv)


def value_offset(shape: Shape, r_t: int) -> int:
    """First value dim of the recency head: kv head 0 carries the topic profile in dims 0..r_t-1."""
    return r_t if kv_head(shape) == 0 else 0


def rope_frequencies(shape: Shape) -> tuple[np.ndarray, float]:
    """(theta [head_dim/2], mscale): the angle per position of each NEOX pair and the factor ggml
    multiplies cos/sin by, as ggml's rope (with YaRN for gpt-oss, ext_factor 1) computes them."""
    n_dims = shape.head_dim
    i = np.arange(n_dims // 2, dtype=np.float64)
    if shape.arch != "gpt-oss":
        return QWEN3_FREQ_BASE ** (-2.0 * i / n_dims), 1.0
    base, factor = GPT_OSS_FREQ_BASE, GPT_OSS_YARN_FACTOR
    freq_scale = 1.0 / factor
    n_ctx_orig = max(1, int(shape.n_ctx_train / factor))

    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(GPT_OSS_YARN_BETA[0])))
    high = min(n_dims - 1.0, math.ceil(corr_dim(GPT_OSS_YARN_BETA[1])))
    y = (i - low) / max(0.001, high - low)
    ramp_mix = 1.0 - np.clip(y, 0.0, 1.0)  # ext_factor 1
    extrap = base ** (-2.0 * i / n_dims)
    theta = extrap * freq_scale * (1.0 - ramp_mix) + extrap * ramp_mix
    # llama.cpp sets attn_factor so that ggml's own YaRN magnitude factor is the one applied
    mscale = 1.0 + 0.1 * math.log(1.0 / freq_scale)
    return theta, mscale


def _nnls(a: np.ndarray, b: np.ndarray, sweeps: int = 300) -> np.ndarray:
    """Non-negative least squares by cyclic coordinate descent (deterministic, small problems)."""
    ata, atb = a.T @ a, a.T @ b
    x = np.zeros(a.shape[1])
    for _ in range(sweeps):
        for j in range(x.size):
            if ata[j, j] > 0:
                x[j] = max(0.0, x[j] + (atb[j] - ata[j] @ x) / ata[j, j])
    return x


@lru_cache(maxsize=16)
def head_vectors(shape: Shape, tokens: float) -> tuple[np.ndarray, np.ndarray]:
    """(q, k) [head_dim] float32: the recency head's query and key after their norms (qwen3moe)
    or biases (gpt-oss), before RoPE. Pair i holds sqrt(a_i / (kq_scale mscale^2)) in its first
    dim in both, so their dot product after RoPE is the fitted series."""
    theta, mscale = rope_frequencies(shape)
    d = np.arange(FIT_TOKENS + 1, dtype=np.float64)
    target = np.minimum(d / tokens, SATURATION)
    weight = np.where(d < 6 * tokens, 1.0, 0.05)  # the near part matters most
    amp = _nnls((1.0 - np.cos(np.outer(d, theta))) * weight[:, None], target * weight)
    kq_scale = 1.0 / math.sqrt(shape.head_dim)
    half = np.sqrt(amp / (kq_scale * mscale * mscale))
    q = np.zeros(shape.head_dim, dtype=np.float32)
    q[: shape.head_dim // 2] = half
    q.setflags(write=False)
    return q, q.copy()


def _rope(x: np.ndarray, pos: np.ndarray, theta: np.ndarray, mscale: float) -> np.ndarray:
    """ggml's NEOX rope of one vector at each position: [n, head_dim]."""
    h = x.size // 2
    ang = np.outer(pos, theta)
    c, s = np.cos(ang) * mscale, np.sin(ang) * mscale
    lo, hi = x[:h].astype(np.float64), x[h:].astype(np.float64)
    return np.concatenate([lo * c - hi * s, lo * s + hi * c], axis=1)


@lru_cache(maxsize=16)
def _scores(shape: Shape, tokens: float, n: int) -> np.ndarray:
    theta, mscale = rope_frequencies(shape)
    q, k = head_vectors(shape, tokens)
    pos = np.arange(n, dtype=np.float64)
    qt = _rope(q, pos[-1:], theta, mscale)[0]
    ks = _rope(k, pos, theta, mscale)
    out = (ks @ qt)[::-1] / math.sqrt(shape.head_dim)  # distance d = (n - 1) - s
    out.setflags(write=False)
    return out


def scores(shape: Shape, tokens: float, n: int) -> np.ndarray:
    """[n] the head's score at distances 0..n-1 (a query at position n-1 against every key)."""
    size = 1 << max(6, (n - 1).bit_length())  # cached in powers of two
    return _scores(shape, tokens, size)[:n]


def mix(values: np.ndarray, shape: Shape, tokens: float, window: int = 0, sink: float | None = None) -> np.ndarray:
    """[n, r] the head's output at each position: softmax over the keys s <= t (and t - s < window
    if a window is set) of score(t - s), weighting ``values`` [n, r]; an attention sink adds
    exp(sink) to the softmax's denominator."""
    n = values.shape[0]
    sc = scores(shape, tokens, n).astype(np.float64)
    if window and window < n:
        sc = sc.copy()
        sc[window:] = -np.inf
    top = sc[0]
    w = np.exp(sc - top)  # [n] weight at distance d
    out = np.empty((n, values.shape[1]))
    for j in range(values.shape[1]):
        out[:, j] = np.convolve(values[:, j].astype(np.float64), w)[:n]
    den = np.cumsum(w)[: n]
    if sink is not None:
        den = den + math.exp(sink - top)
    return out / den[:, None]
