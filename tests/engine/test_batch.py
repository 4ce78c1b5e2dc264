"""Several sequences in one context on the real patched libllama (the CPU as the cache device): every cache mode
gives exactly the tokens of the same batch without a cache (a long prompt beside a short one too), while the cache
sees ubatches of several tokens and counts them as the routing says; sequences end at different times; bad input
is refused. A batch is not bound to give each prompt the tokens it gets decoded alone: the batched products round
differently, and a near-tie can go the other way (these short prompts happen to match theirs)."""
from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from llama_moe import BatchResult, Context, ContextParams, Model, ModelParams, ParameterError, Sampling
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.batch import generate_batch, stream_batch
from oracles.lru import MAX_UBATCH, simulate_lru
from support.cache_sizes import mib_for_slots

PROMPTS = ["The ship left the harbour at dawn, and the crew", "To grow tomatoes in a small garden, start with",
           "The history of the city", "In the morning the baker"]
MAX_TOKENS = [40, 24, 33, 10]  # the sequences end at different steps
RAM = ModelParams(cpu_moe=True, repack=False)
MODES = ("none", "upload", "hybrid", "adaptive")


@pytest.fixture(scope="module")
def model(lib, tiny_model_path):
    with Model(tiny_model_path, RAM) as m:
        yield m


@pytest.fixture(scope="module")
def profile_path(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    layout = expert_layout(tiny_model_path)
    ranked = [(l.il, (5 * l.il + 3 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers]
    path = tmp_path_factory.mktemp("profiles") / "tiny.strp"
    write_profile(path, Profile(layout.n_layer, layout.n_expert, 12, tuple(ranked)))
    return path


@pytest.fixture(scope="module")
def alone(model) -> list[list[int]]:
    """Each prompt's greedy tokens, decoded by itself in a context without a cache."""
    out = []
    for prompt, n in zip(PROMPTS, MAX_TOKENS):
        with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=128, n_threads=2)) as ctx:
            out.append(list(ctx.generate(prompt, n, stop_at_eog=False)))
    return out


def _params(path: Path, mode: str, profile: Path, slots: int) -> ContextParams:
    base = dict(n_ctx=512, n_threads=2, n_seq_max=4)
    if mode == "upload":
        return ContextParams(moe_cache_device="CPU", **base, moe_cache_mib=mib_for_slots(path, slots))
    if mode == "hybrid":
        return ContextParams(moe_cache_device="CPU", **base, moe_cache_mib=mib_for_slots(path, slots, hybrid=True), moe_cache_profile=profile,
                             moe_cache_hybrid=True)
    if mode == "adaptive":
        return ContextParams(moe_cache_device="CPU", **base, moe_cache_mib=mib_for_slots(path, slots, hybrid=True), moe_cache_hybrid=True,
                             moe_cache_adaptive=True)
    return ContextParams(moe_cache_device="CPU", **base)


@pytest.mark.parametrize("mode", MODES)
def test_each_sequence_gets_the_tokens_it_gets_alone_and_the_counters_add_up(model, tiny_model_path, profile_path,
                                                                             alone, mode) -> None:
    layout = expert_layout(tiny_model_path)
    slots = 4 * layout.n_expert_used if mode == "upload" else 12
    with Context(model, _params(tiny_model_path, mode, profile_path, slots)) as ctx:
        if mode == "hybrid":
            resident = {l.il: set(ctx.resident(l.il).tolist()) for l in layout.layers}
        ctx.start_trace()
        res = generate_batch(ctx, PROMPTS, MAX_TOKENS, stop_at_eog=False)
        records = ctx.stop_trace()
        stats, layers = ctx.moe_cache_stats(), ctx.layer_stats()
        assert ctx.n_past == 0  # the run leaves the context empty
    assert isinstance(res, BatchResult)
    assert [list(c.tokens) for c in res.completions] == alone
    assert [c.stopped_by for c in res.completions] == ["length"] * 4
    assert [c.text for c in res.completions] == [model.detokenize(a) for a in alone]
    assert res.n_decoded == sum(n - 1 for n in MAX_TOKENS) and res.n_steps == max(MAX_TOKENS) - 1
    assert res.decode_tps > 0 and res.prompt_seconds > 0
    # the steps' ubatches: four tokens while all four sequences live, fewer as they end
    steps = Counter(r.n_tokens for r in records if r.il == layout.layers[0].il and r.n_tokens <= 4)
    assert steps[4] == min(MAX_TOKENS) - 1 and steps[3] > 0
    small = [r for r in records if r.n_tokens <= MAX_UBATCH]
    distinct = sum(len(np.unique(r.experts)) for r in small)
    if mode == "none":
        assert stats is None
        return
    assert sum(l.n_hit for l in layers) == stats.n_hit and sum(l.n_miss for l in layers) == stats.n_miss
    if mode == "upload":
        sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
        assert (stats.n_hit, stats.n_miss, stats.n_cpu, stats.n_refused) == (sim.n_hit, sim.n_miss, sim.n_cpu, 0)
        assert stats.n_hit > 0 and stats.n_bytes_upload == (stats.n_miss - stats.n_cpu) * layout.layers[0].bytes_per_expert
    elif mode == "hybrid":
        hits = sum(len(set(r.experts.ravel().tolist()) & resident[r.il]) for r in small)
        assert (stats.n_hit, stats.n_miss) == (hits, distinct - hits) and stats.n_hit > 0
        assert stats.n_bytes_upload == 0
    else:  # adaptive: every distinct expert of a small ubatch is a hit or a miss, and swaps follow the text
        assert stats.n_hit + stats.n_miss == distinct and stats.n_swap > 0


# a ~150-token prompt (two corpus paragraphs) beside a short one: decoded alone, the long one's greedy tokens part
# from its batched ones after about twenty (a near-tie the batched products round the other way), so the batch
# without a cache is the reference every cache mode must give exactly
LONG_SHORT_MODES = {
    "upload": dict(slots=8),
    "hybrid": dict(slots=8, moe_cache_hybrid=True, profile=True),
    "adaptive": dict(slots=8, moe_cache_hybrid=True, moe_cache_adaptive=True),
    "hybrid-admit": dict(slots=8, moe_cache_hybrid=True, moe_cache_admit=2),
    "hybrid-admit-repartition": dict(slots=8, moe_cache_hybrid=True, moe_cache_admit=2, moe_cache_repartition=4),
}


@pytest.fixture(scope="module")
def long_and_short(model) -> list[list[int] | str]:
    from llama_moe.tools.synth.corpus import load_corpus, paragraphs

    texts = [p for t in load_corpus().values() for p in paragraphs(t)]
    long = model.tokenize(texts[45] + " " + texts[46], add_special=False)[:154]
    assert len(long) == 154
    return [long, "The ship left the harbour"]


@pytest.fixture(scope="module")
def batch_without_cache(model, long_and_short) -> list[list[int]]:
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2, n_seq_max=2)) as ctx:
        return [list(c.tokens) for c in generate_batch(ctx, long_and_short, 48, stop_at_eog=False).completions]


