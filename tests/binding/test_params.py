"""Every field of ModelParams, ContextParams and Sampling: each kind of value it cannot take (negative, zero where
zero means nothing, over its C type's range, the wrong type, a bool for a number) is refused with a ParameterError
(a LlamaMoeError) that names the field, through validate() and through the real constructors that hand the values
to libllama (where they used to escape as cffi's OverflowError or TypeError); the edge values that are valid pass.
A field without cases here fails test_every_field_has_cases."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from llama_moe import Context, ContextParams, LlamaMoeError, Model, ModelParams, ParameterError, Sampling

NAN, INF = float("nan"), float("inf")
I32, U32 = 2**31, 2**32  # one over int32_t, uint32_t

MODEL_BAD = {
    "n_gpu_layers": [-2, I32, 1.5, "10", None, True],
    "cpu_moe": [1, 0, "yes", None, 2],
    "n_cpu_moe": [-1, 65536, I32, 2.0, "3", None, True],
    "cpu_tensor_patterns": ["blk\\.0", b"blk", 5, None, ("",), (5,), ("a\0b",), [None]],
    "use_mmap": [1, "false", None],
    "main_gpu": [-1, I32, 0.0, "0", None, False],
    "check_tensors": [1, "true", None],
    "repack": [0, "no", None],
    "lazy_experts": [1, "yes", None],
    # not host:port, a port out of range, one string for the tuple, a server named twice
    "rpc": ["127.0.0.1:50052", None, (5,), ("127.0.0.1",), ("h:0",), ("h:70000",), ("h:1,h:2",), ("a:1", "a:1")],
    # a string, no tuple, all zero, a negative, NaN or infinite, a bool, more devices than llama.cpp has
    "tensor_split": ["1,1", None, 1.0, (0, 0), (-1.0, 1.0), (float("nan"), 1.0), (float("inf"),), (True, 1),
                     ("1",), (1.0,) * 17],
}
MODEL_GOOD = {"n_gpu_layers": [-1, 0, 999, I32 - 1], "n_cpu_moe": [0, 3, 65535], "main_gpu": [0, np.int32(0)],
              "cpu_tensor_patterns": [(), ["blk\\.0\\."], ("a", "b")], "cpu_moe": [True, False],
              "rpc": [(), []], "tensor_split": [(), [3, 1], (0, 1), (1.0,) * 16]}

CONTEXT_BAD = {
    "n_ctx": [-1, (1 << 24) + 1, U32, I32 * 4, 256.0, "256", None, True],
    "n_batch": [0, -1, (1 << 24) + 1, U32, 64.0, "64", None, True],
    "n_ubatch": [0, -5, U32, 32.0, None, False],
    "n_threads": [0, -1, 1025, I32, 2.0, "4", True],
    "n_threads_batch": [0, -1, 1025, U32, 2.5, "4", False],
    "flash_attn": [1, 0, "auto", "on"],
    "offload_kqv": [1, "yes", None],
    "op_offload": [0, "no", None],
    "no_perf": [1, "true", None],
    "moe_cache_mib": [-1, -0.5, (1 << 24) + 1, 1e300, NAN, INF, -INF, "2", None, True],
    "moe_cache_profile": [5, 2.0, "", b"", "a\0b", ["p.strp"]],
    "moe_cache_hybrid": [1, "yes"],
    "moe_cache_adaptive": [1, "no"],
    "moe_cache_admit": [-1, 10000, I32, 2.0, "2", True, "Auto"],
    "moe_cache_repartition": [-1, 1000000, I32, 2.0, "16", True],
    "moe_cache_peer": ["", 5, b"CUDA1", "a\0b", "x" * 128],
    "moe_cache_device": ["", 5, b"CPU", "a\0b", "x" * 128, ("CPU",)],
    "moe_cache_copy": [1, "no"],
    "moe_cache_admit_async": [1, "auto", -1],
    "moe_cache_mailbox": [0, "off"],
    "moe_cache_mailbox_on_cpu": [1, "yes"],
    "moe_cache_mailbox_fuse": [0, "no"],
    "moe_cache_mailbox_threads": [-1, 1025, I32, 2.0, "4", True],
    "moe_cache_mailbox_timeout_ms": [0, -1, 3600 * 1000 + 1, I32, 10.0, "10", True],
    "moe_cache_mailbox_prefetch": [-1, (1 << 30) + 1, I32, 4096.0, "4096", False],
    "moe_cache_mailbox_gpu_share": [-0.1, 1.01, NAN, INF, "0.5", True],
    "n_seq_max": [0, -1, 257, U32, 2.0, "4", None, True],
    "moe_cache_mode": ["fast", "Auto", "", 1, True],
    "moe_cache_margin_mib": [-1, (1 << 20) + 1, 2.0, "400", True],
    "moe_ram_mib": [-1, (1 << 24) + 1, NAN, INF, "2", None, True],
}
CONTEXT_GOOD = {"n_ctx": [0, 256, np.int64(512)], "n_batch": [1, 1 << 24], "n_threads": [None, 1, 1024],
                "flash_attn": [None, True, False], "moe_cache_mib": [0, 0.5, 1 << 24, "auto"],
                "n_seq_max": [1, 8, 256, np.int32(4)],
                # a cache setting's None is the engine's default; what cannot apply with the rest is the engine's to say
                "moe_cache_hybrid": [None], "moe_cache_admit": [None, "auto", 0, 9999], "moe_cache_peer": ["CUDA1"],
                "moe_cache_device": [None, "CPU", "CUDA7"], "moe_cache_admit_async": [None, True, False],
                "moe_cache_mailbox": [None, False], "moe_cache_mailbox_threads": [None, 0, 1024, np.int32(3)],
                "moe_cache_mailbox_timeout_ms": [1, 3600 * 1000], "moe_cache_mailbox_prefetch": [0, 1 << 30],
                "moe_cache_mailbox_gpu_share": [0, 1, 0.5, np.float32(0.25)],
                "moe_cache_mode": [None, "auto", "upload", "hybrid", "adaptive", "admit"], "moe_cache_margin_mib": [None, 0, 1 << 20],
                "moe_ram_mib": [0, 0.5, 1 << 24, "auto"]}

SAMPLING_BAD = {
    "temperature": [-0.1, -INF, NAN, INF, "0.7", None, True],
    "top_k": [-1, I32, 4.0, "40", None, True],
    "top_p": [0, -0.5, 1.01, NAN, INF, "0.9", None, False],
    "seed": [-1, U32, 2**64, 1.0, "7", None, True],
}
SAMPLING_GOOD = {"temperature": [0, 0.0, 1e-6, 5], "top_k": [0, I32 - 1], "top_p": [1, 1e-9, 0.5], "seed": [0, U32 - 1]}


def _cases(table: dict[str, list]) -> list:
    return [pytest.param(name, value, id=f"{name}={value!r}") for name, values in table.items() for value in values]


def test_every_field_has_cases() -> None:
    for cls, bad in ((ModelParams, MODEL_BAD), (ContextParams, CONTEXT_BAD), (Sampling, SAMPLING_BAD)):
        assert {f.name for f in dataclasses.fields(cls)} == set(bad), cls.__name__


def _refused(excinfo: pytest.ExceptionInfo, name: str) -> None:
    assert isinstance(excinfo.value, LlamaMoeError) and isinstance(excinfo.value, ParameterError)
    assert str(excinfo.value).startswith(name), str(excinfo.value)


@pytest.mark.parametrize("name, value", _cases(MODEL_BAD))
def test_model_params_refuse_each_bad_value_by_name(lib, tiny_model_path, name, value) -> None:
    params = ModelParams(**{name: value})
    with pytest.raises(ParameterError) as excinfo:
        params.validate()
    _refused(excinfo, name)
    with pytest.raises(ParameterError) as excinfo:  # what a user calls: refused before the file is read
        Model(tiny_model_path, params)
    _refused(excinfo, name)


@pytest.fixture(scope="module")
def model(lib, tiny_model_path):
    with Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False)) as m:
        yield m


@pytest.mark.parametrize("name, value", _cases(CONTEXT_BAD))
def test_context_params_refuse_each_bad_value_by_name(model, name, value) -> None:
    kw = {name: value}
    if name == "n_ubatch" or name == "n_batch":
        kw.setdefault("n_ubatch" if name == "n_batch" else "n_batch", 1 if name == "n_batch" else 1 << 24)
    params = ContextParams(**kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a profile without a cache size also warns; the error is what is tested
        with pytest.raises(ParameterError) as excinfo:
            params.validate()
        _refused(excinfo, name)
        with pytest.raises(ParameterError) as excinfo:  # through the struct libllama takes
            Context(model, params)
        _refused(excinfo, name)


@pytest.mark.parametrize("name, value", _cases(SAMPLING_BAD))
def test_sampling_refuses_each_bad_value_by_name(name, value) -> None:
    with pytest.raises(ParameterError) as excinfo:
        Sampling(**{name: value})
    _refused(excinfo, name)


@pytest.mark.parametrize("name, value", _cases(MODEL_GOOD))
def test_model_params_take_the_edge_values(name, value) -> None:
    ModelParams(**{name: value}).validate()


@pytest.mark.parametrize("name, value", _cases(CONTEXT_GOOD))
def test_context_params_take_the_edge_values(name, value) -> None:
    kw = {name: value, **({"n_ubatch": 1} if name == "n_batch" else {})}
    ContextParams(**kw).validate()


@pytest.mark.parametrize("name, value", _cases(SAMPLING_GOOD))
def test_sampling_takes_the_edge_values(name, value) -> None:
    Sampling(**{name: value})


def test_each_cache_setting_is_one_field_of_the_engines_struct(lib) -> None:
    """One ContextParams field for each field of llama_moe_cache_params (moe_cache_mib for its size, moe_ram_mib
    for the RAM tier's), none more; and a ContextParams left at its defaults passes the engine's defaults (llama_moe_cache_default_params)."""
    from llama_moe._native.ffi import ffi
    from llama_moe.cache_params import settings

    c_fields = {name for name, _ in ffi.typeof("struct llama_moe_cache_params").fields}
    mine = {spec.c_name for _, spec in settings(ContextParams())}
    assert mine | {"size", "ram_size"} == c_fields and not {"size", "ram_size"} & mine
    assert {f.name for f in dataclasses.fields(ContextParams) if f.name.startswith("moe_cache_")} == \
           {f"moe_cache_{c}" for c in mine} | {"moe_cache_mib"}
    native, _ = ContextParams()._to_native(lib)
    default = lib.llama_moe_cache_default_params()
    for name in c_fields:
        assert getattr(native.moe_cache, name) == getattr(default, name), name


def test_edge_values_reach_libllama(model) -> None:
    """numpy integers, the widest thread count and the last seed go through cffi into a working context."""
    with Context(model, ContextParams(n_ctx=np.int64(256), n_batch=np.int32(64), n_ubatch=np.int64(64), n_threads=np.int32(2),
                                      n_threads_batch=np.int64(2))) as ctx:
        assert ctx.complete("The ship", 2, Sampling(temperature=0.5, top_k=I32 - 1, top_p=1, seed=U32 - 1),
                            stop_at_eog=False).tokens


def test_n_cpu_moe_beyond_the_model_s_layers_keeps_them_all_in_ram(lib, tiny_model_path) -> None:
    """The patterns stop at the model's layers (65535 of them, one regex each, would take llama.cpp minutes to
    match); the experts of every layer stay in RAM, as with n_cpu_moe equal to the layer count."""
    assert len(ModelParams(n_cpu_moe=65535).override_patterns(6)) == 6
    with Model(tiny_model_path, ModelParams(n_cpu_moe=65535, repack=False)) as m:
        with Context(m, ContextParams(n_ctx=256)) as ctx:
            assert ctx.complete("The ship", 2, stop_at_eog=False).tokens


def test_bad_call_arguments_are_parameter_errors(model) -> None:
    """The arguments of the context's and the model's calls, as the fields above: a ParameterError (a
    LlamaMoeError, and still a ValueError), not a bare ValueError."""
    with Context(model, ContextParams(n_ctx=256)) as ctx:
        calls = [lambda: ctx.decode([]), lambda: ctx.decode([-1]), lambda: ctx.decode([model.n_vocab]),
                 lambda: ctx.decode([1] * (ctx.n_ctx + 1)), lambda: list(ctx.generate([1], -1)), lambda: list(ctx.generate([], 2)),
                 lambda: ctx.rebalance(-1), lambda: model.token_to_piece(-1), lambda: model.detokenize([model.n_vocab])]
        for call in calls:
            with pytest.raises(ParameterError):
                call()


def test_the_mode_words_are_the_engines_choices() -> None:
    """moe_cache_mode's words come from enum llama_moe_cache_choice; the type hint lists the same words."""
    import typing

    from llama_moe.cache_params import MOE_CACHE_MODES, MoeCacheMode

    assert MOE_CACHE_MODES == typing.get_args(MoeCacheMode) == ("auto", "upload", "hybrid", "adaptive", "admit")
