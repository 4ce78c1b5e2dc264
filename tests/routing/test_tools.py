"""The routing tools (trace, profile, plan, simulate, predict) on the real patched libllama and the tiny
synthetic model, the CPU as the cache device: the planner's slots and profiles are what the engine does,
the static policy counts exactly like the engine's hybrid, and bad input is refused clearly."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from oracles.lru import simulate_lru
from llama_moe.tools.cli import main
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import read_profile
from llama_moe.tools.synth.corpus import split_paragraphs
from llama_moe.tools.routing import (CacheBudgetError, adaptive, belady, cache_bytes_for_slots, engine_slots, kfold,
                             kfold_splits, lru, prefill_resident, rank_pairs, read_routes, routes_from_records,
                             static, t_interval, trace_text)
from llama_moe.tools.routing.budget import MiB, engine_buffer_bytes, mib_to_bytes
from llama_moe.tools.routing import ToolInputError
from llama_moe.tools.routing.heldout import fold_bounds, t975
from llama_moe.tools.routing.routes import Routes
from llama_moe.formats.trace import RoutingRecord, TraceError, write_trace

RAM = ModelParams(cpu_moe=True, repack=False)
PROMPT = ("The ship left the harbour at dawn, and the crew of the old schooner hauled the lines while the captain "
          "watched the tide turn")


@pytest.fixture(scope="module")
def traces(lib, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Train and test traces of held-apart corpus paragraphs, written by the trace command."""
    split = split_paragraphs()
    folder = tmp_path_factory.mktemp("traces")
    out = {}
    for name, paragraphs in (("train", split.train_paragraphs()[:10]), ("test", split.test_paragraphs()[:5])):
        text = folder / f"{name}.txt"
        text.write_text("\n\n".join(paragraphs), encoding="utf-8")
        out[name] = folder / f"{name}.bin"
        assert main(["trace", str(tiny_model_path), str(text), str(out[name]), "--ctx", "512", "-q"]) == 0
    return out


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json", "-q"]) == 0
    return json.loads(capsys.readouterr().out)


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main([*argv, "-q"]) == 2
    return capsys.readouterr().err


# -- the planner against the engine ------------------------------------------------------------------------

def test_engine_slots_are_the_engines(lib, tiny_model_path) -> None:
    layout = expert_layout(tiny_model_path)
    with Model(tiny_model_path, RAM) as model:
        for hybrid in (False, True):
            for mib in (0.2, 0.5, 1.0, 1.37, 2.0, 4.7, 4.8, 6.0):
                with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_hybrid=hybrid)) as ctx:
                    engine = {l.il: l.n_slots for l in ctx.layer_stats()}
                    stats = ctx.moe_cache_stats()
                if not engine:  # the engine turned the cache off: the planner refuses the same budget
                    assert stats is None
                    with pytest.raises(CacheBudgetError, match="cannot hold one expert per layer"):
                        engine_slots(layout, mib_to_bytes(mib), hybrid)
                    continue
                assert engine_slots(layout, mib_to_bytes(mib), hybrid) == engine, (mib, hybrid)
                assert engine_buffer_bytes(layout, engine, hybrid) == stats.n_bytes_cache, (mib, hybrid)
            for slots in (1, 5, layout.n_expert):  # the size asked for a slot count gives exactly that count
                mib = cache_bytes_for_slots(layout, slots, hybrid) / MiB
                with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_hybrid=hybrid)) as ctx:
                    assert {l.n_slots for l in ctx.layer_stats()} == {slots}


def test_a_planned_profile_fills_the_engine_as_planned(lib, tiny_model_path, traces, tmp_path, capsys) -> None:
    layout = expert_layout(tiny_model_path)
    strp = tmp_path / "plan.strp"
    plan = _run_json(capsys, "plan", str(tiny_model_path), "--cache-mib", "1.4", "--trace", str(traces["train"]),
                     "--out", str(strp), "--kfold", "5")
    profile = read_profile(strp, layout.n_layer, layout.n_expert)
    assert plan["profile_pairs"] == len(profile.ranked) and plan["slots"] == 9
    with Model(tiny_model_path, RAM) as model, \
         Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=1.4, moe_cache_profile=strp)) as ctx:
        assert ctx.moe_cache_stats().n_prefilled == plan["n_prefilled"] == 9 * layout.n_moe_layers
        filled = prefill_resident(profile.ranked, {l.il: 9 for l in layout.layers}, layout.n_expert)
        for l in layout.layers:
            assert sorted(filled[l.il]) == ctx.resident(l.il).tolist()
    # held out, with an interval; in-sample only beside it
    assert plan["hit_rate"]["low"] <= plan["hit_rate"]["mean"] <= plan["hit_rate"]["high"]
    assert len(plan["hit_rate"]["folds"]) == 5 and plan["policy"] == "lru"
    assert 0 < plan["h_layer"]["mean"] < plan["hit_rate"]["mean"] < 1