@pytest.mark.parametrize("mode", LONG_SHORT_MODES)
def test_every_cache_mode_gives_the_tokens_of_the_batch_without_a_cache(model, tiny_model_path, profile_path,
                                                                         long_and_short, batch_without_cache,
                                                                         mode) -> None:
    """The guarantee a batch has: greedy, with a prompt longer than a cache ubatch (32 tokens: llama.cpp's path,
    with the copies from the cache) beside a short one, each cache mode gives each sequence exactly the tokens
    the same batch gives without a cache; the cache did look experts up (hits and misses)."""
    opts = dict(LONG_SHORT_MODES[mode])
    slots, profile = opts.pop("slots"), opts.pop("profile", False)
    mib = mib_for_slots(tiny_model_path, slots, hybrid=bool(opts.get("moe_cache_hybrid")))
    params = ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2, n_seq_max=2, moe_cache_mib=mib,
                           moe_cache_profile=profile_path if profile else None, **opts)
    with Context(model, params) as ctx:
        res = generate_batch(ctx, long_and_short, 48, stop_at_eog=False)
        stats = ctx.moe_cache_stats()
    assert [list(c.tokens) for c in res.completions] == batch_without_cache
    assert stats is not None and stats.n_hit > 0 and stats.n_miss > 0
    if mode.startswith("hybrid-admit"):
        assert stats.n_admit > 0


