"""The hybrid's mailbox (patch 0008, ggml-mailbox.h) on the real patched libllama, with the CPU as the cache
device and moe_cache_mailbox_on_cpu=True: in one-token decoding each layer the cache holds in part sends its input
and selected experts to a CPU thread through the mailbox instead of a scheduler split. The protocol, the CPU
side, the graph building and the counting are the same code as on CUDA; only the two device kernels differ."""
from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, MoeCacheWarning
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.batch import generate_batch
from support.cache_sizes import mib_for_slots
from test_moe_cache_hybrid import PROMPTS, RAM


N_GEN = 48


def _profile(path: Path, out: Path) -> Path:
    layout = expert_layout(path)
    ranked = [(l.il, (5 * l.il + 3 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers]
    write_profile(out, Profile(layout.n_layer, layout.n_expert, 12, tuple(ranked)))
    return out


def _on_cpu(cp: ContextParams, **kw) -> ContextParams:
    """cp with the mailbox on the CPU as the device (and kw's other settings)."""
    return dataclasses.replace(cp, moe_cache_mailbox_on_cpu=True, **kw)


def _run(model: Model, cp: ContextParams, prompt: str):
    with Context(model, cp) as ctx:
        tokens = list(ctx.generate(prompt, max_tokens=N_GEN, stop_at_eog=False))
        return tokens, ctx.logits(), ctx.moe_cache_stats()


@pytest.mark.parametrize("adaptive,threads,chunk,prefetch,share", [(False, 1, None, None, 0), (True, 3, None, None, None),
                                                                   (False, 3, "0", 0, 1), (False, 4, "7", 100000, 0.5)])
def test_mailbox_gives_the_same_tokens_logits_and_counts(lib, tiny_model_path, tmp_path, monkeypatch, caplog,
                                                         adaptive, threads, chunk, prefetch, share) -> None:
    """The CPU's part computed by the mailbox's team (its leader alone, or with workers taking rows in chunks of
    GGML_MMID_CHUNK, 0 = a slice each; prefetching rows ahead or not), and the misses the device reads from the
    host copy itself (moe_cache_mailbox_gpu_share: none, the default (none), every one, half): bit for bit what
    ggml computes without a cache, with the scheduler's counts."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    if chunk is not None:
        monkeypatch.setenv("GGML_MMID_CHUNK", chunk)  # the contract's variable
    profile = _profile(tiny_model_path, tmp_path / "p.strp")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, 12, hybrid=True), moe_cache_profile=profile,
                       moe_cache_hybrid=True, moe_cache_adaptive=adaptive, moe_cache_mailbox_threads=threads,
                       moe_cache_mailbox_gpu_share=share, moe_cache_mailbox_prefetch=prefetch)
    with Model(tiny_model_path, RAM) as model:
        for prompt in PROMPTS:
            plain_tokens, plain_logits, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=512), prompt)
            split_tokens, split_logits, split_stats = _run(model, cp, prompt)
            caplog.clear()
            tokens, logits, stats = _run(model, _on_cpu(cp), prompt)
            assert f"llama_moe_cache: mailbox: 6 layers hand over to {threads} CPU threads" in caplog.text
            assert "CPU part runs on one thread" not in caplog.text
            assert tokens == split_tokens == plain_tokens
            np.testing.assert_array_equal(logits, plain_logits)
            np.testing.assert_array_equal(split_logits, plain_logits)
            # the CPU side counts what the graph's split counted: the same hits, misses, bytes and swaps
            assert (stats.n_hit, stats.n_miss, stats.n_bytes_cpu, stats.n_swap) == \
                   (split_stats.n_hit, split_stats.n_miss, split_stats.n_bytes_cpu, split_stats.n_swap)
            assert stats.n_miss > 0 and stats.n_hit > 0
            # one hand-over per generated token and layer (the prompt's last layer-pass is a one-token ubatch too)
            handovers = [line for line in caplog.text.splitlines()
                         if "llama_moe_cache: mailbox: the CPU waited " in line and " hand-overs from the GPU" in line]
            assert handovers and int(handovers[-1].split("for each of ")[1].split()[0]) >= 6 * (N_GEN - 1)
            # and where the parts with experts to compute spent their time
            parts = [line for line in caplog.text.splitlines() if "mailbox: a part with experts to compute took" in line]
            # the misses the device read itself, and the hand-overs it did not wait for (nothing for the CPU)
            n = int(handovers[-1].split("for each of ")[1].split()[0])
            line = next(l for l in caplog.text.splitlines() if "hand-overs had nothing for the CPU" in l)
            no_wait = int(line.split("mailbox: ")[1].split()[0])
            device_reads = int(line.split("the device read ")[1].split()[0])
            assert " 0 records lost after a timeout" in line
            if share == 1:
                # every miss read by the device: the CPU never computes, the device never waits
                assert device_reads > 0 and no_wait == n and not parts
                continue
            assert device_reads == 0 if share in (0, None) else 0 < device_reads < stats.n_miss
            assert no_wait < n
            assert parts and f"on {threads} threads" in parts[-1] and " MB (" in parts[-1]
            # and its serial rest, each share named
            assert all(name in parts[-1] for name in ("the cache's lookup", "quantizing and listing rows", "the other nodes"))


def test_mailbox_with_expert_biases(lib, tmp_path, caplog) -> None:
    from llama_moe.tools.synth import synthesize

    caplog.set_level(logging.INFO, logger="llama_moe.native")
    path = tmp_path / "gpt-oss-tiny.gguf"
    synthesize(path, "gpt-oss-tiny", "mxfp4", seed=0)
    cp = ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(path, 10, hybrid=True), moe_cache_hybrid=True,
                       moe_cache_adaptive=True, moe_cache_mailbox_threads=3)
    with Model(path, RAM) as model:
        plain_tokens, plain_logits, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=512), PROMPTS[0])
        with pytest.warns(MoeCacheWarning, match="the experts have biases"):
            tokens, logits, stats = _run(model, _on_cpu(cp, moe_cache_mailbox_gpu_share=0.5), PROMPTS[0])
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert stats.n_swap > 0 and stats.n_miss > 0
    assert "hand over to 3 CPU threads" in caplog.text and "CPU part runs on one thread" not in caplog.text
    # the device keeps the biases by slot: it cannot add a missed expert's, so the CPU computes every miss
    assert ("the CPU computes every miss (--moe-cache-mailbox-gpu-share 0.50 has no effect): the experts have biases"
            in caplog.text)
    assert "the device read 0 missed experts from the host copy itself" in caplog.text


def test_a_gpu_share_that_cannot_apply_says_why(lib, tiny_model_path, caplog) -> None:
    """A share the graph cannot follow (the unfused graph builds no route): a warning that says what and why, the
    reason in the status, and the text of no cache all the same."""
    why = ("the CPU computes every miss (--moe-cache-mailbox-gpu-share 0.50 has no effect): --no-moe-cache-mailbox-fuse "
           "builds no route")
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), moe_cache_hybrid=True,
                       moe_cache_adaptive=True)
    with Model(tiny_model_path, RAM) as model:
        plain, _, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=256), PROMPTS[0])
        with pytest.warns(MoeCacheWarning, match="builds no route"):
            ctx = Context(model, _on_cpu(cp, moe_cache_mailbox_gpu_share=0.5, moe_cache_mailbox_fuse=False))
        with ctx:
            status = ctx.cache_status()
            tokens = list(ctx.generate(PROMPTS[0], max_tokens=N_GEN, stop_at_eog=False))
    assert tokens == plain
    assert status.mailbox and status.reasons == ("option_ignored",) and why in status.text
    assert any(r.levelno == logging.WARNING and why in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("name,value,why", [
    # every variable the engine reads, each kind of malformed value: refused with the default, and a warning; the
    # test switches are read only by the tests' build
    ("LLAMA_MOE_MAILBOX_TEST_DELAY_US", "x", "is not a whole number from 0 to 10000000; using 0"),
    ("LLAMA_MOE_MAILBOX_TEST_STALL", "layer3", "is not a whole number from 0 to 1048576; using -1"),
    ("GGML_MMID_CHUNK", "-1", "is not a whole number from 0 to 65536; ignored"),
    ("GGML_MMID_CHUNK", "abc", "is not a whole number from 0 to 65536; ignored"),
    ("GGML_MMID_CHUNK", "99999999999999999999", "is not a whole number from 0 to 65536; ignored"),
    ("LLAMA_MOE_CACHE_NO_MAILBOX", "sure", "is not 1 or 0 (true/false, on/off, yes/no); using 0"),
    ("LLAMA_MOE_MAILBOX_TEST_EMPTY", "yes please", "is not 1 or 0 (true/false, on/off, yes/no); using 0"),
])
def test_a_malformed_variable_is_replaced_by_its_default_with_a_warning(lib, tiny_model_path, monkeypatch, caplog,
                                                                      name, value, why) -> None:
    """Each variable is read strictly (no atoi: "2junk" is not 2, "-1" no count, an overflow no clamp): the
    default is used, the warning names the variable, the value and the default, and the decode runs, with the
    tokens of no cache and the mailbox on."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True),
                       moe_cache_hybrid=True, moe_cache_adaptive=True, moe_cache_mailbox_on_cpu=True)
    with Model(tiny_model_path, RAM) as model:
        plain, _, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2), PROMPTS[0])
        monkeypatch.setenv(name, value)
        tokens, _, _ = _run(model, cp, PROMPTS[0])
    assert tokens == plain
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and f"{name}={value} {why}" in r.getMessage()]
    assert said, caplog.text
    if name == "GGML_MMID_CHUNK":  # one reader, one warning (ggml-cpu's products and the mailbox's CPU part)
        assert len([r for r in caplog.records if f"{name}={value}" in r.getMessage()]) == 1, caplog.text
    assert "hand over to" in caplog.text  # the mailbox ran with the default


