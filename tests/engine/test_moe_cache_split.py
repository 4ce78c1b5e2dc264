"""Upload mode is never bypassed: a ubatch that may select more distinct experts of a layer than its slots
(several sequences decoded together, or a cache smaller than a token's experts) is split. Its hits come from
the cache, its misses are uploaded into the slots it does not use, and those left without one are computed on
the CPU. On the real patched libllama with the CPU as the cache's device: tokens and logits identical to no
cache, counters equal to the independent replay (tests/oracles/lru.py)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.experts import expert_layout
from llama_moe.batch import stream_batch
from oracles.lru import simulate_lru
from support.cache_sizes import mib_for_slots

RAM = ModelParams(cpu_moe=True, repack=False)
# prompts of over 32 tokens each: their ubatches keep llama.cpp's path, but for the last layer's outputs
PROMPTS = [
    "The ship left the harbour at dawn, and the crew watched the grey cliffs fall behind them while the gulls "
    "circled the masts and the captain read the charts in silence below the deck",
    "To grow tomatoes in a small garden, start with good soil, a sunny corner, stakes for the stems, water "
    "in the morning and patience through the long weeks before the first fruit turns red",
    "The history of the city begins with a ford across the river, a market on the bank, a wall of timber, "
    "then stone, and the slow gathering of streets around the church and the bridge",
    "In the morning the baker lights the ovens long before the town wakes, shapes the loaves on the floured "
    "table, and listens to the first carts rattle over the cobbles outside the window",
]
N_STEPS = 64  # four sequences: 256 tokens decoded four at a time
SAMPLINGS = [Sampling(temperature=0.8, seed=s) for s in (11, 12, 13, 14)]  # greedy text of a tiny model loops


def _batch(model: Model, cp: ContextParams, trace: bool):
    """Every step's tokens and each sequence's logits, the counters and the routing trace."""
    with Context(model, cp) as ctx:
        if trace:
            ctx.start_trace()
        tokens, logits = [], []
        with stream_batch(ctx, PROMPTS, N_STEPS + 1, SAMPLINGS, stop_at_eog=False) as stream:
            for n, (i, tok) in enumerate(stream):
                tokens.append((i, tok))
                if n >= len(PROMPTS):  # a step's token: the step decoded every sequence, output i is sequence i
                    logits.append(ctx.logits(i))
        records = ctx.stop_trace() if trace else []
        return tokens, np.array(logits), ctx.moe_cache_stats(), ctx.layer_stats(), records


@pytest.mark.parametrize("slots_per_k", [2, 0.5])  # 2 k: four tokens may need 4 k; k / 2: one token is too many
def test_several_sequences_split_like_the_replay_and_change_nothing(lib, tiny_model_path, caplog, slots_per_k) -> None:
    layout = expert_layout(tiny_model_path)
    slots = int(slots_per_k * layout.n_expert_used)
    base = dict(n_ctx=1024, n_threads=2, n_seq_max=4)
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        assert all(len(model.tokenize(p)) > 32 for p in PROMPTS)
        plain_tokens, plain_logits, _, _, _ = _batch(model, ContextParams(moe_cache_device="CPU", **base), trace=False)
        tokens, logits, stats, layers, records = _batch(
            model, ContextParams(moe_cache_device="CPU", **base, moe_cache_mib=mib_for_slots(tiny_model_path, slots)), trace=True)
    assert len(tokens) == len(PROMPTS) * (N_STEPS + 1) and logits.shape[0] == len(PROMPTS) * N_STEPS
    assert tokens == plain_tokens
    assert np.array_equal(logits, plain_logits)
    split = [r for r in records if r.n_tokens <= 32 and r.experts.size > slots]
    assert len(split) >= N_STEPS * layout.n_moe_layers  # every step in every layer, and the prompts' last layer
    sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
    assert (stats.n_hit, stats.n_hit_profile, stats.n_miss, stats.n_cpu) == (sim.n_hit, 0, sim.n_miss, sim.n_cpu)
    assert {l.il: (l.n_hit, l.n_miss, l.n_cpu) for l in layers} == {
        il: (*sim.per_layer[il], sim.per_layer_cpu[il]) for il in sim.per_layer}
    assert stats.n_refused == 0 and all(l.n_refused == 0 for l in layers)
    # every distinct selection of a ubatch the cache serves is a hit or a miss
    assert stats.n_hit + stats.n_miss == sum(len(np.unique(r.experts)) for r in records if r.n_tokens <= 32)
    bytes_per_expert = layout.layers[0].bytes_per_expert
    assert stats.n_cpu > 0 and stats.n_bytes_cpu == stats.n_cpu * bytes_per_expert
    assert stats.n_bytes_upload == (stats.n_miss - stats.n_cpu) * bytes_per_expert
    assert stats.n_hit > 0 and stats.n_miss > stats.n_cpu  # the slots serve, and take new experts
    assert f"upload mode: {stats.n_cpu} missed experts computed on the CPU" in caplog.text
    full = 100.0 * stats.n_resident / stats.n_slots
    assert (f"{stats.n_hit} hits of {stats.n_lookup} lookups = {stats.n_hit / stats.n_lookup:.4f} "
            f"({stats.n_admitted} admitted, 0 refused, cache {full:.2f}% full)") in caplog.text


def test_one_sequence_on_slots_fewer_than_its_experts(lib, tiny_model_path) -> None:
    """A cache of fewer slots than a token selects: each token takes what the slots hold, and the CPU computes
    the rest; 256 tokens after a prompt of over 32, identical to no cache."""
    layout = expert_layout(tiny_model_path)
    slots = layout.n_expert_used - 1
    sampling = Sampling(temperature=0.8, seed=5)
    out = {}
    with Model(tiny_model_path, RAM) as model:
        for mib in (0, mib_for_slots(tiny_model_path, slots)):
            with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2, moe_cache_mib=mib)) as ctx:
                ctx.start_trace()
                toks = list(ctx.generate(PROMPTS[0], 256, sampling, stop_at_eog=False))
                out[mib] = (toks, ctx.logits(), ctx.moe_cache_stats(), ctx.stop_trace())
    (plain, plain_logits, _, _), (got, logits, stats, records) = out.values()
    assert got == plain and np.array_equal(logits, plain_logits)
    sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
    assert (stats.n_hit, stats.n_miss, stats.n_cpu, stats.n_refused) == (sim.n_hit, sim.n_miss, sim.n_cpu, 0)
    # a token's distinct experts are k: at most slots of them come from the cache, at least one from the CPU
    small = [r for r in records if r.n_tokens == 1]
    assert len(small) >= 255 * layout.n_moe_layers
    assert stats.n_cpu >= len(small) and stats.n_hit > 0
