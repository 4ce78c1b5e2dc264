"""Hybrid mode on the real patched libllama, the CPU as the cache device: the cached experts run from the
cache, the others on the CPU from RAM, in the same layer; nothing is uploaded while generating."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.errors import MoeCacheWarning
from llama_moe.tools.experts import expert_layout
from support.cache_sizes import mib_for_slots
from llama_moe.formats.profile import Profile, write_profile

PROMPTS = ["The ship left the harbour at dawn, and the crew", "To grow tomatoes in a small garden, start with"]
N_GEN = 96
RAM = ModelParams(cpu_moe=True, repack=False)


@pytest.fixture(scope="module")
def profile_path(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    layout = expert_layout(tiny_model_path)
    # a profile of a fixed, varied set per layer: some tokens hit, some miss
    ranked = [(l.il, (5 * l.il + 3 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers]
    path = tmp_path_factory.mktemp("profiles") / "tiny.strp"
    write_profile(path, Profile(layout.n_layer, layout.n_expert, 12, tuple(ranked)))
    return path


def _generate(model: Model, cp: ContextParams, prompt: str):
    with Context(model, cp) as ctx:
        ctx.start_trace()
        tokens = list(ctx.generate(prompt, max_tokens=N_GEN, stop_at_eog=False))
        logits = ctx.logits()
        records = ctx.stop_trace()
        resident = {il: set(ctx.resident(il).tolist()) for il in range(model.n_layer)}
        return tokens, logits, ctx.moe_cache_stats(), ctx.layer_stats(), records, resident


@pytest.mark.parametrize("prompt", PROMPTS)
def test_hybrid_is_bit_identical_and_its_counters_add_up(lib, tiny_model_path, profile_path, prompt) -> None:
    layout = expert_layout(tiny_model_path)
    slots = 12
    with Model(tiny_model_path, RAM) as model:
        plain_tokens, plain_logits, *_ = _generate(model, ContextParams(moe_cache_device="CPU", n_ctx=512), prompt)
        tokens, logits, stats, layers, records, resident = _generate(
            model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, slots, hybrid=True),
                                 moe_cache_profile=profile_path, moe_cache_hybrid=True), prompt)
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert stats.hybrid and stats.n_bytes_upload == 0 and stats.n_prefilled == slots * layout.n_moe_layers
    # nothing moves in hybrid mode: the resident sets are the profile's first pairs of each layer
    for l in layout.layers:
        assert resident[l.il] == {(5 * l.il + 3 * i) % layout.n_expert for i in range(slots)}
    small = [r for r in records if r.n_tokens <= 32]
    hits = sum(len(set(r.experts.ravel().tolist()) & resident[r.il]) for r in small)
    distinct = sum(len(set(r.experts.ravel().tolist())) for r in small)
    assert (stats.n_hit, stats.n_miss) == (hits, distinct - hits)
    assert stats.n_hit > 0 and stats.n_miss > 0 and stats.n_hit_profile == stats.n_hit
    assert stats.n_bytes_cpu == stats.n_miss * layout.layers[0].bytes_per_expert
    assert sum(l.n_hit for l in layers) == stats.n_hit


def test_hybrid_without_a_profile_starts_empty_and_says_so(lib, tiny_model_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        plain, *_ = _generate(model, ContextParams(moe_cache_device="CPU", n_ctx=512), PROMPTS[0])
        tokens, _, stats, *_ = _generate(model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True),
                                                              moe_cache_hybrid=True), PROMPTS[0])
    assert tokens == plain
    assert stats.n_hit == 0 and stats.n_miss > 0 and stats.n_prefilled == 0
    assert "impl: hybrid MoE cache: 0 layers held whole (GPU only), the others split between GPU and CPU" in caplog.text
    assert "starts empty" in caplog.text


def test_layers_held_whole_run_on_the_cache_only(lib, tiny_model_path, caplog) -> None:
    layout = expert_layout(tiny_model_path)
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        plain, plain_logits, *_ = _generate(model, ContextParams(moe_cache_device="CPU", n_ctx=512), PROMPTS[1])
        tokens, logits, stats, *_ = _generate(
            model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, layout.n_expert, hybrid=True),
                                 moe_cache_hybrid=True), PROMPTS[1])
    assert tokens == plain
    np.testing.assert_array_equal(logits, plain_logits)
    assert stats.n_hit == stats.n_miss == stats.n_bytes_cpu == 0  # whole layers need no lookups
    assert f"impl: hybrid MoE cache: {layout.n_moe_layers} layers held whole" in caplog.text


def test_adaptive_without_hybrid_is_ignored_with_a_warning(lib, tiny_model_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match="--moe-cache-adaptive without --moe-cache-hybrid is ignored"), \
             Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8),
                                          moe_cache_adaptive=True)) as ctx:
            assert ctx.moe_cache_stats() is not None
    assert "--moe-cache-adaptive without --moe-cache-hybrid is ignored" in caplog.text


@pytest.mark.parametrize("adaptive", [False, True])
def test_hybrid_with_expert_biases_is_bit_identical(lib, gpt_oss_path, tmp_path, caplog, adaptive) -> None:
    """gpt-oss adds a bias per expert to gate, up and down: each part adds those of the experts it computes
    (the device part from the cache's copies, zero in the null slot; the CPU part nothing for -1)."""
    caplog.set_level(logging.WARNING, logger="llama_moe.native")
    layout = expert_layout(gpt_oss_path)
    assert all(l.bias_bytes_per_expert > 0 for l in layout.layers)
    ranked = [(l.il, (3 * l.il + 5 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers]
    profile = tmp_path / "goss.strp"
    write_profile(profile, Profile(layout.n_layer, layout.n_expert, 10, tuple(ranked)))
    slots = 10
    mib = mib_for_slots(gpt_oss_path, slots, hybrid=True)
    with Model(gpt_oss_path, RAM) as model:
        for prompt in PROMPTS:
            plain_tokens, plain_logits, *_ = _generate(model, ContextParams(moe_cache_device="CPU", n_ctx=512), prompt)
            tokens, logits, stats, layers, _, _ = _generate(
                model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib, moe_cache_profile=profile, moe_cache_hybrid=True,
                                     moe_cache_adaptive=adaptive), prompt)
            assert tokens == plain_tokens
            np.testing.assert_array_equal(logits, plain_logits)
            assert stats.hybrid and all(l.n_slots == slots for l in layers)
            assert stats.n_hit > 0 and stats.n_miss > 0  # both parts ran
            per_expert = layout.layers[0].bytes_per_expert + layout.layers[0].bias_bytes_per_expert
            assert stats.n_bytes_cpu == stats.n_miss * per_expert
            assert (stats.n_swap > 0) == adaptive
    assert "cannot copy" not in caplog.text and "cannot split" not in caplog.text