@pytest.mark.parametrize("field,value,why", [
    # the engine's own check of each setting's range, for a caller that passes the struct without the binding's
    ("mailbox_threads", -3, "--moe-cache-mailbox-threads -3 is not a number of threads from 0 to 1024; using 0"),
    ("mailbox_timeout_ms", 0, "--moe-cache-mailbox-timeout 0 is not a number of milliseconds from 1 to 3600000; using 10000"),
    ("mailbox_prefetch", -1, "--moe-cache-mailbox-prefetch -1 is not a number of bytes from 0 to 1073741824; using 4096"),
    ("mailbox_gpu_share", 1.5, "--moe-cache-mailbox-gpu-share 1.5 is not a share from 0 to 1; using 0"),
    ("mailbox_gpu_share", float("nan"), "--moe-cache-mailbox-gpu-share nan is not a share from 0 to 1; using 0"),
    ("admit_async", 2, "--moe-cache-admit-async 2 is not -1 (auto), 0 (off) or 1 (on), a number from -1 to 1; using -1"),
    ("admit", -7, "--moe-cache-admit -7 is not a count of experts; admission is off"),
])
def test_a_setting_out_of_its_range_is_refused_by_the_engine(lib, tiny_model_path, caplog, field, value, why) -> None:
    """The struct as a C caller fills it (the binding's own checks refuse these before): the engine uses the
    default, says which setting, value and default, keeps the reason in the status, and decodes."""
    from llama_moe._native.cache_status import read_status

    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True),
                       moe_cache_hybrid=True, moe_cache_adaptive=True, moe_cache_mailbox_on_cpu=True)
    with Model(tiny_model_path, RAM) as model:
        native, keep = cp._to_native(lib)
        setattr(native.moe_cache, field, value)
        held = model._hold()
        try:
            ptr = lib.llama_init_from_model(held.ptr, native)
            assert ptr
            try:
                status = read_status(lib, ptr)
            finally:
                lib.llama_free(ptr)
        finally:
            held.release()
    del keep
    assert status.state == "partial" and status.reasons == ("option_ignored",), status
    assert status.text == why and status.mailbox
    assert any(r.levelno == logging.WARNING and why in r.getMessage() for r in caplog.records), caplog.text


