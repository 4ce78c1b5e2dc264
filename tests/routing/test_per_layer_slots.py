"""Slots per layer from miss curves: the curves are an LRU replayed at every size at once (Mattson's stack
distances) and a static profile's counts; the split minimises the total misses of the curves for the budget;
the planner splits the engine's bytes, holds the split out fold by fold and writes it into its JSON."""
from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from llama_moe.tools.cli import main
from llama_moe.tools.errors import CacheBudgetError, ToolInputError
from llama_moe.tools.experts import expert_layout
from llama_moe.tools.routing import plan_cache
from llama_moe.tools.routing.budget import MiB, cache_bytes_for_slots
from llama_moe.tools.routing.misscurves import lru_miss_curves, split_slots, static_curves
from llama_moe.tools.routing.planning import per_layer_slots
from llama_moe.tools.routing.policies import run_policy
from llama_moe.tools.routing.ranking import pair_counts
from llama_moe.tools.routing.routes import Routes

from test_heldout_folds import layout_of, tiny_topics  # noqa: F401  (the fixture)


def _lru_misses(col: list[list[int]], slots: int) -> int:
    """An LRU of ``slots`` whose token's experts never evict each other, touched in their order."""
    cache: OrderedDict[int, None] = OrderedDict()
    misses = 0
    for sel in col:
        misses += sum(e not in cache for e in sel)
        for e in sel:
            cache.pop(e, None)
            cache[e] = None
        while len(cache) > slots:
            cache.popitem(last=False)
    return misses


