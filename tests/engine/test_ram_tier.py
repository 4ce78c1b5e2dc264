"""The RAM tier (ContextParams.moe_ram_mib): slots in locked RAM for the experts kept on the CPU, filled from the
model's file by direct reads, an LRU per layer. On the real patched libllama: tokens and logits identical to no
tier (prompts over 32 tokens beside the decodes, several sequences, fewer slots than a token's experts), the
counters equal to the independent replay (tests/oracles/lru.py) and the bytes read equal to its misses, no page
of the experts in the page cache after a load with lazy experts, and the faults: a read that fails fails its
decode with the file and the layer named, and the context goes on."""
from __future__ import annotations

import ctypes
import json
import logging
import mmap
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.errors import NativeCallError
from llama_moe.gguf_files.reader import read_gguf
from llama_moe.tools.experts import expert_layout
from oracles.lru import simulate_lru
from support.cache_sizes import mib_for_slots
from test_moe_cache_split import PROMPTS, _batch  # four sequences, prompts over 32 tokens, 64 steps

PLAIN = ModelParams(cpu_moe=True, repack=False)
LAZY = ModelParams(lazy_experts=True, repack=False)
BASE = dict(n_ctx=1024, n_threads=2, n_seq_max=4)


@pytest.mark.parametrize("slots_per_k", [2, 0.5])  # 2 k; k / 2: fewer slots than one token's experts
def test_the_tier_changes_nothing_and_reads_the_replays_misses(lib, tiny_model_path, caplog, slots_per_k) -> None:
    layout = expert_layout(tiny_model_path)
    slots = max(1, int(slots_per_k * layout.n_expert_used))
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    with Model(tiny_model_path, PLAIN) as model:
        assert all(len(model.tokenize(p)) > 32 for p in PROMPTS)
        plain_tokens, plain_logits, *_ = _batch(model, ContextParams(**BASE), trace=False)
    with Model(tiny_model_path, LAZY) as model:
        cp = ContextParams(**BASE, moe_ram_mib=mib_for_slots(tiny_model_path, slots))
        tokens, logits, stats, layers, records = _batch(model, cp, trace=True)
        with Context(model, cp) as ctx:
            status = ctx.cache_status()
    assert tokens == plain_tokens
    assert np.array_equal(logits, plain_logits)
    assert status.state == "on" and status.ram_tier and status.device == "CPU" and status.mode == "upload"
    assert stats.ram_tier and all(l.n_slots == slots for l in layers)
    sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
    assert (stats.n_hit, stats.n_miss, stats.n_cpu) == (sim.n_hit, sim.n_miss, sim.n_cpu)
    assert {l.il: (l.n_hit, l.n_miss, l.n_cpu) for l in layers} == {
        il: (*sim.per_layer[il], sim.per_layer_cpu[il]) for il in sim.per_layer}
    # every miss a slot took was read from the file, once: gate, up and down, nothing more
    per_expert = layout.layers[0].bytes_per_expert
    read = stats.n_miss - stats.n_cpu
    assert read > 0 and stats.n_upload == read
    # every miss was read from the file once, into its slot or (beyond a ubatch's slots) for the ubatch alone; the
    # prompts' ubatches read the experts no slot held, nothing more
    assert stats.n_bytes_disk - stats.n_bytes_disk_prompt == stats.n_miss * per_expert
    assert 0 < stats.n_bytes_disk_prompt <= len(PROMPTS) * layout.n_moe_layers * layout.n_expert * per_expert
    assert stats.n_bytes_disk_prompt % per_expert == 0
    assert sum(l.n_bytes_disk for l in layers) == stats.n_bytes_disk
    assert stats.n_hit > 0
    assert f"the RAM tier read {stats.n_disk_reads} expert tensors" in caplog.text


