"""Context.cache_status(): what the engine made of the MoE cache asked for (llama_moe_cache_get_status), read from
the engine and not from its log. Each condition that leaves the cache other than asked is a MoeCacheWarning with
the engine's reason, with no logging configured (the package's logger has only a NullHandler), and the status
names it; the command-line tools print it at their default verbosity."""
from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, MoeCacheStatus
from llama_moe._native.ffi import ffi

# no layer in RAM (no_layer) needs a device besides the CPU: on a CPU-only build every expert is in RAM
from llama_moe.errors import MoeCacheWarning
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from support.cache_sizes import mib_for_slots

RAM = ModelParams(cpu_moe=True, repack=False)


@pytest.fixture(autouse=True)
def cache_in_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", raising=False)
    # what a user who configured nothing has: no handler, nothing below WARNING; the status must not need the log
    logging.getLogger("llama_moe.native").setLevel(logging.CRITICAL)


def _open(model: Model, cp: ContextParams) -> tuple[MoeCacheStatus, list[str], object]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = Context(model, cp)
    with ctx:
        return ctx.cache_status(), [str(w.message) for w in caught if issubclass(w.category, MoeCacheWarning)], \
            ctx.layer_stats()


def test_a_cache_as_asked_says_so_and_warns_nothing(lib, tiny_model_path) -> None:
    layout = expert_layout(tiny_model_path)
    with Model(tiny_model_path, RAM) as model:
        none, said, _ = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256))
        assert (none.state, none.mode, none.reasons, none.reason, none.text, none.device) == ("off", "none", (), None, "", "")
        assert said == []
        for kw, mode in [({}, "upload"), ({"moe_cache_hybrid": True, "moe_cache_adaptive": True}, "adaptive")]:
            cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=bool(kw)), **kw)
            status, said, layers = _open(model, cp)
            assert said == []
            assert (status.state, status.mode, status.reason, status.reasons, status.text) == ("on", mode, None, (), "")
            assert status.as_asked and status.device == "CPU" and not status.mailbox
            assert status.n_slots == status.n_slots_asked == 8 == layers[0].n_slots
            assert status.n_layers == len(layout.layers) and status.n_layers_whole == 0 and status.n_bytes > 0


def test_the_mailbox_is_in_the_status(lib, tiny_model_path, monkeypatch) -> None:
    """On by default; off by the setting, or by default where LLAMA_MOE_CACHE_NO_MAILBOX=1 (the contract's
    variable), which the setting still overrides."""
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), moe_cache_hybrid=True,
                       moe_cache_adaptive=True, moe_cache_mailbox_on_cpu=True)
    with Model(tiny_model_path, RAM) as model:
        assert _open(model, cp)[0].mailbox
        assert not _open(model, dataclasses.replace(cp, moe_cache_mailbox=False))[0].mailbox
        monkeypatch.setenv("LLAMA_MOE_CACHE_NO_MAILBOX", "1")
        assert not _open(model, cp)[0].mailbox
        assert _open(model, dataclasses.replace(cp, moe_cache_mailbox=True))[0].mailbox


def test_a_refused_profile_is_a_warning_and_a_partial_cache(lib, tiny_model_path, tmp_path) -> None:
    """The profile of another geometry: the engine refuses it and starts the cache empty. Before the status call
    this reached Python only through the native log, which a user without logging configured never saw."""
    layout = expert_layout(tiny_model_path)
    path = tmp_path / "other.strp"
    write_profile(path, Profile(layout.n_layer, layout.n_expert * 2, 4, ((layout.layers[0].il, 0),)))
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8), moe_cache_profile=path)
    with Model(tiny_model_path, RAM) as model:
        status, said, _ = _open(model, cp)
    assert (status.state, status.reason, status.reasons, status.mode) == ("partial", "profile_refused", ("profile_refused",), "upload")
    assert f"MoE cache profile {path} refused: " in status.text and "the cache starts empty" in status.text
    # the reason alone, for a caller that shows it without the rest
    assert status.profile_error and f"refused: {status.profile_error}; the cache starts empty" in status.text
    assert len(said) == 1 and "the MoE expert cache is not as asked: " + status.text in said[0], said


def test_a_device_with_too_little_free_memory_gives_fewer_slots_or_none(lib, tiny_model_path, monkeypatch) -> None:
    """The engine fits the cache to its device's free memory when the context is made (simulated here by a test
    switch: the model is real, the device's free memory is the input): fewer slots than asked, said; or none."""
    asked = mib_for_slots(tiny_model_path, 24, hybrid=True)
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=asked, moe_cache_hybrid=True, moe_cache_adaptive=True)
    with Model(tiny_model_path, RAM) as model:
        monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(int(mib_for_slots(tiny_model_path, 10, hybrid=True) * 1024)))
        status, said, layers = _open(model, cp)
        assert (status.state, status.reasons, status.n_slots_asked) == ("partial", ("fewer_slots",), 24)
        assert 0 < status.n_slots < 24 and {l.n_slots for l in layers} == {status.n_slots}
        assert "slots per layer instead of 24" in status.text and len(said) == 1 and status.text in said[0]
        monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", "1")
        status, said, layers = _open(model, cp)
        assert (status.state, status.reason, status.mode, layers) == ("off", "no_room", "none", [])
        assert "which cannot hold one expert per layer" in status.text
        assert len(said) == 1 and "asked for a MoE expert cache, but the context has none: " + status.text in said[0]
        # a request over every expert fits a device that holds them all: no warning
        monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(100 * 1024))
        status, said, _ = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=100_000))
        assert status.state == "on" and said == [] and status.n_bytes < 100 * 2**20


