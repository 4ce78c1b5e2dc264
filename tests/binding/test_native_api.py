"""The binding over the real patched libllama: loading, generation with and without --cpu-moe, lifecycles."""
from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import llama_moe
from llama_moe import (ClosedError, Context, ContextParams, Model, ModelLoadError, ModelParams, ParameterError,
                       Sampling)

PROMPT = "The ship left the harbour at dawn, and the crew"


def _greedy(path: Path, mp: ModelParams, n: int = 48) -> tuple[list[int], np.ndarray]:
    with Model(path, mp) as model, Context(model, ContextParams(n_ctx=512, n_threads=2)) as ctx:
        tokens = list(ctx.generate(PROMPT, max_tokens=n, stop_at_eog=False))
        return tokens, ctx.logits()


def test_library_reports_our_abi(lib) -> None:
    info = llama_moe.native_version()
    assert info["abi_version"] == llama_moe._native.ffi.ABI_VERSION == 10
    assert info["context_params_size"] == llama_moe._native.ffi.ffi.sizeof("struct llama_context_params")
    assert Path(info["path"]).is_file()


@pytest.mark.parametrize("fixture", ["tiny_model_path", "tiny_q4_model_path"])
def test_cpu_moe_gives_the_same_greedy_tokens(lib, request, fixture) -> None:
    path = request.getfixturevalue(fixture)
    plain_tokens, plain_logits = _greedy(path, ModelParams())
    ram_tokens, ram_logits = _greedy(path, ModelParams(cpu_moe=True))
    some_tokens, _ = _greedy(path, ModelParams(n_cpu_moe=2))
    assert len(plain_tokens) == 48
    assert plain_tokens == ram_tokens == some_tokens
    np.testing.assert_array_equal(plain_logits, ram_logits)


def test_generation_is_text_and_sampling_is_seeded(lib, tiny_model_path) -> None:
    with Model(tiny_model_path, ModelParams(cpu_moe=True)) as model, Context(model, ContextParams(n_ctx=512)) as ctx:
        tokens = model.tokenize(PROMPT)
        assert model.detokenize(tokens, remove_special=True) == PROMPT
        a = ctx.complete(PROMPT, 32, Sampling(temperature=0.8, seed=7))
        ctx.reset()
        b = ctx.complete(PROMPT, 32, Sampling(temperature=0.8, seed=7))
        ctx.reset()
        c = ctx.complete(PROMPT, 32, Sampling(temperature=0.8, seed=8))
        assert a.tokens == b.tokens
        assert a.tokens != c.tokens
        assert a.text.strip() and all(ch.isprintable() or ch.isspace() for ch in a.text)
        perf = ctx.perf()
        assert perf.n_gen > 0 and perf.gen_tps > 0


def test_logits_of_every_token(lib, tiny_model_path) -> None:
    with Model(tiny_model_path) as model, Context(model, ContextParams(n_ctx=256)) as ctx:
        tokens = model.tokenize(PROMPT)
        ctx.decode(tokens, all_logits=True)
        rows = [ctx.logits(i) for i in range(len(tokens))]
        assert all(r.shape == (model.n_vocab,) and np.isfinite(r).all() for r in rows)
        np.testing.assert_array_equal(rows[-1], ctx.logits(-1))


def test_lifecycle_close_twice_with_and_use_after_close(lib, tiny_model_path) -> None:
    model = Model(tiny_model_path)
    ctx = Context(model, ContextParams(n_ctx=128))
    ctx.close()
    ctx.close()
    with pytest.raises(ClosedError):
        ctx.decode([1])
    with model:
        assert model.n_layer > 0
    assert model.closed
    with pytest.raises(ClosedError):
        model.tokenize("x")


def test_unclosed_objects_are_freed_by_the_collector_with_a_warning(lib, tiny_model_path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Model(tiny_model_path)
        Context(model, ContextParams(n_ctx=128))
        del model
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "Context" in str(w.message) for w in caught)
    assert any(issubclass(w.category, ResourceWarning) and "Model" in str(w.message) for w in caught)


def test_missing_and_corrupt_models_raise_clear_errors(lib, tiny_model_path, tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="no such model file"):
        Model(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelLoadError, match="magic"):
        Model(junk)
    truncated = tmp_path / "truncated.gguf"
    data = tiny_model_path.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated|past the end|ends at"):
        Model(truncated)


def test_bad_parameters_are_refused(lib, tiny_model_path) -> None:
    with pytest.raises(ParameterError, match="n_cpu_moe"):
        Model(tiny_model_path, ModelParams(n_cpu_moe=-1))
    with pytest.raises(ParameterError, match="contradict"):
        Model(tiny_model_path, ModelParams(cpu_moe=True, n_cpu_moe=2))
    with Model(tiny_model_path) as model:
        with pytest.raises(ParameterError, match="n_ubatch"):
            Context(model, ContextParams(n_batch=64, n_ubatch=128))
        with Context(model, ContextParams(n_ctx=64)) as ctx:
            with pytest.raises(ValueError, match="outside the vocabulary"):
                ctx.decode([model.n_vocab + 5])
            with pytest.raises(ValueError, match="do not fit"):
                ctx.decode([1] * (ctx.n_ctx + 1))  # llama.cpp rounds n_ctx up to 256


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)


