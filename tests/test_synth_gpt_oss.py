"""Synthetic gpt-oss models: the MXFP4 quantizer against ggml's own, the file's keys and tensors, loading
and generating through llama.cpp's gpt-oss graph, numpy routing against the engine's, and the MoE cache
(upload mode, CPU as the cache device) giving the same output as no cache."""
from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.errors import LlamaMoeError
from llama_moe.tools.experts import expert_layout
from llama_moe.gguf_files import GgmlType, dequantize, quantize, random_quantized, read_gguf
from llama_moe.gguf_files.quants import KVALUES_MXFP4
from llama_moe.gguf_files.reader import read_tensor_bytes
from llama_moe.tools.synth import SHAPES, load_design, parse_shape, synthesize
from llama_moe.tools.cli import synth as synth_cli
from llama_moe.tools.synth import recency
from support.cache_sizes import mib_for_slots

PROMPT = "The ship left the harbour at dawn, and the crew"
N_GEN = 40
RAM = ModelParams(cpu_moe=True, repack=False)
# a gpt-oss model small enough to synthesize in well under a second (once the design is built)
MICRO = ("n_layer=2,n_embd=64,n_head=2,n_head_kv=1,head_dim=32,n_expert=8,n_expert_used=2,n_ff_exp=64,"
         "n_vocab=512,arch=gpt-oss,n_swa=16")


@pytest.fixture(scope="module")
def gpt_oss_mxfp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-tiny-mxfp4.gguf"
    synthesize(path, "gpt-oss-tiny", "mxfp4", seed=0)
    return path


@pytest.fixture(scope="module")
def gpt_oss_q8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-tiny-q8_0.gguf"
    synthesize(path, "gpt-oss-tiny", "q8_0", seed=0)
    return path


# --- MXFP4 ----------------------------------------------------------------------------------


class _TypeTraits(ctypes.Structure):  # struct ggml_type_traits (ggml/include/ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


def _ggml_mxfp4(lib):
    """ggml's own dequantize_row_mxfp4 and quantize_row_mxfp4_ref, from the built libggml-base."""
    import llama_moe

    base = ctypes.CDLL(str(Path(llama_moe.native_version()["path"]).with_name("libggml-base.so")))
    base.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    tr = base.ggml_get_type_traits(int(GgmlType.MXFP4)).contents
    assert tr.type_name == b"mxfp4" and (tr.blck_size, tr.type_size) == (32, 17)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    return fn(tr.to_float), fn(tr.from_float_ref)


def _hard_input() -> np.ndarray:
    rng = np.random.default_rng(0)
    n = 32 * 4096
    wide = rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))  # every exponent range
    p2 = np.ldexp(np.float32(1), rng.integers(-100, 100, 32 * 256)).astype(np.float32)
    below = np.nextafter(p2, np.float32(0)) * np.where(rng.random(p2.size) < 0.5, 1, -1)  # just under 2^k
    halves = rng.integers(-24, 25, 32 * 256) / 4  # ties between codes, exact
    tiny = rng.standard_normal(32 * 64) * 1e-36  # denormal scales (e = 0, 1)
    gauss = rng.standard_normal(32 * 1024) * 0.02  # what expert weights look like
    return np.concatenate([wide, below, halves, tiny, gauss, np.zeros(64), -np.zeros(32)]).astype(np.float32)


