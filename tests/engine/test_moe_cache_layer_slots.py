"""Unequal slots per layer, carried by a profile's per-layer slot section, on the real patched libllama with the
CPU as the cache's device: each layer gets its own count (the status and the layer stats say so), tokens and
logits are those of no cache in upload, hybrid (also through the mailbox) and admitting modes, and the
counters are those of the independent replays (tests/oracles/lru.py) with the same per-layer counts. Counts
that do not fit the budget are scaled down by the documented rule, said; a bad section is refused, said."""
from __future__ import annotations

import re
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, Sampling
from llama_moe.errors import MoeCacheWarning
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.params import MiB
from llama_moe.tools.routing.budget import cache_bytes_for_layer_slots, engine_layer_slots
from llama_moe.batch import stream_batch
from oracles.hybrid import simulate_hybrid
from oracles.lru import simulate_lru

from test_moe_cache_split import N_STEPS, PROMPTS, RAM, SAMPLINGS  # four sequences, prompts over 32 tokens
N_GEN = 256
SAMPLING = Sampling(temperature=0.8, seed=5)


def _counts(path: Path) -> dict[int, int]:
    """Uneven counts: fewer than a token's experts (upload mode splits every decode), a few, many, more than the
    layer's experts (held whole)."""
    layout = expert_layout(path)
    k, n = layout.n_expert_used, layout.n_expert
    pattern = [k - 1, 3 * k, 2, n + 5, k + 1, n // 2]
    return {l.il: pattern[i % len(pattern)] for i, l in enumerate(layout.layers)}


def _ranked(path: Path) -> tuple[tuple[int, int], ...]:
    layout = expert_layout(path)
    return tuple((l.il, (5 * l.il + 3 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers)


def _profile(path: Path, tmp: Path, counts: dict[int, int] | None, name: str = "slots.strp") -> Path:
    layout = expert_layout(path)
    layer_slots = None if counts is None else tuple(counts.get(il, 0) for il in range(layout.n_layer))
    out = tmp / name
    write_profile(out, Profile(layout.n_layer, layout.n_expert, 8, _ranked(path), layer_slots))
    return out


def _mib(path: Path, counts: dict[int, int], hybrid: bool) -> float:
    layout = expert_layout(path)
    # a quarter of the smallest expert of slack for the MiB -> bytes rounding: not a slot more
    return (cache_bytes_for_layer_slots(layout, counts, hybrid) + min(l.bytes_per_expert for l in layout.layers) // 4) / MiB


def _check_slots(path: Path, ctx: Context, counts: dict[int, int]) -> dict[int, int]:
    layout = expert_layout(path)
    want = {il: min(n, layout.n_expert) for il, n in counts.items()}
    assert {l.il: l.n_slots for l in ctx.layer_stats()} == want
    status = ctx.cache_status()
    assert status.n_slots == max(want.values()) and status.n_slots_asked == max(want.values())
    assert status.n_layers_whole == sum(n >= layout.n_expert for n in want.values())
    assert ctx.moe_cache_stats().n_slots == sum(want.values())
    return want


def _batch(model: Model, cp: ContextParams, path: Path, counts: dict[int, int] | None):
    with Context(model, cp) as ctx:
        if counts is not None:
            _check_slots(path, ctx, counts)
        ctx.start_trace()
        tokens, logits = [], []
        with stream_batch(ctx, PROMPTS, N_STEPS + 1, SAMPLINGS, stop_at_eog=False) as stream:
            for n, (i, tok) in enumerate(stream):
                tokens.append((i, tok))
                if n >= len(PROMPTS):
                    logits.append(ctx.logits(i))
        return tokens, np.array(logits), ctx.moe_cache_stats(), ctx.layer_stats(), ctx.stop_trace()


def test_upload_mode_takes_each_layers_slots(lib, tiny_model_path, tmp_path, caplog) -> None:
    layout = expert_layout(tiny_model_path)
    counts = _counts(tiny_model_path)
    profile = _profile(tiny_model_path, tmp_path, counts)
    base = dict(n_ctx=1024, n_threads=2, n_seq_max=4)
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        assert all(len(model.tokenize(p)) > 32 for p in PROMPTS)
        plain_tokens, plain_logits, *_ = _batch(model, ContextParams(moe_cache_device="CPU", **base), tiny_model_path, None)
        cp = ContextParams(moe_cache_device="CPU", **base, moe_cache_mib=_mib(tiny_model_path, counts, False), moe_cache_profile=profile)
        tokens, logits, stats, layers, records = _batch(model, cp, tiny_model_path, counts)
    assert len(tokens) == len(PROMPTS) * (N_STEPS + 1)
    assert tokens == plain_tokens
    assert np.array_equal(logits, plain_logits)
    assert "per-layer slots from the profile" in caplog.text
    assert "slots per layer: " + " ".join(f"{il}:{min(n, layout.n_expert)}" for il, n in counts.items()) in caplog.text
    sim = simulate_lru(records, counts, layout.n_expert, prefill=_ranked(tiny_model_path))
    assert (stats.n_hit, stats.n_hit_profile, stats.n_miss, stats.n_cpu) == (sim.n_hit, sim.n_hit_profile, sim.n_miss,
                                                                             sim.n_cpu)
    got = {l.il: (l.n_slots, l.n_hit, l.n_miss, l.n_cpu) for l in layers if l.il in sim.per_layer}
    assert got == {il: (counts[il], *sim.per_layer[il], sim.per_layer_cpu[il]) for il in sim.per_layer}
    assert stats.n_cpu > 0 and stats.n_hit_profile > 0 and stats.n_miss > stats.n_cpu  # every path ran


@dataclass(frozen=True)
class _Run:
    tokens: list[int]
    logits: np.ndarray
    stats: object
    layers: list
    records: object
    resident: dict[int, list[int]]


def _plain_and_cached(path: Path, counts: dict[int, int], prompt: str, check=None, **cache) -> tuple[_Run, _Run]:
    """The same sampled generation, traced, with no cache and with the hybrid on counts slots per layer (cache:
    its other ContextParams); check(ctx) runs on the cache's context, after its slots are checked."""
    layout = expert_layout(path)
    runs = []
    with Model(path, RAM) as model:
        for cp in (ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2),
                   ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2, moe_cache_hybrid=True, moe_cache_mib=_mib(path, counts, True),
                                 **cache)):
            with Context(model, cp) as ctx:
                if cp.moe_cache_hybrid:
                    _check_slots(path, ctx, counts)
                    if check is not None:
                        check(ctx)
                ctx.start_trace()
                toks = list(ctx.generate(prompt, N_GEN, SAMPLING, stop_at_eog=False))
                resident = {l.il: sorted(ctx.resident(l.il).tolist()) for l in layout.layers}
                runs.append(_Run(toks, ctx.logits().copy(), ctx.moe_cache_stats(), ctx.layer_stats(), ctx.stop_trace(),
                                 resident))
    return runs[0], runs[1]


@pytest.mark.parametrize("way", ["scheduler", "mailbox"])
def test_hybrid_takes_each_layers_slots(lib, tiny_model_path, tmp_path, way) -> None:
    layout = expert_layout(tiny_model_path)
    counts = _counts(tiny_model_path)
    profile = _profile(tiny_model_path, tmp_path, counts)

    def check(ctx: Context) -> None:
        assert len(ctx.tokenize(PROMPTS[0])) > 32
        assert ctx.cache_status().mailbox == (way == "mailbox")

    plain, run = _plain_and_cached(tiny_model_path, counts, PROMPTS[0], check, moe_cache_profile=profile,
                                   moe_cache_mailbox_on_cpu=way == "mailbox")
    stats, layers, records = run.stats, run.layers, run.records
    assert run.tokens == plain.tokens and np.array_equal(run.logits, plain.logits)
    sim, _, _ = simulate_hybrid(records, counts, layout.n_expert, prefill=_ranked(tiny_model_path))
    assert (stats.n_hit, stats.n_hit_profile, stats.n_miss) == (sim.n_hit, sim.n_hit_profile, sim.n_miss)
    assert {l.il: (l.n_hit, l.n_miss) for l in layers if l.il in sim.per_layer} == sim.per_layer
    assert stats.n_prefilled == sum(min(n, layout.n_expert) for n in counts.values() if n < layout.n_expert)
    assert stats.n_hit > 0 and stats.n_miss > 0 and stats.n_bytes_upload == 0


def test_adaptive_hybrid_keeps_each_layers_slots(lib, tiny_model_path, tmp_path) -> None:
    """The adaptive rounds swap within a layer's own slots: no layer holds more than its count."""
    layout = expert_layout(tiny_model_path)
    counts = _counts(tiny_model_path)
    profile = _profile(tiny_model_path, tmp_path, counts)
    plain, run = _plain_and_cached(tiny_model_path, counts, PROMPTS[2], moe_cache_adaptive=True, moe_cache_profile=profile)
    assert run.tokens == plain.tokens and np.array_equal(run.logits, plain.logits)
    stats, slots = run.stats, {l.il: l.n_slots for l in run.layers}
    resident = {il: len(held) for il, held in run.resident.items()}
    assert stats.n_swap > 0 and stats.n_hit > 0
    assert slots == {il: min(n, layout.n_expert) for il, n in counts.items()}
    assert all(resident[il] <= slots[il] for il in slots) and resident == slots  # the profile filled every slot


@pytest.mark.parametrize("with_profile_ranks, background", [(True, False), (False, False), (True, True)])
def test_admitting_hybrid_takes_each_layers_slots(lib, tiny_model_path, tmp_path, with_profile_ranks,
                                                  background) -> None:
    """Admission with its own slots per layer: synchronous, as on the CPU device by default, or in the
    background, as on a GPU."""
    layout = expert_layout(tiny_model_path)
    counts = _counts(tiny_model_path)
    profile = _profile(tiny_model_path, tmp_path, counts)
    if not with_profile_ranks:  # a profile of counts alone: every layer starts empty and admits
        profile = tmp_path / "counts_only.strp"
        write_profile(profile, Profile(layout.n_layer, layout.n_expert, 0, (),
                                       tuple(counts.get(il, 0) for il in range(layout.n_layer))))
    admit = 2
    plain, run = _plain_and_cached(tiny_model_path, counts, PROMPTS[1], moe_cache_admit=admit, moe_cache_profile=profile,
                                   moe_cache_admit_async=background)
    stats, layers, records, resident = run.stats, run.layers, run.records, run.resident
    assert run.tokens == plain.tokens and np.array_equal(run.logits, plain.logits)
    ranked = _ranked(tiny_model_path) if with_profile_ranks else ()
    sim, slots, admitted = simulate_hybrid(records, counts, layout.n_expert, admit=admit, prefill=ranked,
                                           background=background)
    assert (stats.n_hit, stats.n_hit_profile, stats.n_miss, stats.n_admit) == (sim.n_hit, sim.n_hit_profile, sim.n_miss,
                                                                               admitted)
    assert {l.il: (l.n_hit, l.n_miss) for l in layers if l.il in sim.per_layer} == sim.per_layer
    for il, held in slots.items():
        assert resident[il] == sorted(e for e in held if e >= 0), il
        assert len(resident[il]) <= counts[il]
    assert admitted > 0 and stats.n_hit > 0


def test_counts_over_the_budget_are_scaled_down_and_said(lib, tiny_model_path, tmp_path, caplog) -> None:
    layout = expert_layout(tiny_model_path)
    counts = _counts(tiny_model_path)
    profile = _profile(tiny_model_path, tmp_path, counts)
    half = {il: max(1, n // 2) for il, n in counts.items()}
    mib = _mib(tiny_model_path, half, False)
    want = engine_layer_slots(layout, int(mib * MiB), counts, False)
    assert want != {il: min(n, layout.n_expert) for il, n in counts.items()}
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match="per-layer slots take .* scaled by"):
            ctx = Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, moe_cache_mib=mib, moe_cache_profile=profile))
        with ctx:
            assert {l.il: l.n_slots for l in ctx.layer_stats()} == want
            status = ctx.cache_status()
            assert status.state == "partial" and status.reasons == ("fewer_slots",)
            # the size asked for gives these: the device's free memory did not take any away
            assert status.n_slots == status.n_slots_asked == max(want.values())
            assert len(list(ctx.generate(PROMPTS[0], 16, SAMPLING, stop_at_eog=False))) == 16
    # larger budgets than the counts take: the counts as they are, the rest not allocated
    caplog.clear()
    with Model(tiny_model_path, RAM) as model:
        big = _mib(tiny_model_path, {il: 2 * n for il, n in counts.items()}, False)
        with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=big, moe_cache_profile=profile)) as ctx:
            _check_slots(tiny_model_path, ctx, counts)
            assert ctx.cache_status().as_asked
    assert "the rest is not allocated" in caplog.text


