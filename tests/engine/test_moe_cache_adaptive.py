"""The adaptive cache on the real patched libllama (CPU as the cache device): swaps follow the text and
never change what a token computes."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.experts import expert_layout
from support.cache_sizes import mib_for_slots
from llama_moe.formats.profile import Profile, write_profile

PROMPT = "The ship left the harbour at dawn, and the crew"
SAMPLING = Sampling(temperature=0.8, seed=3)  # sampled text: greedy decoding of a bigram model loops
N_GEN = 400
SLOTS = 8
RAM = ModelParams(cpu_moe=True, repack=False)


def _hybrid(path: Path, **kw) -> ContextParams:
    return ContextParams(moe_cache_device="CPU", n_ctx=1024, moe_cache_mib=mib_for_slots(path, SLOTS, hybrid=True), moe_cache_hybrid=True, **kw)


def _hit_rate_after(ctx: Context, warmup: int) -> tuple[list[int], float]:
    """Generates, and returns the tokens and the hit rate of the tokens after the first ``warmup``."""
    tokens, start = [], None
    for i, tok in enumerate(ctx.generate(PROMPT, N_GEN, SAMPLING, stop_at_eog=False)):
        tokens.append(tok)
        if i + 1 == warmup:
            start = ctx.moe_cache_stats()
    end = ctx.moe_cache_stats()
    hits, misses = end.n_hit - start.n_hit, end.n_miss - start.n_miss
    return tokens, hits / (hits + misses)


def test_adaptive_reaches_a_same_text_profile_and_changes_no_token(lib, tiny_model_path, tmp_path, caplog) -> None:
    layout = expert_layout(tiny_model_path)
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=1024)) as ctx:
            ctx.start_trace()
            plain = list(ctx.generate(PROMPT, N_GEN, SAMPLING, stop_at_eog=False))
            records = ctx.stop_trace()
        with Context(model, _hybrid(tiny_model_path, moe_cache_adaptive=True)) as ctx:
            adaptive, adaptive_rate = _hit_rate_after(ctx, 100)
            stats = ctx.moe_cache_stats()
        # a profile made from the same text: each layer's most selected experts
        counts = np.zeros((layout.n_layer, layout.n_expert))
        for r in records:
            if r.n_tokens <= 32:
                counts[r.il, np.unique(r.experts)] += 1
        ranked = tuple((l.il, int(e)) for l in layout.layers for e in np.argsort(-counts[l.il], kind="stable")[:SLOTS])
        path = tmp_path / "same-text.strp"
        write_profile(path, Profile(layout.n_layer, layout.n_expert, SLOTS, ranked))
        with Context(model, _hybrid(tiny_model_path, moe_cache_profile=path)) as ctx:
            static, static_rate = _hit_rate_after(ctx, 100)
    assert adaptive == plain == static
    assert stats.n_swap > 0 and stats.n_prefilled == 0
    assert adaptive_rate >= 0.9 * static_rate, (adaptive_rate, static_rate)
    assert "adaptive hybrid MoE cache without a profile starts empty and fills itself" in caplog.text
    assert f"llama_moe_cache: adaptive: {stats.n_swap} experts swapped in" in caplog.text


def test_rebalance_on_request(lib, tiny_model_path) -> None:
    with Model(tiny_model_path, RAM) as model:
        with Context(model, _hybrid(tiny_model_path, moe_cache_adaptive=True)) as ctx:
            assert ctx.rebalance(64) == 0  # nothing is hot yet
            ctx.decode(model.tokenize(PROMPT))
            ctx.decode(model.tokenize(" and then the wind rose over the water"))
            swapped = ctx.rebalance(3)
            assert 0 < swapped <= 3
            assert ctx.moe_cache_stats().n_swap >= swapped
            with pytest.raises(ValueError):
                ctx.rebalance(-1)
        with Context(model, _hybrid(tiny_model_path)) as ctx:
            assert ctx.rebalance(8) == -1  # hybrid without adaptive
        with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256)) as ctx:
            assert ctx.rebalance(8) == -1  # no cache at all


def test_rebalance_uploads_at_most_max_swaps_in_all(lib, tiny_model_path) -> None:
    """rebalance(n) on a partly filled cache that could both fill free slots and swap cold experts out: n
    uploads in all, the fills first (they evict nothing), and the rest on a later call."""
    layout = expert_layout(tiny_model_path)
    held = 5  # of the 8 slots of each layer
    fade = 0.5 ** (1 / 350)  # LLAMA_MOE_ADAPT_HALF_LIFE, per one-token ubatch
    with Model(tiny_model_path, RAM) as model:
        with Context(model, _hybrid(tiny_model_path, moe_cache_adaptive=True)) as ctx:
            ctx.start_trace()
            for tok in model.tokenize(PROMPT)[:6]:  # one at a time: under the 8 tokens of the first automatic round
                ctx.decode([tok])
            records = ctx.stop_trace()
            assert ctx.moe_cache_stats().n_resident == 0
            heat = np.zeros((layout.n_layer, layout.n_expert))
            for r in records:
                heat[r.il] *= fade
                heat[r.il, np.unique(r.experts)] += 1.0
            # each layer holds its coldest experts: the router's favourites are hot enough to replace them
            cold = {l.il: [int(e) for e in np.argsort(heat[l.il], kind="stable")[:held]] for l in layout.layers}
            for il, experts in cold.items():
                assert ctx.admit_experts(il, experts) == held
            fills = sum(min(SLOTS - held, int((heat[il] > 0).sum() - (heat[il, cold[il]] > 0).sum())) for il in cold)
            swaps = sum(int(np.sort(heat[il])[::-1][0] > 1.5 * heat[il, cold[il]].min() + 2.0) for il in cold)
            assert fills > 3 and swaps > 0  # the old caps (3 fills and 3 swaps apart) would upload more than 3
            before = ctx.moe_cache_stats()
            assert ctx.rebalance(3) == 3
            after = ctx.moe_cache_stats()
            assert after.n_swap - before.n_swap == 3
            assert after.n_resident == before.n_resident + 3  # three free slots filled, nothing evicted
            assert all(set(experts) <= set(ctx.resident(il).tolist()) for il, experts in cold.items())
            # what was left: the other fills and the swaps
            assert ctx.rebalance(64) > fills - 3
            assert any(not set(experts) <= set(ctx.resident(il).tolist()) for il, experts in cold.items())


def test_a_profiles_experts_start_with_a_prior_as_the_replay_has_it(lib, tiny_model_path, tmp_path) -> None:
    """A profile's experts start with the heat of their share of 64 tokens' picks (llama-moe-policy.h), so a few
    picks of text do not evict them. The engine's swaps and hits over a generation equal the simulator's replay of
    its trace (routing.policies.adaptive, the engine's own policy), and the swaps come late: a profile of other
    text is evicted only once the text's own picks outweigh the prior."""
    from llama_moe.tools.routing.policies import adaptive
    from llama_moe.tools.routing.routes import routes_from_records

    layout = expert_layout(tiny_model_path)
    # a profile of other text: each layer's experts by index from the top, which the text does not favour
    ranked = tuple((l.il, e) for l in layout.layers for e in range(layout.n_expert - 1, layout.n_expert - 1 - SLOTS, -1))
    path = tmp_path / "other.strp"
    write_profile(path, Profile(layout.n_layer, layout.n_expert, SLOTS, ranked))
    swaps = {}
    with Model(tiny_model_path, RAM) as model:
        for n in (32, 200):
            with Context(model, _hybrid(tiny_model_path, moe_cache_adaptive=True, moe_cache_profile=path)) as ctx:
                ctx.start_trace()
                list(ctx.generate(PROMPT, n, SAMPLING, stop_at_eog=False))
                records = ctx.stop_trace()
                stats = ctx.moe_cache_stats()
            swaps[n] = stats.n_swap
    routes = routes_from_records(records)
    slots = {l.il: SLOTS for l in layout.layers}
    replayed = adaptive(routes, slots, layout.n_expert, list(ranked))
    assert (stats.n_swap, stats.n_hit, stats.n_miss) == (replayed.n_swap + replayed.n_fill, replayed.n_hit, replayed.n_miss)
    assert replayed.n_swap > 0 and swaps[32] == 0  # the profile's experts outlast the first round's picks
