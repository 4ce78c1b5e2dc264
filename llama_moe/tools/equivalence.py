"""Whether a cache mode computes what no cache computes: greedy tokens over n steps must be identical, or part
only at a near tie of the run without the cache (its top two logits closer than ``tolerance`` of the largest
|logit|), with the logits, fed that run's tokens (teacher forcing), within ``tolerance`` at every step. On one device the
hybrid and the upload cache are bit-identical to no cache; on a GPU a prompt of up to 32 tokens computes the
cached experts with the GPU's kernels, which round differently from the CPU's, so near ties can tip."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._native.env import environment
from ..context import Context
from ..model import Model
from ..params import ContextParams
from ..stats import MoeCacheStats

TOLERANCE = 1e-3
# another device's kernels against the CPU's: on an H200 the logits of every layer held whole on the GPU (no
# CPU part at all) were 1.5-1.7e-3 of the largest from no cache's; an expert computed wrongly moves them far more
DEVICE_TOLERANCE = 5e-3
# short prompts of real text: up to 32 tokens, they take the cache's path (on a GPU, its kernels)
PROMPTS = ("The ship left the harbour at dawn, and the crew", "To grow tomatoes in a small garden, start with",
           "The telescope was pointed at the northern sky")


@dataclass(frozen=True)
class Mode:
    """A cache mode to compare: its ContextParams fields, and the engine's test switches (environment variables
    of the tests' build, docs/configuration.md) set while its context is made."""
    cache: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)


def greedy_steps(model: Model, cp: ContextParams, prompt: str, n: int,
                 forced: list[int] | None = None) -> tuple[list[int], np.ndarray, MoeCacheStats | None]:
    """Greedy decoding, one token a decode: the tokens, every step's logits and the cache's counters
    (forced: feed those tokens instead)."""
    with Context(model, cp) as ctx:
        ctx.decode(model.tokenize(prompt))
        tokens, steps = [], []
        for i in range(n):
            logits = ctx.logits().copy()
            steps.append(logits)
            tokens.append(int(np.argmax(logits)) if forced is None else forced[i])
            ctx.decode([tokens[-1]])
        return tokens, np.stack(steps), ctx.moe_cache_stats()


def forced_steps(ctx: Context, tokens: list[int]) -> np.ndarray:
    """The logits after each of ``tokens``, decoded one a decode on the context as it stands."""
    out = []
    for t in tokens:
        ctx.decode([t])
        out.append(ctx.logits().copy())
    return np.array(out)


def max_rel_diff(steps: np.ndarray, ref_steps: np.ndarray) -> float:
    """The largest logit difference from the reference's, of the reference's largest |logit|."""
    return float(np.max(np.abs(steps - ref_steps))) / (float(np.max(np.abs(ref_steps))) or 1.0)


def top_gap(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


@dataclass(frozen=True)
class Comparison:
    identical: bool                 # the same tokens over every step
    first_part: int | None          # where they part
    max_diff_rel: float             # logits against no cache's (teacher-forced where they part), of max |logit|
    gap_rel: float | None           # no cache's top-two gap where they part, of max |logit|
    ok: bool
    stats: MoeCacheStats | None     # the cache's counters after the free-running decode
    tolerance: float = TOLERANCE    # what the logits and a near tie were held to

    def describe(self) -> str:
        if self.identical:
            return f"tokens identical, logits within {self.max_diff_rel:.1e} of the largest"
        return (f"tokens part at step {self.first_part} (no cache's top two {self.gap_rel:.1e} of the largest logit "
                f"apart{': a near tie' if self.gap_rel is not None and self.gap_rel <= self.tolerance else ''}), "
                f"teacher-forced logits within {self.max_diff_rel:.1e}")


def compare(model: Model, reference: tuple[list[int], np.ndarray], cp: ContextParams, prompt: str,
            tolerance: float = TOLERANCE) -> Comparison:
    """cp's decoding against a reference (greedy_steps of no cache on the same model and prompt)."""
    ref_tokens, ref_steps = reference
    tokens, steps, stats = greedy_steps(model, cp, prompt, len(ref_tokens))
    first = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), None)
    if first is None:
        diff = max_rel_diff(steps, ref_steps)
        return Comparison(True, None, diff, None, diff <= tolerance, stats, tolerance)
    _, forced, _ = greedy_steps(model, cp, prompt, len(ref_tokens), forced=ref_tokens)
    diff = max_rel_diff(forced, ref_steps)
    gap = top_gap(ref_steps[first]) / (float(np.max(np.abs(ref_steps))) or 1.0)
    return Comparison(False, first, diff, gap, gap <= tolerance and diff <= tolerance, stats, tolerance)


def reference(model: Model, prompt: str, n: int) -> tuple[list[int], np.ndarray]:
    """No cache: the tokens and logits every mode is compared with."""
    tokens, steps, _ = greedy_steps(model, ContextParams(n_ctx=1024), prompt, n)
    return tokens, steps


def compare_mode(model: Model, ref: tuple[list[int], np.ndarray], mode: Mode, cache_mib: float, prompt: str,
                 tolerance: float = TOLERANCE) -> Comparison:
    with environment(**mode.env):
        return compare(model, ref, ContextParams(n_ctx=1024, moe_cache_mib=cache_mib, **mode.cache), prompt, tolerance)