def _section(n_layers: int, counts: list[int], magic: bytes = b"SLOT", version: int = 1) -> bytes:
    return magic + version.to_bytes(4, "little") + n_layers.to_bytes(4, "little") + b"".join(
        c.to_bytes(4, "little") for c in counts)


def _bad_sections(path: Path) -> dict[str, tuple[bytes, str]]:
    layout = expert_layout(path)
    plain = Profile(layout.n_layer, layout.n_expert, 8, _ranked(path)).to_bytes()
    good = [4] * layout.n_layer
    zero = list(good)
    zero[layout.layers[0].il] = 0
    return {
        "magic": (plain + _section(layout.n_layer, good, magic=b"SLOX"), "not a per-layer slot section"),
        "stray bytes": (plain + b"\0\0", "not a per-layer slot section"),
        "version": (plain + _section(layout.n_layer, good, version=2), "per-layer slot section version 2"),
        "layers": (plain + _section(layout.n_layer + 1, good + [4]), f"slot section has {layout.n_layer + 1} layers"),
        "truncated": (plain + _section(layout.n_layer, good)[:-2], "should be"),
        "short header": (plain + b"SLOT\1\0", "truncated"),
        "zero": (plain + _section(layout.n_layer, zero), f"gives layer {layout.layers[0].il} no slots"),
    }


