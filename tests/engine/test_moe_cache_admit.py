"""The hybrid with admission (moe_cache_admit N) on the real patched libllama, the CPU as the cache's device:
each decode's missed experts are uploaded before the next decode, at most N per layer, into the least recently
used slots, synchronously or (as on a GPU) in the background, where an expert becomes a hit a decode later.
Nothing a token computes changes, and the counters are those of an independent replay of the engine's own
routing trace."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, MoeCacheWarning, Sampling
from llama_moe.errors import ParameterError
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.trace import RoutingRecord
from support.cache_sizes import mib_for_slots
from support.traced import traced_generation

PROMPT = "The ship left the harbour at dawn, and the crew"
SAMPLING = Sampling(temperature=0.8, seed=3)  # sampled text: greedy decoding of a bigram model loops
N_GEN = 160
SLOTS = 8
RAM = ModelParams(cpu_moe=True, repack=False)


def _admitting(path: Path, n: int, slots: int = SLOTS, **kw) -> ContextParams:
    return ContextParams(moe_cache_device="CPU", n_ctx=1024, moe_cache_mib=mib_for_slots(path, slots, hybrid=True), moe_cache_hybrid=True,
                         moe_cache_admit=n, **kw)


def _without_cache(model: Model) -> tuple[list[int], np.ndarray]:
    """The reference: the same generation without a cache, its tokens and last logits."""
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=1024)) as ctx:
        return list(ctx.generate(PROMPT, N_GEN, SAMPLING, stop_at_eog=False)), ctx.logits().copy()


@dataclass
class _Layer:
    """One layer of the replay: slot -> expert, slot -> last use, the misses waiting for the next admission."""
    expert_in: list[int]
    last_use: list[int]
    queue: list[int] = field(default_factory=list)
    in_flight: set[int] = field(default_factory=set)  # slots whose background upload is not known complete
    last_lookup: int = 0  # the stamp of the layer's latest lookup: what its slots served there is the current token's
    hits: int = 0
    misses: int = 0


def replay(records: list[RoutingRecord], n_slots: int, admit: int,
           background: bool = False) -> tuple[dict[int, _Layer], int]:
    """The admission rule, written from its description: per ubatch and layer, a selected expert in a slot is a
    hit (once per ubatch) and marks the slot used; a missed one (once per ubatch) waits in first-seen order.
    Between decodes (here: between ubatches, one ubatch a decode), each layer uploads its first ``admit``
    waiting experts, each into its first free slot, else the least recently used one (the lowest of equals),
    marked as used after every hit of the ubatch before. A round never evicts what it admitted or what the
    ubatch before used: a layer whose slots all hold such experts admits no more. In the ``background``, an
    admitted expert evicts its slot's expert at once but is a hit only from the decode after the next one: the
    next decode starts by waiting for the round before it, whose experts land as used by the decode just done."""
    layers: dict[int, _Layer] = {}
    admitted, clock, prev_il = 0, 0, None

    def admit_all() -> None:
        nonlocal admitted, clock
        for l in layers.values():
            for s in l.in_flight:  # the round before is complete
                l.last_use[s] = clock
            l.in_flight.clear()
        clock += 1
        for l in layers.values():
            n = 0
            for e in l.queue:
                if n >= admit:
                    break
                if e in l.expert_in:
                    continue
                free = [s for s, x in enumerate(l.expert_in) if x < 0]
                s = free[0] if free else min(range(n_slots), key=lambda i: (l.last_use[i], i))
                if l.expert_in[s] >= 0 and l.last_use[s] >= l.last_lookup:
                    break  # every slot holds what this round admitted or the ubatch before used
                l.expert_in[s], l.last_use[s] = e, clock
                if background:
                    l.in_flight.add(s)
                n += 1
            l.queue.clear()
            admitted += n

    for r in records:
        if prev_il is not None and r.il <= prev_il:
            admit_all()  # the next decode starts
        prev_il = r.il
        clock += 1
        l = layers.setdefault(r.il, _Layer([-1] * n_slots, [0] * n_slots))
        l.last_lookup = clock
        seen: set[int] = set()
        for e in r.experts.reshape(-1).tolist():
            if e < 0 or e in seen:  # -1: a token the layer did not compute (the last layer computes a prompt's last)
                continue
            seen.add(e)
            if e in l.expert_in and l.expert_in.index(e) not in l.in_flight:
                l.hits += 1
                l.last_use[l.expert_in.index(e)] = clock
            else:
                l.misses += 1
                l.queue.append(e)
    return layers, admitted


# 2 slots: fewer than a token's 4 experts, and admissions of a round up to twice the slots
@pytest.mark.parametrize("admit, background, slots", [(1, False, SLOTS), (4, False, SLOTS), (2, True, SLOTS),
                                                      (4, False, 2), (2, True, 2), (4, True, 2)])
def test_admission_changes_no_token_and_counts_as_its_replay(lib, tiny_model_path, caplog,
                                                             admit: int, background: bool, slots: int) -> None:
    layout = expert_layout(tiny_model_path)
    # on the CPU device admission is synchronous unless asked; a GPU's default is the background
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        plain, plain_logits = _without_cache(model)
        with Context(model, _admitting(tiny_model_path, admit, slots, moe_cache_admit_async=background)) as ctx:
            run = traced_generation(ctx, PROMPT, N_GEN, SAMPLING)
            resident = {il: sorted(ctx.resident(il).tolist()) for il in run.layers}
    records, stats, per_layer = run.records, run.stats, run.layers
    assert run.tokens == plain
    assert np.array_equal(run.logits, plain_logits)
    assert all(l.n_slots == slots for l in per_layer.values())
    layers, admitted = replay(records, slots, admit, background)
    # the last decode's misses wait for a next decode that never came
    assert stats.n_admit == admitted > 0
    assert stats.n_swap == 0 and stats.n_prefilled == 0
    assert stats.n_bytes_upload == stats.n_admit * layout.layers[0].bytes_per_expert
    for il, l in layers.items():
        assert (per_layer[il].n_hit, per_layer[il].n_miss) == (l.hits, l.misses), il
        assert resident[il] == sorted(e for s, e in enumerate(l.expert_in) if e >= 0 and s not in l.in_flight), il
    assert stats.n_resident == sum(len(r) for r in resident.values())
    assert f"admits up to {admit} missed experts per layer between two decodes" in caplog.text
    assert ("admission uploads in the background on a stream of its own" in caplog.text) == background
    if background:
        assert "llama_moe_cache: admission in the background: " in caplog.text
    assert "starts empty and stays empty" not in caplog.text


def test_a_round_never_evicts_its_own_arrivals(lib, tiny_model_path) -> None:
    """At 2 slots a layer and 2 admissions a round, the background's arrivals are hits for the decode after the
    next, as the synchronous ones are for the next: its hit rate stays near the synchronous one's."""
    rates = {}
    with Model(tiny_model_path, RAM) as model:
        for background in (False, True):
            with Context(model, _admitting(tiny_model_path, 2, 2, moe_cache_admit_async=background)) as ctx:
                list(ctx.generate(PROMPT, N_GEN, SAMPLING, stop_at_eog=False))
                s = ctx.moe_cache_stats()
                rates[background] = s.hit_rate
                assert s.n_admit <= 2 * len(ctx.layer_stats()) * (N_GEN + 1)
    assert rates[False] > 0.1 and rates[True] >= 0.5 * rates[False], rates


