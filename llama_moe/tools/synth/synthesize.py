"""Write a synthetic qwen3moe or gpt-oss GGUF, tensor by tensor, from a Design (see design.py)."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from llama_moe.errors import LlamaMoeError
from llama_moe.gguf_files.quants import GgmlType, ggml_type, quantize, random_quantized, tensor_nbytes
from llama_moe.gguf_files.writer import GgufWriter
from gguf import GGUFValueType
from llama_moe.tools.synth import recency
from llama_moe.tools.synth.recency import GPT_OSS_FREQ_BASE as GPT_OSS_ROPE_FREQ_BASE
from llama_moe.tools.synth.recency import GPT_OSS_YARN_BETA, GPT_OSS_YARN_FACTOR
from llama_moe.tools.synth.recency import QWEN3_FREQ_BASE as ROPE_FREQ_BASE
from llama_moe.tools.synth.config import RoutingConfig, routing_for
from llama_moe.tools.synth.design import Design, build_design
from llama_moe.tools.synth.shapes import Shape, get_shape
from llama_moe.tools.synth.tokenizer import CHAT_TEMPLATE, ENDOFTEXT, IM_END, BpeTokenizer

ARCH = "qwen3moe"  # the default architecture (Shape.arch)
SYNTH_FORMAT = 2  # bump when the same seed would give different weights
EXPERT_TYPES = {"q8_0": GgmlType.Q8_0, "q4_0": GgmlType.Q4_0, "f16": GgmlType.F16, "mxfp4": GgmlType.MXFP4}
# LLAMA_FTYPE_MOSTLY_* (include/llama.h); MXFP4_MOE: experts MXFP4, the rest Q8_0 here
_FILE_TYPE = {GgmlType.Q8_0: 7, GgmlType.Q4_0: 2, GgmlType.F16: 1, GgmlType.MXFP4: 38}
RMS_EPS = 1e-6
# gpt-oss's own values (HF config.json of gpt-oss-20b/120b): rms_norm_eps, rope_theta, and YaRN
# with factor 32 over an original context of 4096 (here n_ctx_train / 32); beta_fast/slow are
# llama.cpp's defaults, written as the converter does
GPT_OSS_RMS_EPS = 1e-5
EXPERT_BIAS = 0.1  # gpt-oss gate/up expert biases (the pre-activations have unit RMS)
DOWN_BIAS = 0.005  # gpt-oss down-projection biases, ~ an expert's output
ATTN_OUT_BIAS = 1e-3  # gpt-oss attention output bias: added to the residual in every layer
K_BIAS = 0.1  # gpt-oss key bias: shifts every score of a query alike (tiny queries: ~0)
Q_NORM = 2e-3  # tiny queries (gpt-oss) or q_norm weights: attention scores ~0, a uniform average
NOISE = 0.02  # relative size of the attention weights that carry nothing
DOWN_SCALE = 0.01  # experts' down projections: output RMS ~0.5% of the residual's per layer
ROW_CHUNK = 8192  # vocabulary rows generated per chunk (bounds memory for 200k-token vocabs)

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SynthInfo:
    path: Path
    shape: Shape
    expert_type: str
    file_bytes: int
    expert_bytes: int  # one expert of one layer: gate + up + down
    n_vocab_used: int  # real tokens (bytes, merges, special); the rest is padding
    seed: int
    routing: RoutingConfig
    arch: str = ""    # general.architecture, when not the shape's
    config: str = ""  # archs.CONFIGS name, for the random-weight architectures


def _rng(seed: int, *tag: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *tag]))


def _expert_type(expert_type: str | GgmlType) -> GgmlType:
    t = ggml_type(expert_type)
    if t not in EXPERT_TYPES.values():
        raise LlamaMoeError(f"expert type must be one of {', '.join(EXPERT_TYPES)}, got {expert_type!r}")
    return t


def _ordered_parallel(jobs: list[Callable[[], np.ndarray]], workers: int) -> Iterator[np.ndarray]:
    """Run ``jobs`` on a thread pool (numpy's generators and copies release the GIL) and yield
    results in order, keeping only a few in flight so memory stays bounded."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield job()
        return
    with ThreadPoolExecutor(workers) as pool:
        ahead = 2 * workers
        futures = [pool.submit(j) for j in jobs[:ahead]]
        for i in range(len(jobs)):
            yield futures[i].result()
            futures[i] = None  # type: ignore[call-overload]
            if i + ahead < len(jobs):
                futures.append(pool.submit(jobs[i + ahead]))


class _Plan:
    """The tensors of the model with the code that produces each one's data."""

    def __init__(self, design: Design, expert_type: GgmlType, workers: int) -> None:
        self.d = design
        self.et = expert_type
        self.dense = GgmlType.F16 if expert_type == GgmlType.F16 else GgmlType.Q8_0
        self.workers = workers
        s = design.shape
        # (name, ne, type, producer of chunks)
        self.tensors: list[tuple[str, tuple[int, ...], GgmlType, Callable[[], Iterator[np.ndarray]]]] = []
        self._add("token_embd.weight", (s.n_embd, s.n_vocab), self.dense, self._token_embd)
        for layer in range(s.n_layer):
            self._add_layer(layer)
        self._add("output_norm.weight", (s.n_embd,), GgmlType.F32, self._ones(s.n_embd))
        self._add("output.weight", (s.n_embd, s.n_vocab), self.dense, self._output)

    def _add(self, name: str, ne: tuple[int, ...], t: GgmlType, fn: Callable[[], Iterator[np.ndarray]]) -> None:
        self.tensors.append((name, ne, t, fn))

    @staticmethod
    def _ones(n: int, value: float = 1.0) -> Callable[[], Iterator[np.ndarray]]:
        return lambda: iter([np.full(n, value, dtype=np.float32)])

    def _add_layer(self, layer: int) -> None:
        if self.d.shape.arch == "gpt-oss":
            self._add_layer_gpt_oss(layer)
            return
        s, et = self.d.shape, self.et
        n_q, n_kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        p = f"blk.{layer}."
        self._add(p + "attn_norm.weight", (s.n_embd,), GgmlType.F32, self._ones(s.n_embd))
        q_vec, k_vec = self._recency_vectors()
        self._add(p + "attn_q.weight", (s.n_embd, n_q), self.dense, lambda: self._attn_q(layer))
        self._add(p + "attn_k.weight", (s.n_embd, n_kv), self.dense, lambda: self._attn_k(layer))
        self._add(p + "attn_v.weight", (s.n_embd, n_kv), self.dense, lambda: self._attn_v(layer))
        self._add(p + "attn_output.weight", (n_q, s.n_embd), self.dense, lambda: self._attn_output(layer))
        # q and k are all-equal per head (the constant column), so their norms output these weights
        self._add(p + "attn_q_norm.weight", (s.head_dim,), GgmlType.F32,
                  (lambda: iter([q_vec])) if layer == 0 else self._ones(s.head_dim, Q_NORM))
        self._add(p + "attn_k_norm.weight", (s.head_dim,), GgmlType.F32,
                  (lambda: iter([k_vec])) if layer == 0 else self._ones(s.head_dim))
        self._add(p + "ffn_norm.weight", (s.n_embd,), GgmlType.F32, self._ones(s.n_embd))
        self._add(p + "ffn_gate_inp.weight", (s.n_embd, s.n_expert), GgmlType.F32,
                  lambda: iter([(self.d.router(layer) @ self.d.rot).astype(np.float32)]))
        gate_up = 1.0 / np.sqrt(s.n_embd)
        down = DOWN_SCALE / np.sqrt(s.n_ff_exp)
        self._add(p + "ffn_gate_exps.weight", (s.n_embd, s.n_ff_exp, s.n_expert), et,
                  lambda: self._experts(layer, 0, (s.n_ff_exp, s.n_embd), gate_up))
        self._add(p + "ffn_up_exps.weight", (s.n_embd, s.n_ff_exp, s.n_expert), et,
                  lambda: self._experts(layer, 1, (s.n_ff_exp, s.n_embd), gate_up))
        self._add(p + "ffn_down_exps.weight", (s.n_ff_exp, s.n_embd, s.n_expert), et,
                  lambda: self._experts(layer, 2, (s.n_embd, s.n_ff_exp), down))

    def _add_layer_gpt_oss(self, layer: int) -> None:
        """llama.cpp's gpt-oss layer (src/models/openai-moe.cpp): biased q/k/v/output projections,
        per-head attention sinks, post_attention_norm before the router, a biased router, and
        biased experts (swiglu-oai). Attention is made uniform by tiny query weights instead of
        q_norm, and the recency head's query and key are biases; the sinks and sliding windows
        are part of the design (routing.py)."""
        s, et, d = self.d.shape, self.et, self.d
        n_q, n_kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        p = f"blk.{layer}."
        f32 = GgmlType.F32
        self._add(p + "attn_norm.weight", (s.n_embd,), f32, self._ones(s.n_embd))
        self._add(p + "attn_q.weight", (s.n_embd, n_q), self.dense, lambda: self._attn_q(layer))
        self._add(p + "attn_q.bias", (n_q,), f32, lambda: self._attn_q_bias(layer))
        self._add(p + "attn_k.weight", (s.n_embd, n_kv), self.dense, lambda: self._attn_k(layer))
        self._add(p + "attn_k.bias", (n_kv,), f32, lambda: self._attn_k_bias(layer))
        self._add(p + "attn_v.weight", (s.n_embd, n_kv), self.dense, lambda: self._attn_v(layer))
        self._add(p + "attn_v.bias", (n_kv,), f32, lambda: self._attn_v_bias(layer))
        self._add(p + "attn_output.weight", (n_q, s.n_embd), self.dense, lambda: self._attn_output(layer))
        self._add(p + "attn_output.bias", (s.n_embd,), f32, lambda: self._random_f32(layer, 43, s.n_embd, ATTN_OUT_BIAS))
        self._add(p + "attn_sinks.weight", (s.n_head,), f32, lambda: iter([d.sinks[layer].astype(np.float32)]))
        self._add(p + "post_attention_norm.weight", (s.n_embd,), f32, self._ones(s.n_embd))
        self._add(p + "ffn_gate_inp.weight", (s.n_embd, s.n_expert), f32,
                  lambda: iter([(d.router(layer) @ d.rot).astype(np.float32)]))
        self._add(p + "ffn_gate_inp.bias", (s.n_expert,), f32, lambda: iter([d.router_bias(layer).astype(np.float32)]))
        gate_up = 1.0 / np.sqrt(s.n_embd)
        down = DOWN_SCALE / np.sqrt(s.n_ff_exp)
        self._add(p + "ffn_gate_exps.weight", (s.n_embd, s.n_ff_exp, s.n_expert), et,
                  lambda: self._experts(layer, 0, (s.n_ff_exp, s.n_embd), gate_up))
        self._add(p + "ffn_gate_exps.bias", (s.n_ff_exp, s.n_expert), f32,
                  lambda: self._random_f32(layer, 44, s.n_ff_exp * s.n_expert, EXPERT_BIAS))
        self._add(p + "ffn_up_exps.weight", (s.n_embd, s.n_ff_exp, s.n_expert), et,
                  lambda: self._experts(layer, 1, (s.n_ff_exp, s.n_embd), gate_up))
        self._add(p + "ffn_up_exps.bias", (s.n_ff_exp, s.n_expert), f32,
                  lambda: self._random_f32(layer, 45, s.n_ff_exp * s.n_expert, EXPERT_BIAS))
        self._add(p + "ffn_down_exps.weight", (s.n_ff_exp, s.n_embd, s.n_expert), et,
                  lambda: self._experts(layer, 2, (s.n_embd, s.n_ff_exp), down))
        self._add(p + "ffn_down_exps.bias", (s.n_embd, s.n_expert), f32,
                  lambda: self._random_f32(layer, 46, s.n_embd * s.n_expert, DOWN_BIAS))

    # --- producers (each yields raw bytes as uint8 arrays, or float arrays to quantize) -----

    def _random_f32(self, layer: int, kind: int, n: int, scale: float) -> Iterator[np.ndarray]:
        x = _rng(self.d.seed, 20, layer, kind).standard_normal(n, dtype=np.float32)
        yield x * np.float32(scale)

    def _attn_v_bias(self, layer: int) -> Iterator[np.ndarray]:
        d = self.d
        b = _rng(d.seed, 20, layer, 42).standard_normal(d.shape.n_head_kv * d.shape.head_dim, dtype=np.float32)
        b *= np.float32(NOISE)
        b[: d.layout.r_t] = 0.0  # kv head 0's topic dims carry the context: no offset there
        if layer == 0:
            b[self._recency_values()] = 0.0
        yield b

    # --- the recency head (recency.py): query head HEAD of layer 0 and its kv head -------------

    def _recency_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        return recency.head_vectors(self.d.shape, self.d.routing.recency_tokens)

    def _head_rows(self, head: int) -> slice:
        hd = self.d.shape.head_dim
        return slice(head * hd, (head + 1) * hd)

    def _recency_values(self) -> slice:
        """Value dims (rows of attn_v) that carry the recency memory."""
        s = self.d.shape
        start = recency.kv_head(s) * s.head_dim + recency.value_offset(s, self.d.layout.r_t)
        return slice(start, start + recency.R_M)

    def _query_group(self) -> slice:
        """The query heads that read the recency head's kv head (their keys are its constant key)."""
        g = self.d.shape.n_head // self.d.shape.n_head_kv
        kv = recency.kv_head(self.d.shape)
        return slice(kv * g * self.d.shape.head_dim, (kv + 1) * g * self.d.shape.head_dim)

    def _attn_q(self, layer: int) -> Iterator[np.ndarray]:
        d = self.d
        n, n_q = d.shape.n_embd, d.shape.n_head * d.shape.head_dim
        if d.shape.arch == "gpt-oss":
            w = self._random_dense_f32(layer, 0, n_q, Q_NORM)
            if layer == 0:
                w[self._query_group()] = 0.0  # exact zeros: uniform over the recency head's keys
        else:
            w = np.zeros((n_q, n), dtype=np.float32)  # q = 0: every score 0, uniform attention
            if layer == 0:  # every dim reads the constant column: q_norm then outputs its weights
                w[self._head_rows(recency.HEAD)] = d.rot[0] / d.c0
        yield quantize(w, self.dense)

    def _attn_q_bias(self, layer: int) -> Iterator[np.ndarray]:
        b = next(iter(self._random_f32(layer, 40, self.d.shape.n_head * self.d.shape.head_dim, Q_NORM)))
        if layer == 0:
            b[self._query_group()] = 0.0
            b[self._head_rows(recency.HEAD)] = self._recency_vectors()[0]
        yield b

    def _attn_k(self, layer: int) -> Iterator[np.ndarray]:
        d = self.d
        n_kv = d.shape.n_head_kv * d.shape.head_dim
        w = self._random_dense_f32(layer, 1, n_kv, 1.0)
        if layer == 0:
            rows = self._head_rows(recency.kv_head(d.shape))
            w[rows] = 0.0 if d.shape.arch == "gpt-oss" else d.rot[0] / d.c0  # gpt-oss: the key is the bias
        yield quantize(w, self.dense)

    def _attn_k_bias(self, layer: int) -> Iterator[np.ndarray]:
        b = next(iter(self._random_f32(layer, 41, self.d.shape.n_head_kv * self.d.shape.head_dim, K_BIAS)))
        if layer == 0:
            b[self._head_rows(recency.kv_head(self.d.shape))] = self._recency_vectors()[1]
        yield b

    def _random_dense_f32(self, layer: int, kind: int, rows: int, gain: float) -> np.ndarray:
        n = self.d.shape.n_embd
        rng = _rng(self.d.seed, 20, layer, kind)
        return rng.standard_normal((rows, n), dtype=np.float32) * np.float32(gain / np.sqrt(n))

    def _rows(self, real: np.ndarray, pad: Callable[[int, int], np.ndarray]) -> Iterator[np.ndarray]:
        """Vocabulary-sized matrix: real rows (rotated) first, then padding rows in chunks."""
        n_vocab = self.d.shape.n_vocab
        for start in range(0, real.shape[0], ROW_CHUNK):
            yield quantize(real[start : start + ROW_CHUNK] @ self.d.rot, self.dense)
        for start in range(real.shape[0], n_vocab, ROW_CHUNK):
            yield pad(start, min(n_vocab, start + ROW_CHUNK))

    def _token_embd(self) -> Iterator[np.ndarray]:
        d = self.d

        def pad(a: int, b: int) -> np.ndarray:
            # unused tokens: random unit-RMS embeddings (they are never generated)
            return random_quantized(self.dense, (b - a, d.shape.n_embd), _rng(d.seed, 10, a), 1.0)

        return self._rows(d.emb, pad)

    def _output(self) -> Iterator[np.ndarray]:
        d = self.d
        n = d.shape.n_embd
        floor = (d.pad_logit / d.c0) * d.rot[0]  # the constant column carries the -big logit

        def pad(a: int, b: int) -> np.ndarray:
            noise = _rng(d.seed, 11, a).standard_normal((b - a, n), dtype=np.float32) * np.float32(0.01 / np.sqrt(n))
            return quantize(noise + floor[None, :], self.dense)

        return self._rows(d.out, pad)

    def _attn_v(self, layer: int) -> Iterator[np.ndarray]:
        d = self.d
        n = d.shape.n_embd
        rows = d.shape.n_head_kv * d.shape.head_dim
        w = _rng(d.seed, 21, layer).standard_normal((rows, n), dtype=np.float32) * np.float32(NOISE / np.sqrt(n))
        # kv head 0, dims 0..r_t-1 read the topic columns: w @ x_rot = T(x)
        w[: d.layout.r_t] = d.rot[d.layout.t]
        if layer == 0:  # the recency head's values: phi_w @ x
            w[self._recency_values()] = d.phi_w @ d.rot
        yield quantize(w, self.dense)

    def _attn_output(self, layer: int) -> Iterator[np.ndarray]:
        d = self.d
        n = d.shape.n_embd
        cols = d.shape.n_head * d.shape.head_dim
        w = _rng(d.seed, 22, layer).standard_normal((n, cols), dtype=np.float32) * np.float32(NOISE / np.sqrt(cols))
        # head 0, dims 0..r_t-1 (the mean topic profile) go to the context columns, scaled by gamma
        w[:, : d.layout.r_t] = float(d.gamma[layer]) * d.rot[d.layout.c].T
        if layer == 0:  # the recency head's output goes to the M columns
            start = recency.HEAD * d.shape.head_dim + recency.value_offset(d.shape, d.layout.r_t)
            w[:, start : start + recency.R_M] = d.rot[d.layout.m].T
        yield quantize(w, self.dense)

    def _experts(self, layer: int, kind: int, rows_cols: tuple[int, int], scale: float) -> Iterator[np.ndarray]:
        seed, et = self.d.seed, self.et
        jobs = [
            (lambda e=e: random_quantized(et, rows_cols, _rng(seed, 30, layer, kind, e), scale))
            for e in range(self.d.shape.n_expert)
        ]
        return _ordered_parallel(jobs, self.workers)


def _add_metadata(w: GgufWriter, design: Design, expert_type: GgmlType, shape_name: str) -> None:
    s, tok, r = design.shape, design.tokenizer, design.routing
    arch = s.arch
    gpt_oss = arch == "gpt-oss"
    w.add_string("general.name", f"llama-moe synthetic {shape_name}")
    w.add_uint32("general.file_type", _FILE_TYPE[expert_type])
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32(f"{arch}.context_length", s.n_ctx_train)
    w.add_uint32(f"{arch}.embedding_length", s.n_embd)
    w.add_uint32(f"{arch}.block_count", s.n_layer)
    # gpt-oss's converter writes intermediate_size (one expert's) here; qwen3moe's the active total
    w.add_uint32(f"{arch}.feed_forward_length", s.n_ff_exp if gpt_oss else s.n_ff_exp * s.n_expert_used)
    w.add_uint32(f"{arch}.expert_feed_forward_length", s.n_ff_exp)
    w.add_uint32(f"{arch}.attention.head_count", s.n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", s.n_head_kv)
    w.add_uint32(f"{arch}.attention.key_length", s.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", s.head_dim)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", GPT_OSS_RMS_EPS if gpt_oss else RMS_EPS)
    if gpt_oss:
        # every other layer (0, 2, ...) slides: llama.cpp's default pattern for gpt-oss (set_swa_pattern(2))
        w.add_uint32(f"{arch}.attention.sliding_window", s.n_swa)
        w.add_float32(f"{arch}.rope.freq_base", GPT_OSS_ROPE_FREQ_BASE)
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", GPT_OSS_YARN_FACTOR)
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", max(1, int(s.n_ctx_train / GPT_OSS_YARN_FACTOR)))
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_fast", GPT_OSS_YARN_BETA[0])
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_slow", GPT_OSS_YARN_BETA[1])
    else:
        w.add_float32(f"{arch}.rope.freq_base", ROPE_FREQ_BASE)
    w.add_uint32(f"{arch}.expert_count", s.n_expert)
    w.add_uint32(f"{arch}.expert_used_count", s.n_expert_used)
    _add_tokenizer(w, tok)
    # enough to rebuild the design (and so route tokens in numpy) from the file alone
    w.add_uint32("llama_moe.synth.format", SYNTH_FORMAT)
    w.add_string("llama_moe.synth.shape", s.describe())
    w.add_uint64("llama_moe.synth.seed", design.seed)
    for f in fields(RoutingConfig):
        w.add_float32(f"llama_moe.synth.{f.name}", getattr(r, f.name))
    w.add_uint32("llama_moe.synth.n_vocab_used", tok.n_real)


def _add_tokenizer(w: GgufWriter, tok: BpeTokenizer) -> None:
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", list(tok.tokens))
    w.add_typed_array("tokenizer.ggml.token_type", tok.token_types, GGUFValueType.INT32)
    w.add_array("tokenizer.ggml.merges", tok.merge_strings())
    w.add_uint32("tokenizer.ggml.bos_token_id", tok.token_id(ENDOFTEXT))
    w.add_uint32("tokenizer.ggml.eos_token_id", tok.token_id(IM_END))
    w.add_uint32("tokenizer.ggml.padding_token_id", tok.token_id(ENDOFTEXT))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHAT_TEMPLATE)


def synthesize(
    path: str | os.PathLike[str],
    shape: str | Shape = "tiny",
    expert_type: str = "q8_0",
    seed: int = 0,
    routing: RoutingConfig | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
) -> SynthInfo:
    """Write a synthetic model (qwen3moe, or gpt-oss for a gpt-oss shape) to ``path``; same
    arguments, same bytes. Tensors are made and written one at a time (experts in parallel chunks of
    one expert each), so memory stays bounded whatever the file's size."""
    shp = get_shape(shape)
    shape_name = shape if isinstance(shape, str) else "custom"
    et = _expert_type(expert_type)
    routing = routing or routing_for(shp)
    if seed < 0:
        raise LlamaMoeError(f"seed must be >= 0, got {seed}")
    design = build_design(shp, seed, routing)
    workers = workers if workers is not None else min(8, os.cpu_count() or 1)
    plan = _Plan(design, et, workers)

    with GgufWriter(path, shp.arch) as w:
        _add_metadata(w, design, et, shape_name)
        for name, ne, t, _ in plan.tensors:
            w.declare_tensor(name, ne, t)
        w.write_header()
        total = w.total_bytes
        if progress:
            progress(w.bytes_written, total)
        for name, _, _, fn in plan.tensors:
            w.write_tensor_data(name, fn())
            if progress:
                progress(w.bytes_written, total)

    expert_bytes = 3 * tensor_nbytes(et, (shp.n_embd, shp.n_ff_exp))
    return SynthInfo(
        path=Path(path), shape=shp, expert_type=et.name.lower(), file_bytes=Path(path).stat().st_size,
        expert_bytes=expert_bytes, n_vocab_used=design.tokenizer.n_real, seed=seed, routing=routing,
    )


def synthesize_arch(
    path: str | os.PathLike[str],
    config: str,
    expert_type: str = "q8_0",
    seed: int = 0,
    progress: Progress | None = None,
) -> SynthInfo:
    """Write the tiny random-weight model of one of archs.CONFIGS (llama.cpp architectures other than
    qwen3moe and gpt-oss, whose models synthesize() designs), with the tiny shape's tokenizer."""
    from llama_moe.tools.synth import archs
    from llama_moe.tools.synth.corpus import load_corpus
    from llama_moe.tools.synth.design import build_tokenizer

    if seed < 0:
        raise LlamaMoeError(f"seed must be >= 0, got {seed}")
    et = _expert_type(expert_type)
    m = archs.arch_model(config)
    tiny = get_shape("tiny")
    tok = build_tokenizer(tiny, load_corpus())
    dense = GgmlType.F16 if et == GgmlType.F16 else GgmlType.Q8_0

    def ne_of(spec: archs.TensorSpec) -> tuple[int, ...]:
        return tuple(tiny.n_vocab if x == -1 else x for x in spec.ne)

    def type_of(spec: archs.TensorSpec) -> GgmlType:
        ne = ne_of(spec)
        if spec.kind.startswith("exps"):
            return et
        # matrices quantized as the dense weights of the designed models; norms, biases, routers F32
        return dense if spec.kind in ("mat", "embd", "out") and ne[0] % 32 == 0 else GgmlType.F32

    def data(k: int, spec: archs.TensorSpec) -> Iterator[np.ndarray]:
        ne = ne_of(spec)
        if spec.kind.startswith("exps"):
            scale = archs.expert_scale(spec)
            for e in range(ne[2]):
                yield random_quantized(et, (ne[1], ne[0]), _rng(seed, 50, k, e), scale)
            return
        x = archs.values(archs.TensorSpec(spec.name, ne, spec.kind), _rng(seed, 51, k))
        yield quantize(x, type_of(spec))

    with GgufWriter(path, m.arch) as w:
        w.add_string("general.name", f"llama-moe synthetic {config} tiny")
        w.add_uint32("general.file_type", _FILE_TYPE[et])
        w.add_uint32("general.quantization_version", 2)
        for key, value, vtype in m.keys:
            w.add_key_value(key, value, vtype)
        _add_tokenizer(w, tok)
        w.add_uint32("llama_moe.synth.format", SYNTH_FORMAT)
        w.add_string("llama_moe.synth.config", config)
        w.add_uint64("llama_moe.synth.seed", seed)
        for spec in m.tensors:
            w.declare_tensor(spec.name, ne_of(spec), type_of(spec))
        w.write_header()
        for k, spec in enumerate(m.tensors):
            w.write_tensor_data(spec.name, data(k, spec))
            if progress:
                progress(w.bytes_written, w.total_bytes)
    d = archs.Dims()
    expert_bytes = 3 * tensor_nbytes(et, (d.n_embd, d.n_ff_exp))
    shape = replace(tiny, n_layer=d.n_layer, n_expert=d.n_expert, n_expert_used=d.n_expert_used, n_ff_exp=d.n_ff_exp)
    return SynthInfo(path=Path(path), shape=shape, expert_type=et.name.lower(), file_bytes=Path(path).stat().st_size,
                     expert_bytes=expert_bytes, n_vocab_used=tok.n_real, seed=seed, routing=routing_for(tiny),
                     arch=m.arch, config=config)


def load_design(path: str | os.PathLike[str]) -> Design:
    """Rebuild the Design of a file written by synthesize() from its metadata, e.g. to route
    its prompts in numpy (routing.route) without reading any tensor data."""
    from llama_moe.gguf_files.reader import read_gguf
    from llama_moe.tools.synth.shapes import parse_shape

    g = read_gguf(path)
    fmt = g.get("llama_moe.synth.format")
    if fmt is None:
        raise LlamaMoeError(f"{path}: not a llama_moe synthetic model (no llama_moe.synth.format key)")
    if fmt != SYNTH_FORMAT:
        raise LlamaMoeError(f"{path}: synthetic model format {fmt}, this llama_moe writes {SYNTH_FORMAT}")
    # float32 keys: round so the config equals the one that was passed to synthesize()
    routing = RoutingConfig(**{f.name: round(float(g.require(f"llama_moe.synth.{f.name}")), 6)
                               for f in fields(RoutingConfig)})
    shape = parse_shape(g.require("llama_moe.synth.shape"))
    return build_design(shape, int(g.require("llama_moe.synth.seed")), routing)
