"""Each sequence's share of the MoE cache's counters (Context.moe_cache_seq_stats, llama_moe_cache_get_seq_stats)
on the real patched libllama, the CPU as the cache device: every lookup is charged to exactly one sequence, so the
shares add up to the context's counters in upload and hybrid mode; one sequence alone gets all of them."""
from __future__ import annotations

import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, ParameterError, SeqStats
from llama_moe.batch import generate_batch, stream_batch
from support.cache_sizes import mib_for_slots

PROMPTS = ["The ship left the harbour at dawn, and the crew", "To grow tomatoes in a small garden, start with",
           "The history of the city", "In the morning the baker"]
FIELDS = (("n_hit", "n_hit"), ("n_miss", "n_miss"), ("n_refused", "n_refused"), ("n_bytes_upload", "n_bytes_upload"),
          ("n_bytes_cpu", "n_bytes_cpu"))


@pytest.fixture(scope="module")
def model(lib, tiny_model_path):
    with Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False)) as m:
        yield m


@pytest.mark.parametrize("hybrid", [False, True])
def test_the_sequences_shares_add_up_to_the_counters(model, tiny_model_path, hybrid) -> None:
    mib = mib_for_slots(tiny_model_path, 16, hybrid)
    # the hybrid adaptive, so that it fills itself and hits (without a profile it would stay empty)
    cp = ContextParams(moe_cache_device="CPU", n_ctx=1024, n_seq_max=4, moe_cache_mib=mib, moe_cache_hybrid=hybrid, moe_cache_adaptive=hybrid,
                       n_threads=2)
    with Context(model, cp) as ctx:
        generate_batch(ctx, PROMPTS, max_tokens=[24, 12, 18, 6])
        total = ctx.moe_cache_stats()
        shares = [ctx.moe_cache_seq_stats(q) for q in range(4)]
        assert all(isinstance(s, SeqStats) and s.n_lookup > 0 for s in shares), shares
        for seq_field, field in FIELDS:
            if hybrid and field == "n_bytes_upload":
                # the adaptive cache's swaps upload between decodes, for no sequence
                assert sum(s.n_bytes_upload for s in shares) == 0
                continue
            assert sum(getattr(s, seq_field) for s in shares) == getattr(total, field), field
        assert total.n_hit > 0 and total.n_miss > 0
        assert ctx.moe_cache_seq_stats(4) == SeqStats(0, 0, 0, 0, 0)   # a sequence that never decoded
        with pytest.raises(ParameterError, match="seq must be from 0 to 255"):
            ctx.moe_cache_seq_stats(256)


@pytest.mark.parametrize("hybrid", [False, True])
def test_each_lookup_goes_to_the_sequence_that_selected_it_first(model, tiny_model_path, hybrid) -> None:
    """Four sequences whose distinct experts (4 x 4 a decode) fit the 16 slots, so that upload mode takes its
    path without the split: each distinct expert of a decode step is charged to the first of its tokens, in batch
    order (the live sequences in order), that selected it, as the accounting rule says; read from the routing trace
    of the steps after the prompts."""
    max_tokens = [24, 12, 18, 6]
    cp = ContextParams(moe_cache_device="CPU", n_ctx=1024, n_seq_max=4, moe_cache_mib=mib_for_slots(tiny_model_path, 16, hybrid),
                       moe_cache_hybrid=hybrid, moe_cache_adaptive=hybrid, n_threads=2)
    with Context(model, cp) as ctx:
        with stream_batch(ctx, PROMPTS, max_tokens=max_tokens, stop_at_eog=False) as stream:
            for _ in range(4):  # the prompts' first tokens, before any step
                next(stream)
            before = [ctx.moe_cache_seq_stats(q).n_lookup for q in range(4)]
            ctx.start_trace()
            for _ in stream:
                pass
        records = ctx.stop_trace()
        shares = [ctx.moe_cache_seq_stats(q).n_lookup - before[q] for q in range(4)]
        n_layers = len(ctx.layer_stats())
    # the records by ubatch (a layer not after the one before starts the next); a step's live sequences may come
    # in several ubatches, in order
    ubatches: list[list] = []
    for r in records:
        if not ubatches or r.il <= ubatches[-1][-1].il:
            ubatches.append([])
        ubatches[-1].append(r)
    assert all(len(u) == n_layers for u in ubatches)
    expected, step, done = [0] * 4, 0, 0
    for u in ubatches:
        live = [i for i in range(4) if step + 1 < max_tokens[i]]
        owners = live[done:done + u[0].n_tokens]
        for r in u:
            assert r.n_tokens == len(owners)
            seen: set[int] = set()
            for k, row in enumerate(r.experts.tolist()):
                for e in row:
                    if e not in seen:
                        seen.add(e)
                        expected[owners[k]] += 1
        done += u[0].n_tokens
        if done == len(live):
            step, done = step + 1, 0
    assert step == max(max_tokens) - 1 and done == 0
    assert shares == expected


def test_one_sequence_gets_every_lookup(model, tiny_model_path) -> None:
    cp = ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, 13), n_threads=2)
    with Context(model, cp) as ctx:
        generate_batch(ctx, PROMPTS[:1], max_tokens=16)
        total, own = ctx.moe_cache_stats(), ctx.moe_cache_seq_stats(0)
        assert (own.n_hit, own.n_miss, own.n_refused, own.n_bytes_upload) == (
            total.n_hit, total.n_miss, total.n_refused, total.n_bytes_upload)
        assert own.hit_rate == total.hit_rate


def test_no_cache_no_shares(model) -> None:
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2)) as ctx:
        assert ctx.moe_cache_seq_stats(0) is None