def test_admission_fills_a_hybrid_that_would_stay_empty(lib, tiny_model_path) -> None:
    rates, admitted = {}, {}
    with Model(tiny_model_path, RAM) as model:
        for n in (0, 8):
            cp = _admitting(tiny_model_path, n, n_threads=2)
            with Context(model, cp) as ctx:
                list(ctx.generate(PROMPT, 96, SAMPLING, stop_at_eog=False))
                s = ctx.moe_cache_stats()
                rates[n], admitted[n] = s.hit_rate, s.n_admit
    assert rates[0] == 0.0 and admitted[0] == 0  # the hybrid without a profile nor admission stays empty
    assert rates[8] > 0.3 and admitted[8] > 0, (rates, admitted)


def test_admission_through_the_mailbox_is_the_schedulers(lib, tiny_model_path) -> None:
    """The mailbox's CPU side counts a token's misses itself: admission sees the same misses either way."""
    out = {}
    with Model(tiny_model_path, RAM) as model:
        for way in ("scheduler", "mailbox"):
            with Context(model, _admitting(tiny_model_path, 2, n_threads=2, moe_cache_mailbox_on_cpu=way == "mailbox")) as ctx:
                tokens = list(ctx.generate(PROMPT, 64, SAMPLING, stop_at_eog=False))
                out[way] = (tokens, ctx.logits().copy(), [(l.n_hit, l.n_miss) for l in ctx.layer_stats()],
                            ctx.moe_cache_stats().n_admit)
    assert out["mailbox"][0] == out["scheduler"][0]
    assert np.array_equal(out["mailbox"][1], out["scheduler"][1])
    assert out["mailbox"][2:] == out["scheduler"][2:]
    assert out["mailbox"][3] > 0