def test_bad_slot_sections_are_refused_with_the_reason(lib, tiny_model_path, tmp_path, caplog) -> None:
    from llama_moe.errors import ProfileError
    from llama_moe.formats.profile import read_profile

    layout = expert_layout(tiny_model_path)
    equal = 6
    mib = _mib(tiny_model_path, {l.il: equal for l in layout.layers}, False)
    caplog.set_level(logging.WARNING, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        for name, (data, why) in _bad_sections(tiny_model_path).items():
            path = tmp_path / f"{name.replace(' ', '_')}.strp"
            path.write_bytes(data)
            if name != "zero":  # a count of 0 is a layer without one: only a cached layer refuses it
                with pytest.raises(ProfileError, match=why):
                    read_profile(path)
            caplog.clear()
            with pytest.warns(MoeCacheWarning, match=why):
                ctx = Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib, moe_cache_profile=path))
            with ctx:
                status = ctx.cache_status()
                assert status.reasons == ("profile_refused",) and why in status.text, name
                assert re.search(why, status.profile_error), (name, status.profile_error)
                assert {l.n_slots for l in ctx.layer_stats()} == {equal}, name  # equal slots, as without a section
                assert ctx.moe_cache_stats().n_prefilled == 0, name
                assert list(ctx.generate(PROMPTS[0], 4, stop_at_eog=False)), name
            assert "refused" in caplog.text and why in caplog.text, (name, caplog.text)
    # an old profile (no section) still loads, with equal slots
    old = _profile(tiny_model_path, tmp_path, None, "old.strp")
    assert read_profile(old).layer_slots is None
    with Model(tiny_model_path, RAM) as model:
        with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib, moe_cache_profile=old)) as ctx:
            assert {l.n_slots for l in ctx.layer_stats()} == {equal} and ctx.cache_status().as_asked
            assert ctx.moe_cache_stats().n_prefilled == equal * layout.n_moe_layers