def test_sampled_sequences_keep_their_own_sampler(model) -> None:
    samplings = [Sampling(temperature=0.8, seed=s) for s in (5, 6, 7, 8)]
    alone = []
    for prompt, n, s in zip(PROMPTS, MAX_TOKENS, samplings):
        with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=128, n_threads=2)) as ctx:
            alone.append(list(ctx.generate(prompt, n, s, stop_at_eog=False)))
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, n_seq_max=4)) as ctx:
        res = generate_batch(ctx, PROMPTS, MAX_TOKENS, samplings, stop_at_eog=False)
    assert [list(c.tokens) for c in res.completions] == alone


def test_the_stream_yields_each_token_as_it_is_made(model, alone) -> None:
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, n_seq_max=4)) as ctx:
        pairs = []
        with stream_batch(ctx, PROMPTS, MAX_TOKENS, stop_at_eog=False) as stream:
            for pair in stream:
                pairs.append(pair)
        assert [[t for i, t in pairs if i == k] for k in range(4)] == alone
        # the first tokens come first, then one per live sequence and step, in index order
        assert [i for i, _ in pairs[:4]] == [0, 1, 2, 3]
        assert [i for i, _ in pairs[-2:]] == [0, 0]
        assert stream.result is not None and [list(c.tokens) for c in stream.result.completions] == alone
        # closed early: the context is left empty and takes the next run
        stream = stream_batch(ctx, PROMPTS, 20, stop_at_eog=False)
        next(stream), next(stream)
        stream.close()
        assert ctx.n_past == 0
        assert [list(c.tokens) for c in generate_batch(ctx, PROMPTS[:2], MAX_TOKENS[:2], stop_at_eog=False).completions] \
            == alone[:2]
        # a single-sequence generate afterwards is the plain one
        assert list(ctx.generate(PROMPTS[3], MAX_TOKENS[3], stop_at_eog=False)) == alone[3]


def test_end_of_generation_ends_one_sequence_and_the_others_go_on(model) -> None:
    prompt = model.tokenize("<|im_start|>user\nThe ship left the harbour at dawn<|im_end|>\n<|im_start|>assistant\n",
                            parse_special=True)
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=1024, n_threads=2, n_seq_max=4)) as ctx:
        res = generate_batch(ctx, [prompt] * 4, 160, [Sampling(temperature=1.5, top_k=0, seed=s) for s in range(4)])
        ended = [c for c in res.completions if c.stopped_by == "eog"]
        assert ended and all(len(c.tokens) < 160 for c in ended)
        assert not any(model.is_eog(t) for c in res.completions for t in c.tokens)
        for c, s in zip(res.completions, range(4)):
            with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2)) as one:
                assert list(one.generate(prompt, 160, Sampling(temperature=1.5, top_k=0, seed=s))) == list(c.tokens)


def test_bad_input_is_refused(model) -> None:
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2, n_seq_max=2)) as ctx:
        cases = [([], "empty"), ("one prompt", "list of strings"), (PROMPTS[:3], "at most n_seq_max=2"),
                 (["fine", ""], r"prompts\[1\] is empty"), ([[1, 2], [10**9]], "outside the vocabulary"),
                 (["word " * 200], "positions")]
        for prompts, text in cases:
            with pytest.raises(ParameterError, match=text):
                generate_batch(ctx, prompts)
            with pytest.raises(ParameterError, match=text):
                stream_batch(ctx, prompts)
        with pytest.raises(ParameterError, match="2 values for 1 prompts"):
            generate_batch(ctx, PROMPTS[:1], [3, 4])
        with pytest.raises(ParameterError, match="max_tokens"):
            generate_batch(ctx, PROMPTS[:2], -1)
        with pytest.raises(ParameterError, match="sampling"):
            generate_batch(ctx, PROMPTS[:2], 4, [Sampling(), "greedy"])
        res = generate_batch(ctx, PROMPTS[:2], [0, 3], stop_at_eog=False)
        assert [len(c.tokens) for c in res.completions] == [0, 3]


def test_concurrent_batches_on_one_context_queue(model, alone) -> None:
    with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, n_seq_max=4)) as ctx:
        got: list[list[list[int]]] = []

        def worker() -> None:
            got.append([list(c.tokens) for c in generate_batch(ctx, PROMPTS, MAX_TOKENS, stop_at_eog=False).completions])

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert got == [alone] * 3