def test_a_bad_mmid_chunk_is_said_without_the_mailbox_too(lib, tiny_model_path, monkeypatch, caplog) -> None:
    """With the mailbox off, GGML_MMID_CHUNK still shapes the CPU's one-token expert products: a bad value is said
    once when the context is made, and the decode runs with the default."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    monkeypatch.setenv("GGML_MMID_CHUNK", "-7")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True),
                       moe_cache_hybrid=True, moe_cache_adaptive=True, moe_cache_mailbox=False)
    with Model(tiny_model_path, RAM) as model:
        tokens, _, _ = _run(model, cp, PROMPTS[0])
    assert tokens
    said = [r.getMessage() for r in caplog.records if "GGML_MMID_CHUNK=-7" in r.getMessage()]
    assert len(said) == 1 and "is not a whole number from 0 to 65536; ignored" in said[0], caplog.text


def test_mailbox_off_switch_and_lifecycles(lib, tiny_model_path, monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), moe_cache_hybrid=True,
                       moe_cache_adaptive=True, moe_cache_mailbox_on_cpu=True)
    with Model(tiny_model_path, RAM) as model:
        # contexts come and go: the CPU side's thread starts and stops with each, mid-generation or idle
        for i in range(5):
            with Context(model, cp) as ctx:
                for n, _ in enumerate(ctx.generate(PROMPTS[i % 2], max_tokens=3 * i, stop_at_eog=False)):
                    pass
        assert caplog.text.count("llama_moe_cache: mailbox: 6 layers hand over") == 5
        # off by the setting, and by default where the contract's variable says so
        for off in (dataclasses.replace(cp, moe_cache_mailbox=False), cp):
            caplog.clear()
            monkeypatch.setenv("LLAMA_MOE_CACHE_NO_MAILBOX", "1" if off is cp else "0")
            with Context(model, off) as ctx:
                list(ctx.generate(PROMPTS[0], max_tokens=4, stop_at_eog=False))
                assert not ctx.cache_status().mailbox
            assert "mailbox off (--no-moe-cache-mailbox, or LLAMA_MOE_CACHE_NO_MAILBOX=1)" in caplog.text
            assert "hand over" not in caplog.text


def test_a_stuck_cpu_side_fails_the_decode_with_the_layer_named_never_hangs(lib, tiny_model_path, monkeypatch) -> None:
    """LLAMA_MOE_MAILBOX_TEST_STALL=3 (a test switch) makes the CPU side leave layer 3 unanswered: the device's
    wait ends at moe_cache_mailbox_timeout_ms, the decode fails naming the layer, and the context still frees
    cleanly."""
    import time

    from llama_moe.errors import NativeCallError

    monkeypatch.setenv("LLAMA_MOE_MAILBOX_TEST_STALL", "3")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), moe_cache_hybrid=True,
                       moe_cache_adaptive=True, moe_cache_mailbox_on_cpu=True, moe_cache_mailbox_timeout_ms=300)
    with Model(tiny_model_path, RAM) as model:
        t0 = time.monotonic()
        with Context(model, cp) as ctx:
            with pytest.raises(NativeCallError, match=r"mailbox: layer 3: the CPU's part did not come within --moe-cache-mailbox-timeout"):
                list(ctx.generate(PROMPTS[0], max_tokens=4, stop_at_eog=False))
        assert time.monotonic() - t0 < 30


def test_a_failed_decode_leaves_the_context_as_before_and_one_timeout_ends_it(lib, tiny_model_path, monkeypatch, caplog) -> None:
    """A decode of eight one-token ubatches whose layer 3 the CPU side leaves unanswered: the first wait that
    times out raises the shared abort flag, so every later wait of the same decode gives up at once (one timeout,
    said in the log), and the failed decode takes its tokens out of the KV cache: the prompt decodes again from
    position 0, and generation goes on with the tokens of no cache."""
    import time

    from llama_moe.errors import NativeCallError

    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, RAM) as model:
        prompt = model.tokenize(PROMPTS[0])
        plain = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=512), prompt)[0]
        monkeypatch.setenv("LLAMA_MOE_MAILBOX_TEST_STALL", "3")
        cp = ContextParams(moe_cache_device="CPU", n_ctx=512, n_batch=8, n_ubatch=1, moe_cache_hybrid=True,
                           moe_cache_mib=mib_for_slots(tiny_model_path, 4, hybrid=True), moe_cache_mailbox_on_cpu=True,
                           moe_cache_mailbox_timeout_ms=400)
        with Context(model, cp) as ctx:
            t0 = time.monotonic()
            with pytest.raises(NativeCallError, match=r"mailbox: layer 3: the CPU's part did not come within"):
                ctx.decode(prompt[:8])
            # one timeout for the decode, not one per ubatch (eight here: at least 3.2 s); below that, the rest is
            # the machine's load (a busy 2-core machine took 2.0 s)
            assert time.monotonic() - t0 < 8 * 0.4, time.monotonic() - t0
            assert ctx.n_past == 0
            assert re.search(r"mailbox: \d+ later layers did not wait for the CPU side after that", caplog.text), caplog.text
            ctx.decode(prompt)  # from position 0 again: the failed decode left nothing in the KV cache
            tokens = list(ctx.generate([], max_tokens=N_GEN, stop_at_eog=False))
    assert tokens == plain


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_slow_cpu_side_loses_no_record_of_steps_the_device_did_not_wait_for(lib, tiny_model_path, tmp_path, monkeypatch,
                                                                               caplog, adaptive) -> None:
    """One-token ubatches back to back in one decode, the CPU side slowed before each record it reads
    (LLAMA_MOE_MAILBOX_TEST_DELAY_US): steps with nothing for the CPU do not wait for it, so the device runs
    ahead, up to the ring's length; every step is still read whole and counted once: no error, the tokens and
    logits of no cache, and per layer the counts of the scheduler's path."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    profile = _profile(tiny_model_path, tmp_path / "p.strp")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=512, n_batch=64, n_ubatch=1, moe_cache_mib=mib_for_slots(tiny_model_path, 24, hybrid=True),
                       moe_cache_profile=profile, moe_cache_hybrid=True, moe_cache_adaptive=adaptive)

    def run(model: Model, params: ContextParams) -> tuple:
        with Context(model, params) as ctx:
            tokens = list(ctx.generate(PROMPTS[1], max_tokens=16, stop_at_eog=False))
            return tokens, ctx.logits(), [(l.n_hit, l.n_miss) for l in ctx.layer_stats()]

    with Model(tiny_model_path, RAM) as model:
        plain_tokens, plain_logits, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=512), PROMPTS[1])
        split = run(model, cp)
        monkeypatch.setenv("LLAMA_MOE_MAILBOX_TEST_DELAY_US", "300")
        caplog.clear()
        tokens, logits, layers = run(model, _on_cpu(cp))
    assert "LLAMA_MOE_MAILBOX_TEST_DELAY_US" in caplog.text
    line = next(l for l in caplog.text.splitlines() if "hand-overs had nothing for the CPU" in l)
    assert int(line.split("mailbox: ")[1].split()[0]) > 0, line  # steps the device did not wait for
    assert "0 records lost after a timeout" in line, line
    assert tokens == split[0] == plain_tokens[:16]
    np.testing.assert_array_equal(logits, split[1])
    assert layers == split[2]