def test_mxfp4_quantizer_is_ggmls_bit_for_bit(lib) -> None:
    to_float, from_float_ref = _ggml_mxfp4(lib)
    x = _hard_input()
    ref = np.empty(x.size // 32 * 17, dtype=np.uint8)
    from_float_ref(x.ctypes.data, ref.ctypes.data, x.size)
    mine = quantize(x, "mxfp4")
    assert mine.nbytes == ref.nbytes
    bad = np.flatnonzero((mine != ref).reshape(-1, 17).any(axis=1))
    assert bad.size == 0, f"{bad.size} blocks differ, first {bad[:5]}"
    back = np.empty(x.size, dtype=np.float32)
    to_float(ref.ctypes.data, back.ctypes.data, x.size)
    np.testing.assert_array_equal(dequantize(ref, "mxfp4"), back)
    # and what the synthesizer writes decodes the same through ggml
    rnd = random_quantized("mxfp4", (16, 256), np.random.default_rng(3), 0.02)
    back = np.empty(16 * 256, dtype=np.float32)
    to_float(rnd.ctypes.data, back.ctypes.data, back.size)
    np.testing.assert_array_equal(dequantize(rnd, "mxfp4"), back)


def test_mxfp4_layout_and_round_trip() -> None:
    # one block: scale byte, then element j in the low nibble and j + 16 in the high nibble of byte j
    x = np.zeros(32, dtype=np.float32)
    x[0], x[16], x[1], x[31] = 6.0, -1.0, 0.5, -12.0  # amax 12 -> e = floor(log2 12) - 2 + 127 = 128, d = 1
    b = quantize(x, "mxfp4")
    assert b.nbytes == 17 and b[0] == 128
    assert b[1] == (5 | (9 << 4))  # 6 -> code 5, -1 -> code 9
    assert b[2] == 0  # 0.5 ties 0 and 1: the first code (0) wins
    assert b[16] >> 4 == 15  # -12 -> code 15
    x = np.random.default_rng(1).standard_normal((8, 320)).astype(np.float32)
    back = dequantize(quantize(x, "mxfp4"), "mxfp4").reshape(x.shape)
    amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
    # the largest step of E2M1 (8 -> 12) at scale d <= amax / 4 is 4d: error <= 2d <= amax / 2
    assert np.all(np.abs(back - x).reshape(-1, 32) <= amax / 2 + 1e-7)
    assert np.corrcoef(back.ravel(), x.ravel())[0, 1] > 0.98
    assert set(np.unique(KVALUES_MXFP4)) == {0, 1, 2, 3, 4, 6, 8, 12, -1, -2, -3, -4, -6, -8, -12}


def test_random_mxfp4() -> None:
    a = random_quantized("mxfp4", (64, 256), np.random.default_rng(1), 0.05)
    assert np.array_equal(a, random_quantized("mxfp4", (64, 256), np.random.default_rng(1), 0.05))
    assert a.nbytes == 64 * 8 * 17
    v = dequantize(a, "mxfp4")
    assert np.all(np.isfinite(v)) and 0.045 < v.std() < 0.055
    assert len(np.unique(a.reshape(-1, 17)[:, 0])) == 2  # two neighbouring scales mixed


# --- shapes and the file --------------------------------------------------------------------


def test_gpt_oss_shapes() -> None:
    big = SHAPES["gpt-oss-120b"]
    assert (big.arch, big.n_layer, big.n_embd, big.n_head, big.n_head_kv, big.head_dim, big.n_expert,
            big.n_expert_used, big.n_ff_exp, big.n_vocab, big.n_ctx_train, big.n_swa) == \
        ("gpt-oss", 36, 2880, 64, 8, 64, 128, 4, 2880, 201088, 131072, 128)
    small = SHAPES["gpt-oss-20b"]
    assert (small.n_layer, small.n_expert, small.n_expert_used, small.n_embd) == (24, 32, 4, 2880)
    tiny = SHAPES["gpt-oss-tiny"]
    assert (tiny.arch, tiny.n_layer, tiny.n_embd, tiny.n_expert, tiny.n_expert_used) == ("gpt-oss", 4, 128, 32, 4)
    assert [big.is_swa(il) for il in range(4)] == [True, False, True, False]
    for s in SHAPES.values():
        assert parse_shape(s.describe()) == s
    assert "arch" not in SHAPES["tiny"].describe()  # qwen3moe files keep their metadata byte for byte
    q = parse_shape("gpt-oss-120b,arch=qwen3moe")
    assert (q.arch, q.n_swa, q.n_embd) == ("qwen3moe", 0, 2880)
    with pytest.raises(LlamaMoeError, match="sliding window"):
        parse_shape("gpt-oss-tiny,n_swa=0")
    with pytest.raises(LlamaMoeError, match="arch"):
        parse_shape("tiny,arch=llama")


def test_synthesized_file_is_gpt_oss(tmp_path: Path) -> None:
    info = synthesize(tmp_path / "m.gguf", MICRO, "mxfp4", seed=2)
    g = read_gguf(info.path)
    md = g.metadata
    a = "gpt-oss"
    assert md["general.architecture"] == a and md["general.file_type"] == 38  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    assert (md[f"{a}.block_count"], md[f"{a}.expert_count"], md[f"{a}.expert_used_count"]) == (2, 8, 2)
    assert md[f"{a}.expert_feed_forward_length"] == 64 and md[f"{a}.attention.sliding_window"] == 16
    assert (md[f"{a}.attention.key_length"], md[f"{a}.attention.value_length"]) == (32, 32)
    assert md[f"{a}.rope.scaling.type"] == "yarn" and md[f"{a}.rope.scaling.factor"] == 32.0
    assert md[f"{a}.rope.scaling.original_context_length"] == 4096 // 32
    assert md[f"{a}.rope.freq_base"] == 150000.0 and md[f"{a}.attention.layer_norm_rms_epsilon"] > 0
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen2"
    t = {x.name: x for x in g.tensors}
    for il in range(2):
        p = f"blk.{il}."
        want = {
            "attn_norm.weight": ((64,), GgmlType.F32), "post_attention_norm.weight": ((64,), GgmlType.F32),
            "attn_q.weight": ((64, 64), GgmlType.Q8_0), "attn_q.bias": ((64,), GgmlType.F32),
            "attn_k.weight": ((64, 32), GgmlType.Q8_0), "attn_k.bias": ((32,), GgmlType.F32),
            "attn_v.weight": ((64, 32), GgmlType.Q8_0), "attn_v.bias": ((32,), GgmlType.F32),
            "attn_output.weight": ((64, 64), GgmlType.Q8_0), "attn_output.bias": ((64,), GgmlType.F32),
            "attn_sinks.weight": ((2,), GgmlType.F32),
            "ffn_gate_inp.weight": ((64, 8), GgmlType.F32), "ffn_gate_inp.bias": ((8,), GgmlType.F32),
            "ffn_gate_exps.weight": ((64, 64, 8), GgmlType.MXFP4), "ffn_gate_exps.bias": ((64, 8), GgmlType.F32),
            "ffn_up_exps.weight": ((64, 64, 8), GgmlType.MXFP4), "ffn_up_exps.bias": ((64, 8), GgmlType.F32),
            "ffn_down_exps.weight": ((64, 64, 8), GgmlType.MXFP4), "ffn_down_exps.bias": ((64, 8), GgmlType.F32),
        }
        for name, (ne, ty) in want.items():
            assert (t[p + name].ne, t[p + name].type) == (ne, ty), p + name
        assert not any(n.startswith(p) and n[len(p):] not in want for n in t), "unexpected tensors"
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= set(t)
    d = load_design(info.path)
    for x in g.tensors:  # every tensor is real data, but layer 0's queries of the recency head's kv head
        values = dequantize(read_tensor_bytes(info.path, x), x.type)
        if x.name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):  # MICRO: one kv head, the recency head's
            assert np.all(values == 0), x.name
        else:
            assert np.any(values != 0), x.name
    assert d.shape == info.shape and d.shape.arch == "gpt-oss"
    # the recency head's query and key are biases: the fitted vectors (recency.py)
    q, k = recency.head_vectors(d.shape, d.routing.recency_tokens)
    hd = d.shape.head_dim
    qb = np.frombuffer(read_tensor_bytes(info.path, t["blk.0.attn_q.bias"]), np.float32)
    kb = np.frombuffer(read_tensor_bytes(info.path, t["blk.0.attn_k.bias"]), np.float32)
    np.testing.assert_array_equal(qb[hd : 2 * hd], q)
    np.testing.assert_array_equal(qb[:hd], 0)
    np.testing.assert_array_equal(kb[:hd], k)
    # the router's bias carries the hot-expert term, scaled by the depth profile; the sinks are the design's
    b = np.frombuffer(read_tensor_bytes(info.path, t["blk.1.ffn_gate_inp.bias"]), np.float32)
    np.testing.assert_allclose(b, d.routing.depth(2)[1] * d.routing.skew * d.bias[1], rtol=1e-6)
    s = np.frombuffer(read_tensor_bytes(info.path, t["blk.0.attn_sinks.weight"]), np.float32)
    np.testing.assert_array_equal(s, d.sinks[0])
    assert expert_layout(info.path).layers[0].bytes_per_expert == 3 * 64 * 64 // 32 * 17


