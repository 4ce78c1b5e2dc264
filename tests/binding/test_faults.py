"""Faults and bad parameters: a model file truncated while it loads or after, no device for the MoE
cache at start, and cache options that are out of range or contradict each other, through the Python API and
the command lines. Each ends in a clear error or warning (or, where the operating system decides, in an outcome
that is documented in docs/reliability.md and pinned here)."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llama_moe import Context, ContextParams, Model, ModelLoadError, ModelParams, MoeCacheWarning, ParameterError
from llama_moe.tools.cli import main
from llama_moe.tools.errors import ServePlanError
from llama_moe.tools.server.plan import plan_serve
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile

RAM = ModelParams(cpu_moe=True, repack=False)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_gpu(lib) -> None:
    from llama_moe.devices import gpus

    if gpus():
        pytest.skip("a GPU is visible: the cache has a device")


@pytest.fixture
def copy_of_model(tiny_model_path, tmp_path) -> Path:
    path = tmp_path / "copy.gguf"
    shutil.copy(tiny_model_path, path)
    return path


# -- a model file truncated after the load started ----------------------------------------------------------

class _TruncateWhenLoading(logging.Handler):
    """Truncates the file when llama.cpp logs that it starts reading the tensors: after its loader checked the
    file's size against the tensor table, before the data is read or mapped. Deterministic: llama.cpp's log
    reaches Python on the loading thread, inside llama_model_load_from_file."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.DEBUG)
        self.path, self.done = path, False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.done and "loading model tensors" in record.getMessage():
            os.truncate(self.path, self.path.stat().st_size // 2)
            self.done = True


@pytest.mark.parametrize("use_mmap, said", [(False, "unexpectedly reached end of file"),
                                            (True, "truncated .*after llama.cpp opened it.*SIGBUS")])
def test_a_file_truncated_while_it_loads_is_refused(lib, copy_of_model, use_mmap, said) -> None:
    native = logging.getLogger("llama_moe.native")
    handler, level = _TruncateWhenLoading(copy_of_model), native.level
    native.addHandler(handler)
    native.setLevel(logging.INFO)
    try:
        with pytest.raises(ModelLoadError, match=said):
            Model(copy_of_model, ModelParams(cpu_moe=True, repack=False, use_mmap=use_mmap))
    finally:
        native.removeHandler(handler)
        native.setLevel(level)
    assert handler.done


def test_a_mapped_file_truncated_after_the_load_is_refused_by_the_next_context(lib, copy_of_model) -> None:
    with Model(copy_of_model, RAM) as model:
        os.truncate(copy_of_model, copy_of_model.stat().st_size // 2)
        with pytest.raises(ModelLoadError, match="SIGBUS"):
            Context(model, ContextParams(n_ctx=256))


_AFTER_CONTEXT = """
import os, sys
from llama_moe import *
path, mmap = sys.argv[1], sys.argv[2] == "1"
with Model(path, ModelParams(cpu_moe=True, repack=False, use_mmap=mmap)) as m, Context(m, ContextParams(n_ctx=256)) as c:
    c.decode(m.tokenize("The ship"))
    os.truncate(path, os.path.getsize(path) // 2)
    print("truncated", flush=True)
    c.decode(m.tokenize(" left the harbour"))
    print("decoded", flush=True)
"""


@pytest.mark.parametrize("use_mmap", [False, True])
def test_a_file_truncated_under_a_running_context(lib, copy_of_model, use_mmap) -> None:
    """What the operating system decides: read into memory (use_mmap=False), the weights no longer need the
    file; memory-mapped, the next read of a page past the new end kills the process with SIGBUS, which no
    library can turn into an exception. docs/reliability.md says so; this pins it."""
    proc = subprocess.run([sys.executable, "-c", _AFTER_CONTEXT, str(copy_of_model), "1" if use_mmap else "0"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert "truncated" in proc.stdout, proc.stderr[-2000:]
    if use_mmap:
        assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    else:
        assert proc.returncode == 0 and "decoded" in proc.stdout, proc.stderr[-2000:]


# -- no device for the cache at start -----------------------------------------------------------------------

def test_no_gpu_for_the_cache_warns_and_runs_without_it(no_gpu, tiny_model_path) -> None:
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match=r"moe_cache_mib=2 asked for a MoE expert cache, but the context has "
                                                 r"none: no GPU to hold the cache; it is off"):
            ctx = Context(model, ContextParams(n_ctx=256, moe_cache_mib=2, moe_cache_hybrid=True))
        with ctx:
            assert ctx.moe_cache_stats() is None and ctx.layer_stats() == []
            assert "--moe-cache-device CPU" in ctx.moe_cache_off_reason
            assert len(list(ctx.generate("The ship", 4, stop_at_eog=False))) == 4  # it runs, without the cache


def test_a_cache_device_that_does_not_exist_warns(lib, tiny_model_path) -> None:
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match="--moe-cache-device CUDA7 names no device; the cache is off"):
            Context(model, ContextParams(n_ctx=256, moe_cache_mib=2, moe_cache_device="CUDA7")).close()


def test_stats_says_the_cache_is_off_and_why(no_gpu, tiny_model_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "llama_moe", "stats", str(tiny_model_path), "--moe-cache-mib", "2",
                           "--moe-cache-device", "CUDA7", "--no-repack", "-n", "4"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("MoE cache    OFF: asked for, but llama.cpp went on without it: --moe-cache-device CUDA7 names no "
            "device; the cache is off") in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr and "MoeCacheWarning" not in proc.stderr  # said once, in the report


def test_stats_without_a_gpu_runs_the_cache_in_ram_and_says_so(no_gpu, tiny_model_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "llama_moe", "stats", str(tiny_model_path), "--moe-cache-mib", "2",
                           "-n", "4"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no GPU: the cache is in RAM (--moe-cache-device CPU)" in proc.stdout
    assert "MoE cache    upload mode" in proc.stdout and "OFF" not in proc.stdout


# -- bad parameters: the Python API ---------------------------------------------------------------------------

@pytest.mark.parametrize("kw, said", [
    (dict(moe_cache_mib=-1), "moe_cache_mib must be a number of MiB from 0 to 16777216, or \"auto\""),
    (dict(moe_cache_mib=1e12), "moe_cache_mib must be .* got 1000000000000.0"),
    (dict(moe_cache_mib=float("nan")), "moe_cache_mib must be .* got nan"),
    (dict(moe_cache_mib=float("inf")), "moe_cache_mib must be .* got inf"),
    (dict(moe_cache_mib=True), "moe_cache_mib must be .* got True"),
    (dict(moe_cache_mib="2"), "moe_cache_mib must be .* got '2'"),
    (dict(n_ubatch=1024, n_batch=512), r"n_ubatch \(1024\) cannot exceed n_batch \(512\)"),
    (dict(n_threads=0), "n_threads must be from 1 to 1024"),
])
def test_context_params_out_of_range_or_contradicting_are_refused(kw, said) -> None:
    with pytest.raises(ParameterError, match=said):
        ContextParams(**kw).validate()


@pytest.mark.parametrize("kw, said", [
    (dict(moe_cache_mib=2, moe_cache_adaptive=True), "--moe-cache-adaptive without --moe-cache-hybrid is ignored"),
    (dict(moe_cache_hybrid=True), r"no MoE expert cache \(moe_cache_mib=0\): --moe-cache-hybrid: no effect without "
                                  r"--moe-cache-mib"),
    (dict(moe_cache_profile="p.strp", moe_cache_hybrid=True, moe_cache_adaptive=True),
     "--moe-cache-profile, --moe-cache-hybrid, --moe-cache-adaptive: no effect without --moe-cache-mib"),
])
def test_cache_options_that_cannot_apply_warn_with_the_engines_reason(lib, tiny_model_path, kw, said) -> None:
    """Python checks types and ranges only: the engine refuses what cannot apply with the rest, and the binding
    says its reason (and keeps it in the status)."""
    ContextParams(**kw).validate()  # no warning, no error: each value is of its type and in its range
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match=said):
            ctx = Context(model, ContextParams(n_ctx=256, moe_cache_device="CPU", **kw))
        with ctx:
            assert not ctx.cache_status().as_asked


@pytest.mark.parametrize("kw, said", [
    (dict(n_cpu_moe=-1), "n_cpu_moe must be a whole number of layers from 0 to 65535, got -1"),
    (dict(cpu_moe=True, n_cpu_moe=2), "would contradict it"),
    (dict(main_gpu=-1), "main_gpu must be a device index from 0 to 2147483647, got -1"),
])
def test_model_params_out_of_range_or_contradicting_are_refused(kw, said) -> None:
    with pytest.raises(ParameterError, match=said):
        ModelParams(**kw).validate()


def test_a_cache_too_small_for_one_expert_per_layer_warns(lib, tiny_model_path) -> None:
    with Model(tiny_model_path, RAM) as model:
        with pytest.warns(MoeCacheWarning, match="0.01 MiB cannot hold one expert per layer"):
            Context(model, ContextParams(n_ctx=256, moe_cache_mib=0.01, moe_cache_device="CPU")).close()


# a cache larger than its device's free memory: tests/binding/test_cache_status.py (the engine fits it)


# -- bad parameters: the command lines -----------------------------------------------------------------------

CLI_CASES = [
    (["stats", "{model}", "-n", "-5"], "-n/--n-gen must be >= 1, got -5"),
    (["stats", "{model}", "--moe-cache-mib", "-1"], "--moe-cache-mib must be from 0 to 16777216 (MiB), got -1"),
    (["stats", "{model}", "--moe-cache-mib", "1e9"], "--moe-cache-mib must be from 0 to 16777216 (MiB), got 1e+09"),
    (["stats", "{model}", "--moe-cache-mib", "nan"], "--moe-cache-mib must be a finite number, got nan"),
    (["stats", "{model}", "--moe-cache-mib", "2", "--moe-cache-profile", "{missing}"], "no such file"),
    (["stats", "{model}", "--n-cpu-moe", "-2"], "--n-cpu-moe must be >= 0, got -2"),
    (["stats", "{model}", "-t", "0"], "n_threads must be from 1 to 1024"),
    (["plan", "{model}", "--cache-mib", "-5"], "--cache-mib must be > 0, got -5"),
    (["plan", "{model}", "--cache-mib", "0"], "--cache-mib must be > 0, got 0"),
    (["plan", "{model}", "--vram-gib", "-1"], "--vram-gib must be > 0, got -1"),
    (["plan", "{model}", "--vram-gib", "80", "--reserve-gib", "-1"], "--reserve-gib must be >= 0, got -1"),
    (["plan", "{model}", "--cache-mib", "2", "--kfold", "1"], "--kfold must be >= 2, got 1"),
    (["plan", "{model}", "--cache-mib", "2", "--whole-layers", "-1"], "--whole-layers must be >= 0, got -1"),
    (["plan", "{model}", "--vram-gib", "0.001"], "leaves nothing for the cache"),
    (["serve", "{model}", "--dry-run", "--cache-mib", "-5"], "--cache-mib must be >= 0, got -5"),
    (["serve", "{model}", "--dry-run", "--cache-mib", "0"], "--cache-mib 0 turns the cache off"),
    (["serve", "{model}", "--dry-run", "--margin-mib", "-1"], "--margin-mib must be >= 0, got -1"),
    (["serve", "{model}", "--dry-run", "--profile", "{missing}"], "no such file"),
    (["serve", "{model}", "--dry-run", "--threads", "0"], "--threads must be >= 1 or auto, got 0"),
    (["serve", "{model}", "--dry-run", "--ubatch", "0"], "--ubatch must be from 1 to 65536 or auto, got 0"),
    (["serve", "{model}", "--dry-run", "--ctx", "-1"], "--ctx must be >= 256"),
    (["bench", "{model}", "--modes", "cpu-moe,foo"], "unknown --modes foo"),
    (["bench", "{model}", "--cache-pct", "-5", "50"], "--cache-pct must be above 0 and at most 100, got -5"),
    (["bench", "{model}", "--cache-pct", "150"], "--cache-pct must be above 0 and at most 100, got 150"),
    (["bench", "{model}", "-t", "0"], "-t/--threads must be >= 1, got 0"),
    (["bench", "{model}", "--runs", "0"], "--runs must be >= 1, got 0"),
    (["bench", "{model}", "--profile-stride", "0"], "--profile-stride must be >= 1, got 0"),
    (["bench-adaptive", "{model}", "--cache-pct", "0"], "--cache-pct must be above 0 and at most 100, got 0"),
    (["bench-adaptive", "{model}", "--cache-pct", "150"], "--cache-pct must be above 0 and at most 100, got 150"),
    (["bench-adaptive", "{model}", "-t", "0"], "-t/--threads must be >= 1, got 0"),
]


@pytest.mark.parametrize("argv, said", CLI_CASES, ids=[" ".join(a[2:]) + f" [{a[0]}]" for a, _ in CLI_CASES])
def test_command_lines_refuse_bad_cache_options_with_their_names(lib, tiny_model_path, tmp_path, capsys, argv, said) -> None:
    layout = expert_layout(tiny_model_path)
    profile = tmp_path / "fits.strp"
    write_profile(profile, Profile(layout.n_layer, layout.n_expert, 1, ()))
    args = [a.format(model=tiny_model_path, missing=tmp_path / "missing.strp", profile=profile) for a in argv]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: " in err and said in err, err
    assert "Traceback" not in err


def test_serve_plan_takes_an_adaptive_hybrid_without_a_profile(tiny_model_path, tmp_path) -> None:
    server = tmp_path / "llama-server"
    plan = plan_serve(tiny_model_path, server, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, hybrid=True,
                      extra=("--moe-cache-adaptive",))
    assert "--moe-cache-hybrid" in plan.command and "--moe-cache-adaptive" in plan.command


@pytest.mark.parametrize("argv, said", [
    (["--moe-cache-mib", "0", "--moe-cache-hybrid"], "--moe-cache-hybrid: no effect without --moe-cache-mib"),
    (["--moe-cache-mib", "0", "--moe-cache-profile", "{profile}", "--moe-cache-hybrid"],
     "--moe-cache-profile, --moe-cache-hybrid: no effect without --moe-cache-mib"),
    (["--moe-cache-mib", "2", "--moe-cache-adaptive"], "--moe-cache-adaptive without --moe-cache-hybrid is ignored"),
])
def test_stats_reports_the_engines_reason_for_options_that_cannot_apply(lib, tiny_model_path, tmp_path, capsys,
                                                                        argv, said) -> None:
    """The rules between the cache's options are the engine's: stats runs, and its report says what the engine
    did not apply and why."""
    layout = expert_layout(tiny_model_path)
    profile = tmp_path / "fits.strp"
    write_profile(profile, Profile(layout.n_layer, layout.n_expert, 1, ()))
    args = [a.format(profile=profile) for a in argv]
    capsys.readouterr()
    assert main(["stats", str(tiny_model_path), *args, "--moe-cache-device", "CPU", "--no-repack", "-n", "4",
                 "--no-compare"]) == 0
    out = capsys.readouterr().out
    assert f"NOT AS ASKED: {said}" in out, out