@pytest.mark.parametrize("n_ubatch", [512, 16])  # the prompt in one ubatch (over 32 tokens), or in pieces of 16
def test_the_static_policy_counts_like_the_engines_hybrid(lib, tiny_model_path, traces,
                                                          n_ubatch, tmp_path, capsys) -> None:
    layout = expert_layout(tiny_model_path)
    strp = tmp_path / "hybrid.strp"
    plan = _run_json(capsys, "plan", str(tiny_model_path), "--cache-mib", "1.4", "--hybrid", "--trace",
                     str(traces["train"]), "--out", str(strp), "--kfold", "3")
    profile = read_profile(strp)
    cp = ContextParams(moe_cache_device="CPU", n_ctx=512, n_ubatch=n_ubatch, moe_cache_mib=1.4, moe_cache_hybrid=True, moe_cache_profile=strp)
    with Model(tiny_model_path, RAM) as model, Context(model, cp) as ctx:
        ctx.start_trace()
        list(ctx.generate(PROMPT, max_tokens=64, stop_at_eog=False))
        records = ctx.stop_trace()
        stats, layers = ctx.moe_cache_stats(), ctx.layer_stats()
    slots = engine_slots(layout, mib_to_bytes(1.4), hybrid=True)
    assert stats.n_prefilled == plan["n_prefilled"] and {l.n_slots for l in layers} == {plan["slots"]}
    sim = static(routes_from_records(records), slots, layout.n_expert, profile.ranked)
    assert (stats.n_hit, stats.n_hit_profile, stats.n_miss) == (sim.n_hit, sim.n_hit_profile, sim.n_miss)
    assert {l.il: (l.n_hit, l.n_miss) for l in layers} == sim.per_layer
    assert sim.n_hit > 0 and sim.n_miss > 0


def test_the_lru_policy_counts_like_simulate_lru(lib, tiny_model_path, traces) -> None:
    """lru adds h_layer to simulate_lru's replay (which CI checks against the engine): the same counts, on
    ubatches of 32 tokens (split: more distinct experts than slots, the rest on the CPU) and on single tokens."""
    layout = expert_layout(tiny_model_path)
    text = "\n\n".join(split_paragraphs().test_paragraphs()[5:7])
    records = trace_text(tiny_model_path, text, n_ctx=256)
    routes = read_routes(traces["train"], layout)
    profile = rank_pairs(routes, layout.n_expert)
    per_token = [RoutingRecord(il, routes.experts[t:t + 1, j]) for t in range(routes.n_tokens)
                 for j, il in enumerate(routes.layers)]
    for slots_per_layer in (4, 9, 20):
        slots = {l.il: slots_per_layer for l in layout.layers}
        for recs, r in ((records, routes_from_records(records)), (per_token, routes)):
            want = simulate_lru(recs, slots, layout.n_expert, prefill=profile)
            got = lru(r, slots, layout.n_expert, profile)
            assert (got.n_hit, got.n_hit_profile, got.n_miss) == (want.n_hit, want.n_hit_profile, want.n_miss)
            assert got.per_layer == want.per_layer
            assert (got.n_cpu, got.per_layer_cpu) == (want.n_cpu, want.per_layer_cpu)
            assert got.hit_rate == want.hit_rate
    # the text's ubatches of 32 tokens select more than 20 experts: split; single tokens fit 4 slots and more
    every = {l.il: 20 for l in layout.layers}
    split = lru(routes_from_records(records), every, layout.n_expert, profile)
    assert split.n_split_lookups > 0 and split.n_miss > split.n_cpu > 0
    assert lru(routes, {l.il: 4 for l in layout.layers}, layout.n_expert, profile).n_cpu == 0


# -- the trace command ----------------------------------------------------------------------------------------