def _resident_pages(path: Path, ranges: list[tuple[int, int]]) -> int:
    """Pages of the file's byte ranges in the page cache now (mincore over a private mapping of our own, whose
    pages are the page cache's until written)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    n = 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        view = ctypes.c_char.from_buffer(m)
        try:
            start = ctypes.addressof(view)
            for first, last in ranges:
                lo = first // page * page
                hi = min(size, (last + page - 1) // page * page)
                vec = (ctypes.c_ubyte * ((hi - lo + page - 1) // page))()
                assert libc.mincore(ctypes.c_void_p(start + lo), ctypes.c_size_t(hi - lo), vec) == 0, ctypes.get_errno()
                n += sum(v & 1 for v in vec)
        finally:
            del view
            m.close()
    return n


def _settled_pages(path: Path, ranges: list[tuple[int, int]]) -> int:
    """_resident_pages once the readahead the kernel still has in flight has landed: two equal counts 0.2 s apart
    (5 s at most). The load's faults around the experts' neighbours start readahead that can complete after it."""
    n = _resident_pages(path, ranges)
    for _ in range(25):
        time.sleep(0.2)
        m = _resident_pages(path, ranges)
        if m == n:
            break
        n = m
    return n


def _drop_from_page_cache(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_the_load_and_the_decodes_leave_the_experts_out_of_the_page_cache(lib, tmp_path) -> None:
    from llama_moe.tools.synth import synthesize

    # experts of 4 MiB a tensor: the pages the load reads around the other tensors are their edges alone
    path = tmp_path / "wide-experts.gguf"
    synthesize(path, shape="tiny,n_ff_exp=1024", expert_type="q8_0", seed=0)
    experts = [(t.offset, t.offset + t.nbytes) for t in read_gguf(path).tensors if "_exps" in t.name]
    pages = sum((last - first) // mmap.PAGESIZE for first, last in experts)
    layout = expert_layout(path)
    _drop_from_page_cache(path)
    assert _resident_pages(path, experts) == 0
    with Model(path, LAZY) as model:
        loaded = _settled_pages(path, experts)
        # no MAP_POPULATE, no WILLNEED on them: only what the kernel reads around the faults of their neighbours,
        # at their edges (under 1 MiB a tensor, whatever its size)
        assert loaded * mmap.PAGESIZE < len(experts) * (1 << 20) and loaded < pages // 5
        # a prompt over 32 tokens (not looked up: read into the staging copy) and fewer slots than a token's experts
        # (each decode's rest read for it alone): nothing of the experts through the mapping
        slots = layout.n_expert_used // 2
        cp = ContextParams(n_ctx=256, n_threads=2, moe_ram_mib=mib_for_slots(path, slots))
        with Context(model, cp) as ctx:
            status = ctx.cache_status()
            prompt = ctx.tokenize(PROMPTS[0])
            assert len(prompt) > 32
            text = list(ctx.generate(prompt, max_tokens=48, sampling=Sampling(temperature=0.0)))
            stats = ctx.moe_cache_stats()
    assert status.ram_tier and text and stats.n_miss > 0 and stats.n_cpu > 0 and stats.n_bytes_disk_prompt > 0
    read = stats.n_bytes_disk // mmap.PAGESIZE
    if status.disk_direct:
        assert _settled_pages(path, experts) <= loaded  # direct reads: the decodes added no page
    else:  # a file system without O_DIRECT: each range is dropped from the page cache after its read
        assert _settled_pages(path, experts) <= loaded + read // 10


@pytest.mark.parametrize("way", ["direct, several in flight", "direct, one at a time", "through the page cache"])
def test_whole_blocks_of_an_expert_are_read_into_its_slot(lib, tmp_path, caplog, monkeypatch, way) -> None:
    """f16 experts of 16 KiB a tensor: whole blocks of the direct reads, which go into the slots themselves (with
    the kernel's asynchronous I/O, or one at a time without it); only an expert's partial first and last blocks go
    through a buffer and a copy. Reads through the page cache (a file system without direct reads) take any range:
    nothing is copied. The test switches take the engine down the paths of a kernel without asynchronous I/O and
    of a file system without direct reads."""
    from llama_moe.tools.synth import synthesize

    path = tmp_path / "f16-experts.gguf"
    switch = {"direct, one at a time": "LLAMA_MOE_TEST_DISK_SYNC", "through the page cache": "LLAMA_MOE_TEST_DISK_BUFFERED"}
    if way in switch:
        monkeypatch.setenv(switch[way], "1")
    try:
        synthesize(path, shape="tiny", expert_type="f16", seed=0)
        layout = expert_layout(path)
        assert all(t.nbytes // layout.layers[0].n_expert % 4096 == 0 for t in read_gguf(path).tensors if "_exps" in t.name)
        caplog.set_level(logging.INFO, logger="llama_moe.native")
        sampling = Sampling(temperature=0.0)
        with Model(path, PLAIN) as model, Context(model, ContextParams(n_ctx=256, n_threads=2)) as ctx:
            plain = list(ctx.generate("Once", max_tokens=48, sampling=sampling))
        with Model(path, LAZY) as model:
            # slots for every expert the prompt's ubatch selects: nothing read for a ubatch alone (into the staging
            # copy, whose place cannot agree with every layer's offsets)
            cp = ContextParams(n_ctx=256, n_threads=2, moe_ram_mib=mib_for_slots(path, 3 * layout.n_expert_used))
            with Context(model, cp) as ctx:
                status = ctx.cache_status()
                tokens = list(ctx.generate("Once", max_tokens=48, sampling=sampling))
                stats = ctx.moe_cache_stats()
    finally:
        path.unlink(missing_ok=True)
    if way != "through the page cache" and not status.disk_direct:
        pytest.skip("this file system refuses direct reads: every read goes through the page cache")
    assert status.disk_direct == (way != "through the page cache")
    for name in switch.values():
        assert (f"{name}: the RAM tier reads" in caplog.text) == (switch.get(way) == name)
    assert tokens == plain and stats.n_miss > 0 and stats.n_cpu == 0 and stats.n_bytes_disk_prompt == 0
    said = r"read (\d+) expert tensors \(([\d.]+) MiB\) from the model's file, ([\d.]+) MiB of them through a copy"
    m = next((m for m in (re.search(said, r.getMessage()) for r in caplog.records) if m), None)
    assert m, caplog.text
    assert int(m[1]) == stats.n_disk_reads and abs(float(m[2]) - stats.n_bytes_disk / 2**20) < 0.01
    if way == "through the page cache":
        assert float(m[3]) == 0
    else:  # at most one block of the four of a tensor is copied (its offset's first and last partial blocks)
        assert 0 < float(m[3]) <= float(m[2]) / 4 + 0.01


def test_a_read_that_fails_fails_its_decode_and_the_context_goes_on(lib, tiny_model_path, monkeypatch) -> None:
    layout = expert_layout(tiny_model_path)
    bad = layout.layers[1].il
    monkeypatch.setenv("LLAMA_MOE_TEST_DISK_FAIL_IL", str(bad))
    with Model(tiny_model_path, LAZY) as model:
        cp = ContextParams(n_ctx=256, n_threads=2, moe_ram_mib=mib_for_slots(tiny_model_path, layout.n_expert_used))
        with Context(model, cp) as ctx:
            monkeypatch.delenv("LLAMA_MOE_TEST_DISK_FAIL_IL")
            with pytest.raises(NativeCallError) as err:
                list(ctx.generate("Once upon a time", max_tokens=4, sampling=Sampling(temperature=0.0)))
            said = str(err.value)
            assert f"layer {bad}" in said and str(tiny_model_path.name) in said and "Input/output error" in said
            # the slots it could not fill hold nothing: the next lookups of that layer miss again, and fail again
            stats = ctx.moe_cache_stats()
            assert stats.n_resident <= stats.n_slots
            with pytest.raises(NativeCallError):
                list(ctx.generate("Once", max_tokens=2, sampling=Sampling(temperature=0.0)))
        # a context without the fault runs from the same model
        with Context(model, cp) as ctx:
            assert list(ctx.generate("Once upon a time", max_tokens=4, sampling=Sampling(temperature=0.0)))


def test_a_file_that_shrinks_fails_the_decodes_that_need_what_it_lost(lib, tiny_model_path, tmp_path) -> None:
    path = tmp_path / "shrinking.gguf"
    path.write_bytes(tiny_model_path.read_bytes())
    layout = expert_layout(path)
    last = max(layout.layers, key=lambda l: l.il).il
    cut = min(t.offset for t in read_gguf(path).tensors if t.name.startswith(f"blk.{last}.") and "_exps" in t.name)
    # the other weights in memory (no mmap): only the experts, mapped untouched, are the file's
    with Model(path, ModelParams(lazy_experts=True, use_mmap=False, repack=False)) as model:
        slots = 4 * layout.n_expert_used
        cp = ContextParams(n_ctx=256, n_threads=2, moe_ram_mib=mib_for_slots(path, slots))
        with Context(model, cp) as ctx:
            prompt = ctx.tokenize("Once")
            assert len(list(ctx.generate(prompt, max_tokens=2, sampling=Sampling(temperature=0.0)))) == 2
            os.truncate(path, cut + 4096)
            with pytest.raises(NativeCallError) as err:
                list(ctx.generate([], max_tokens=64, sampling=Sampling(temperature=0.0)))
            said = str(err.value)
            assert f"layer {last}" in said and "shrank" in said and path.name in said
            assert ctx.moe_cache_stats().n_cpu == 0  # nothing read from the lost pages through the mapping


def test_an_automatic_tier_holds_a_small_model_whole(lib, tiny_model_path) -> None:
    with Model(tiny_model_path, PLAIN) as model:
        with Context(model, ContextParams(n_ctx=256, n_threads=2)) as ctx:
            plain = list(ctx.generate("Once upon a time", max_tokens=24, sampling=Sampling(temperature=0.0)))
    with Model(tiny_model_path, LAZY) as model:
        with Context(model, ContextParams(n_ctx=256, n_threads=2, moe_ram_mib="auto")) as ctx:
            status = ctx.cache_status()
            text = list(ctx.generate("Once upon a time", max_tokens=24, sampling=Sampling(temperature=0.0)))
            stats = ctx.moe_cache_stats()
    assert status.ram_tier and status.size_auto and "--moe-ram-mib auto" in status.choice
    assert status.n_layers_whole == status.n_layers  # a tiny model fits: every layer read whole at creation
    assert text == plain
    assert stats.n_miss == 0 and stats.n_bytes_disk == sum(l.bytes_per_expert * l.n_expert
                                                           for l in expert_layout(tiny_model_path).layers)



def test_an_automatic_tier_leaves_room_for_its_staging_copy(lib, tiny_model_path, monkeypatch) -> None:
    """--moe-ram-mib auto on a machine that cannot hold every expert (the test switch gives it half the experts
    beyond the model's other weights and the 1 GiB margin): the slots and the staging copy of one layer's experts,
    which the tier keeps besides them, together fit in what the machine can spare."""
    layout = expert_layout(tiny_model_path)
    experts = sum(l.bytes_per_expert * l.n_expert for l in layout.layers)
    stage = max(l.bytes_per_expert * l.n_expert for l in layout.layers)  # one shape: one layer's experts
    spare = experts // 2
    with Model(tiny_model_path, LAZY) as model:
        others = model.size_bytes - experts
        monkeypatch.setenv("LLAMA_MOE_TEST_RAM_AVAIL_KIB", str((others + (1 << 30) + spare) // 1024))
        with Context(model, ContextParams(n_ctx=256, n_threads=2, moe_ram_mib="auto")) as ctx:
            status = ctx.cache_status()
            text = list(ctx.generate("Once upon a time", max_tokens=8, sampling=Sampling(temperature=0.0)))
    assert status.ram_tier and status.size_auto and status.n_layers_whole < status.n_layers
    assert "staging copy of one layer's experts" in status.choice
    assert status.n_bytes + stage <= spare + 1024 and status.n_bytes > 0, (status.n_bytes, stage, spare)
    assert len(text) == 8

_LOCK_SCRIPT = """
import json, resource, sys, warnings
from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, 64 << 10))
warnings.simplefilter("ignore")
with Model(sys.argv[1], ModelParams(lazy_experts=True, repack=False)) as model:
    with Context(model, ContextParams(n_ctx=256, n_threads=2, moe_ram_mib=float(sys.argv[2]))) as ctx:
        st = ctx.cache_status()
        out = list(ctx.generate("Once upon a time", max_tokens=4, sampling=Sampling(temperature=0.0)))
        print(json.dumps({"state": st.state, "reasons": st.reasons, "text": st.text, "tokens": len(out)}))
"""


def test_a_tier_the_machine_cannot_lock_is_refused_with_the_limit_named(lib, tiny_model_path) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("util-linux's setpriv is needed to run without CAP_IPC_LOCK, which ignores RLIMIT_MEMLOCK")
    layout = expert_layout(tiny_model_path)
    mib = mib_for_slots(tiny_model_path, layout.n_expert_used)
    # without CAP_IPC_LOCK (root's would let it lock past the limit), under a limit of 64 KiB
    res = subprocess.run([setpriv, "--bounding-set=-ipc_lock", sys.executable, "-c", _LOCK_SCRIPT, str(tiny_model_path),
                          f"{mib:.4f}"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["state"] == "off" and "no_tier" in out["reasons"]
    assert "RLIMIT_MEMLOCK 64 KiB" in out["text"] and "cannot lock" in out["text"]
    assert out["tokens"] == 4  # the context runs without the tier
