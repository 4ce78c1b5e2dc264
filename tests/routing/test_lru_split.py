"""The package's lru policy follows upload mode's split: a ubatch that selects more distinct experts of a layer
than its slots takes its hits from the cache, uploads misses into the slots it does not use while any is left,
and leaves the others to the CPU (n_cpu). Its replay of the engine's own trace equals the engine's counters on
the real patched libllama (several sequences at once, prompts in small ubatches, a profile, slots fewer than a
token selects), and it equals the independent replay of tests/oracles/lru.py on synthetic routing."""
from __future__ import annotations

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.formats.trace import RoutingRecord
from llama_moe.tools.routing import lru, routes_from_records
from llama_moe.tools.routing.routes import Routes
from llama_moe.batch import stream_batch
from oracles.lru import simulate_lru
from support.cache_sizes import mib_for_slots

RAM = ModelParams(cpu_moe=True, repack=False)
PROMPTS = [
    "The ship left the harbour at dawn, and the crew watched the grey cliffs fall behind them",
    "To grow tomatoes in a small garden, start with good soil, a sunny corner and stakes for the stems",
    "The history of the city begins with a ford across the river and a market on the bank",
]
SAMPLINGS = [Sampling(temperature=0.8, seed=s) for s in (21, 22, 23)]


def _engine(model: Model, cp: ContextParams, n_gen: int, several: bool):
    """The counters and the routing trace of three sequences decoded together (prompts in ubatches of
    ``cp.n_ubatch`` tokens), or of one sequence."""
    with Context(model, cp) as ctx:
        ctx.start_trace()
        if several:
            list(stream_batch(ctx, PROMPTS, n_gen, SAMPLINGS, stop_at_eog=False))
        else:
            list(ctx.generate(PROMPTS[0], n_gen, SAMPLINGS[0], stop_at_eog=False))
        return ctx.moe_cache_stats(), ctx.layer_stats(), ctx.stop_trace()


def _assert_replays_the_engine(stats, layers, records, slots: dict[int, int], n_expert: int,
                               profile: list[tuple[int, int]]) -> None:
    routes = routes_from_records(records)
    got = lru(routes, slots, n_expert, profile)
    assert (got.n_hit, got.n_hit_profile, got.n_miss, got.n_cpu) == (
        stats.n_hit, stats.n_hit_profile, stats.n_miss, stats.n_cpu)
    assert got.per_layer == {l.il: (l.n_hit, l.n_miss) for l in layers}
    assert got.per_layer_cpu == {l.il: l.n_cpu for l in layers}
    assert got.n_lookup == stats.n_lookup and stats.n_refused == 0
    # the oracle the engine is tested against counts the same
    want = simulate_lru(records, slots, n_expert, prefill=profile)
    assert (got.n_hit, got.n_hit_profile, got.n_miss, got.n_cpu, got.per_layer, got.per_layer_cpu) == (
        want.n_hit, want.n_hit_profile, want.n_miss, want.n_cpu, want.per_layer, want.per_layer_cpu)


