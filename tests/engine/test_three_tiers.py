"""Three tiers: a device cache (moe_cache_mib) over the RAM tier (moe_ram_mib) over the model's file. On the real
patched libllama, the device cache held in RAM (moe_cache_device="CPU") stands in for a GPU's: in every mode the
tokens and logits are those of no cache (four sequences, prompts over 32 tokens beside the decodes, fewer slots
than a token's experts in both tiers), the RAM tier looks up exactly the experts the device's slots lacked, every
byte read from the file is one of its misses or a prompt's read, upload mode's two levels (exclusive: what moves up
leaves the tier, what the device lets go moves down) equal an independent replay of the trace
(tests/oracles/tiers.py), a read that fails fails its decode, and the hybrid's mailbox over the tier counts what
the scheduler's path counts."""
from __future__ import annotations

import dataclasses
import logging
import warnings

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.errors import NativeCallError
from llama_moe.tools.experts import expert_layout
from oracles.lru import simulate_lru
from oracles.tiers import simulate_three_tiers
from support.cache_sizes import mib_for_slots
from test_moe_cache_split import PROMPTS, _batch  # four sequences, prompts over 32 tokens, 64 steps

PLAIN = ModelParams(cpu_moe=True, repack=False)
LAZY = ModelParams(lazy_experts=True, repack=False)
BASE = dict(n_ctx=1024, n_threads=2, n_seq_max=4, moe_cache_device="CPU")

MODES = {
    "upload": dict(),
    "hybrid": dict(moe_cache_hybrid=True),  # no fill: every expert of the decodes from the RAM tier
    "admitting": dict(moe_cache_hybrid=True, moe_cache_admit=2),
    "adaptive": dict(moe_cache_hybrid=True, moe_cache_adaptive=True),
}


@pytest.fixture(scope="module")
def plain(lib, tiny_model_path):
    with Model(tiny_model_path, PLAIN) as model:
        tokens, logits, *_ = _batch(model, ContextParams(n_ctx=1024, n_threads=2, n_seq_max=4), trace=False)
    return tokens, logits


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("device_k,ram_k", [(0.5, 0.5), (2, 1)])  # slots per experts a token selects, in each tier
def test_three_tiers_change_nothing_and_the_tier_serves_what_the_device_lacks(
        lib, tiny_model_path, caplog, plain, mode, device_k, ram_k) -> None:
    layout = expert_layout(tiny_model_path)
    k = layout.n_expert_used
    dev_slots, ram_slots = max(1, int(device_k * k)), max(1, int(ram_k * k))
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(**BASE, **MODES[mode], moe_cache_mib=mib_for_slots(tiny_model_path, dev_slots, hybrid=mode != "upload"),
                       moe_ram_mib=mib_for_slots(tiny_model_path, ram_slots))
    with Model(tiny_model_path, LAZY) as model:
        tokens, logits, stats, layers, _ = _batch(model, cp, trace=False)
        with Context(model, cp) as ctx:
            status = ctx.cache_status()
    assert tokens == plain[0]
    assert np.array_equal(logits, plain[1])
    # the hybrid without a fill says it stays empty: every expert of the decodes comes from the RAM tier
    assert status.state == "on" or (mode == "hybrid" and status.reasons == ("stays_empty",)), status.text
    assert stats.ram_below and stats.ram_tier and stats.hybrid == (mode != "upload")
    assert all(l.n_slots == dev_slots for l in layers)
    # the RAM tier looks up what the device's slots lacked, distinct per ubatch: the decodes' misses, and what
    # admission and the adaptive rounds brought in between decodes
    assert stats.n_ram_hit + stats.n_ram_miss == stats.n_miss + stats.n_admit + stats.n_swap
    assert stats.n_ram_miss > 0 and stats.n_ram_hit > 0
    # every byte read from the file is a miss of the tier (into a slot, or beyond its slots for that read alone),
    # or a prompt's read into its staging copy; nothing through the mapping
    per_expert = layout.layers[0].bytes_per_expert
    assert stats.n_bytes_disk - stats.n_bytes_disk_prompt == stats.n_ram_miss * per_expert
    assert stats.n_bytes_disk_prompt > 0 and stats.n_bytes_disk_prompt % per_expert == 0
    assert sum(l.n_bytes_disk for l in layers) == stats.n_bytes_disk
    assert "the RAM tier under the cache held" in caplog.text


def _one_by_one(model: Model, cp: ContextParams, prompt: list[int]):
    """One sequence's greedy tokens over 64 steps, its last logits and the counters: one-token decodes, which
    the mailbox hands over."""
    with Context(model, cp) as ctx:
        tokens = list(ctx.generate(prompt, max_tokens=64, sampling=Sampling(temperature=0.0), stop_at_eog=False))
        return tokens, ctx.logits(), ctx.moe_cache_stats(), ctx.layer_stats()


