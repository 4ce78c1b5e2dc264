"""The engine's replay of its cache's policies (``llama_moe.policy_replay``) against the engine itself, on the real
patched libllama, the CPU as the cache's device: the routing trace of a real decode of a synthetic model, fed back
into the replay, gives the context's own counters, per layer and in all, and the same experts in the slots, in each
mode and at the edges (fewer slots than a token's experts, admissions as many as the slots or more, the
background's admissions, the mailbox, re-partitioning). What a size gives is what a context of that size reports,
and ``plan`` says the same."""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.errors import ParameterError
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.params import mib_to_bytes
from llama_moe.policy_replay import LayerShape, PolicyReplay, ReplayPolicy, max_ubatch, size_slots
from llama_moe.tools.cli import main
from llama_moe.tools.experts import expert_layout
from llama_moe.tools.routing.budget import layer_shapes
from support.cache_sizes import mib_for_slots
from support.traced import traced_generation

PROMPT = "The ship left the harbour at dawn, and the crew sang of the long way home. " * 3  # over 32 tokens
SAMPLING = Sampling(temperature=0.8, seed=3)
N_GEN = 160
RAM = ModelParams(cpu_moe=True, repack=False)


# name: (slots, context options, the replay's policy); the profile, where asked, ranks each layer's
# experts from the top, which the text does not favour, so that the adaptive rounds have work
CASES = {
    "upload": (8, {}, ReplayPolicy("upload")),
    "upload-fewer-slots-than-k": (2, {}, ReplayPolicy("upload")),
    "upload-profile": (8, {"profile": True}, ReplayPolicy("upload")),
    "hybrid-profile": (8, {"moe_cache_hybrid": True, "profile": True}, ReplayPolicy("hybrid")),
    "adaptive": (8, {"moe_cache_hybrid": True, "moe_cache_adaptive": True}, ReplayPolicy("adaptive")),
    "adaptive-profile": (6, {"moe_cache_hybrid": True, "moe_cache_adaptive": True, "profile": True},
                         ReplayPolicy("adaptive")),
    "admit2": (8, {"moe_cache_hybrid": True, "moe_cache_admit": 2}, ReplayPolicy("hybrid", admit=2)),
    "admit4-of-2-slots": (2, {"moe_cache_hybrid": True, "moe_cache_admit": 4}, ReplayPolicy("hybrid", admit=4)),
    "admit2-background": (6, {"moe_cache_hybrid": True, "moe_cache_admit": 2, "moe_cache_admit_async": True},
                          ReplayPolicy("hybrid", admit=2, admit_background=True)),
    "admit2-mailbox": (8, {"moe_cache_hybrid": True, "moe_cache_admit": 2, "moe_cache_mailbox_on_cpu": True},
                       ReplayPolicy("hybrid", admit=2)),
    "admit2-adaptive": (8, {"moe_cache_hybrid": True, "moe_cache_admit": 2, "moe_cache_adaptive": True},
                        ReplayPolicy("adaptive", admit=2)),
    "repartition": (8, {"moe_cache_hybrid": True, "moe_cache_admit": 2, "moe_cache_repartition": 16},
                    ReplayPolicy("hybrid", admit=2, repartition=16)),
}


def _other_text_profile(path: Path, tmp_path: Path, slots: int) -> tuple[Path, tuple[tuple[int, int], ...]]:
    layout = expert_layout(path)
    ranked = tuple((l.il, e) for l in layout.layers for e in range(layout.n_expert - 1, layout.n_expert - 1 - slots, -1))
    strp = tmp_path / "other.strp"
    write_profile(strp, Profile(layout.n_layer, layout.n_expert, slots, ranked))
    return strp, ranked


def _case(case: str, path: Path, tmp_path: Path) -> tuple[int, dict, ReplayPolicy, bool]:
    """CASES[case] made concrete: its slots, the context's options (a profile written where asked, and given to the
    replay as its ranked pairs), the replay's policy, and whether it is the hybrid."""
    slots, options, policy = CASES[case]
    options = dict(options)
    hybrid = bool(options.get("moe_cache_hybrid"))
    if options.pop("profile", False):
        options["moe_cache_profile"], ranked = _other_text_profile(path, tmp_path, slots)
        policy = replace(policy, ranked=ranked)
    return slots, options, policy, hybrid