def _routes(n: int = 240, seed: int = 0) -> Routes:
    """Three layers that differ: layer 0 reuses a small set, layer 1 picks from all 16, layer 2 drifts."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n):
        drift = (t // 20) % 12
        rows.append([rng.choice(6, 4, replace=False), rng.choice(16, 4, replace=False),
                     drift + rng.choice(5, 4, replace=False)])
    x = np.array(rows, dtype=np.int8)
    return Routes((0, 1, 2), x, np.arange(n + 1, dtype=np.int64))


def test_lru_curves_are_an_lru_at_every_size() -> None:
    r = _routes()
    mc = lru_miss_curves(r, 16, [(0, 100), (100, 240)])
    whole = mc.total()
    for j in range(3):
        col = r.experts[:, j].tolist()
        assert whole[j, 0] == r.n_tokens * 4 and whole[j, 16] == 0  # nothing held; held whole
        for c in range(4, 16):
            assert whole[j, c] == _lru_misses(col, c), (j, c)
        assert np.all(np.diff(whole[j]) <= 0)
    # the blocks add up to the whole, and the first block alone is an LRU of its tokens
    assert np.array_equal(mc.misses.sum(axis=0), whole)
    assert [mc.misses[0, 1, c] for c in range(4, 16)] == [_lru_misses(r.experts[:100, 1].tolist(), c) for c in range(4, 16)]
    # the engine's LRU breaks ties by slot, not by the router's order: close, not equal
    for c in (4, 8, 12):
        engine = run_policy("lru", r, {0: c, 1: c, 2: c}, 16, ())
        assert abs(engine.n_miss - int(whole[:, c].sum())) <= 0.05 * engine.n_miss + 4


def test_a_ubatch_larger_than_the_slots_hits_what_is_resident() -> None:
    # two tokens a ubatch, 4 distinct experts: at fewer slots upload mode splits it, its resident experts hit
    # and the others miss (uploaded while a slot is left, else on the CPU), as the stack distances count
    x = np.array([[[0, 1]], [[2, 3]]] * 10, dtype=np.int8)
    r = Routes((0,), x, np.arange(0, 21, 2, dtype=np.int64))
    whole = lru_miss_curves(r, 8).total()[0]
    assert whole[0] == r.n_tokens * 2 and whole[4] == 4  # then the first ubatch's four experts are the only misses
    for c in (1, 2, 3):
        assert whole[c] == 4 + 9 * (4 - c)  # c of the four stay resident; the engine's split counts the same
        assert run_policy("lru", r, {0: c}, 8, ()).n_miss == whole[c]


def test_static_curves_hold_the_most_selected() -> None:
    counts = np.array([[5, 0, 3, 2], [1, 1, 1, 1]])
    np.testing.assert_array_equal(static_curves(counts), [[10, 5, 2, 0, 0], [4, 3, 2, 1, 0]])


def test_the_split_is_the_best_for_convex_curves() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        curves = []
        for _ in range(3):
            steps = np.sort(rng.integers(0, 30, 8))[::-1]  # falling gains: a convex curve
            curves.append(np.concatenate(([steps.sum()], steps.sum() - np.cumsum(steps))))
        c = np.array(curves)
        budget, lo = int(rng.integers(6, 22)), 2
        got = split_slots(c, (10, 11, 12), budget, lo)
        assert sum(got.values()) <= budget and min(got.values()) >= lo
        best = min(sum(c[j, a[j]] for j in range(3)) for a in itertools.product(range(lo, 9), repeat=3)
                   if sum(a) <= budget)
        assert sum(c[j, got[10 + j]] for j in range(3)) == best
    # weights: a budget in bytes, a layer twice as dear gets fewer slots for the same curve
    c = np.array([[8, 7, 6, 5, 4, 3, 2, 1, 0]] * 2)
    w = split_slots(c, (0, 1), 12, 1, weights=[1, 2])
    assert w[0] + 2 * w[1] <= 12 and w[0] > w[1]


def test_the_split_refuses_what_it_cannot_do() -> None:
    c = np.zeros((2, 9), dtype=np.int64)
    with pytest.raises(CacheBudgetError):
        split_slots(c, (0, 1), 7, 4)
    with pytest.raises(ToolInputError):
        split_slots(c, (0, 1), 8, 0)
    # nothing to gain: every layer keeps its least, the rest is left over
    assert split_slots(c, (0, 1), 16, 4) == {0: 4, 1: 4}


def test_per_layer_slots_miss_less_than_equal_slots_held_out() -> None:
    train, test = _routes(seed=0), _routes(seed=1)
    split = split_slots(lru_miss_curves(train, 16).total(), (0, 1, 2), 24, 4)
    assert split[0] <= 6 and split[1] > 8  # the small set needs few, the wide layer takes the rest
    equal = run_policy("lru", test, {0: 8, 1: 8, 2: 8}, 16, ())
    per_layer = run_policy("lru", test, split, 16, ())
    assert per_layer.n_miss < 0.95 * equal.n_miss
    static = split_slots(static_curves(pair_counts(train, 16)), (0, 1, 2), 24, 1)
    assert sum(static.values()) == 24 and static[0] <= 6


def test_the_planner_splits_the_engines_bytes(tiny_topics: list[Path]) -> None:  # noqa: F811
    from llama_moe.tools.routing import TraceRoutes

    layout = layout_of("tiny")
    routes = TraceRoutes([str(p) for p in tiny_topics], layout).scan()
    mib = cache_bytes_for_slots(layout, 8, False) / MiB
    split = per_layer_slots(layout, mib, False, routes)
    assert sum(split.values()) <= 8 * layout.n_layer and min(split.values()) >= layout.n_expert_used
    assert len(set(split.values())) > 1  # the layers differ (first and last are less local)
    plan, _ = plan_cache("tiny", layout, mib, False, routes, per_layer=True)
    s = plan.per_layer
    assert s is not None and s.slots == split and s.curve == "lru" and s.min_slots == layout.n_expert_used
    assert s.uniform_hit_rate == plan.hit_rate  # the same folds with equal slots
    assert s.hit_rate is not None and s.hit_rate.mean > plan.hit_rate.mean
    assert s.misses_per_token < s.uniform_misses_per_token
    hybrid, _ = plan_cache("tiny", layout, cache_bytes_for_slots(layout, 8, True) / MiB, True, routes, per_layer=True,
                           min_slots=2)
    assert hybrid.per_layer.curve == "static" and min(hybrid.per_layer.slots.values()) >= 2


def test_plan_per_layer_writes_the_counts_into_its_json(tiny_model_path: Path, tiny_topics: list[Path],  # noqa: F811
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    model = str(tiny_model_path)
    mib = f"{cache_bytes_for_slots(expert_layout(model), 8, False) / MiB:.4f}"
    traces = [str(p) for p in tiny_topics]
    capsys.readouterr()
    assert main(["plan", model, "--cache-mib", mib, "--trace", *traces, "--per-layer", "--json", "-q"]) == 0
    rep = json.loads(capsys.readouterr().out)
    slots = rep["per_layer"]["slots"]
    assert sorted(int(k) for k in slots) == list(range(6)) and sum(slots.values()) <= 48
    assert "the engine sizes each layer from them" in rep["per_layer"]["note"] and rep["slots"] == 8
    assert main(["plan", model, "--cache-mib", mib, "--trace", *traces, "--per-layer", "-q"]) == 0
    out = capsys.readouterr().out
    assert "per layer  (the profile written with them (--out) carries these counts" in out
    assert "per-layer split loses" not in out  # the topics' curves carry: the split misses less held out
    for argv, why in ((["--per-layer"], "--per-layer needs routing"), (["--trace", *traces, "--min-slots", "2"],
                                                                      "give --per-layer"),
                      (["--trace", *traces, "--per-layer", "--min-slots", "0"], "--min-slots must be >= 1")):
        assert main(["plan", model, "--cache-mib", mib, *argv, "-q"]) == 2
        assert why in capsys.readouterr().err


def test_plan_per_layer_writes_the_counts_into_its_profile(tiny_model_path: Path, tiny_topics: list[Path],  # noqa: F811
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out with --per-layer: the profile carries per_layer.slots in its slot section (every layer of the
    model, 0 for a layer without experts); without --per-layer it has none, as before."""
    from llama_moe.formats.profile import read_profile

    model = str(tiny_model_path)
    layout = expert_layout(model)
    mib = f"{cache_bytes_for_slots(layout, 8, False) / MiB:.4f}"
    traces = [str(p) for p in tiny_topics]
    out = tmp_path / "split.strp"
    capsys.readouterr()
    assert main(["plan", model, "--cache-mib", mib, "--trace", *traces, "--per-layer", "--out", str(out), "--json", "-q"]) == 0
    slots = {int(k): v for k, v in json.loads(capsys.readouterr().out)["per_layer"]["slots"].items()}
    profile = read_profile(out, layout.n_layer, layout.n_expert)
    assert profile.layer_slots == tuple(slots.get(il, 0) for il in range(layout.n_layer))
    assert len(set(profile.layer_slots)) > 1 and profile.ranked
    plain = tmp_path / "plain.strp"
    assert main(["plan", model, "--cache-mib", mib, "--trace", *traces, "--out", str(plain), "-q"]) == 0
    assert read_profile(plain).layer_slots is None and read_profile(plain).ranked == profile.ranked


