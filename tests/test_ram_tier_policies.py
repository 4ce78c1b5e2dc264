"""The RAM tier's policy study (benchmarks/ram_tier_policies.py) on small routing: the VRAM tier's misses are
the RAM tier's stream, its LRU and the exclusive pair are LRUs at the sizes the library's stack distances give,
every policy reads what it misses and keeps what it must, and the ceiling bounds them all."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from llama_moe.tools.errors import ToolInputError
from llama_moe.tools.routing.misscurves import lru_miss_curves
from llama_moe.tools.routing.routes import Routes

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load():
    sys.path.insert(0, str(_BENCH))  # the script imports its sibling admit_policies, as when run
    try:
        spec = importlib.util.spec_from_file_location("ram_tier_policies", _BENCH / "ram_tier_policies.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(_BENCH))


rt = _load()
N_EXPERT, K = 32, 4
POLICIES = ("lru", "lfu", "slru:0.5", "arc", "lrfu:16", "static+lru:0.5")


def _routing(n: int = 400, seed: int = 0) -> np.ndarray:
    """[n, 3, K]: layer 0 reuses a small drifting set, layer 1 picks from all experts, layer 2 mixes a few
    recurring experts with one-offs."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n):
        drift = (t // 25) % 20
        recurring = rng.choice(5, 2, replace=False)
        rows.append([drift + rng.choice(12, K, replace=False), rng.choice(N_EXPERT, K, replace=False),
                     np.concatenate([recurring, 5 + rng.choice(N_EXPERT - 5, K - 2, replace=False)])])
    return np.array(rows, dtype=np.int32)


def _lru_misses(x: np.ndarray | Routes, slots: int) -> int:
    """Misses of a cold LRU of ``slots`` per layer over ``x``, by the library's stack distances."""
    if isinstance(x, np.ndarray):
        x = Routes(tuple(range(x.shape[1])), x.astype(np.int8), np.arange(len(x) + 1, dtype=np.int64))
    return int(lru_miss_curves(x, N_EXPERT).total()[:, slots].sum())


def _cold(n_layer: int = 3) -> list[list[int]]:
    return [[] for _ in range(n_layer)]


@pytest.mark.parametrize("vram", [0, 6])
def test_the_stream_is_the_vram_tiers_misses(vram: int) -> None:
    x = _routing()
    s = rt.vram_tier(x, vram, _cold(), N_EXPERT)
    assert s.lookups + s.vram_hits == x.size  # every selection hit VRAM or reached RAM
    assert s.lookups == _lru_misses(x, vram)  # an LRU's misses, by stack distances
    for j in range(3):
        for t, (row, out) in enumerate(zip(s.rows[j], s.victims[j])):
            assert set(row) <= set(x[t, j].tolist()) and not set(out) & set(x[t, j].tolist())
    for spec in (*POLICIES, "belady", "lru-exclusive"):
        assert rt.tier_replay(spec, s, 8, K, _cold(), _cold()).lookups == s.lookups


@pytest.mark.parametrize("vram", [0, 6])
def test_lru_is_an_lru_and_gains_with_slots(vram: int) -> None:
    x = _routing()
    s = rt.vram_tier(x, vram, _cold(), N_EXPERT)
    rates = []
    for ram in (4, 6, 8, 12, 16, 24):
        c = rt.tier_replay("lru", s, ram, K, _cold(), _cold())
        assert c.disk_reads == _lru_misses(s.routes(), ram)  # stack distances on the stream itself
        if not vram:
            assert c.disk_reads == _lru_misses(x, ram)
        rates.append(c.hit_rate)
    assert rates == sorted(rates) and rates[-1] > rates[0] + 0.2


def test_lru_from_a_fill_gains_with_slots() -> None:
    x = _routing()
    train_raw, train_tier = rt.document_counts(_routing(seed=1), 6, N_EXPERT)
    got = [rt.held_out_fold(x, train_raw, train_tier, 6, [n], ["lru"]).tiers[n, "lru"].hit_rate
           for n in (4, 8, 12, 16, 24)]
    assert got == sorted(got) and got[-1] > got[0]


@pytest.mark.parametrize("vram", [0, 6])
def test_belady_bounds_every_policy_on_its_stream(vram: int) -> None:
    x = _routing()
    train_raw, train_tier = rt.document_counts(_routing(seed=1), vram, N_EXPERT)
    for ram in (8, 12, 16):
        f = rt.held_out_fold(x, train_raw, train_tier, vram, [ram], [*POLICIES, "belady"])
        ceiling = f.tiers[ram, "belady"].hits
        for spec in POLICIES:
            assert f.tiers[ram, spec].hits <= ceiling, (vram, ram, spec)
        assert f.tiers[ram, "belady"].hits > f.tiers[ram, "lru"].hits  # a ceiling above, not level


def test_exclusive_is_one_lru_of_both_tiers() -> None:
    x = _routing()
    for vram, ram in ((6, 8), (6, 12), (8, 16)):
        s = rt.vram_tier(x, vram, _cold(), N_EXPERT)
        excl = rt.tier_replay("lru-exclusive", s, ram, K, _cold(), _cold())
        incl = rt.tier_replay("lru", s, ram, K, _cold(), _cold())
        assert excl.lookups == incl.lookups == s.lookups
        assert excl.hits + excl.disk_reads == excl.lookups and incl.hits + incl.disk_reads == incl.lookups
        assert excl.disk_reads == _lru_misses(x, vram + ram)  # VRAM its most recent, RAM the next
        assert excl.disk_reads <= incl.disk_reads  # no copy held twice
    s0 = rt.vram_tier(x, 0, _cold(), N_EXPERT)
    assert rt.tier_replay("lru-exclusive", s0, 8, K, _cold(), _cold()) == rt.TierCount(
        "lru-exclusive", *[getattr(rt.tier_replay("lru", s0, 8, K, _cold(), _cold()), a) for a in ("hits", "lookups")])


def test_exclusive_tiers_never_hold_an_expert_twice() -> None:
    x = _routing()
    vram, ram = 6, 8
    s = rt.vram_tier(x, vram, _cold(), N_EXPERT)
    for j in range(3):
        tier = rt.ExclusiveLru(ram, K, [])
        in_vram: set[int] = set()
        for t, (row, out) in enumerate(zip(s.rows[j], s.victims[j])):
            before = tier.held()
            hits = tier.token(row, t, out)
            in_vram = (in_vram | set(row)) - set(out)
            assert hits == len(set(row) & before)
            assert set(x[t, j].tolist()) <= in_vram and len(in_vram) <= vram
            assert not tier.held() & in_vram and len(tier.held()) <= ram
            assert tier.held() <= (before - set(row)) | set(out)  # nothing but VRAM's victims comes in


@pytest.mark.parametrize("spec", POLICIES)
def test_every_policy_reads_its_misses_and_keeps_the_token(spec: str) -> None:
    x = _routing()
    ranked = [list(range(N_EXPERT)) for _ in range(3)]
    for ram in (K, 8, 12):
        if spec.startswith("static") and ram < 2 * K:
            continue
        for j in range(3):
            tier = rt.make_policy(spec, ram, K, ranked[j][:ram], ranked[j])
            assert tier.held() == set(range(ram))
            for t, row in enumerate(x[:, j].tolist()):
                before = tier.held()
                assert tier.token(row, t) == len(set(row) & before)
                after = tier.held()
                assert set(row) <= after and len(after) <= ram and after <= before | set(row), (spec, ram, t)


def test_static_pins_its_share_and_without_one_is_lru() -> None:
    x = _routing()
    s = rt.vram_tier(x, 0, _cold(), N_EXPERT)
    fills = [list(range(12)) for _ in range(3)]
    assert (rt.tier_replay("static+lru:0", s, 12, K, fills, fills).hits
            == rt.tier_replay("lru", s, 12, K, fills, fills).hits)
    tier = rt.make_policy("static+lru:0.5", 12, K, fills[0], fills[0])
    for t, row in enumerate(x[:, 2].tolist()):
        tier.token(row, t)
        assert set(range(6)) <= tier.held()  # the pinned half never leaves


def test_bad_sizes_and_names_say_why() -> None:
    with pytest.raises(ToolInputError, match="cannot hold one token's 4 experts"):
        rt.make_policy("lru", 3, K, [])
    with pytest.raises(ToolInputError, match="leaving fewer than one token's 4 experts"):
        rt.make_policy("static+lru:0.75", 12, K, [], list(range(12)))
    with pytest.raises(ToolInputError, match="unknown RAM tier policy 'mru'"):
        rt.parse_policy("mru")
    with pytest.raises(ToolInputError, match="cannot hold one token's 4 experts"):
        rt.vram_tier(_routing(20), 2, _cold(), N_EXPERT)


def test_the_stream_parts_add_up_to_the_stream() -> None:
    docs = [_routing(150, seed) for seed in range(3)]
    specs = ["lru", "lfu", "lru-exclusive", "belady"]
    for vram in (0, 6):
        parts = rt.stream_parts(docs, vram, [8, 12], specs, N_EXPERT)
        whole = rt.vram_tier(np.concatenate(docs), vram, _cold(), N_EXPERT)
        assert [p.n_tokens for p in parts] == [150] * 3
        assert sum(p.vram_lookups for p in parts) == sum(d.size for d in docs)
        for n in (8, 12):
            for spec in ("lru", "lfu", "lru-exclusive"):
                got = [p.tiers[n, spec] for p in parts]
                assert sum(c.lookups for c in got) == whole.lookups == sum(p.vram_lookups - p.vram_hits for p in parts)
                assert sum(c.hits for c in got) == rt.tier_replay(spec, whole, n, K, _cold(), _cold()).hits
                if spec != "lru-exclusive":
                    assert all(c.hits <= p.tiers[n, "belady"].hits for c, p in zip(got, parts))