@pytest.mark.parametrize("slots_of_k", [0.5, 1.25, 3])  # fewer than a token selects; one token fits, three not; more
def test_the_lru_replay_of_the_engines_trace_is_its_split(lib, tiny_model_path, tmp_path, slots_of_k) -> None:
    layout = expert_layout(tiny_model_path)
    k, n_expert = layout.n_expert_used, layout.n_expert
    n = int(slots_of_k * k)
    slots = {l.il: n for l in layout.layers}
    # a profile that fills part of every layer: its hits count as the profile's
    profile = [(l.il, (5 * l.il + i) % n_expert) for l in layout.layers for i in range(max(1, n // 2))]
    path = tmp_path / "p.strp"
    write_profile(path, Profile(layout.n_layer, n_expert, n, tuple(profile)))
    cp = ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2, n_seq_max=3, n_batch=64, n_ubatch=8,
                       moe_cache_mib=mib_for_slots(tiny_model_path, n), moe_cache_profile=path)
    with Model(tiny_model_path, RAM) as model:
        stats, layers, records = _engine(model, cp, 24, several=True)
    assert {l.n_slots for l in layers} == {n} and stats.n_prefilled == len(profile)
    ubatches = routes_from_records(records)
    assert not ubatches.one_token_ubatches and int(ubatches.layer_tokens.max()) == 8  # prompts in ubatches of 8
    assert stats.n_cpu > 0 and stats.n_miss > stats.n_cpu and stats.n_hit_profile > 0
    _assert_replays_the_engine(stats, layers, records, slots, n_expert, profile)


def test_the_token_replay_of_the_engines_trace_is_its_split(lib, tiny_model_path) -> None:
    """One token a ubatch (the prompt too): the vectorised replay, every layer at once, on slots fewer than a
    token selects and on slots that take one token."""
    layout = expert_layout(tiny_model_path)
    k, n_expert = layout.n_expert_used, layout.n_expert
    with Model(tiny_model_path, RAM) as model:
        for n in (k - 1, k + 1):
            cp = ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, n_batch=1, n_ubatch=1,
                               moe_cache_mib=mib_for_slots(tiny_model_path, n))
            stats, layers, records = _engine(model, cp, 48, several=False)
            assert routes_from_records(records).one_token_ubatches
            assert (stats.n_cpu > 0) == (n < k) and stats.n_hit > 0
            _assert_replays_the_engine(stats, layers, records, {l.il: n for l in layout.layers}, n_expert, [])


def _synthetic(rng: np.random.Generator, n_ub: int, sizes: list[int], n_layers: int, n_expert: int,
               k: int) -> list[RoutingRecord]:
    """Records as the engine writes them: per ubatch every layer, a ubatch of over 32 tokens computing only
    its last token in the last layer at times; layer 0 picks from few experts (many hits)."""
    recs = []
    for _ in range(n_ub):
        n = int(rng.choice(sizes))
        for il in range(n_layers):
            rows = 1 if il == n_layers - 1 and n > 32 and rng.random() < 0.5 else n
            pool = 7 if il == 0 else n_expert
            recs.append(RoutingRecord(il, np.stack([rng.choice(pool, k, replace=False)
                                                    for _ in range(rows)]).astype(np.int32)))
    return recs


def test_the_lru_policy_equals_the_oracle_on_synthetic_routing() -> None:
    rng = np.random.default_rng(7)
    n_expert, k, n_layers = 16, 4, 3
    for trial in range(12):
        many = _synthetic(rng, 50, [1, 1, 2, 3, 5, 8, 40], n_layers, n_expert, k)  # the loop replay
        single = _synthetic(rng, 150, [1], n_layers, n_expert, k)                 # the token replay
        for n in (1, 2, 3, 4, 5, 7, 9, 13):
            slots = {il: min(n + il, n_expert) for il in range(n_layers)}  # the last may be held whole
            profile = [(il, int(e)) for e in rng.permutation(n_expert) for il in range(n_layers)][:int(rng.integers(0, 24))]
            for recs in (many, single):
                want = simulate_lru(recs, slots, n_expert, prefill=profile)
                got = lru(routes_from_records(recs), slots, n_expert, profile, chunk_tokens=int(rng.integers(1, 64)))
                assert (got.n_hit, got.n_hit_profile, got.n_miss, got.n_cpu) == (
                    want.n_hit, want.n_hit_profile, want.n_miss, want.n_cpu), (trial, n)
                assert got.per_layer == want.per_layer and got.per_layer_cpu == want.per_layer_cpu, (trial, n)
                assert got.hit_rate == want.hit_rate
        assert lru(routes_from_records(many), {il: 2 for il in range(n_layers)}, n_expert).n_cpu > 0


def test_a_split_uploads_into_the_slots_it_does_not_use_and_computes_the_rest_on_the_cpu() -> None:
    """Fewer slots than a token's k experts: each token's misses fill the slots in order, the rest go to the
    CPU; every selection is a lookup, so the hit rate is 0 here, not 1. The split depends on the distinct
    experts of a ubatch, not on its tokens x k."""
    r = Routes((0,), np.array([[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]], dtype=np.int32)[:, None, :],
               np.arange(4, dtype=np.int64))
    for slots in (1, 2, 3):
        res = lru(r, {0: slots}, 8)
        assert (res.n_hit, res.n_miss, res.n_cpu, res.n_split_lookups) == (0, 12, 3 * (4 - slots), 3)
        assert res.n_lookup == 12 and res.hit_rate == 0.0 and res.h_layer == 0.0
        assert res.layer_hit_rate(0) == 0.0 and res.per_layer_cpu == {0: 3 * (4 - slots)}
        assert res.n_resident == slots
    # the first token's first misses take the slots: the second token hits them and leaves its misses to the CPU
    hot = Routes((0,), np.array([[0, 1, 2, 3], [0, 1, 4, 5]], dtype=np.int32)[:, None, :], np.arange(3, dtype=np.int64))
    res = lru(hot, {0: 2}, 8)
    assert (res.n_hit, res.n_miss, res.n_cpu) == (2, 6, 4)  # 2, 3, then 4, 5 on the CPU
    fits = lru(r, {0: 4}, 8)
    assert (fits.n_cpu, fits.n_hit, fits.n_miss, fits.n_split_lookups) == (0, 0, 12, 0)
    # a ubatch of two tokens selecting 6 distinct experts: 6 slots take them all, 5 leave one to the CPU
    two = Routes((0,), np.array([[0, 1, 2, 3], [2, 3, 4, 5]], dtype=np.int32)[:, None, :], np.array([0, 2]))
    assert (lambda x: (x.n_hit, x.n_miss, x.n_cpu, x.n_token_layers))(lru(two, {0: 6}, 8)) == (0, 6, 0, 2)
    res = lru(two, {0: 5}, 8)
    assert (res.n_hit, res.n_miss, res.n_cpu, res.n_split_lookups, res.hit_rate) == (0, 6, 1, 1, 0.0)