def test_cli_defaults_to_mxfp4_for_gpt_oss(tmp_path: Path) -> None:
    ap = argparse.ArgumentParser()
    synth_cli.register(ap.add_subparsers(dest="cmd"))
    out = tmp_path / "cli.gguf"
    assert synth_cli.run(ap.parse_args(["synth", str(out), "--shape", MICRO, "--quiet"])) == 0
    assert read_gguf(out).tensor("blk.0.ffn_up_exps.weight").type == GgmlType.MXFP4


# --- through llama.cpp ----------------------------------------------------------------------


def _generate(path: Path, cp: ContextParams) -> tuple[list[int], np.ndarray, object]:
    with Model(path, RAM) as model, Context(model, cp) as ctx:
        tokens = list(ctx.generate(PROMPT, max_tokens=N_GEN, stop_at_eog=False))
        return tokens, ctx.logits(), ctx.moe_cache_stats()


@pytest.mark.parametrize("which", ["gpt_oss_mxfp4", "gpt_oss_q8"])
def test_loads_decodes_and_generates(lib, which: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(which)
    with Model(path, RAM) as model, Context(model, ContextParams(n_ctx=512, n_threads=2)) as ctx:
        assert model.n_layer == 4
        tokens = list(ctx.generate(PROMPT, max_tokens=N_GEN, stop_at_eog=False))
        assert len(tokens) == N_GEN
        text = "".join(model.token_to_piece(t).decode(errors="replace") for t in tokens)
        assert sum(c.isalpha() for c in text) > len(text) / 2, text  # words from the corpus, not padding
        logits = ctx.logits()
        assert np.all(np.isfinite(logits))
        d = load_design(path)
        assert max(tokens) < d.n_real  # padding tokens are never generated


def test_moe_cache_upload_mode_is_identical(lib, gpt_oss_mxfp4) -> None:
    cp = dict(n_ctx=512, n_threads=2, moe_cache_device="CPU")
    plain_tokens, plain_logits, no_stats = _generate(gpt_oss_mxfp4, ContextParams(**cp))
    assert no_stats is None
    layout = expert_layout(gpt_oss_mxfp4)
    assert layout.n_moe_layers == 4 and layout.layers[0].type_name == "mxfp4"
    for slots in (layout.n_expert_used, 2 * layout.n_expert_used, layout.n_expert):
        tokens, logits, stats = _generate(
            gpt_oss_mxfp4, ContextParams(**cp, moe_cache_mib=mib_for_slots(gpt_oss_mxfp4, slots)))
        assert tokens == plain_tokens, f"{slots} slots per layer changed the text"
        np.testing.assert_array_equal(logits, plain_logits)
        assert stats is not None and not stats.hybrid and stats.n_slots == slots * layout.n_moe_layers
        if slots < layout.n_expert:
            assert stats.n_hit > 0 and stats.n_miss > 0
            # a miss is uploaded, or computed by the CPU when the ubatch already uses every slot (n_cpu)
            assert stats.n_bytes_upload == (stats.n_miss - stats.n_cpu) * layout.layers[0].bytes_per_expert
            assert stats.n_bytes_cpu == stats.n_cpu * layout.layers[0].bytes_per_expert
        else:
            assert stats.n_hit == stats.n_miss == 0