def test_import_works_without_a_library(tmp_path) -> None:
    proc = _run_python("import llama_moe; print(llama_moe.__version__)", LLAMA_MOE_LIB=str(tmp_path / "none.so"))
    assert proc.returncode == 0, proc.stderr


def test_missing_library_says_where_it_looked(tmp_path) -> None:
    proc = _run_python("import llama_moe; llama_moe.native_version()", LLAMA_MOE_LIB=str(tmp_path / "none.so"))
    assert proc.returncode != 0
    assert "NativeLibraryError" in proc.stderr and "none.so" in proc.stderr


def _compile_fake_library(tmp_path: Path, body: str) -> Path:
    src = tmp_path / "fake.c"
    src.write_text("#include <stddef.h>\n#include <stdint.h>\n" + body)
    out = tmp_path / "libfake.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def test_a_library_of_another_abi_is_refused(tmp_path) -> None:
    wrong = _compile_fake_library(tmp_path, (
        "int32_t llama_moe_abi_version(void) { return 999; }\n"
        "size_t llama_moe_context_params_size(void) { return 8; }\n"
        "size_t llama_moe_model_params_size(void) { return 8; }\n"))
    proc = _run_python("import llama_moe; llama_moe.native_version()", LLAMA_MOE_LIB=str(wrong))
    assert proc.returncode != 0
    assert "AbiMismatchError" in proc.stderr
    assert "ABI version 999" in proc.stderr and "sizeof(llama_context_params) is 8" in proc.stderr


def test_a_library_whose_status_struct_differs_is_refused(tmp_path) -> None:
    """The right ABI number and params, but a llama_moe_cache_status of another size: cffi would read past it."""
    from llama_moe._native.ffi import ABI_VERSION, ffi

    wrong = _compile_fake_library(tmp_path, (
        f"int32_t llama_moe_abi_version(void) {{ return {ABI_VERSION}; }}\n"
        f"size_t llama_moe_context_params_size(void) {{ return {ffi.sizeof('struct llama_context_params')}; }}\n"
        f"size_t llama_moe_model_params_size(void) {{ return {ffi.sizeof('struct llama_model_params')}; }}\n"
        "size_t llama_moe_cache_status_size(void) { return 16; }\n"))
    proc = _run_python("import llama_moe; llama_moe.native_version()", LLAMA_MOE_LIB=str(wrong))
    assert proc.returncode != 0
    assert "AbiMismatchError" in proc.stderr and "sizeof(llama_moe_cache_status) is 16" in proc.stderr, proc.stderr[-2000:]


def test_a_library_that_is_not_ours_is_refused(tmp_path) -> None:
    other = _compile_fake_library(tmp_path, "int llama_decode(void) { return 0; }\n")
    proc = _run_python("import llama_moe; llama_moe.native_version()", LLAMA_MOE_LIB=str(other))
    assert proc.returncode != 0
    assert "not a llama_moe build" in proc.stderr


def test_a_library_with_its_own_libstdcxx_is_refused_not_crashed_on(tmp_path) -> None:
    src = tmp_path / "static.cpp"
    src.write_text('#include <string>\n#include <cstdint>\n#include <cstddef>\n'
                   'extern "C" int32_t llama_moe_abi_version(void) { return std::to_string(2).size() + 1; }\n')
    lib = tmp_path / "libstatic.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-static-libstdc++", "-o", str(lib), str(src)], check=True)
    proc = _run_python("import llama_moe; llama_moe.native_version()", LLAMA_MOE_LIB=str(lib))
    assert proc.returncode != 0
    assert "NativeLibraryError" in proc.stderr and "its own copy of libstdc++" in proc.stderr


def test_every_llama_moe_function_of_the_library_is_declared_and_exists(lib) -> None:
    """The binding's declarations (llama_moe/_native/decl/llama_moe.h) and the C API libllama exports name the
    same llama_moe_* functions: one the declarations lose is unreachable from Python (cffi says only
    AttributeError at its first call), one they keep after the engine dropped it fails the same way."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", llama_moe.native_version()["path"]],
                         capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-1].startswith("llama_moe_")}
    decl = (Path(llama_moe._native.__file__).parent / "decl" / "llama_moe.h").read_text()
    declared = set(re.findall(r"\b(llama_moe_\w+)\s*\(", decl))
    assert exported and declared == exported, (sorted(exported - declared), sorted(declared - exported))