@pytest.mark.parametrize("mp,kw,reason,words", [
    (RAM, dict(moe_cache_mib=0.01), "too_small", "0.01 MiB cannot hold one expert per layer"),
    (RAM, dict(moe_cache_mib=2, moe_cache_hybrid=True), "stays_empty", "starts empty and stays empty"),
    (RAM, dict(moe_cache_mib=2, moe_cache_adaptive=True), "option_ignored", "--moe-cache-adaptive without --moe-cache-hybrid is ignored"),
], ids=["size too small", "hybrid that stays empty", "option that cannot apply"])
def test_each_condition_is_a_warning_from_the_status(lib, tiny_model_path, mp, kw, reason, words) -> None:
    with Model(tiny_model_path, mp) as model:
        status, said, _ = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, **kw))
    assert status.reason == reason and reason in status.reasons and words in status.text
    assert status.state == ("off" if reason == "too_small" else "partial")
    assert [s for s in said if status.text in s], said


def test_no_device_for_the_cache(lib, tiny_model_path) -> None:
    with Model(tiny_model_path, RAM) as model:
        status, said, _ = _open(model, ContextParams(n_ctx=256, moe_cache_mib=2, moe_cache_device="CUDA7"))
    assert (status.state, status.reasons) == ("off", ("no_device",))
    assert status.text == "--moe-cache-device CUDA7 names no device; the cache is off"  # said once, not twice
    assert len(said) == 1


def test_a_context_that_drafts_for_another_gets_no_cache(lib, tiny_model_path) -> None:
    """A draft model's context (made with ctx_other, as llama.cpp's speculative decoding makes it) asked for a cache
    gets none: the cache is the target's, and a second one would split the device's memory and the counters."""
    from llama_moe._native.cache_status import read_status

    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8))
    with Model(tiny_model_path, RAM) as model, Context(model, cp) as target:
        native, keep = cp._to_native(model._lib)
        held = model._hold()
        try:
            with target._using() as ptr:
                native.ctx_other = ptr
                draft = model._lib.llama_init_from_model(held.ptr, native)
                assert draft != ffi.NULL
                try:
                    status = read_status(model._lib, draft)
                    assert not model._lib.llama_moe_cache_get_stats(draft, ffi.new("struct llama_moe_cache_stats *"))
                finally:
                    model._lib.llama_free(draft)
        finally:
            held.release()
            del keep
        assert target.cache_status().state == "on"
    assert (status.state, status.mode, status.reason, status.reasons) == ("off", "none", "draft", ("draft",))
    assert "drafts for another" in status.text and "the MoE cache belongs to the target's context" in status.text


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llama_moe", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_the_command_line_says_a_cache_other_than_asked(lib, tiny_model_path: Path) -> None:
    """stats puts it in its report; the other commands print the warning at their default verbosity."""
    free = str(int(mib_for_slots(tiny_model_path, 10) * 1024))
    mib = f"{mib_for_slots(tiny_model_path, 24):.4f}"
    proc = _cli("stats", str(tiny_model_path), "--moe-cache-mib", mib, "--no-repack", "-n", "2",
                env={"LLAMA_MOE_TEST_DEVICE_FREE_KIB": free})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NOT AS ASKED: " in proc.stdout and "slots per layer instead of 24" in proc.stdout, proc.stdout
    proc = _cli("stats", str(tiny_model_path), "--moe-cache-mib", mib, "--no-repack", "-n", "2",
                env={"LLAMA_MOE_TEST_DEVICE_FREE_KIB": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MoE cache    OFF: asked for, but llama.cpp went on without it: CPU has 0.00 MiB free" in proc.stdout, proc.stdout


def test_every_command_prints_a_cache_warning_as_one_line(capsys) -> None:
    """The display every command runs under (llama_moe.tools.cli.main): a MoeCacheWarning is one line on stderr each time
    it is raised, at any verbosity; the display ends with the command."""
    from llama_moe.tools.cli import show_cache_warnings

    before = warnings.showwarning
    with warnings.catch_warnings():
        show_cache_warnings("llama_moe bench")
        for _ in range(2):
            warnings.warn("the MoE expert cache is not as asked: 2.00 MiB asked", MoeCacheWarning)
    assert warnings.showwarning is before
    err = capsys.readouterr().err.splitlines()
    ours = [line for line in err if line.startswith("llama_moe bench: warning: ")]
    assert ours == ["llama_moe bench: warning: the MoE expert cache is not as asked: 2.00 MiB asked"] * 2, err