def test_the_trace_command_writes_every_token_of_every_layer(lib, tiny_model_path, traces, capsys, tmp_path) -> None:
    layout = expert_layout(tiny_model_path)
    routes = read_routes(traces["test"], layout)
    assert routes.layers == tuple(l.il for l in layout.layers) and routes.k == layout.n_expert_used
    assert len(routes.starts) == routes.n_tokens + 1  # a trace file is read one token per ubatch
    # the same text as records: the last layer has every token (the tracer asks for every token's logits)
    text = (tmp_path / "t.txt")
    text.write_text(PROMPT, encoding="utf-8")
    report = _run_json(capsys, "trace", str(tiny_model_path), str(text), str(tmp_path / "t.bin"), "--ubatch", "5")
    records = trace_text(tiny_model_path, PROMPT, ubatch=5)
    assert all(r.n_tokens == records[0].n_tokens for r in records[:layout.n_moe_layers])
    assert report["n_tokens"] == routes_from_records(records).n_tokens
    assert report["n_records"] == report["n_tokens"] * layout.n_moe_layers
    np.testing.assert_array_equal(read_routes(tmp_path / "t.bin", layout).experts, routes_from_records(records).experts)


# -- simulate, k-fold, policies ----------------------------------------------------------------------------

def test_simulate_reports_every_policy_held_out_and_by_kfold(lib, tiny_model_path, traces, capsys) -> None:
    report = _run_json(capsys, "simulate", str(tiny_model_path), "--cache-mib", "0.8", "1.4", "5",
                       "--train", str(traces["train"]), "--test", str(traces["test"]), "--kfold", "3")
    assert [s["slots"] for s in report["sizes"]] == [5, 9, 32]
    assert report["sizes"][2]["whole"]
    for size in report["sizes"][:2]:
        held = size["heldout"]
        for name in ("lru", "static", "adaptive", "belady"):
            assert 0 < held[name]["h_layer"] < held[name]["hit_rate"] < 1
            est = size["kfold"][name]["hit_rate"]
            assert est["low"] <= est["mean"] <= est["high"] and len(est["folds"]) == 3  # of over 350 tokens
        assert held["belady"]["hit_rate"] >= max(held[p]["hit_rate"] for p in ("lru", "static"))
        assert held["static"]["n_hit_profile"] == held["static"]["n_hit"]
        assert size["in_sample"]["policy"] == "static"


def test_kfold_interval_contains_its_mean(tiny_model_path, traces) -> None:
    layout = expert_layout(tiny_model_path)
    routes = read_routes(traces["train"], layout)
    splits = kfold_splits(routes, 10)
    assert sum(te.n_tokens for _, te in splits) == routes.n_tokens
    for train, test in splits:  # contiguous blocks; the train side is everything else
        assert train.n_tokens + test.n_tokens == routes.n_tokens
    slots = {l.il: 6 for l in layout.layers}
    result = kfold(splits, lambda tr, te: static(te, slots, layout.n_expert, rank_pairs(tr, layout.n_expert)))
    est = result.hit_rate
    assert est.low < est.mean < est.high and est.mean == pytest.approx(np.mean(est.folds))
    assert result.pooled.n_lookup == sum(r.n_lookup for r in result.folds)
    assert t975(9) == 2.262 and t975(30) == pytest.approx(t975(31), abs=0.01) and t975(1000) == pytest.approx(1.962, abs=1e-3)
    e = t_interval([0.5, 0.6, 0.7])
    assert (e.low, e.high) == pytest.approx((0.6 - 4.303 * 0.1 / 3**0.5, 0.6 + 4.303 * 0.1 / 3**0.5))
    assert fold_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(ToolInputError, match="too few"):
        kfold_splits(routes.tokens(0, 15), 10)


def _routes(tokens: list[list[int]]) -> Routes:
    """One layer (0), one token per ubatch."""
    ex = np.array(tokens, dtype=np.int32)[:, None, :]
    return Routes((0,), ex, np.arange(len(tokens) + 1, dtype=np.int64))