@pytest.mark.parametrize("mode", ["hybrid", "admitting", "adaptive"])
def test_the_mailbox_computes_the_cpu_experts_from_the_tier(lib, tiny_model_path, caplog, mode) -> None:
    """The hybrid's mailbox over a RAM tier (moe_cache_mailbox_on_cpu: the CPU as the device, the protocol and the
    CPU side as on CUDA): its CPU side reads a token's experts into the tier's slots, then computes them there.
    Tokens and logits as no cache's, and every counter of both tiers as the scheduler's path counts it."""
    layout = expert_layout(tiny_model_path)
    k = layout.n_expert_used
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, PLAIN) as model:
        with Context(model, ContextParams(n_ctx=512, n_threads=2)) as ctx:
            prompt = ctx.tokenize(PROMPTS[0])  # over 32 tokens: the prompt takes the tier's staging copy
        plain_tokens, plain_logits, *_ = _one_by_one(model, ContextParams(n_ctx=512, n_threads=2), prompt)
    cp = ContextParams(n_ctx=512, n_threads=2, moe_cache_device="CPU", **MODES[mode],
                       moe_cache_mib=mib_for_slots(tiny_model_path, k // 2, hybrid=True),
                       moe_ram_mib=mib_for_slots(tiny_model_path, k + 1))
    with Model(tiny_model_path, LAZY) as model:
        caplog.clear()
        tokens, logits, stats, layers = _one_by_one(model, dataclasses.replace(cp, moe_cache_mailbox_on_cpu=True), prompt)
        said = caplog.text
        sched_tokens, sched_logits, sched_stats, sched_layers = _one_by_one(model, cp, prompt)
    assert f"mailbox: {len(layout.layers)} layers hand over" in said
    handovers = [line for line in said.splitlines() if "the CPU waited " in line and " hand-overs from the GPU" in line]
    assert handovers and int(handovers[-1].split("for each of ")[1].split()[0]) >= len(layout.layers) * 60
    assert tokens == sched_tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    np.testing.assert_array_equal(sched_logits, plain_logits)
    fields = ("n_hit", "n_miss", "n_admit", "n_swap", "n_ram_hit", "n_ram_miss", "n_disk_reads", "n_bytes_disk",
              "n_bytes_disk_prompt")
    assert {f: getattr(stats, f) for f in fields} == {f: getattr(sched_stats, f) for f in fields}
    assert stats.ram_below and stats.n_ram_miss > 0 and stats.n_ram_hit > 0
    assert [(l.n_hit, l.n_miss, l.n_bytes_disk) for l in layers] == [(l.n_hit, l.n_miss, l.n_bytes_disk) for l in sched_layers]


def test_the_mailbox_steps_aside_for_a_tier_smaller_than_a_token(lib, tiny_model_path, caplog) -> None:
    """A RAM tier with fewer slots than a token's experts cannot hold them all for the mailbox's CPU side: the
    hybrid hands over through the scheduler, which reads the rest through the tier's staging copy, and says so."""
    k = expert_layout(tiny_model_path).n_expert_used
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(n_ctx=256, n_threads=2, moe_cache_device="CPU", moe_cache_hybrid=True, moe_cache_mailbox_on_cpu=True,
                       moe_cache_mib=mib_for_slots(tiny_model_path, k // 2, hybrid=True),
                       moe_ram_mib=mib_for_slots(tiny_model_path, k - 1))
    with Model(tiny_model_path, PLAIN) as model:
        plain, *_ = _one_by_one(model, ContextParams(n_ctx=256, n_threads=2), [1, 2, 3])
    with Model(tiny_model_path, LAZY) as model:
        tokens, _, stats, _ = _one_by_one(model, cp, [1, 2, 3])
    assert f"fewer than the {k} experts a token selects; the hybrid hands over through the scheduler" in caplog.text
    assert tokens == plain and stats.n_ram_miss > 0


@pytest.mark.parametrize("device_k,ram_k", [(0.5, 1), (2, 2)])
def test_upload_modes_two_levels_equal_the_replay(lib, tiny_model_path, caplog, plain, device_k, ram_k) -> None:
    layout = expert_layout(tiny_model_path)
    k = layout.n_expert_used
    dev_slots, ram_slots = int(device_k * k), int(ram_k * k)
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(**BASE, moe_cache_mib=mib_for_slots(tiny_model_path, dev_slots),
                       moe_ram_mib=mib_for_slots(tiny_model_path, ram_slots))
    with Model(tiny_model_path, LAZY) as model:
        tokens, logits, stats, layers, records = _batch(model, cp, trace=True)
    assert tokens == plain[0] and np.array_equal(logits, plain[1])
    dev = simulate_lru(records, {l.il: dev_slots for l in layout.layers}, layout.n_expert)
    assert (stats.n_hit, stats.n_miss, stats.n_cpu) == (dev.n_hit, dev.n_miss, dev.n_cpu)
    sim = simulate_three_tiers(records, dev_slots, ram_slots, layout.n_expert)
    assert (stats.n_ram_hit, stats.n_ram_miss) == (sim.n_ram_hit, sim.n_ram_miss)
    assert sim.n_demoted > 0 and f"and took {sim.n_demoted} experts the device let go" in caplog.text
    per_expert = layout.layers[0].bytes_per_expert
    assert stats.n_bytes_disk - stats.n_bytes_disk_prompt == sim.n_ram_miss * per_expert


def test_a_read_that_fails_under_the_device_cache_fails_its_decode(lib, tiny_model_path, monkeypatch) -> None:
    layout = expert_layout(tiny_model_path)
    bad = layout.layers[1].il
    monkeypatch.setenv("LLAMA_MOE_TEST_DISK_FAIL_IL", str(bad))
    k = layout.n_expert_used
    cp = ContextParams(n_ctx=256, n_threads=2, moe_cache_device="CPU", moe_cache_hybrid=True, moe_cache_admit=2,
                       moe_cache_mib=mib_for_slots(tiny_model_path, k, hybrid=True), moe_ram_mib=mib_for_slots(tiny_model_path, k))
    with Model(tiny_model_path, LAZY) as model:
        with Context(model, cp) as ctx:
            monkeypatch.delenv("LLAMA_MOE_TEST_DISK_FAIL_IL")
            with pytest.raises(NativeCallError) as err:
                list(ctx.generate("Once upon a time", max_tokens=4, sampling=Sampling(temperature=0.0)))
            said = str(err.value)
            assert f"layer {bad}" in said and tiny_model_path.name in said and "Input/output error" in said
            with pytest.raises(NativeCallError):  # the slots it could not fill hold nothing: it fails again
                list(ctx.generate("Once", max_tokens=2, sampling=Sampling(temperature=0.0)))
        with Context(model, cp) as ctx:  # a context without the fault runs from the same model
            assert list(ctx.generate("Once upon a time", max_tokens=4, sampling=Sampling(temperature=0.0)))


def test_what_cannot_run_over_the_tier_is_refused_with_its_reason(lib, tiny_model_path) -> None:
    k = expert_layout(tiny_model_path).n_expert_used
    cp = ContextParams(n_ctx=256, n_threads=2, moe_cache_device="CPU", moe_cache_hybrid=True, moe_cache_admit=2,
                       moe_cache_admit_async=True, moe_cache_peer="CPU", moe_cache_mib=mib_for_slots(tiny_model_path, k, hybrid=True),
                       moe_ram_mib=mib_for_slots(tiny_model_path, k))
    with Model(tiny_model_path, LAZY) as model:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Context(model, cp) as ctx:
                status = ctx.cache_status()
                out = list(ctx.generate("Once upon a time", max_tokens=4, sampling=Sampling(temperature=0.0)))
                stats = ctx.moe_cache_stats()
    assert "option_ignored" in status.reasons and not status.peer
    assert "--moe-cache-peer, --moe-cache-admit-async 1: with a RAM tier under the device cache" in status.text
    assert any("RAM tier under the device cache" in str(w.message) for w in caught)
    assert len(out) == 4 and stats.ram_below and stats.n_hit_peer == 0


@pytest.mark.parametrize("mode", ["hybrid", "admitting"])
def test_three_tiers_on_a_model_with_expert_biases(lib, gpt_oss_path, mode) -> None:
    """gpt-oss's experts carry biases, which the CPU adds by expert: its layers read every CPU expert from the
    tier's staging copy instead of its slots. Tokens and logits as no cache's."""
    layout = expert_layout(gpt_oss_path)
    k = layout.n_expert_used
    base = dict(n_ctx=512, n_threads=2)
    with Model(gpt_oss_path, PLAIN) as model:
        with Context(model, ContextParams(**base)) as ctx:
            prompt = ctx.tokenize(PROMPTS[0])
            plain = list(ctx.generate(prompt, max_tokens=48, sampling=Sampling(temperature=0.0)))
    cp = ContextParams(**base, moe_cache_device="CPU", **MODES[mode],
                       moe_cache_mib=mib_for_slots(gpt_oss_path, k, hybrid=True), moe_ram_mib=mib_for_slots(gpt_oss_path, k))
    with Model(gpt_oss_path, LAZY) as model:
        with Context(model, cp) as ctx:
            tiers = list(ctx.generate(prompt, max_tokens=48, sampling=Sampling(temperature=0.0)))
            stats = ctx.moe_cache_stats()
    assert tiers == plain
    assert stats.ram_below and stats.n_ram_miss > 0 and stats.n_miss > 0
