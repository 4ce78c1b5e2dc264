"""The MoE expert cache in upload mode, on the real patched libllama with the CPU as the cache device
(moe_cache_device="CPU"): identical results, counters that match the routing, profiles and splits."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from oracles.lru import simulate_lru
from llama_moe.tools.experts import expert_layout
from support.cache_sizes import mib_for_slots
from llama_moe.formats.profile import Profile, write_profile

PROMPT = "The ship left the harbour at dawn, and the crew"
N_GEN = 40
# experts in RAM, not repacked: the cache slices experts out of the model's own tensors
RAM = ModelParams(cpu_moe=True, repack=False)


def _run(path: Path, mp: ModelParams, cp: ContextParams, trace: bool = False):
    with Model(path, mp) as model, Context(model, cp) as ctx:
        if trace:
            ctx.start_trace()
        tokens = list(ctx.generate(PROMPT, max_tokens=N_GEN, stop_at_eog=False))
        logits = ctx.logits()
        records = ctx.stop_trace() if trace else []
        return tokens, logits, ctx.moe_cache_stats(), ctx.layer_stats(), records, \
            {il: ctx.resident(il) for il in range(model.n_layer)}


def _params(mib: float = 0, profile: Path | None = None, **kw) -> ContextParams:
    return ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, moe_cache_mib=mib, moe_cache_profile=profile, **kw)


def test_cache_gives_identical_tokens_and_logits(lib, tiny_model_path) -> None:
    plain_tokens, plain_logits, no_stats, _, _, _ = _run(tiny_model_path, RAM, _params())
    assert no_stats is None
    layout = expert_layout(tiny_model_path)
    for slots in (layout.n_expert_used, 2 * layout.n_expert_used, layout.n_expert):
        tokens, logits, stats, layers, _, _ = _run(tiny_model_path, RAM, _params(mib_for_slots(tiny_model_path, slots)))
        assert tokens == plain_tokens, f"{slots} slots per layer changed the text"
        np.testing.assert_array_equal(logits, plain_logits)
        assert stats is not None and stats.n_slots == slots * layout.n_moe_layers
        assert all(l.n_slots == slots for l in layers)
        if slots < layout.n_expert:
            assert stats.n_hit > 0 and stats.n_miss > 0
            # the prompt's ubatch selects more experts than slots: what found no slot the CPU computed
            assert stats.n_bytes_upload == (stats.n_miss - stats.n_cpu) * layout.layers[0].bytes_per_expert
            assert stats.n_bytes_cpu == stats.n_cpu * layout.layers[0].bytes_per_expert
        else:  # held whole: no lookups
            assert stats.n_hit == stats.n_miss == 0


def test_counters_match_an_independent_replay_of_the_routing(lib, tiny_model_path) -> None:
    layout = expert_layout(tiny_model_path)
    slots = 2 * layout.n_expert_used
    tokens, _, stats, layers, records, resident = _run(
        tiny_model_path, RAM, _params(mib_for_slots(tiny_model_path, slots)), trace=True)
    # the ubatches the cache looks up: up to 32 tokens
    small = [r for r in records if r.n_tokens <= 32]
    assert len(small) >= (N_GEN - 1) * layout.n_moe_layers
    sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
    assert (stats.n_hit, stats.n_miss, stats.n_cpu, stats.n_refused) == (sim.n_hit, sim.n_miss, sim.n_cpu, 0)
    for layer in layers:
        assert (layer.n_hit, layer.n_miss, layer.n_cpu) == (*sim.per_layer[layer.il], sim.per_layer_cpu[layer.il])
    # hits and misses are distinct experts per ubatch and layer
    distinct = sum(len(np.unique(r.experts)) for r in small)
    assert stats.n_hit + stats.n_miss == distinct
    # the prompt's ubatch may select more experts than slots: split in every layer but the last (one token there)
    assert any(r.n_tokens <= 32 and r.experts.size > slots for r in records)
    # what the cache holds at the end: the last experts each layer used
    for il in range(layout.n_layer):
        assert len(resident[il]) == slots
        last = [r for r in small if r.il == il][-1]
        assert set(last.experts.ravel()) <= set(resident[il].tolist())


def test_a_profile_fills_each_layer_with_its_own_hottest_experts(lib, tiny_model_path, tmp_path, caplog) -> None:
    layout = expert_layout(tiny_model_path)
    slots = 2 * layout.n_expert_used
    # layer 0's pairs come first and overflow its slots: that must not end the fill of the others
    ranked = [(0, e) for e in range(layout.n_expert)]
    ranked += [(l.il, (3 * l.il + i) % layout.n_expert) for l in layout.layers[1:] for i in range(slots - 1)]
    path = tmp_path / "p.strp"
    write_profile(path, Profile(layout.n_layer, layout.n_expert, slots, tuple(ranked)))
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    tokens, _, stats, layers, records, resident = _run(
        tiny_model_path, RAM, _params(mib_for_slots(tiny_model_path, slots), path), trace=True)
    assert f"MoE cache filled with {slots + (slots - 1) * (layout.n_moe_layers - 1)} experts" in caplog.text
    assert stats.n_prefilled == slots + (slots - 1) * (layout.n_moe_layers - 1)
    sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert, prefill=ranked)
    assert (stats.n_hit, stats.n_hit_profile, stats.n_miss) == (sim.n_hit, sim.n_hit_profile, sim.n_miss)
    plain_tokens, _, _, _, _, _ = _run(tiny_model_path, RAM, _params())
    assert tokens == plain_tokens


def _bad_profiles(tmp_path: Path, n_layer: int, n_expert: int) -> dict[str, tuple[bytes, str]]:
    good = Profile(n_layer, n_expert, 8, ((0, 1), (1, 2))).to_bytes()
    header = bytearray(good[:24])
    def with_u32(offset: int, value: int) -> bytes:
        b = bytearray(good)
        b[offset:offset + 4] = value.to_bytes(4, "little")
        return bytes(b)
    return {
        "truncated": (good[:30], "truncated"),
        "header only": (bytes(header[:10]), "truncated"),
        "magic": (b"XXXX" + good[4:], "magic"),
        "version": (with_u32(4, 7), "version 7"),
        "layers": (with_u32(8, n_layer + 1), f"made for {n_layer + 1} layers"),
        "experts": (with_u32(12, n_expert * 2), f"x {n_expert * 2} experts"),
        "n_ranked": (with_u32(20, n_layer * n_expert + 1), "n_ranked"),
        "pair range": (good[:24] + (n_layer).to_bytes(2, "little") + (0).to_bytes(2, "little") + good[28:],
                       "out of range"),
    }


def test_every_bad_profile_is_refused_and_the_cache_starts_empty(lib, tiny_model_path, tmp_path, caplog) -> None:
    layout = expert_layout(tiny_model_path)
    slots = 2 * layout.n_expert_used
    caplog.set_level(logging.WARNING, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        for name, (data, why) in _bad_profiles(tmp_path, layout.n_layer, layout.n_expert).items():
            path = tmp_path / f"{name.replace(' ', '_')}.strp"
            path.write_bytes(data)
            caplog.clear()
            with Context(model, _params(mib_for_slots(tiny_model_path, slots), path)) as ctx:
                stats = ctx.moe_cache_stats()
                assert stats is not None and stats.n_prefilled == 0, name
                assert all(len(ctx.resident(l.il)) == 0 for l in layout.layers), name
                assert list(ctx.generate(PROMPT, max_tokens=4, stop_at_eog=False)), name
            assert "refused" in caplog.text and why in caplog.text, (name, caplog.text)
        caplog.clear()
        with Context(model, _params(mib_for_slots(tiny_model_path, slots), tmp_path / "absent.strp")) as ctx:
            assert ctx.moe_cache_stats().n_prefilled == 0
        assert "cannot open" in caplog.text


def test_options_that_cannot_apply_warn(lib, tiny_model_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="llama_moe.native")
    with Model(tiny_model_path, ModelParams(repack=False)) as model:  # experts not in RAM on a GPU build,
        with Context(model, _params(0, moe_cache_hybrid=True)) as ctx:  # and no cache size: nothing to do
            assert ctx.moe_cache_stats() is None
        assert "--moe-cache-hybrid: no effect without --moe-cache-mib (there is no cache)" in caplog.text
    caplog.clear()
    with Model(tiny_model_path, RAM) as model:
        with Context(model, _params(0.01)) as ctx:
            assert ctx.moe_cache_stats() is None
        assert "cannot hold one expert per layer" in caplog.text


def test_multi_token_ubatches_take_the_cache_too(lib, tiny_model_path) -> None:
    """Ubatches of several tokens whose experts all fit the slots (a prompt fed in small pieces, parallel
    sequences) are looked up and computed from the cache like single tokens."""
    layout = expert_layout(tiny_model_path)
    slots = 3 * layout.n_expert_used  # a 3-token ubatch always fits
    small_batches = dict(n_batch=3, n_ubatch=3)
    plain_tokens, plain_logits, *_ = _run(tiny_model_path, RAM, _params(**small_batches))
    tokens, logits, stats, _, records, _ = _run(
        tiny_model_path, RAM, _params(mib_for_slots(tiny_model_path, slots), **small_batches), trace=True)
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert any(r.n_tokens == 3 for r in records)
    sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
    assert (stats.n_hit, stats.n_miss) == (sim.n_hit, sim.n_miss)


def _selected(records, layout, slots: int) -> dict[int, int]:
    """Per layer, the distinct experts of each ubatch (of up to 32 tokens) the cache serves: what hits and misses
    count between them."""
    out = {l.il: 0 for l in layout.layers}
    if slots < layout.n_expert:
        for r in records:
            if r.n_tokens <= 32:
                out[r.il] += len(np.unique(r.experts))
    return out


@pytest.mark.parametrize("slots_per_k", [2, 0.5])  # a 4-token ubatch needs 4 k: split; at k / 2 a token is too
def test_lookups_too_big_for_the_slots_are_split_and_counted(lib, tiny_model_path, caplog, slots_per_k) -> None:
    """A ubatch of several tokens on a cache too small for its experts: the lookup is split in every layer
    (hits from the cache, misses uploaded while slots the ubatch does not use remain, the rest on the CPU; the
    text is the same), and hits and misses add up to the selections, per layer and in all, as the replay of the
    engine's own routing counts them."""
    layout = expert_layout(tiny_model_path)
    slots = int(slots_per_k * layout.n_expert_used)
    pieces = dict(n_batch=4, n_ubatch=4)  # the prompt in ubatches of 4 tokens: 4 k selections each
    plain_tokens, plain_logits, *_ = _run(tiny_model_path, RAM, _params(**pieces))
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    tokens, logits, stats, layers, records, resident = _run(
        tiny_model_path, RAM, _params(mib_for_slots(tiny_model_path, slots), **pieces), trace=True)
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    # the prompt's ubatches are split in every layer, and the CPU computes what finds no slot (in every layer
    # when a token selects more experts than the slots)
    assert stats is not None and stats.n_refused == 0 and stats.n_cpu > 0
    assert all(l.n_cpu > 0 for l in layers) or slots >= layout.n_expert_used
    selected = _selected(records, layout, slots)
    for l in layers:
        assert l.n_hit + l.n_miss == selected[l.il] and l.n_refused == 0, l
    assert stats.n_hit + stats.n_miss == stats.n_lookup == sum(selected.values())
    sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
    assert (stats.n_hit, stats.n_miss, stats.n_cpu) == (sim.n_hit, sim.n_miss, sim.n_cpu)
    assert {l.il: (l.n_hit, l.n_miss, l.n_cpu) for l in layers} == {
        il: (*sim.per_layer[il], sim.per_layer_cpu[il]) for il in sim.per_layer}
    assert stats.hit_rate == pytest.approx(stats.n_hit / (stats.n_hit + stats.n_miss))
    assert stats.n_resident == sum(len(r) for r in resident.values())
    assert stats.n_bytes_upload == (stats.n_miss - stats.n_cpu) * layout.layers[0].bytes_per_expert
    assert stats.n_hit > 0 and stats.n_miss > stats.n_cpu
    full = 100.0 * stats.n_resident / stats.n_slots
    assert (f"{stats.n_hit} hits of {stats.n_lookup} lookups = {stats.n_hit / stats.n_lookup:.4f} "
            f"({stats.n_admitted} admitted, 0 refused, cache {full:.2f}% full)") in caplog.text