def test_adaptive_swaps_only_clearly_hotter_experts_in() -> None:
    # the profile holds 4..7, the text selects 0..3. Without a prior, after 32 tokens their heats (~31) would beat
    # 1.5 * 0 + 2; the profile's experts start with their share of 64 tokens' picks (4 / 4 slots: 64), so the
    # text's experts come in at the round after 96 tokens (heat ~83 against 1.5 * 52.8 + 2)
    profile = [(0, 4), (0, 5), (0, 6), (0, 7)]
    r = _routes([[0, 1, 2, 3]] * 120)
    res = adaptive(r, {0: 4}, 8, profile=profile)
    assert res.n_swap == 4 and res.n_fill == 0 and res.n_hit_profile == 0
    assert res.n_hit == 4 * (120 - 96) and res.n_miss == 4 * 96
    assert static(r, {0: 4}, 8, profile).n_hit == 0
    # the text alternates between two sets: heat(in) never clears 1.5 heat(out) + 2, nothing flaps
    r = _routes([[0, 1, 2, 3], [4, 5, 6, 7]] * 40)
    assert adaptive(r, {0: 4}, 8, profile=[(0, 4), (0, 5), (0, 6), (0, 7)]).n_swap == 0
    # without a profile the free slots fill every 8 tokens
    r = _routes([[0, 1, 2, 3]] * 20)
    res = adaptive(r, {0: 6}, 8)
    assert res.n_fill == 4 and res.n_hit == 4 * (20 - 8) and res.n_resident == 4


def test_belady_is_the_ceiling() -> None:
    r = _routes([[0], [1], [2], [0], [1], [3], [0], [2]])
    res = belady(r, {0: 2}, 8)
    # starts with 0 and 1 (needed first): hits 0, 1, then 2 is bypassed or swapped as the future says
    assert res.n_hit == 5 and res.n_miss == 3
    for p in (lru(r, {0: 2}, 8), static(r, {0: 2}, 8, [(0, 0), (0, 1)]), adaptive(r, {0: 2}, 8, [(0, 0), (0, 1)])):
        assert p.n_hit <= res.n_hit


# -- profile and predict ----------------------------------------------------------------------------------

def test_profile_traces_and_writes_a_profile(lib, tiny_model_path, tmp_path, capsys) -> None:
    layout = expert_layout(tiny_model_path)
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(split_paragraphs().train_paragraphs()[10:13]), encoding="utf-8")
    out = tmp_path / "p.strp"
    plan = _run_json(capsys, "profile", str(tiny_model_path), str(text), "-o", str(out), "--slots", "12",
                     "--kfold", "4", "--trace-out", str(tmp_path / "p.bin"), "--whole-layers", "1")
    profile = read_profile(out, layout.n_layer, layout.n_expert)
    assert plan["slots"] == profile.n_slots == 12 and plan["n_prefilled"] == 12 * layout.n_moe_layers
    assert plan["trace_tokens"] == read_routes(tmp_path / "p.bin", layout).n_tokens
    whole = plan["whole_layers"]
    assert len(whole["layers"]) == 1 and "report only" in whole["note"]
    assert whole["other_slots"] == 8  # (12 slots x 6 layers - 32) / 5 layers


def test_predict_beats_or_matches_the_frequency_baseline(lib, tiny_model_path, traces, capsys) -> None:
    report = _run_json(capsys, "predict", str(tiny_model_path), str(traces["train"]), str(traces["test"]))
    layers = report["layers"]
    assert layers[0]["predictor"] is None and layers[0]["prev_il"] is None
    for l in layers[1:]:
        assert 0 < l["baseline"] <= 1 and 0 < l["predictor"] <= 1
    assert report["mean_predictor"] > report["mean_baseline"]  # the synthetic routers chain layers
    assert report["top"] == report["k"] == 4


# -- bad input ---------------------------------------------------------------------------------------------

