"""The admitting hybrid moving slots between layers online (moe_cache_repartition R) on the real patched libllama,
the CPU as the cache's device: every R decodes the engine splits the slots anew from each layer's observed miss
curve. Nothing a token computes changes, and the counters, the rounds and each layer's slots are those of the
simulator's replay of the engine's own routing trace (``admitN-repartR``, replayed by the engine's policies:
llama_moe.policy_replay)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, MoeCacheWarning, Sampling
from llama_moe.errors import ParameterError
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.trace import RoutingRecord
from llama_moe.policy_replay import PolicyReplay, ReplayPolicy, ReplayResult
from llama_moe.tools.routing.budget import layer_shapes
from support.cache_sizes import mib_for_slots
from support.traced import traced_generation

PROMPT = "The ship left the harbour at dawn, and the crew sang of the long way home. " * 3  # over 32 tokens
SAMPLING = Sampling(temperature=0.8, seed=3)
N_GEN = 256
SLOTS = 8
ADMIT = 2
PERIOD = 16
RAM = ModelParams(cpu_moe=True, repack=False)


def _params(path: Path, slots: int = SLOTS, **kw) -> ContextParams:
    return ContextParams(moe_cache_device="CPU", n_ctx=1024, moe_cache_mib=mib_for_slots(path, slots, hybrid=True), moe_cache_hybrid=True,
                         moe_cache_admit=ADMIT, moe_cache_repartition=PERIOD, **kw)


def _without_cache(model: Model, n_gen: int = N_GEN) -> tuple[list[int], np.ndarray]:
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=1024)) as ctx:
        return list(ctx.generate(PROMPT, n_gen, SAMPLING, stop_at_eog=False)), ctx.logits().copy()


def _replay(path: Path, records: list[RoutingRecord], slots: int) -> ReplayResult:
    layout = expert_layout(path)
    with PolicyReplay(layer_shapes(layout), {l.il: slots for l in layout.layers},
                      ReplayPolicy("hybrid", admit=ADMIT, repartition=PERIOD)) as replay:
        replay.feed_records(records)
        return replay.result()


@pytest.mark.parametrize("way", ["scheduler", "mailbox"])
def test_repartition_changes_no_token_and_follows_the_simulator(lib, tiny_model_path, caplog, way) -> None:
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        plain, plain_logits = _without_cache(model)
        # with the mailbox, one-token decodes hand over through it
        with Context(model, _params(tiny_model_path, n_threads=2, moe_cache_mailbox_on_cpu=way == "mailbox")) as ctx:
            assert ctx.cache_status().mailbox == (way == "mailbox")
            run = traced_generation(ctx, PROMPT, N_GEN, SAMPLING)
    records, stats, per_layer = run.records, run.stats, run.layers
    assert run.tokens == plain
    assert np.array_equal(run.logits, plain_logits)
    assert records[0].n_tokens > 32  # the prompt took llama.cpp's path, uncounted

    result = _replay(tiny_model_path, records, SLOTS)
    now = {l.il: l.n_slots for l in result.layers}
    assert result.n_repartition >= 1 and result.n_moved > 0  # the test sees slots move
    assert (stats.n_repartition, stats.n_moved) == (result.n_repartition, result.n_moved)
    assert {il: l.n_slots for il, l in per_layer.items()} == now
    assert {il: (l.n_hit, l.n_miss) for il, l in per_layer.items()} == {l.il: (l.n_hit, l.n_miss) for l in result.layers}
    assert sum(now.values()) == SLOTS * len(per_layer) == stats.n_slots  # moved, never made
    assert stats.n_admit == result.n_admit  # the last decode's misses wait for a next decode, in both
    assert f"moves slots between layers every {PERIOD} decodes" in caplog.text


def test_repartition_in_the_background_changes_no_token(lib, tiny_model_path) -> None:
    """As on a GPU: admissions upload in the background and land a decode later; a re-partition keeps a slot in
    flight in its pool entry, so the expert lands where the slot now is."""
    with Model(tiny_model_path, RAM) as model:
        plain, plain_logits = _without_cache(model)
        with Context(model, _params(tiny_model_path, slots=6, moe_cache_admit_async=True)) as ctx:
            got = list(ctx.generate(PROMPT, N_GEN, SAMPLING, stop_at_eog=False))
            logits = ctx.logits().copy()
            stats = ctx.moe_cache_stats()
            slots = [l.n_slots for l in ctx.layer_stats()]
    assert got == plain
    assert np.array_equal(logits, plain_logits)
    assert stats.n_moved > 0 and sum(slots) == 6 * len(slots) and len(set(slots)) > 1


def test_repartition_with_expert_biases_changes_no_token(lib, gpt_oss_path) -> None:
    """gpt-oss: the experts' biases share the pool's entries with the experts."""
    with Model(gpt_oss_path, RAM) as model:
        plain, plain_logits = _without_cache(model, 128)
        with Context(model, _params(gpt_oss_path, slots=4)) as ctx:
            got = list(ctx.generate(PROMPT, 128, SAMPLING, stop_at_eog=False))
            logits = ctx.logits().copy()
            assert ctx.moe_cache_stats().n_admit > 0
    assert got == plain
    assert np.array_equal(logits, plain_logits)


@pytest.mark.parametrize("kw, why", [
    (dict(moe_cache_repartition=-1), "moe_cache_repartition must be a whole number of decodes"),
    (dict(moe_cache_repartition=True), "moe_cache_repartition must be"),
])
def test_bad_repartition_settings_are_refused(kw, why) -> None:
    base = dict(moe_cache_mib=4, moe_cache_hybrid=True, moe_cache_admit=2)
    with pytest.raises(ParameterError, match=why):
        ContextParams(moe_cache_device="CPU", **{**base, **kw}).validate()


def test_repartition_without_admission_is_the_engines_to_refuse(lib, tiny_model_path) -> None:
    """Repartition follows the admitting hybrid's miss curves: without admission the engine drops it, says why
    and keeps the reason in the status; the slots stay as sized."""
    cp = ContextParams(moe_cache_device="CPU", n_ctx=1024, moe_cache_mib=mib_for_slots(tiny_model_path, SLOTS, hybrid=True),
                       moe_cache_hybrid=True, moe_cache_repartition=PERIOD)
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match=f"--moe-cache-repartition {PERIOD} needs the admitting hybrid"):
            ctx = Context(model, cp)
        with ctx:
            status = ctx.cache_status()
    assert status.mode == "hybrid" and "option_ignored" in status.reasons
