"""How the held-out estimates are held out: with several traces, one fold per trace (leave one document out);
with one, contiguous folds labelled as within one document; adaptive's estimate only on folds long enough for
it to adapt; every report says which. On real trace files of the synthetic routing (numpy only: the traces are
written here in the reference format, one per corpus topic), through the API and the commands."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from llama_moe.tools.cli import main
from llama_moe.tools.experts import ExpertLayout, LayerExperts, expert_layout
from llama_moe.tools.synth import SHAPES, sample_routes
from llama_moe.tools.synth.corpus import TOPICS
from llama_moe.tools.routing import TraceRoutes, load_traces, plan_cache, rank_pairs, simulate_sizes
from llama_moe.tools.routing.budget import MiB, cache_bytes_for_slots, layer_shapes
from llama_moe.tools.errors import ToolInputError
from llama_moe.tools.routing.heldout import (Folds, choose_folds, document_split, fold_counts, kfold_result, min_fold_tokens,
                                     t_interval, trace_folds)
from llama_moe.policy_replay import PolicyReplay, ReplayPolicy, adaptive_half_life
from llama_moe.tools.routing.routes import Routes
from llama_moe.formats.trace import RoutingRecord, read_trace, write_trace

PER_TOPIC = 9  # sample_routes: 72 paragraphs, 9 per topic, in TOPICS order


def write_routing(path: Path, experts: np.ndarray) -> Path:
    """[tokens, layers, k] routing as a reference-format trace, layers interleaved token by token (what the trace
    command writes): the same bytes as ``write_trace`` of one record per token and layer, at numpy speed."""
    n, n_layer, k = experts.shape
    rows = np.zeros((n, n_layer, 2 + 2 * k), dtype="<i4")
    rows[:, :, 0] = np.arange(n_layer)
    rows[:, :, 1] = k
    rows[:, :, 2:2 + k] = experts
    path.write_bytes(rows.tobytes())
    return path


def topic_traces(shape: str, folder: Path) -> list[Path]:
    paras = sample_routes(shape, seed=0)
    assert len(paras) == PER_TOPIC * len(TOPICS)
    return [write_routing(folder / f"{t}.bin", np.concatenate(paras[PER_TOPIC * i:PER_TOPIC * (i + 1)]))
            for i, t in enumerate(TOPICS)]


def layout_of(shape: str) -> ExpertLayout:
    s = SHAPES[shape]
    row = 3 * s.n_embd * s.n_ff_exp * 18 // 32  # one Q4_0 expert: gate, up, down
    return ExpertLayout(s.n_layer, s.n_expert, s.n_expert_used,
                        tuple(LayerExperts(il, s.n_expert, row, "q4_0") for il in range(s.n_layer)))


@pytest.fixture(scope="module")
def tiny_topics(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return topic_traces("tiny", tmp_path_factory.mktemp("tiny_topics"))


def test_the_writer_writes_the_trace_format(tmp_path: Path) -> None:
    x = np.random.default_rng(0).integers(0, 32, size=(5, 3, 4)).astype(np.int32)
    write_trace(tmp_path / "ref.bin", (RoutingRecord(il, x[t:t + 1, il]) for t in range(5) for il in range(3)))
    assert write_routing(tmp_path / "fast.bin", x).read_bytes() == (tmp_path / "ref.bin").read_bytes()


# -- the folds ----------------------------------------------------------------------------------------------

def test_several_traces_fold_one_per_trace_and_one_trace_contiguously(tiny_topics: list[Path]) -> None:
    layout = layout_of("tiny")
    routes = TraceRoutes(tiny_topics[:3], layout)
    lengths = routes.trace_tokens()
    assert len(lengths) == 3 and sum(lengths) == routes.n_tokens
    f = choose_folds(routes)
    assert f.by_trace and not f.optimistic and f.lengths() == lengths
    assert f.bounds[0][0] == 0 and f.bounds[-1][1] == routes.n_tokens
    assert f.describe() == "leave one of 3 traces out"
    assert choose_folds(routes, "trace") == f == choose_folds(routes, "auto")
    c = choose_folds(routes, 5)  # asked for: contiguous across the traces, and said so
    assert not c.by_trace and c.k == 5 and "contiguous folds over 3 traces" in c.describe()
    assert "likely optimistic on new text" in c.describe()
    one = choose_folds(TraceRoutes(tiny_topics[:1], layout))
    assert not one.by_trace and one.k == 10 and one.n_traces == 1
    assert one.describe().startswith("10 contiguous folds of one trace: within one document")
    with pytest.raises(ToolInputError, match="two or more traces"):
        choose_folds(TraceRoutes(tiny_topics[:1], layout), "trace")
    # a view keeps the files it reaches, cut at its ends
    a = lengths[0] - 10
    view = routes.tokens(a, lengths[0] + lengths[1] + 5)
    assert view.trace_tokens() == (10, lengths[1], 5)
    # read into memory, the files keep their tokens (views too): the same folds
    loaded = load_traces(tiny_topics[:3], layout)
    assert loaded.trace_tokens() == lengths and choose_folds(loaded) == f
    assert loaded.tokens(a, lengths[0] + lengths[1] + 5).trace_tokens() == (10, lengths[1], 5)
    # any other routing in memory is one trace; its documents' lengths make the folds
    mem = Routes(routes.layers, np.zeros((30, 6, 4), dtype=np.int8), np.arange(31))
    assert choose_folds(mem).k == 10 and not choose_folds(mem).by_trace
    assert choose_folds(mem, trace_folds([10, 20])).bounds == ((0, 10), (10, 30))
    with pytest.raises(ToolInputError, match="consecutive blocks"):
        choose_folds(mem, Folds(((0, 10), (12, 30)), True, 2))


def test_a_traces_fold_is_ranked_on_the_other_trace_files(tiny_topics: list[Path]) -> None:
    """Leave-one-trace-out from real files: each fold is one file, and its profile is the ranking of the other
    files read on their own."""
    layout = layout_of("tiny")
    files = tiny_topics[:4]
    routes = TraceRoutes(files, layout)
    f = choose_folds(routes)
    counts = fold_counts(routes, f.bounds, layout.n_expert)
    for i, profile in enumerate(counts.fold_profiles()):
        others = TraceRoutes([p for j, p in enumerate(files) if j != i], layout)
        assert profile == rank_pairs(others, layout.n_expert)
        assert counts.test[i].sum() == TraceRoutes([files[i]], layout).n_tokens * layout.n_moe_layers * layout.n_expert_used


def test_predict_splits_between_traces() -> None:
    mem = Routes((0,), np.zeros((100, 1, 1), dtype=np.int8), np.arange(101))
    assert document_split(mem)[0] == 50 and "first half of one trace" in document_split(mem)[1]


# -- adaptive needs folds long enough to adapt -------------------------------------------------------------

def test_adaptive_leaves_out_folds_too_short_to_adapt(tiny_topics: list[Path], tmp_path: Path) -> None:
    half_life = adaptive_half_life()  # the engine's
    assert min_fold_tokens("adaptive") == half_life == 350 and min_fold_tokens("static") == 0
    layout = layout_of("tiny")
    # three traces of over 1000 tokens and one of 200
    short = write_routing(tmp_path / "short.bin", np.concatenate([blk for _, blk in TraceRoutes(tiny_topics[3:4], layout)
                                                                  .blocks()])[:200].astype(np.int32))
    train = TraceRoutes(tiny_topics[:3] + [short], layout)
    mib = cache_bytes_for_slots(layout, 8, True) / MiB
    r = simulate_sizes("tiny", layout, [mib], train, None, "auto", True, ("static", "adaptive"))
    assert r.held_out_kfold == "leave one of 4 traces out" and r.folds == 4
    static, adaptive = r.sizes[0].kfold["static"], r.sizes[0].kfold["adaptive"]
    assert static.too_short == () and len(static.hit_rate.folds) == 4
    assert adaptive.too_short == (3,) and adaptive.min_tokens == half_life
    kept = [x.hit_rate for x in adaptive.folds[:3]]
    assert adaptive.hit_rate == t_interval(kept)  # the short fold is not averaged in
    assert adaptive.pooled.n_lookup == sum(x.n_lookup for x in adaptive.folds[:3])
    assert "1 of 4 folds left out: under 350 tokens" in adaptive.short_note()
    # every fold too short: no estimate, said so
    none = kfold_result(list(adaptive.folds), [200] * 4, min_fold_tokens("adaptive"))
    assert none.hit_rate is None and none.pooled is None and none.short_note().startswith("every fold is under 350")


# -- the figures: leave one topic out against contiguous folds ---------------------------------------------

@pytest.mark.slow
def test_leave_one_topic_out_is_below_contiguous_folds_for_a_static_profile(tmp_path: Path) -> None:
    """The synthetic Qwen3-30B-A3B routing of the corpus, one trace per topic: contiguous folds over the same
    documents make a static profile look better than on a topic it was not ranked on (docs/tools.md)."""
    layout = layout_of("qwen3-30b-a3b")
    files = topic_traces("qwen3-30b-a3b", tmp_path)
    for slots in (32, 64):
        mib = cache_bytes_for_slots(layout, slots, True) / MiB
        loto, _ = plan_cache("q30", layout, mib, True, TraceRoutes(files, layout))
        contiguous, _ = plan_cache("q30", layout, mib, True, TraceRoutes(files, layout), 10)
        assert loto.held_out == "leave one of 8 traces out" and loto.folds == 8
        assert "10 contiguous folds over 8 traces" in contiguous.held_out
        print(f"{slots} slots: leave one topic out {loto.hit_rate.mean:.4f}, 10 contiguous folds "
              f"{contiguous.hit_rate.mean:.4f}, in-sample {loto.in_sample_hit_rate:.4f}")
        assert loto.hit_rate.mean < contiguous.hit_rate.mean - 0.02
        assert loto.hit_rate.mean < loto.in_sample_hit_rate


# -- the commands ------------------------------------------------------------------------------------------

def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json", "-q"]) == 0
    return json.loads(capsys.readouterr().out)


def _text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main([*argv, "-q"]) == 0
    return capsys.readouterr().out


def test_plan_folds_by_trace_and_says_so(tiny_model_path: Path, tiny_topics: list[Path], capsys) -> None:
    model = str(tiny_model_path)
    assert expert_layout(model).n_expert == SHAPES["tiny"].n_expert
    traces = [str(p) for p in tiny_topics]
    mib = f"{cache_bytes_for_slots(expert_layout(model), 8, True) / MiB:.4f}"
    by_trace = _json(capsys, "plan", model, "--cache-mib", mib, "--hybrid", "--trace", *traces)
    assert by_trace["held_out"] == "leave one of 8 traces out" and by_trace["folds"] == 8
    assert len(by_trace["hit_rate"]["folds"]) == 8
    contiguous = _json(capsys, "plan", model, "--cache-mib", mib, "--hybrid", "--trace", *traces, "--kfold", "10")
    assert contiguous["folds"] == 10 and "share documents" in contiguous["held_out"]
    assert by_trace["hit_rate"]["mean"] < contiguous["hit_rate"]["mean"]
    assert _json(capsys, "plan", model, "--cache-mib", mib, "--trace", *traces[:2], "--kfold", "trace")["folds"] == 2
    out = _text(capsys, "plan", model, "--cache-mib", mib, "--hybrid", "--trace", *traces)
    assert "held out   hit rate" in out and "(leave one of 8 traces out; " in out
    out = _text(capsys, "plan", model, "--cache-mib", mib, "--trace", traces[0], "--kfold", "5")
    assert "(5 contiguous folds of one trace: within one document, likely optimistic on new text; " in out
    capsys.readouterr()
    assert main(["plan", model, "--cache-mib", mib, "--trace", traces[0], "--kfold", "trace", "-q"]) == 2
    assert "two or more traces" in capsys.readouterr().err


def test_simulate_folds_by_trace_and_leaves_short_folds_out_of_adaptive(tiny_model_path: Path, tiny_topics: list[Path],
                                                                       tmp_path: Path, capsys) -> None:
    model = str(tiny_model_path)
    layout = expert_layout(model)
    traces = [str(p) for p in tiny_topics[:3]]
    short = write_routing(tmp_path / "short.bin", np.concatenate(
        [b for _, b in TraceRoutes(tiny_topics[3:4], layout).blocks()])[:120].astype(np.int32))
    argv = ["simulate", model, "--cache-mib", "1.4", "--hybrid", "--policies", "static,adaptive", "--train", *traces,
            str(short), "--kfold"]
    report = _json(capsys, *argv)
    assert report["held_out_kfold"] == "leave one of 4 traces out" and report["folds"] == 4
    adaptive = report["sizes"][0]["kfold"]["adaptive"]
    assert adaptive["too_short"] == [3] and len(adaptive["hit_rate"]["folds"]) == 3
    out = _text(capsys, *argv)
    assert "held out   k-fold: leave one of 4 traces out" in out
    assert "k-fold: 1 of 4 folds left out: under 350 tokens, too short" in out
    # the test traces are held out as whole traces too, and said so
    out = _text(capsys, "simulate", model, "--cache-mib", "1.4", "--train", *traces, "--test", str(tiny_topics[4]))
    assert "held out   test: the profile ranked on the train routing (3 traces), scored on the test routing (1 trace)" in out
    # one trace: contiguous folds, said to be within one document
    out = _text(capsys, "simulate", model, "--cache-mib", "1.4", "--train", traces[0], "--kfold")
    assert "held out   k-fold: 10 contiguous folds of one trace: within one document, likely optimistic" in out


def test_predict_trains_and_scores_on_different_traces(tiny_model_path: Path, tiny_topics: list[Path], capsys) -> None:
    model = str(tiny_model_path)
    traces = [str(p) for p in tiny_topics]
    lengths = TraceRoutes(tiny_topics, expert_layout(model)).trace_tokens()
    report = _json(capsys, "predict", model, *traces)
    assert report["held_out"] == "trained on traces 1-4 of 8, scored on traces 5-8"
    assert report["n_train"] == sum(lengths[:4]) and report["n_test"] == sum(lengths[4:])
    out = _text(capsys, "predict", model, traces[0])
    assert "held out   trained on the first half of one trace, scored on the second: within one document" in out
    two = _json(capsys, "predict", model, *traces[:2])
    assert two["held_out"] == "trained on trace 1 of 2, scored on trace 2" and two["n_train"] == lengths[0]


def test_simulate_prints_every_policy_it_accepts(tiny_model_path: Path, tiny_topics: list[Path], capsys) -> None:
    """The text report (not only --json) of the admitting policies and their variants: each row names its policy
    and says what it is, with the admissions it made (and the slots the re-partitioning moved)."""
    from llama_moe.tools.routing.policies import ALL_POLICIES, describe

    assert all(describe(name) for name in ALL_POLICIES)
    with pytest.raises(ValueError, match="unknown policy"):
        describe("admit3")
    model = str(tiny_model_path)
    policies = ["lru", "admit2", "admit1-lrfu", "admit4-repart16", "belady"]
    out = _text(capsys, "simulate", model, "--cache-mib", "1.4", "--hybrid", "--policies", ",".join(policies),
                "--train", str(tiny_topics[0]), "--test", str(tiny_topics[1]), "--kfold", "3")
    rows = {m.group(1): line for line in out.splitlines()
            if (m := re.match(r"\s*(?:[\d.]+\s+\d+\s+)?([a-z][\w-]*)\s", line)) and m.group(1) in policies}
    assert sorted(rows) == sorted(policies), out
    for name in policies:
        assert describe(name) in rows[name]
    assert "hybrid admitting 2 misses per layer and decode" in rows["admit2"]
    assert re.search(r"; \d+ admitted", rows["admit2"]) and re.search(r"; \d+ admitted", rows["admit1-lrfu"])
    assert re.search(r"; \d+ slots moved in \d+ rounds", rows["admit4-repart16"]), rows["admit4-repart16"]


def engine_reads(layout: ExpertLayout, slots: dict[int, int], traces: list[Path]) -> tuple[int, int, int]:
    """(n_bytes_upload, n_bytes_cpu, tokens) of the engine's own replay of upload mode, each trace held out in turn
    from a profile ranked on the others, as the RAM tier would run it."""
    upload = cpu = tokens = 0
    for i, trace in enumerate(traces):
        ranked = rank_pairs(load_traces([t for j, t in enumerate(traces) if j != i], layout), layout.n_expert)
        with PolicyReplay(layer_shapes(layout), slots, ReplayPolicy("upload", ranked=ranked)) as replay:
            records = read_trace(trace)
            replay.feed_records(records)
            r = replay.result()
        upload, cpu, tokens = upload + r.n_bytes_upload, cpu + r.n_bytes_cpu, tokens + len(records) // layout.n_moe_layers
    return upload, cpu, tokens


def test_plan_sizes_a_ram_tier_and_its_reads(tiny_model_path: Path, tiny_topics: list[Path], capsys) -> None:
    """--ram-mib plans the RAM tier as upload mode's LRU, and its disk reads per token are what the engine's own
    replay of each held-out trace reads: the misses uploaded into its slots, and with fewer slots than a token
    selects, the experts its split reads for itself too."""
    model = str(tiny_model_path)
    layout = expert_layout(model)
    for n_slots in (8, layout.n_expert_used - 1):
        mib = f"{math.ceil(cache_bytes_for_slots(layout, n_slots, False) / MiB * 1e4) / 1e4:.4f}"  # rounded up
        upload = _json(capsys, "plan", model, "--cache-mib", mib, "--trace", *map(str, tiny_topics))
        assert _json(capsys, "plan", model, "--ram-mib", mib, "--trace", *map(str, tiny_topics)) == upload
        out = _text(capsys, "plan", model, "--ram-mib", mib, "--trace", *map(str, tiny_topics))
        assert f"budget     --moe-ram-mib {float(mib):g} (the RAM tier" in out
        slots = {l["il"]: l["slots"] for l in upload["layers"]}
        assert set(slots.values()) == {n_slots}
        n_upload, n_cpu, tokens = engine_reads(layout, slots, tiny_topics)
        assert tokens == upload["trace_tokens"] and n_upload > 0
        assert (upload["bytes_upload_per_token"], upload["bytes_cpu_per_token"]) == (n_upload / tokens, n_cpu / tokens)
        assert (n_cpu > 0) == (n_slots < layout.n_expert_used)
        line = next(l for l in out.splitlines() if l.startswith("disk"))
        assert line.startswith(f"disk       {(n_upload + n_cpu) / tokens / 1e6:.2f} MB read from the model's file per "
                               f"token, held out (the engine's replay of decoding: "), line
        if n_cpu:
            assert (f"{n_upload / tokens / 1e6:.2f} MB of misses read into the slots and {n_cpu / tokens / 1e6:.2f} MB "
                    f"its split reads for itself") in line
    capsys.readouterr()
    assert main(["plan", model, "--ram-mib", mib, "--hybrid", "-q"]) == 2
    assert "--ram-mib plans the RAM tier" in capsys.readouterr().err


@pytest.mark.parametrize("hybrid", [False, True])
def test_plan_sizes_three_tiers_from_the_engines_replay_of_both(tiny_model_path: Path, tiny_topics: list[Path], capsys,
                                                                hybrid: bool) -> None:
    """--cache-mib with --ram-mib plans the cache over a RAM tier: the tier's slots as the engine sizes them, and its
    hit rate and reads of the file held out, each fold what the engine's replay of both tiers counts on that trace
    from a profile ranked on the others (the tier's fill at load left out)."""
    model = str(tiny_model_path)
    layout = expert_layout(model)
    k = layout.n_expert_used
    mib = lambda n, h: f"{math.ceil(cache_bytes_for_slots(layout, n, h) / MiB * 1e4) / 1e4:.4f}"  # noqa: E731
    dev_mib, ram_mib = mib(2 * k, hybrid), mib(k, False)
    argv = ["plan", model, "--cache-mib", dev_mib, "--ram-mib", ram_mib, "--trace", *map(str, tiny_topics),
            *(["--hybrid"] if hybrid else [])]
    plan = _json(capsys, *argv)
    slots = {l["il"]: l["slots"] for l in plan["layers"]}
    assert plan["ram_slots"] == k and set(slots.values()) == {2 * k}
    rates, disk, tokens = [], 0, 0
    per_expert = layout.layers[0].bytes_per_expert
    for i, trace in enumerate(tiny_topics):
        ranked = rank_pairs(load_traces([t for j, t in enumerate(tiny_topics) if j != i], layout), layout.n_expert)
        policy = ReplayPolicy("hybrid" if hybrid else "upload", ranked=ranked)
        with PolicyReplay(layer_shapes(layout), slots, policy, ram_slots={il: k for il in slots}) as replay:
            records = read_trace(trace)
            replay.feed_records(records)
            r = replay.result()
        misses = r.n_ram_miss - r.n_ram_fill
        rates.append(r.n_ram_hit / (r.n_ram_hit + misses))
        assert r.n_bytes_ram_fill == r.n_ram_fill * per_expert  # one expert shape: every miss reads one expert
        disk, tokens = disk + r.n_bytes_disk - r.n_bytes_ram_fill, tokens + len(records) // layout.n_moe_layers
    assert plan["ram_hit_rate"]["folds"] == pytest.approx(rates)
    assert plan["ram_bytes_disk_per_token"] == pytest.approx(disk / tokens)
    out = _text(capsys, *argv)
    line = next(l for l in out.splitlines() if l.startswith("RAM tier"))
    assert line.startswith(f"RAM tier   --moe-ram-mib {float(ram_mib):g}: {k} slots per layer under the cache; of what the "
                           f"cache lacks it holds {plan['ram_hit_rate']['mean']:.4f}"), line
    assert f"reads {disk / tokens / 1e6:.2f} MB from the model's file per token" in line