def test_bad_input_is_refused_clearly(lib, tiny_model_path, traces, tmp_path, capsys) -> None:
    model = str(tiny_model_path)
    data = traces["test"].read_bytes()
    # truncated inside a record, and at a record boundary inside a token
    (tmp_path / "cut.bin").write_bytes(data[:-6])
    assert "runs past the end" in _fails(capsys, "predict", model, str(tmp_path / "cut.bin"))
    (tmp_path / "cut2.bin").write_bytes(data[:-3 * (8 + 8 * 4)])
    assert "truncated" in _fails(capsys, "simulate", model, "--cache-mib", "1", "--train", str(tmp_path / "cut2.bin"),
                                 "--kfold", "3")
    # traces of other models: another k, other layers, experts out of range
    for name, records, why in (
        ("k8", [RoutingRecord(il, np.arange(8, dtype=np.int32)[None]) for il in range(6)], "8 experts per token"),
        ("layers", [RoutingRecord(il, np.arange(4, dtype=np.int32)[None]) for il in range(8)], "MoE layers are 0..5"),
        ("range", [RoutingRecord(il, np.array([[1, 2, 3, 40]], dtype=np.int32)) for il in range(6)], "expert 40"),
    ):
        write_trace(tmp_path / f"{name}.bin", records * 4)
        assert why in _fails(capsys, "plan", model, "--cache-mib", "1", "--trace", str(tmp_path / f"{name}.bin"),
                             "--kfold", "2"), name
    # a budget too small for one slot per layer
    assert "cannot hold one expert per layer" in _fails(capsys, "plan", model, "--cache-mib", "0.1")
    assert "cannot hold one expert per layer" in _fails(capsys, "simulate", model, "--cache-mib", "0.1", "--train",
                                                        str(traces["train"]), "--kfold", "3")
    # held-out only, files that are not there, a profile without routing, an empty text
    assert "must be held out" in _fails(capsys, "simulate", model, "--cache-mib", "1", "--train", str(traces["train"]))
    assert "no such trace file" in _fails(capsys, "predict", model, str(tmp_path / "absent.bin"))
    assert "no such model file" in _fails(capsys, "plan", str(tmp_path / "absent.gguf"), "--cache-mib", "1")
    assert "give --trace" in _fails(capsys, "plan", model, "--cache-mib", "1", "--out", str(tmp_path / "x.strp"))
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    assert "empty" in _fails(capsys, "trace", model, str(tmp_path / "empty.txt"), str(tmp_path / "e.bin"))
    assert not (tmp_path / "e.bin").exists() and not (tmp_path / "e.bin.part").exists()
    with pytest.raises(TraceError, match="empty"):
        (tmp_path / "zero.bin").write_bytes(b"")
        read_routes(tmp_path / "zero.bin")


# -- no perfect cache out of nothing -------------------------------------------------------------------------

def test_plan_per_device_refuses_what_it_cannot_plan(lib, tiny_model_path, traces, capsys) -> None:
    model = str(tiny_model_path)
    assert "--cache-mib, the size on each device" in _fails(capsys, "plan", model, "--vram-gib", "8", "--tensor-split", "1,1")
    assert "every share is 0" in _fails(capsys, "plan", model, "--cache-mib", "1", "--tensor-split", "0,0")
    with pytest.raises(SystemExit):  # argparse's own refusal
        main(["plan", model, "--cache-mib", "1", "--tensor-split", "1,x"])
    assert "a comma-separated list of numbers" in capsys.readouterr().err
    assert "cannot hold one expert in each of device 0's 4 layers" in _fails(capsys, "plan", model, "--cache-mib", "0.1",
                                                                             "--tensor-split", "1,1")
    assert "--whole-layers reports a budget on one device" in _fails(
        capsys, "plan", model, "--cache-mib", "1", "--tensor-split", "1,1", "--whole-layers", "1", "--trace", str(traces["train"]))


def test_plan_per_layer_splits_each_devices_budget_across_its_layers(lib, tiny_model_path, traces, tmp_path,
                                                                    capsys) -> None:
    """``plan --tensor-split 1,1 --per-layer``: each device's bytes split across its own layers (a device's layers
    never take another's), written into the profile; the engine's rule mirrored per device
    (``engine_device_layer_slots``) keeps the counts as they are, since each device's fit its budget."""
    from llama_moe.tools.routing.budget import cache_bytes_for_layer_slots, engine_device_layer_slots
    from llama_moe.tools.routing.placement import mirrored_devices
    from llama_moe.tools.routing.planning import _on

    layout = expert_layout(tiny_model_path)
    out = tmp_path / "split.strp"
    capsys.readouterr()
    assert main(["plan", str(tiny_model_path), "--cache-mib", "1", "--tensor-split", "1,1", "--per-layer", "--trace",
                 str(traces["train"]), "--kfold", "3", "--out", str(out), "--json", "-q"]) == 0
    plan = json.loads(capsys.readouterr().out)
    split = {int(il): n for il, n in plan["per_layer"]["slots"].items()}
    devices = mirrored_devices(layout, (1.0, 1.0), 1.0, False)
    assert [tuple(d["layers"]) for d in plan["devices"]] == [d.layers for d in devices] == [(0, 1, 2, 3), (4, 5)]
    profile = read_profile(out)
    assert profile.layer_slots == tuple(split.get(il, 0) for il in range(layout.n_layer))
    for d in devices:
        mine = {il: split[il] for il in d.layers}
        # the device's own bytes: no more than its equal slots take, and not the same split as equal slots
        assert sum(mine.values()) <= d.slots * len(d.layers) and min(mine.values()) >= layout.n_expert_used
        assert cache_bytes_for_layer_slots(_on(layout, d.layers), mine, False) <= mib_to_bytes(1.0)
        assert engine_device_layer_slots(layout, d.layers, mib_to_bytes(1.0), split, False) == mine
    assert len(set(split.values())) > 1
    mirrored = mirrored_devices(layout, (1.0, 1.0), 1.0, False, split)
    assert [dict(zip(d.layers, d.layer_slots)) for d in mirrored] == [{il: split[il] for il in d.layers} for d in devices]
    # the text report says where the split is made
    text = _plan_text(capsys, "plan", str(tiny_model_path), "--cache-mib", "1", "--tensor-split", "1,1", "--per-layer",
                      "--trace", str(traces["train"]), "--kfold", "3")
    assert "the profile carries the per-layer split below, within each device" in text