@pytest.mark.parametrize("ubatch", [1, 4])
def test_mailbox_with_small_ubatches_of_a_prompt(lib, tiny_model_path, ubatch) -> None:
    """Prompts cut into one-token ubatches (every layer hands over, graphs reused) or into ubatches of 4 (graphs
    rebuilt between shapes while earlier ones hand over): the same tokens as no cache."""
    with Model(tiny_model_path, RAM) as model:
        plain, plain_logits, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=512, n_batch=ubatch, n_ubatch=ubatch), PROMPTS[1])
        cp = ContextParams(moe_cache_device="CPU", n_ctx=512, n_batch=ubatch, n_ubatch=ubatch, moe_cache_hybrid=True,
                           moe_cache_mib=mib_for_slots(tiny_model_path, 12, hybrid=True), moe_cache_adaptive=True,
                           moe_cache_mailbox_on_cpu=True)
        tokens, logits, stats = _run(model, cp, PROMPTS[1])
    assert tokens == plain
    np.testing.assert_array_equal(logits, plain_logits)
    assert stats.n_hit + stats.n_miss > 0


def test_mailbox_thread_count_leaves_a_core_to_the_device_thread(lib, tiny_model_path, caplog) -> None:
    """The mailbox takes n_threads - 1 CPU threads (the thread that drives the device keeps a core);
    moe_cache_mailbox_threads sets the count, and the tokens do not depend on it."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=3, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True),
                       moe_cache_hybrid=True, moe_cache_adaptive=True, moe_cache_mailbox_on_cpu=True)
    with Model(tiny_model_path, RAM) as model:
        tokens, _, _ = _run(model, cp, PROMPTS[0])
        assert "mailbox: 6 layers hand over to 2 CPU threads" in caplog.text
        # the CPU as the cache device: the layers run on the CPU, so a one-token graph keeps its threads
        assert "the rest of a one-token graph's CPU work on 1 thread" not in caplog.text
        caplog.clear()
        assert _run(model, dataclasses.replace(cp, moe_cache_mailbox_threads=5), PROMPTS[0])[0] == tokens
        assert "mailbox: 6 layers hand over to 5 CPU threads" in caplog.text


def test_hand_overs_with_nothing_to_compute_skip_the_cpu_graph(lib, tiny_model_path, tmp_path, caplog) -> None:
    """With most experts cached, many tokens find all theirs in VRAM at a layer: the CPU answers zeros without
    running its graph (what the graph would give), and the text, logits and counters stay those of no mailbox."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    profile = _profile(tiny_model_path, tmp_path / "p.strp")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, 28, hybrid=True), moe_cache_profile=profile,
                       moe_cache_hybrid=True, moe_cache_adaptive=True)
    with Model(tiny_model_path, RAM) as model:
        plain_tokens, plain_logits, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=512), PROMPTS[1])
        split_tokens, _, split_stats = _run(model, cp, PROMPTS[1])
        caplog.clear()
        tokens, logits, stats = _run(model, _on_cpu(cp), PROMPTS[1])
    assert tokens == split_tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert (stats.n_hit, stats.n_miss, stats.n_swap) == (split_stats.n_hit, split_stats.n_miss, split_stats.n_swap)
    line = next(l for l in caplog.text.splitlines() if "hand-overs from the GPU" in l)
    n = int(line.split("for each of ")[1].split()[0])
    empty = int(line.split("on average, ")[1].split()[0])
    assert 0 < empty < n, line


