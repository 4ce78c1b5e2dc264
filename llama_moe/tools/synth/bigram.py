"""Bigram statistics of the corpus: the language the synthetic model speaks.

The model's next-token logits are fitted to log P(next | current) estimated here, so sampled
text recombines corpus phrases at shared words. Greedy decoding of a bigram model cycles
through the most likely chain of words (e.g. "of the ... of the"); sample with a temperature to
get varied text.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llama_moe.tools.synth.corpus import paragraphs
from llama_moe.tools.synth.tokenizer import ENDOFTEXT, IM_END, BpeTokenizer

# Probability of ending the reply (<|im_end|>) after a sentence-final ".": a chat reply ends
# after ~20 sentences (~500 tokens) on average. High enough to survive llama.cpp's default
# min_p; fixed-length benchmarks should ignore EOS.
P_END_AFTER_PERIOD = 0.05


@dataclass(frozen=True, eq=False)
class BigramStats:
    n_real: int
    counts: np.ndarray  # [n_real, n_real] float64: counts[u, v] of u followed by v
    unigram: np.ndarray  # [n_real] float64 counts of v as a successor
    topic_counts: np.ndarray  # [n_real, n_topics] occurrences of each token per topic
    emittable: np.ndarray  # [n_real] bool: tokens the model may generate
    topics: tuple[str, ...]


def corpus_bigrams(tok: BpeTokenizer, corpus: dict[str, str]) -> BigramStats:
    n = tok.n_real
    counts = np.zeros((n, n), dtype=np.float64)
    topic_counts = np.zeros((n, len(corpus)), dtype=np.float64)
    bos, end = tok.token_id(ENDOFTEXT), tok.token_id(IM_END)
    newline = tok.encode("\n")
    assert len(newline) == 1
    period = tok.encode(".")
    for k, text in enumerate(corpus.values()):
        ids = np.asarray(tok.encode(text), dtype=np.int64)
        np.add.at(counts, (ids[:-1], ids[1:]), 1.0)
        np.add.at(topic_counts, (ids, k), 1.0)
        for p in paragraphs(text):
            first = tok.encode(p)[0]
            # a paragraph starts after BOS, and after the "\n" that ends a ChatML header
            counts[bos, first] += 1.0
            counts[newline[0], first] += 1.0
    if len(period) == 1:
        c = counts[period[0]].sum()
        counts[period[0], end] += c * P_END_AFTER_PERIOD / (1.0 - P_END_AFTER_PERIOD)
    unigram = counts.sum(axis=0)
    emittable = unigram > 0
    return BigramStats(n, counts, unigram, topic_counts, emittable, tuple(corpus))


def log_probs(stats: BigramStats, alpha: float = 0.5) -> np.ndarray:
    """log P(v | u) over emittable v (others -inf): counts interpolated with the unigram
    distribution (a Dirichlet prior of strength ``alpha``), so unseen pairs stay possible."""
    uni = stats.unigram / stats.unigram.sum()
    row = stats.counts.sum(axis=1, keepdims=True)
    p = (stats.counts + alpha * uni[None, :]) / (row + alpha)
    with np.errstate(divide="ignore"):
        lp = np.log(p)
    lp[:, ~stats.emittable] = -np.inf
    return lp


def topic_profile(stats: BigramStats, prior: float = 1.0) -> np.ndarray:
    """[n_real, n_topics]: P(topic | token) minus the uniform 1/n_topics, scaled so a token seen
    in one topic only has norm ~1. Function words and unseen tokens come out near zero."""
    nt = stats.topic_counts.shape[1]
    c = stats.topic_counts
    p = (c + prior / nt) / (c.sum(axis=1, keepdims=True) + prior)
    tau = p - 1.0 / nt
    return tau / np.sqrt(1.0 - 1.0 / nt)