def test_the_mirror_scales_a_devices_counts_by_the_engines_rule(tiny_model_path) -> None:
    """Counts that do not fit a device's budget are scaled on that device alone (engine_layer_slots' rule on its
    layers); a count of 0 for a layer the cache serves is refused, as the engine refuses such a profile."""
    from llama_moe.tools.routing.budget import engine_device_layer_slots, engine_layer_slots
    from llama_moe.tools.routing.placement import mirrored_devices
    from llama_moe.tools.routing.planning import _on

    layout = expert_layout(tiny_model_path)
    counts = {0: 3, 1: 12, 2: 2, 3: 37, 4: 5, 5: 16}  # the first device's 4 layers ask 49 slots of about 40
    first = engine_device_layer_slots(layout, (0, 1, 2, 3), mib_to_bytes(1.0), counts, False)
    assert first == engine_layer_slots(_on(layout, (0, 1, 2, 3)), mib_to_bytes(1.0), counts, False)
    assert first != {il: min(counts[il], layout.n_expert) for il in (0, 1, 2, 3)} and min(first.values()) >= 1
    assert engine_device_layer_slots(layout, (4, 5), mib_to_bytes(1.0), counts, False) == {4: 5, 5: 16}
    assert engine_device_layer_slots(layout, (4, 5), mib_to_bytes(0.01), counts, False) == {}
    with pytest.raises(CacheBudgetError, match="layer 4 no slots"):
        engine_device_layer_slots(layout, (4, 5), mib_to_bytes(1.0), {**counts, 4: 0}, False)
    with pytest.raises(CacheBudgetError, match="cannot hold one expert in each of device 0's 4 layers"):
        mirrored_devices(layout, (1.0, 1.0), 0.1, False, counts)


def test_nothing_looked_up_gives_no_hit_rate() -> None:
    """A layer held whole looks nothing up: no hit rate (None), never 1.0 made out of zero lookups (a cache
    smaller than a token's experts: tests/routing/test_lru_split.py)."""
    r = _routes([[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]])
    held = lru(r, {0: 8}, 8)   # held whole: nothing to look up, no rate at all
    assert held.n_lookup == 0 and held.hit_rate is None and held.h_layer is None and held.layer_hit_rate(0) is None
    for policy in (static(r, {0: 8}, 8, []), belady(r, {0: 8}, 8), adaptive(r, {0: 8}, 8)):
        assert policy.hit_rate is None, policy.policy


def _plan_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main([*argv, "-q"]) == 0
    return capsys.readouterr().out


