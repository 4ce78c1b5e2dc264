"""Knobs of the synthetic router: how skewed and how local expert selection is."""
from __future__ import annotations

from dataclasses import dataclass

from llama_moe.errors import LlamaMoeError


@dataclass(frozen=True)
class RoutingConfig:
    """Router logit of expert e for a token u at position t in layer l (before softmax)::

        (skew * b[l,e] + tok[l,e](u) + locality * v[l,e] . (topic(u) + ctx[l](t))) / rho

    ``b`` ~ N(0,1) per-expert bias: a few hot experts per layer. ``tok`` ~ N(0,1): the token's
    own preference, from random router rows applied to its embedding, so similar tokens agree.
    ``v`` is each expert's affinity to the eight corpus topics; ``topic(u)`` is the token's
    topic profile and ``ctx`` the mean topic profile of the text so far, carried by attention,
    growing from ``context/2`` in layer 0 to ``context`` in the last layer. ``layer_corr``
    correlates each layer's router with the previous layer's, up to a permutation of experts.
    ``rho`` is the RMS norm of the residual stream.
    """

    skew: float = 1.08
    locality: float = 3.3
    context: float = 2.0
    layer_corr: float = 0.5

    def __post_init__(self) -> None:
        if self.skew < 0 or self.locality < 0 or self.context < 0:
            raise LlamaMoeError("routing: skew, locality and context must be >= 0")
        if not 0.0 <= self.layer_corr < 1.0:
            raise LlamaMoeError(f"routing: layer_corr must be in [0, 1), got {self.layer_corr}")


# The closest setting to the same targets when calibrated on the shape they were measured on
# (512 experts, top-10) instead of qwen3-30b-a3b; see routing.py. Less cache-friendly on
# 128-expert shapes than the defaults.
SOURCE_SHAPE_ROUTING = RoutingConfig(skew=0.52, locality=2.0)