def _cyclic_and_skewed(n: int = 800, seed: int = 0) -> Routes:
    """Six layers of 32 experts, k=4: layer 0 cycles through all 32 (an LRU hits it only when it holds them all),
    the others pick by a steep Zipf law: at 12 slots the split holds layer 0 whole, which equal slots do not."""
    rng = np.random.default_rng(seed)
    w = 1 / np.arange(1, 33) ** 2.0
    x = np.zeros((n, 6, 4), dtype=np.int8)
    for t in range(n):
        x[t, 0] = (4 * t + np.arange(4)) % 32
        for j in range(1, 6):
            x[t, j] = rng.choice(32, 4, replace=False, p=w / w.sum())
    return Routes(tuple(range(6)), x, np.arange(n + 1, dtype=np.int64))


def test_the_split_and_equal_slots_are_compared_over_the_same_lookups() -> None:
    """A layer held whole needs no lookups: its selections drop out of a hit rate's denominator, so the split's
    hit rate and the equal slots' count other lookups. Misses per token and the share of the selected experts
    resident count every selection of every layer, the same for both."""
    layout = layout_of("tiny")
    k, n_layers = layout.n_expert_used, layout.n_layer
    routes = _cyclic_and_skewed()
    plan, _ = plan_cache("tiny", layout, cache_bytes_for_slots(layout, 12, False) / MiB, False, routes, per_layer=True)
    s = plan.per_layer
    assert s is not None and s.slots[0] == layout.n_expert and plan.slots == 12  # the split holds layer 0 whole
    for resident, misses in ((s.resident, s.misses), (s.uniform_resident, s.uniform_misses)):
        assert resident is not None and misses is not None
        # one token a ubatch: k selections per token and layer, every one a hit, a miss or a whole layer's
        for share, per_token in zip(resident.folds, misses.folds):
            assert share == pytest.approx(1 - per_token / (k * n_layers))
    assert s.misses_per_token < s.uniform_misses_per_token and not s.loses() and s.warning() == ""
    assert s.resident.mean > s.uniform_resident.mean
    assert s.hit_rate.mean < s.resident.mean - 0.02  # over the looked-up layers alone: layer 0's hits drop out
    assert s.uniform_hit_rate == plan.hit_rate and s.uniform_resident.mean == pytest.approx(plan.hit_rate.mean)


def _swapped(local_first: bool, n: int = 400, seed: int = 0) -> np.ndarray:
    """Layers 0-2 local (4 of 6 experts) and 3-5 wide (4 of 32), or the other way round."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 6, 4), dtype=np.int32)
    for t in range(n):
        for il in range(6):
            x[t, il] = (rng.choice(6, 4, replace=False) if (il < 3) == local_first
                        else rng.choice(32, 4, replace=False))
    return x


def test_plan_warns_when_the_split_loses_held_out(tiny_model_path: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Curves from routing that does not carry to the held-out text (here each trace's local layers are the
    other's wide ones): the split misses more than equal slots held out, and the plan says so with both figures."""
    from test_heldout_folds import write_routing

    model = str(tiny_model_path)
    mib = f"{cache_bytes_for_slots(expert_layout(model), 8, False) / MiB:.4f}"
    traces = [str(write_routing(tmp_path / f"{name}.bin", _swapped(first, seed=i)))
              for i, (name, first) in enumerate((("a", True), ("b", False)))]
    argv = ["plan", model, "--cache-mib", mib, "--trace", *traces, "--per-layer", "-q"]
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    rep = json.loads(captured.out)["per_layer"]
    split, equal = rep["misses_per_token"], rep["uniform_misses_per_token"]
    assert split > 1.05 * equal
    warning = next(w for w in json.loads(captured.out)["warnings"] if "per-layer split loses" in w)
    assert f"{split:.3f} against {equal:.3f} misses/token" in warning and "more misses per token" in warning
    assert f"warning: {warning}" in captured.err
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"warning    {warning}" in out
    assert f"per-layer split  " in out and f"(pooled {split:.3f})" in out and f"(pooled {equal:.3f})" in out
    assert "the same lookups for both" in out