@pytest.mark.parametrize("background", [False, True])
def test_admission_chosen_by_the_engine(lib, tiny_model_path, caplog, background: bool) -> None:
    """moe_cache_admit="auto": the engine sizes each round from its measured copy and decode times, between 0
    and 4 a layer, and says what it chose; nothing a token computes changes."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        plain, plain_logits = _without_cache(model)
        with Context(model, _admitting(tiny_model_path, "auto", moe_cache_admit_async=background)) as ctx:
            got = list(ctx.generate(PROMPT, N_GEN, SAMPLING, stop_at_eog=False))
            logits = ctx.logits().copy()
            stats = ctx.moe_cache_stats()
            n_layers = len(ctx.layer_stats())
    assert got == plain and np.array_equal(logits, plain_logits)
    assert "as many per layer (up to 4) as the measured copies fit in half a decode" in caplog.text
    m = re.search(r"admission's budget, chosen by the engine: (\d+) per layer and decode at the end \(from (\d+) to "
                  r"(\d+)\); an expert's copy took ([\d.]+) us, a decode ([\d.]+) ms", caplog.text)
    assert m, caplog.text[-2000:]
    n, lo, hi = (int(m.group(i)) for i in (1, 2, 3))
    assert 0 <= lo <= n <= hi <= 4 and hi >= 1
    assert float(m.group(4)) > 0 and float(m.group(5)) > 0
    # at most the budget's ceiling a layer and decode
    assert 0 < stats.n_admit <= 4 * n_layers * N_GEN


@pytest.mark.parametrize("kw, why", [
    ({"moe_cache_admit": -1}, "moe_cache_admit must be \"auto\" or a whole number of experts"),
    ({"moe_cache_admit": "fast"}, "moe_cache_admit must be \"auto\" or a whole number of experts"),
    ({"moe_cache_admit": 2.5}, "moe_cache_admit must be \"auto\" or a whole number of experts"),
    ({"moe_cache_admit": True}, "moe_cache_admit must be \"auto\" or a whole number of experts"),
])
def test_bad_admission_settings_are_refused(kw, why) -> None:
    base = {"moe_cache_mib": 4, "moe_cache_hybrid": True}
    with pytest.raises(ParameterError, match=why):
        ContextParams(moe_cache_device="CPU", **{**base, **kw}).validate()


@pytest.mark.parametrize("admit", ["auto", 2])
def test_admission_without_the_hybrid_is_the_engines_to_refuse(lib, tiny_model_path, admit) -> None:
    """Admission needs the hybrid: Python takes the value (its type and range are right), the engine drops it
    with its reason in the status, and the upload cache runs."""
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, SLOTS),
                       moe_cache_admit=admit)
    cp.validate()
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match="--moe-cache-admit without --moe-cache-hybrid is ignored"):
            ctx = Context(model, cp)
        with ctx:
            status = ctx.cache_status()
            list(ctx.generate(PROMPT, 8, SAMPLING, stop_at_eog=False))
            assert ctx.moe_cache_stats().n_admit == 0
    assert (status.state, status.mode, status.reasons) == ("partial", "upload", ("option_ignored",))