@pytest.mark.parametrize("case", list(CASES))
def test_the_replay_of_a_decodes_trace_is_the_engines_own_count(lib, tiny_model_path, tmp_path, case) -> None:
    slots, options, policy, hybrid = _case(case, tiny_model_path, tmp_path)
    layout = expert_layout(tiny_model_path)
    cp = ContextParams(moe_cache_device="CPU", n_ctx=1024, moe_cache_mib=mib_for_slots(tiny_model_path, slots, hybrid), **options)
    with Model(tiny_model_path, RAM) as model, Context(model, cp) as ctx:
        assert ctx.cache_status().mailbox == bool(options.get("moe_cache_mailbox_on_cpu"))
        run = traced_generation(ctx, PROMPT, N_GEN, SAMPLING)
        resident = {il: sorted(ctx.resident(il).tolist()) for il in run.layers}
    stats = run.stats
    assert run.records[0].n_tokens > max_ubatch()  # the prompt took llama.cpp's path, uncounted
    with PolicyReplay(layer_shapes(layout), {l.il: slots for l in layout.layers}, policy) as replay:
        replay.feed_records(run.records)
        got = replay.result()
        held = {il: sorted(e for e in replay.slots(il) if e >= 0) for il in run.layers}
    assert {l.il: (l.n_slots, l.n_hit, l.n_hit_profile, l.n_miss, l.n_cpu, l.n_hit_peer) for l in got.layers} == \
        {il: (l.n_slots, l.n_hit, l.n_hit_profile, l.n_miss, l.n_cpu, l.n_hit_peer) for il, l in run.layers.items()}
    assert (got.n_admit, got.n_swap, got.n_prefilled, got.n_repartition, got.n_moved) == \
        (stats.n_admit, stats.n_swap, stats.n_prefilled, stats.n_repartition, stats.n_moved)
    assert (got.n_bytes_upload, got.n_bytes_cpu) == (stats.n_bytes_upload, stats.n_bytes_cpu)
    assert sum(l.n_upload for l in got.layers) == stats.n_upload
    assert held == resident and sum(l.n_resident for l in got.layers) == stats.n_resident
    assert got.n_hit > 0 and got.n_miss > 0
    # the case does what it is named for
    if case == "upload-fewer-slots-than-k":
        assert all(l.n_split == l.n_lookup > 0 for l in got.layers) and stats.n_cpu > 0
    if policy.mode == "adaptive":
        assert got.n_swap == sum(l.n_swap + l.n_fill for l in got.layers) > 0
    if case == "adaptive":  # an empty cache fills itself
        assert sum(l.n_fill for l in got.layers) > 0
    if case == "adaptive-profile":  # a full one swaps
        assert sum(l.n_swap for l in got.layers) > 0 and sum(l.n_fill for l in got.layers) == 0
    if policy.admit:
        assert got.n_admit == sum(l.n_admit for l in got.layers) > 0
    if case == "repartition":
        assert got.n_repartition >= 1 and got.n_moved > 0 and len({l.n_slots for l in got.layers}) > 1


def test_the_replay_refuses_what_a_cache_would_not_take(lib) -> None:
    shapes = [LayerShape(0, 8, 2, 100), LayerShape(1, 8, 2, 100)]
    slots = {0: 4, 1: 4}
    for policy, why in ((ReplayPolicy("upload", admit=2), "upload mode uploads every miss"),
                        (ReplayPolicy("hybrid", repartition=16), "needs|admitting hybrid"),
                        (ReplayPolicy("hybrid", admit=-1, admit_auto=9), "0 to 4"),
                        (ReplayPolicy("lru"), "mode 'lru'")):
        with pytest.raises(ParameterError, match=why):
            PolicyReplay(shapes, slots, policy)
    with pytest.raises(ParameterError, match="at least one"):
        PolicyReplay(shapes, {0: 0, 1: 4})
    with PolicyReplay(shapes, slots, ReplayPolicy("hybrid")) as replay:
        with pytest.raises(ParameterError, match="selects 3 experts a token, the layer 2"):
            replay.feed([0, 1, 3, 1, 2, 3])
        with pytest.raises(ParameterError, match="expert 8; the layer has experts 0 to 7"):
            replay.feed([0, 1, 2, 1, 8])
        with pytest.raises(ParameterError, match="runs past the end"):
            replay.feed([0, 2, 2, 1, 2])
        replay.feed([0, 1, 2, 1, 2, 1, 1, 2, 1, 2, 5, 1, 2, 1, 2])  # records of a layer it lacks are passed over
        assert [l.n_miss for l in replay.result().layers] == [2, 2]


def test_the_replay_admits_the_engines_auto_choice_as_given(lib) -> None:
    """A replay measures no copy: auto admission (-1) runs the budget it is given, or the one the engine starts with."""
    shapes = [LayerShape(0, 16, 2, 100)]
    data = [v for t in range(40) for v in (0, 1, 2, (2 * t) % 16, (2 * t + 1) % 16)]
    admitted = {}
    for auto in (None, 0, 3):
        with PolicyReplay(shapes, {0: 4}, ReplayPolicy("hybrid", admit=-1, admit_auto=auto)) as replay:
            replay.feed(data)
            admitted[auto] = replay.result().n_admit
    with PolicyReplay(shapes, {0: 4}, ReplayPolicy("hybrid", admit=1)) as replay:
        replay.feed(data)
        assert admitted[None] == replay.result().n_admit == 39  # starts at one a layer and round
    assert admitted[0] == 1  # none, but a probe of one every 32 decodes
    assert admitted[3] > admitted[None]