def test_plan_warns_when_upload_mode_splits_ubatches(lib, tiny_model_path, traces, capsys) -> None:
    layout = expert_layout(tiny_model_path)
    k, model = layout.n_expert_used, str(tiny_model_path)

    def mib(slots: int, hybrid: bool = False) -> str:
        return f"{cache_bytes_for_slots(layout, slots, hybrid) / MiB + 0.001:.3f}"

    # fewer slots than k: every token computes some of its experts on the CPU, held out as a share and per token
    for slots in (1, k - 1):
        argv = ("plan", model, "--cache-mib", mib(slots), "--trace", str(traces["train"]), "--kfold", "3")
        out = _plan_text(capsys, *argv)
        assert (f"warning    {slots} slots per layer are fewer than the {k} experts one token selects: upload mode "
                f"computes at least {k - slots} of every token's experts on the CPU in each of the "
                f"{layout.n_moe_layers} layers not held whole; the held-out replay of the routing computed ") in out
        assert "of them on the CPU" in out and "refus" not in out
        plan = _run_json(capsys, *argv)
        # every layer computes every token of a trace: the slots serve `slots` of its experts, the CPU the others
        assert all(l["cpu_per_token"] == k - slots for l in plan["layers"]) and len(plan["warnings"]) == 1
        assert all(l["misses_per_token"] >= l["cpu_per_token"] for l in plan["layers"])
        per_token = sum(l["cpu_per_token"] for l in plan["layers"])
        m = re.search(r"computed (\d+\.\d+)% of its lookups on the CPU \((\d+\.\d+) experts per token\)",
                      plan["warnings"][0])
        assert m and abs(float(m[2]) - per_token) < 1e-3
        looked = sum(l["misses_per_token"] / (1 - l["hit_rate"]) for l in plan["layers"])  # lookups per token
        assert abs(float(m[1]) / 100 - per_token / looked) < 1e-4
        assert plan["hit_rate"]["mean"] < 0.5  # the CPU's selections are in the denominator
    # enough for a token, not for a ubatch of 32: the largest ubatch served whole is named
    out = _plan_text(capsys, "plan", model, "--cache-mib", mib(9))
    assert ("warning    9 slots per layer serve ubatches of up to 2 tokens whole: larger ones of up to 32 tokens "
            "(short prompts, several sequences decoded together) that select more distinct experts than the slots "
            "compute the rest on the CPU; ") in out
    assert f"{layout.n_expert} slots (--moe-cache-mib" in out and "refus" not in out
    capsys.readouterr()
    assert main(["plan", model, "--cache-mib", mib(9), "--json", "-q"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["warnings"] and "warning: 9 slots per layer serve ubatches" in printed.err
    # with the trace (one token a ubatch), the held-out share of the CPU is none
    out = _plan_text(capsys, "plan", model, "--cache-mib", mib(9), "--trace", str(traces["train"]), "--kfold", "3")
    assert "the held-out replay of the routing computed 0.00% of its lookups on the CPU (0.000 experts per token)" in out
    assert "of them on the CPU" not in out
    # the hybrid computes its misses on the CPU by design; a cache that holds every layer whole looks nothing up
    for argv in (("--cache-mib", mib(2, True), "--hybrid"), ("--cache-mib", mib(layout.n_expert))):
        out = _plan_text(capsys, "plan", model, *argv)
        assert "warning" not in out, argv
    out = _plan_text(capsys, "plan", model, "--cache-mib", mib(layout.n_expert), "--trace", str(traces["train"]),
                     "--kfold", "3")
    assert "held out   hit rate n/a: nothing is looked up (every layer held whole)" in out


def test_simulate_prints_the_cpus_misses_and_no_rate_for_nothing_looked_up(lib, tiny_model_path, traces,
                                                                           capsys) -> None:
    layout = expert_layout(tiny_model_path)
    small = f"{cache_bytes_for_slots(layout, 2, False) / MiB + 0.001:.3f}"
    report = _run_json(capsys, "simulate", str(tiny_model_path), "--cache-mib", small, "--train",
                       str(traces["train"]), "--test", str(traces["test"]), "--kfold", "3", "--policies", "lru,static")
    held = report["sizes"][0]["heldout"]
    lru_, static_ = held["lru"], held["static"]
    assert "n_refused" not in lru_ and lru_["n_lookup"] == lru_["n_hit"] + lru_["n_miss"] > 0
    # 2 slots, k experts a token: the slots serve 2 of them (hits, then uploads), the CPU the other k - 2
    assert lru_["n_cpu"] == (layout.n_expert_used - 2) * lru_["n_token_layers"] == sum(lru_["per_layer_cpu"].values())
    assert lru_["n_split_lookups"] == lru_["n_token_layers"] and 0 < lru_["hit_rate"] < 2 / layout.n_expert_used
    assert 0 < static_["hit_rate"] < 1 and static_["n_cpu"] == 0   # the hybrid uploads nothing: no split
    out = _plan_text(capsys, "simulate", str(tiny_model_path), "--cache-mib", small, "--train", str(traces["train"]),
                     "--test", str(traces["test"]), "--policies", "lru")
    assert f"{lru_['n_cpu']} misses computed on the CPU in {lru_['n_split_lookups']} lookups" in out
    assert "hit rate = hits / (hits + misses) of" in out and "refus" not in out