def test_the_devices_free_memory_scales_the_counts_by_the_same_rule(lib, tiny_model_path, tmp_path, monkeypatch) -> None:
    layout = expert_layout(tiny_model_path)
    counts = _counts(tiny_model_path)
    profile = _profile(tiny_model_path, tmp_path, counts)
    free_kib = int(_mib(tiny_model_path, {il: max(1, n // 3) for il, n in counts.items()}, True) * 1024)
    monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(free_kib))
    want = engine_layer_slots(layout, free_kib * 1024, counts, True)
    asked = {il: min(n, layout.n_expert) for il, n in counts.items()}
    assert want != asked
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match="MiB free: the per-layer slots scaled down"):
            ctx = Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, moe_cache_hybrid=True, moe_cache_profile=profile,
                                               moe_cache_mib=_mib(tiny_model_path, counts, True)))
        with ctx:
            assert {l.il: l.n_slots for l in ctx.layer_stats()} == want
            status = ctx.cache_status()
            assert status.reasons == ("fewer_slots",)
            assert (status.n_slots, status.n_slots_asked) == (max(want.values()), max(asked.values()))
            assert len(list(ctx.generate(PROMPTS[0], 8, SAMPLING, stop_at_eog=False))) == 8
        # too little for one slot per layer: off, said
        monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", "1")
        with pytest.warns(MoeCacheWarning, match="cannot hold one expert per layer"):
            ctx = Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_profile=profile,
                                               moe_cache_mib=_mib(tiny_model_path, counts, False)))
        with ctx:
            assert ctx.cache_status().state == "off" and ctx.moe_cache_stats() is None