def test_unfused_kernels_and_the_empty_hand_over_timing_test(lib, tiny_model_path, tmp_path, monkeypatch, caplog) -> None:
    """moe_cache_mailbox_fuse=False builds the graph the earlier way (a copy of the input, a repeat, the recv's own
    rows, an add): the same tokens and logits as no cache. LLAMA_MOE_MAILBOX_TEST_EMPTY=1 (a test switch) makes the CPU answer
    every hand-over without computing, which times the hand-over alone: it says so, every hand-over counts as
    empty, and the logits are no longer those of no cache (the CPU's experts are missing)."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    profile = _profile(tiny_model_path, tmp_path / "p.strp")
    cp = ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, 12, hybrid=True), moe_cache_profile=profile,
                       moe_cache_hybrid=True)
    with Model(tiny_model_path, RAM) as model:
        plain_tokens, plain_logits, _ = _run(model, ContextParams(moe_cache_device="CPU", n_ctx=512), PROMPTS[0])
        tokens, logits, stats = _run(model, _on_cpu(cp, moe_cache_mailbox_fuse=False), PROMPTS[0])
        assert tokens == plain_tokens and stats.n_miss > 0
        np.testing.assert_array_equal(logits, plain_logits)
        monkeypatch.setenv("LLAMA_MOE_MAILBOX_TEST_EMPTY", "1")
        caplog.clear()
        _, logits, _ = _run(model, _on_cpu(cp), PROMPTS[0])
    assert "LLAMA_MOE_MAILBOX_TEST_EMPTY: the CPU computes none of its experts; the output is wrong" in caplog.text
    assert not np.array_equal(logits, plain_logits)
    line = next(l for l in caplog.text.splitlines() if "hand-overs from the GPU" in l)
    assert int(line.split("for each of ")[1].split()[0]) == int(line.split("on average, ")[1].split()[0]), line


@pytest.mark.parametrize("ubatch", [1, 512])
def test_mailbox_with_several_sequences_in_one_decode(lib, tiny_model_path, tmp_path, caplog, ubatch) -> None:
    """Four sequences decoded together, as llama-server --parallel 4 does: ubatches of one token of each sequence
    in turn (n_ubatch=1: every one hands over, several sequences in one decode), or one ubatch of a token per
    sequence (graphs of several tokens take the scheduler's path, which the log says once, while the last
    sequence alone hands over again). No error, the tokens of no cache, and per layer the counts of the
    scheduler's path."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    profile = _profile(tiny_model_path, tmp_path / "p.strp")
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0] + " And then", "Once"]
    max_tokens = [12, 6, 9, 16]  # sequences end at different steps: the last ones run alone
    base = dict(n_ctx=1024, n_seq_max=4, n_batch=512, n_ubatch=ubatch)
    cp = ContextParams(moe_cache_device="CPU", **base, moe_cache_mib=mib_for_slots(tiny_model_path, 12, hybrid=True), moe_cache_profile=profile,
                       moe_cache_hybrid=True, moe_cache_adaptive=True)

    def run(model: Model, params: ContextParams) -> tuple:
        with Context(model, params) as ctx:
            res = generate_batch(ctx, prompts, max_tokens, stop_at_eog=False)
            return [list(c.tokens) for c in res.completions], [(l.n_hit, l.n_miss) for l in ctx.layer_stats()]

    with Model(tiny_model_path, RAM) as model:
        plain, _ = run(model, ContextParams(moe_cache_device="CPU", **base))
        split, split_layers = run(model, cp)
        caplog.clear()
        tokens, layers = run(model, _on_cpu(cp))
    assert "llama_moe_cache: mailbox: 6 layers hand over" in caplog.text
    assert tokens == split == plain
    assert layers == split_layers
    line = next(l for l in caplog.text.splitlines() if "hand-overs from the GPU" in l)
    assert int(line.split("for each of ")[1].split()[0]) > 0, line  # the mailbox did hand over
    said = caplog.text.count("graphs with no one-token layer to hand over (prompts, several sequences at once) "
                             "compute the CPU's experts through the scheduler")
    assert said == 1 if ubatch > 1 else said <= 1, caplog.text  # said once, where graphs of several tokens come