@pytest.mark.parametrize("hybrid", [False, True])
@pytest.mark.parametrize("model", ["tiny", "gpt-oss"])
def test_plans_slots_are_what_a_context_of_that_size_reports(lib, tiny_model_path, gpt_oss_path, capsys, hybrid,
                                                             model) -> None:
    path = tiny_model_path if model == "tiny" else gpt_oss_path
    layout = expert_layout(path)
    with Model(path, RAM) as m:
        for mib in (0.9, 1.4, 2.6):
            capsys.readouterr()
            argv = ["plan", str(path), "--cache-mib", str(mib), "--json", "-q"] + (["--hybrid"] if hybrid else [])
            code = main(argv)
            out, err = capsys.readouterr()
            with Context(m, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_hybrid=hybrid)) as ctx:
                status, layers = ctx.cache_status(), {l.il: l.n_slots for l in ctx.layer_stats()}
            if not layers:  # the engine turned the cache off: the planner refuses the same size
                assert code == 2 and "cannot hold one expert per layer" in err
                continue
            plan = json.loads(out)
            assert plan["slots"] == status.n_slots, (mib, hybrid)
            assert size_slots(layer_shapes(layout), mib_to_bytes(mib), hybrid) == layers


def test_a_profiles_per_layer_counts_are_sized_as_a_context_sizes_them(lib, tiny_model_path, tmp_path) -> None:
    """Counts that do not fit are scaled down by the engine's rule; the replay's sizing is the context's."""
    layout = expert_layout(tiny_model_path)
    counts = {l.il: 2 + 3 * i for i, l in enumerate(layout.layers)}
    strp = tmp_path / "counts.strp"
    ranked = tuple((l.il, e) for l in layout.layers for e in range(layout.n_expert))
    write_profile(strp, Profile(layout.n_layer, layout.n_expert, 0, ranked, layer_slots=tuple(
        counts.get(il, 0) for il in range(layout.n_layer))))
    with Model(tiny_model_path, RAM) as model:
        for mib in (0.6, 1.0, 3.0):
            with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_profile=strp)) as ctx:
                layers = {l.il: l.n_slots for l in ctx.layer_stats()}
            assert size_slots(layer_shapes(layout), mib_to_bytes(mib), False, counts) == layers, mib


THREE_TIER_CASES = [c for c in CASES if c not in ("admit2-background", "admit2-mailbox")]  # a RAM tier turns both off


@pytest.mark.parametrize("case", THREE_TIER_CASES)
def test_the_replay_of_three_tiers_is_the_engines_own_count(lib, tiny_model_path, tmp_path, caplog, case) -> None:
    slots, options, policy, hybrid = _case(case, tiny_model_path, tmp_path)
    layout = expert_layout(tiny_model_path)
    ram_slots = 6
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=1024, moe_cache_mib=mib_for_slots(tiny_model_path, slots, hybrid),
                       moe_ram_mib=mib_for_slots(tiny_model_path, ram_slots), **options)
    with Model(tiny_model_path, ModelParams(lazy_experts=True, repack=False)) as model, Context(model, cp) as ctx:
        run = traced_generation(ctx, PROMPT, N_GEN, SAMPLING)
    stats = run.stats
    assert stats.ram_below
    with PolicyReplay(layer_shapes(layout), {l.il: slots for l in layout.layers}, policy,
                      ram_slots={l.il: ram_slots for l in layout.layers}) as replay:
        replay.feed_records(run.records)
        got = replay.result()
    # the device's counts are those of the cache without a tier, and the tier's the replay's
    assert {l.il: (l.n_hit, l.n_miss, l.n_cpu) for l in got.layers} == \
        {il: (l.n_hit, l.n_miss, l.n_cpu) for il, l in run.layers.items()}
    assert (got.n_admit, got.n_swap, got.n_moved) == (stats.n_admit, stats.n_swap, stats.n_moved)
    assert (got.n_ram_hit, got.n_ram_miss) == (stats.n_ram_hit, stats.n_ram_miss)
    assert got.n_ram_miss > 0
    assert f"and took {got.n_ram_demoted} experts the device let go" in caplog.text
    # the bytes read from the file: the replay's count is the context's, prompts aside
    assert stats.n_bytes_disk - stats.n_bytes_disk_prompt == got.n_bytes_disk > 0
    assert got.n_bytes_ram_fill == got.n_ram_fill * layout.layers[0].bytes_per_expert


def test_a_replays_ram_tier_is_refused_where_a_context_turns_it_off(lib) -> None:
    shapes = [LayerShape(0, 8, 2, 100), LayerShape(1, 8, 2, 100)]
    slots = {0: 4, 1: 4}
    with pytest.raises(ParameterError, match="admit_background off"):
        PolicyReplay(shapes, slots, ReplayPolicy("hybrid", admit=2, admit_background=True), ram_slots=slots)
    with pytest.raises(ParameterError, match="turns the peer off"):
        PolicyReplay(shapes, slots, ReplayPolicy("hybrid", admit=2), peer_slots=slots, ram_slots=slots)
    with pytest.raises(ParameterError, match="at least one"):
        PolicyReplay(shapes, slots, ReplayPolicy("upload"), ram_slots={0: 0, 1: 4})
