"""Tiny random-weight models of llama.cpp's MoE architectures, for testing the cache on each one's layout.

Each configuration lists the GGUF keys and the tensors llama.cpp's loader for that architecture requires
(src/models/ARCH.cpp at the base, ``load_arch_hparams`` and ``load_arch_tensors``), with tensor names and
key names from gguf-py's constants. What differs between them is what the cache meets in ``build_moe_ffn``:
shared experts beside the routed ones, dense layers before the MoE ones, merged gate-up expert tensors,
gate-less experts, sigmoid gating with a selection bias and expert groups, weight normalisation and
scaling, an MTP block after the trunk, attention that is not softmax attention. The weights are random
(seeded): these models load, decode and route, but their text means nothing; qwen3moe and gpt-oss keep the
designed routing of synthesize.py.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from gguf import GGUFValueType, Keys
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

from llama_moe.errors import LlamaMoeError

U32, F32, BOOL, STR = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL, GGUFValueType.STRING
# llama_expert_gating_func_type (src/llama-hparams.h)
GATING_SOFTMAX, GATING_SIGMOID = 1, 2


@dataclass(frozen=True)
class Dims:
    """The tiny sizes every configuration starts from (each may change some)."""

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_expert: int = 16
    n_expert_used: int = 4
    n_ff_exp: int = 64
    n_ff: int = 256  # dense layers' FFN
    n_ctx_train: int = 4096


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order: fastest-varying first
    kind: str            # how its values are made: see _values


@dataclass(frozen=True)
class ArchModel:
    """What a configuration writes: its architecture, keys and tensors, and what the cache should see."""

    config: str
    arch: str                      # general.architecture
    keys: tuple[tuple[str, Any, GGUFValueType], ...]
    tensors: tuple[TensorSpec, ...]
    moe_layers: tuple[int, ...]    # layers whose routed experts the cache may hold
    n_layer_nextn: int = 0         # MTP blocks after the trunk (in block_count, never computed)
    notes: str = ""
    expert_tensor_names: tuple[str, ...] = field(default=(), repr=False)


def tn(t: MODEL_TENSOR, bid: int | None = None, suffix: str | None = "weight") -> str:
    return TENSOR_NAMES[t].format(bid=bid) + ("." + suffix if suffix else "")


class _Builder:
    def __init__(self, arch: str, d: Dims) -> None:
        self.arch = arch
        self.d = d
        self.keys: list[tuple[str, Any, GGUFValueType]] = []
        self.tensors: list[TensorSpec] = []

    def key(self, template: str, value: Any, vtype: GGUFValueType) -> None:
        self.keys.append((template.format(arch=self.arch), value, vtype))

    def t(self, name: str, ne: tuple[int, ...], kind: str) -> None:
        self.tensors.append(TensorSpec(name, tuple(int(x) for x in ne), kind))

    # --- the parts most architectures share --------------------------------------------------

    def base_keys(self, n_block: int | None = None, n_ff: int | None = None, rope: bool = True) -> None:
        d = self.d
        L, A = Keys.LLM, Keys.Attention
        self.key(L.CONTEXT_LENGTH, d.n_ctx_train, U32)
        self.key(L.EMBEDDING_LENGTH, d.n_embd, U32)
        self.key(L.BLOCK_COUNT, n_block or d.n_layer, U32)
        self.key(L.FEED_FORWARD_LENGTH, n_ff or d.n_ff, U32)
        self.key(L.EXPERT_FEED_FORWARD_LENGTH, d.n_ff_exp, U32)
        self.key(A.HEAD_COUNT, d.n_head, U32)
        self.key(A.HEAD_COUNT_KV, d.n_head_kv, U32)
        self.key(A.KEY_LENGTH, d.head_dim, U32)
        self.key(A.VALUE_LENGTH, d.head_dim, U32)
        self.key(A.LAYERNORM_RMS_EPS, 1e-6, F32)
        if rope:
            self.key(Keys.Rope.FREQ_BASE, 10000.0, F32)
        self.key(L.EXPERT_COUNT, d.n_expert, U32)
        self.key(L.EXPERT_USED_COUNT, d.n_expert_used, U32)

    def moe_keys(self, lead: int | None = None, shared: int | None = None, shared_ff: int | None = None,
                 gating: int | None = None, norm: bool | None = None, scale: float | None = None,
                 groups: int | None = None, groups_used: int | None = None) -> None:
        """The routing keys many architectures share, each written only when given: leading dense blocks,
        shared experts (count, width), the gating function, weight normalisation and scale, expert groups."""
        L = Keys.LLM
        for template, value, vtype in ((L.LEADING_DENSE_BLOCK_COUNT, lead, U32), (L.EXPERT_SHARED_COUNT, shared, U32),
                                       (L.EXPERT_SHARED_FEED_FORWARD_LENGTH, shared_ff, U32),
                                       (L.EXPERT_GATING_FUNC, gating, U32), (L.EXPERT_WEIGHTS_NORM, norm, BOOL),
                                       (L.EXPERT_WEIGHTS_SCALE, scale, F32), (L.EXPERT_GROUP_COUNT, groups, U32),
                                       (L.EXPERT_GROUP_USED_COUNT, groups_used, U32)):
            if value is not None:
                self.key(template, value, vtype)

    def embeddings(self, tied: bool = False) -> None:
        d = self.d
        self.t(tn(MODEL_TENSOR.TOKEN_EMBD), (d.n_embd, -1), "embd")
        self.t(tn(MODEL_TENSOR.OUTPUT_NORM), (d.n_embd,), "norm")
        if not tied:
            self.t(tn(MODEL_TENSOR.OUTPUT), (d.n_embd, -1), "out")

    def attention(self, i: int, qk_norm: str | None = "head", bias: bool = False, merged: bool = False,
                  out_bias: bool = False) -> None:
        d = self.d
        n_q, n_kv = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
        self.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        if merged:
            self.t(tn(MODEL_TENSOR.ATTN_QKV, i), (d.n_embd, n_q + 2 * n_kv), "mat")
        else:
            self.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, n_q), "mat")
            self.t(tn(MODEL_TENSOR.ATTN_K, i), (d.n_embd, n_kv), "mat")
            self.t(tn(MODEL_TENSOR.ATTN_V, i), (d.n_embd, n_kv), "mat")
            if bias:
                for t, n in ((MODEL_TENSOR.ATTN_Q, n_q), (MODEL_TENSOR.ATTN_K, n_kv), (MODEL_TENSOR.ATTN_V, n_kv)):
                    self.t(tn(t, i, "bias"), (n,), "bias")
        self.t(tn(MODEL_TENSOR.ATTN_OUT, i), (n_q, d.n_embd), "mat")
        if out_bias:
            self.t(tn(MODEL_TENSOR.ATTN_OUT, i, "bias"), (d.n_embd,), "bias")
        if qk_norm == "head":
            self.t(tn(MODEL_TENSOR.ATTN_Q_NORM, i), (d.head_dim,), "norm")
            self.t(tn(MODEL_TENSOR.ATTN_K_NORM, i), (d.head_dim,), "norm")
        elif qk_norm == "full":  # over all heads at once (OLMoE, MiniMax-M2)
            self.t(tn(MODEL_TENSOR.ATTN_Q_NORM, i), (n_q,), "norm")
            self.t(tn(MODEL_TENSOR.ATTN_K_NORM, i), (n_kv,), "norm")

    def dense_ffn(self, i: int, norm: bool = True) -> None:
        d = self.d
        if norm:
            self.t(tn(MODEL_TENSOR.FFN_NORM, i), (d.n_embd,), "norm")
        self.t(tn(MODEL_TENSOR.FFN_GATE, i), (d.n_embd, d.n_ff), "mat")
        self.t(tn(MODEL_TENSOR.FFN_DOWN, i), (d.n_ff, d.n_embd), "mat")
        self.t(tn(MODEL_TENSOR.FFN_UP, i), (d.n_embd, d.n_ff), "mat")

    def moe(self, i: int, norm: bool = True, gate: bool = True, merged_gate_up: bool = False, probs_b: bool = False,
            shexp: int = 0, shexp_gate_inp: bool = False) -> None:
        d = self.d
        if norm:
            self.t(tn(MODEL_TENSOR.FFN_NORM, i), (d.n_embd,), "norm")
        self.t(tn(MODEL_TENSOR.FFN_GATE_INP, i), (d.n_embd, d.n_expert), "router")
        if probs_b:
            self.t(tn(MODEL_TENSOR.FFN_EXP_PROBS_B, i, "bias"), (d.n_expert,), "sel_bias")
        if merged_gate_up:
            self.t(tn(MODEL_TENSOR.FFN_GATE_UP_EXP, i), (d.n_embd, 2 * d.n_ff_exp, d.n_expert), "exps")
        else:
            if gate:
                self.t(tn(MODEL_TENSOR.FFN_GATE_EXP, i), (d.n_embd, d.n_ff_exp, d.n_expert), "exps")
            self.t(tn(MODEL_TENSOR.FFN_UP_EXP, i), (d.n_embd, d.n_ff_exp, d.n_expert), "exps")
        self.t(tn(MODEL_TENSOR.FFN_DOWN_EXP, i), (d.n_ff_exp, d.n_embd, d.n_expert), "exps_down")
        if shexp:
            if shexp_gate_inp:
                self.t(tn(MODEL_TENSOR.FFN_GATE_INP_SHEXP, i), (d.n_embd,), "mat_f32")
            self.t(tn(MODEL_TENSOR.FFN_GATE_SHEXP, i), (d.n_embd, shexp), "mat")
            self.t(tn(MODEL_TENSOR.FFN_DOWN_SHEXP, i), (shexp, d.n_embd), "mat")
            self.t(tn(MODEL_TENSOR.FFN_UP_SHEXP, i), (d.n_embd, shexp), "mat")

    def ffn(self, i: int, dense_lead: int = 1, norm: bool = True, **moe: Any) -> None:
        """The first ``dense_lead`` layers dense (leading_dense_block_count), the others MoE."""
        if i < dense_lead:
            self.dense_ffn(i, norm=norm)
        else:
            self.moe(i, norm=norm, **moe)

    def layers(self, attention: dict[str, Any] | None = None, lead: int = 0, **moe: Any) -> None:
        """The embeddings, then n_layer blocks of attention and FFN: the first ``lead`` dense, the others MoE
        (``moe``: the keywords of :meth:`moe`)."""
        self.embeddings()
        for i in range(self.d.n_layer):
            self.attention(i, **(attention or {}))
            self.ffn(i, dense_lead=lead, **moe)

    def mla(self, i: int, q_lora: int, kv_lora: int, rope: int, nope: int, v: int) -> None:
        """DeepSeek's multi-head latent attention, its K and V up-projections split (k_b, v_b) as converted
        for the MLA KV cache."""
        d = self.d
        if q_lora:
            self.t(tn(MODEL_TENSOR.ATTN_Q_A_NORM, i), (q_lora,), "norm")
            self.t(tn(MODEL_TENSOR.ATTN_Q_A, i), (d.n_embd, q_lora), "mat")
            self.t(tn(MODEL_TENSOR.ATTN_Q_B, i), (q_lora, d.n_head * (nope + rope)), "mat")
        else:
            self.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, d.n_head * (nope + rope)), "mat")
        self.t(tn(MODEL_TENSOR.ATTN_KV_A_NORM, i), (kv_lora,), "norm")
        self.t(tn(MODEL_TENSOR.ATTN_KV_A_MQA, i), (d.n_embd, kv_lora + rope), "mat")
        self.t(tn(MODEL_TENSOR.ATTN_K_B, i), (nope, kv_lora, d.n_head), "mat")
        self.t(tn(MODEL_TENSOR.ATTN_V_B, i), (kv_lora, v, d.n_head), "mat")
        self.t(tn(MODEL_TENSOR.ATTN_OUT, i), (d.n_head * v, d.n_embd), "mat")

    def nextn(self, i: int) -> None:
        d = self.d
        self.t(tn(MODEL_TENSOR.NEXTN_EH_PROJ, i), (2 * d.n_embd, d.n_embd), "mat")
        self.t(tn(MODEL_TENSOR.NEXTN_ENORM, i), (d.n_embd,), "norm")
        self.t(tn(MODEL_TENSOR.NEXTN_HNORM, i), (d.n_embd,), "norm")

    def model(self, config: str, moe_layers: list[int], n_layer_nextn: int = 0, notes: str = "") -> ArchModel:
        return ArchModel(config, self.arch, tuple(self.keys), tuple(self.tensors), tuple(moe_layers), n_layer_nextn,
                         notes)


# --- the configurations ----------------------------------------------------------------------


def _qwen2moe(d: Dims) -> ArchModel:
    b = _Builder("qwen2moe", d)
    b.base_keys()
    b.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, d.n_ff_exp * 2, U32)
    b.layers(attention=dict(qk_norm=None, bias=True), shexp=2 * d.n_ff_exp, shexp_gate_inp=True)
    return b.model("qwen2moe", list(range(d.n_layer)), notes="a shared expert with its own sigmoid gate; q/k/v biases")


def _olmoe(d: Dims) -> ArchModel:
    d = replace(d, n_head_kv=d.n_head)  # its k norm spans n_embd: no grouped-query attention
    b = _Builder("olmoe", d)
    b.base_keys(n_ff=d.n_ff_exp)  # OLMoE's experts take feed_forward_length
    b.layers(attention=dict(qk_norm="full"))
    return b.model("olmoe", list(range(d.n_layer)), notes="q/k norms over all heads; experts sized by feed_forward_length")


def _mixtral(d: Dims) -> ArchModel:
    b = _Builder("llama", d)
    b.base_keys(n_ff=d.n_ff_exp)
    b.layers(attention=dict(qk_norm=None))
    return b.model("llama", list(range(d.n_layer)), notes="Mixtral: llama with experts, no shared expert")


def _granitemoe(d: Dims, shared: bool) -> ArchModel:
    b = _Builder("granitemoe", d)
    b.base_keys(n_ff=d.n_ff_exp)
    b.key(Keys.LLM.LOGIT_SCALE, 4.0, F32)
    b.key(Keys.LLM.RESIDUAL_SCALE, 0.25, F32)
    b.key(Keys.LLM.EMBEDDING_SCALE, 8.0, F32)
    b.key(Keys.Attention.SCALE, 1.0 / d.head_dim, F32)
    if shared:
        b.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 2 * d.n_ff_exp, U32)
    b.layers(attention=dict(qk_norm=None), shexp=2 * d.n_ff_exp if shared else 0)
    return b.model("granitemoe-shared" if shared else "granitemoe", list(range(d.n_layer)),
                   notes=("a shared expert, " if shared else "") + "residual, embedding, attention and logit scales")


def _ernie(d: Dims) -> ArchModel:
    b = _Builder("ernie4_5-moe", d)
    b.base_keys()
    b.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 2 * d.n_ff_exp, U32)
    b.key(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, 1, U32)
    b.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 1, U32)
    b.layers(attention=dict(qk_norm=None), lead=1, probs_b=True, shexp=2 * d.n_ff_exp)
    return b.model("ernie4_5-moe", list(range(1, d.n_layer)),
                   notes="a dense first layer, a shared expert, a selection bias")


def _dots1(d: Dims) -> ArchModel:
    d = replace(d, n_head_kv=d.n_head)  # its k and v take n_head heads
    b = _Builder("dots1", d)
    b.base_keys()
    b.moe_keys(lead=1, shared=2, scale=2.5, norm=True, gating=GATING_SIGMOID)
    b.layers(attention=dict(qk_norm="head"), lead=1, probs_b=True, shexp=2 * d.n_ff_exp)
    return b.model("dots1", list(range(1, d.n_layer)),
                   notes="sigmoid gating with a selection bias, normalised and scaled weights, two shared experts, "
                   "a dense first layer")


def _hunyuan(d: Dims) -> ArchModel:
    b = _Builder("hunyuan-moe", d)
    b.base_keys(n_ff=d.n_ff_exp)
    b.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 2 * d.n_ff_exp, U32)
    b.layers(attention=dict(qk_norm="head"), shexp=2 * d.n_ff_exp)
    return b.model("hunyuan-moe", list(range(d.n_layer)), notes="a shared expert; q/k norms after RoPE")


def _bailingmoe2(d: Dims, mtp: bool = False) -> ArchModel:
    b = _Builder("bailingmoe2", d)
    nextn = 1 if mtp else 0
    b.base_keys(n_block=d.n_layer + nextn)
    if nextn:
        b.key(Keys.LLM.NEXTN_PREDICT_LAYERS, nextn, U32)
    b.moe_keys(lead=1, shared=1, scale=2.5, norm=True, gating=GATING_SIGMOID, groups=4, groups_used=2)
    b.layers(attention=dict(qk_norm="head", merged=True), lead=1, probs_b=True, shexp=d.n_ff_exp)
    return b.model("bailingmoe2", list(range(1, d.n_layer)),
                   notes="sigmoid gating in expert groups with a selection bias, a shared expert, a merged QKV, "
                   "a dense first layer")


def _minimax_m2(d: Dims) -> ArchModel:
    b = _Builder("minimax-m2", d)
    b.base_keys(n_ff=d.n_ff_exp)
    b.key(Keys.LLM.EXPERT_GATING_FUNC, GATING_SIGMOID, U32)
    b.key(Keys.Rope.DIMENSION_COUNT, d.head_dim // 2, U32)
    b.layers(attention=dict(qk_norm="full"), probs_b=True)
    return b.model("minimax-m2", list(range(d.n_layer)),
                   notes="sigmoid gating with a selection bias, no shared expert, partial RoPE")


def _glm4moe(d: Dims, mtp: bool) -> ArchModel:
    b = _Builder("glm4moe", d)
    nextn = 1 if mtp else 0
    b.base_keys(n_block=d.n_layer + nextn)
    if nextn:
        b.key(Keys.LLM.NEXTN_PREDICT_LAYERS, nextn, U32)
    b.moe_keys(shared=1, lead=1, scale=2.5, norm=True, gating=GATING_SIGMOID)
    b.key(Keys.Rope.DIMENSION_COUNT, d.head_dim // 2, U32)
    b.embeddings()
    for i in range(d.n_layer + nextn):
        b.attention(i, qk_norm="head", bias=True)
        b.t(tn(MODEL_TENSOR.ATTN_POST_NORM, i), (d.n_embd,), "norm")
        b.ffn(i, norm=False, probs_b=True, shexp=d.n_ff_exp)
        if i >= d.n_layer:
            b.nextn(i)
    return b.model("glm4moe-mtp" if mtp else "glm4moe", list(range(1, d.n_layer)), n_layer_nextn=nextn,
                   notes=("an MTP block after the trunk (in block_count, never run), " if mtp else "")
                   + "sigmoid gating with a selection bias, a shared expert, a dense first layer")


def _deepseek2(d: Dims, style: str) -> ArchModel:
    """style: "v3" (q LoRA, sigmoid in expert groups, selection bias), "lite" (V2-Lite: no q LoRA, softmax),
    "fused" (GLM-4.7-Flash-like: gate and up experts in one tensor)."""
    b = _Builder("deepseek2", d)
    kv_lora, q_lora, rope, nope, v = 64, 64 if style != "lite" else 0, 16, 32, 32
    b.base_keys()
    b.key(Keys.Attention.Q_LORA_RANK, q_lora, U32)
    b.key(Keys.Attention.KV_LORA_RANK, kv_lora, U32)
    b.key(Keys.Attention.KEY_LENGTH_MLA, nope + rope, U32)
    b.key(Keys.Attention.VALUE_LENGTH_MLA, v, U32)
    b.key(Keys.Rope.DIMENSION_COUNT, rope, U32)
    # MLA stores one latent "head" as the KV cache (the converter's key_length / value_length)
    b.keys = [k for k in b.keys if k[0] not in (Keys.Attention.KEY_LENGTH.format(arch="deepseek2"),
                                                 Keys.Attention.VALUE_LENGTH.format(arch="deepseek2"),
                                                 Keys.Attention.HEAD_COUNT_KV.format(arch="deepseek2"))]
    b.key(Keys.Attention.KEY_LENGTH, kv_lora + rope, U32)
    b.key(Keys.Attention.VALUE_LENGTH, kv_lora, U32)
    b.key(Keys.Attention.HEAD_COUNT_KV, 1, U32)
    lite = style == "lite"
    b.moe_keys(lead=1, shared=1, scale=1.0 if lite else 2.5, norm=not lite, gating=GATING_SOFTMAX if lite else GATING_SIGMOID)
    if style == "v3":
        b.key(Keys.LLM.EXPERT_GROUP_COUNT, 4, U32)
        b.key(Keys.LLM.EXPERT_GROUP_USED_COUNT, 2, U32)
    b.embeddings()
    for i in range(d.n_layer):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        b.mla(i, q_lora, kv_lora, rope, nope, v)
        b.ffn(i, probs_b=style != "lite", merged_gate_up=style == "fused", shexp=d.n_ff_exp)
    notes = {"v3": "DeepSeek-V3 style: MLA with q LoRA, sigmoid gating in expert groups, a selection bias",
             "lite": "DeepSeek-V2-Lite style: MLA without q LoRA, softmax gating",
             "fused": "GLM-4.7-Flash style: gate and up experts merged in one tensor, sigmoid gating"}[style]
    name = {"v3": "deepseek2", "lite": "deepseek2-lite", "fused": "deepseek2-fused"}[style]
    return b.model(name, list(range(1, d.n_layer)), notes=notes + "; a shared expert, a dense first layer")


def _llama4(d: Dims) -> ArchModel:
    b = _Builder("llama4", d)
    b.base_keys()
    b.key(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, 2, U32)
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm=None)
        if (i + 1) % 2 == 0:
            b.moe(i, shexp=d.n_ff_exp)
        else:
            b.dense_ffn(i)
    return b.model("llama4", [i for i in range(d.n_layer) if (i + 1) % 2 == 0],
                   notes="MoE every other layer (dense between), top-k on the logits with the sigmoid weight "
                   "applied before the experts, a shared expert")


def _gated_delta_net(b: _Builder, i: int, split_beta_alpha: bool) -> None:
    """A linear-attention (gated delta net) layer of qwen3next / qwen35moe, sized by _ssm_keys."""
    d = b.d
    key_dim, value_dim, n_v = SSM_STATE * SSM_GROUPS, SSM_STATE * SSM_V_HEADS, SSM_V_HEADS
    b.t(tn(MODEL_TENSOR.ATTN_QKV, i), (d.n_embd, 2 * key_dim + value_dim), "mat")
    b.t(tn(MODEL_TENSOR.ATTN_GATE, i), (d.n_embd, value_dim), "mat")
    b.t(tn(MODEL_TENSOR.SSM_CONV1D, i), (SSM_CONV, 2 * key_dim + value_dim), "mat_f32")
    b.t(tn(MODEL_TENSOR.SSM_DT, i, "bias"), (n_v,), "bias")
    b.t(tn(MODEL_TENSOR.SSM_A, i, None), (n_v,), "neg_ones")  # A = -exp(A_log): a decay, never growth
    if split_beta_alpha:
        b.t(tn(MODEL_TENSOR.SSM_BETA, i), (d.n_embd, n_v), "mat_f32")
        b.t(tn(MODEL_TENSOR.SSM_ALPHA, i), (d.n_embd, n_v), "mat_f32")
    else:
        b.t(tn(MODEL_TENSOR.SSM_BETA_ALPHA, i), (d.n_embd, 2 * n_v), "mat_f32")
    b.t(tn(MODEL_TENSOR.SSM_NORM, i), (SSM_STATE,), "norm")
    b.t(tn(MODEL_TENSOR.SSM_OUT, i), (value_dim, d.n_embd), "mat")


SSM_CONV, SSM_STATE, SSM_GROUPS, SSM_V_HEADS = 4, 32, 2, 4


def _qwen3next(d: Dims, arch: str) -> ArchModel:
    """Linear attention in three layers of four (full attention in every fourth), a gated query, routed
    experts plus a shared expert with its own gate."""
    b = _Builder(arch, d)
    b.base_keys()
    b.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, d.n_ff_exp, U32)
    b.key(Keys.LLM.FULL_ATTENTION_INTERVAL, 4, U32)
    b.key(Keys.SSM.CONV_KERNEL, SSM_CONV, U32)
    b.key(Keys.SSM.STATE_SIZE, SSM_STATE, U32)
    b.key(Keys.SSM.GROUP_COUNT, SSM_GROUPS, U32)
    b.key(Keys.SSM.TIME_STEP_RANK, SSM_V_HEADS, U32)
    b.key(Keys.SSM.INNER_SIZE, SSM_STATE * SSM_V_HEADS, U32)
    b.key(Keys.Rope.DIMENSION_COUNT, d.head_dim // 2, U32)
    if arch == "qwen35moe":
        b.key(Keys.Rope.DIMENSION_SECTIONS, [3, 3, 2, 0], GGUFValueType.ARRAY)
    b.embeddings()
    n_q = d.n_head * d.head_dim
    for i in range(d.n_layer):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.ATTN_POST_NORM, i), (d.n_embd,), "norm")
        if (i + 1) % 4:
            _gated_delta_net(b, i, split_beta_alpha=arch == "qwen35moe")
        else:
            b.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, 2 * n_q), "mat")  # the query and its gate
            b.t(tn(MODEL_TENSOR.ATTN_K, i), (d.n_embd, d.n_head_kv * d.head_dim), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_V, i), (d.n_embd, d.n_head_kv * d.head_dim), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_OUT, i), (n_q, d.n_embd), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_Q_NORM, i), (d.head_dim,), "norm")
            b.t(tn(MODEL_TENSOR.ATTN_K_NORM, i), (d.head_dim,), "norm")
        b.moe(i, norm=False, shexp=d.n_ff_exp, shexp_gate_inp=True)
    return b.model(arch, list(range(d.n_layer)),
                   notes="hybrid: gated delta net (linear attention) in three layers of four; a gated shared expert"
                   + ("; multi-section RoPE" if arch == "qwen35moe" else ""))


def _gemma4(d: Dims, scaled: bool) -> ArchModel:
    """Gemma 4's MoE layers: a dense FFN beside the routed experts (llama.cpp runs it as their shared
    expert), a scaled router input, gate and up experts merged in one tensor, and (as released) a per-expert
    scale of the down projection; sliding-window layers with a full-attention one every fourth."""
    b = _Builder("gemma4", d)
    b.base_keys(n_ff=d.n_ff_exp * 2)
    pattern = [(i + 1) % 4 != 0 for i in range(d.n_layer)]
    b.key(Keys.Attention.SLIDING_WINDOW_PATTERN, pattern, GGUFValueType.ARRAY)
    b.key(Keys.Attention.SLIDING_WINDOW, 64, U32)
    b.key(Keys.LLM.EMBD_LENGTH_PER_LAYER_INP, 0, U32)
    b.key(Keys.Attention.KEY_LENGTH_SWA, d.head_dim, U32)
    b.key(Keys.Attention.VALUE_LENGTH_SWA, d.head_dim, U32)
    b.key(Keys.Rope.FREQ_BASE_SWA, 10000.0, F32)
    b.key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, 30.0, F32)
    b.embeddings()
    n_q, n_kv = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    b.t(tn(MODEL_TENSOR.ROPE_FREQS), (d.head_dim // 2,), "norm")
    for i in range(d.n_layer):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, n_q), "mat")
        b.t(tn(MODEL_TENSOR.ATTN_K, i), (d.n_embd, n_kv), "mat")
        b.t(tn(MODEL_TENSOR.ATTN_V, i), (d.n_embd, n_kv), "mat")
        b.t(tn(MODEL_TENSOR.ATTN_OUT, i), (n_q, d.n_embd), "mat")
        b.t(tn(MODEL_TENSOR.ATTN_Q_NORM, i), (d.head_dim,), "norm")
        b.t(tn(MODEL_TENSOR.ATTN_K_NORM, i), (d.head_dim,), "norm")
        b.t(tn(MODEL_TENSOR.ATTN_POST_NORM, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_NORM, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_GATE, i), (d.n_embd, 2 * d.n_ff_exp), "mat")
        b.t(tn(MODEL_TENSOR.FFN_UP, i), (d.n_embd, 2 * d.n_ff_exp), "mat")
        b.t(tn(MODEL_TENSOR.FFN_DOWN, i), (2 * d.n_ff_exp, d.n_embd), "mat")
        b.t(tn(MODEL_TENSOR.FFN_POST_NORM, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_GATE_INP, i), (d.n_embd, d.n_expert), "router")
        b.t(tn(MODEL_TENSOR.FFN_GATE_INP, i, "scale"), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_PRE_NORM_2, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_POST_NORM_1, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_POST_NORM_2, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_GATE_UP_EXP, i), (d.n_embd, 2 * d.n_ff_exp, d.n_expert), "exps")
        b.t(tn(MODEL_TENSOR.FFN_DOWN_EXP, i), (d.n_ff_exp, d.n_embd, d.n_expert), "exps_down")
        if scaled:
            b.t(tn(MODEL_TENSOR.FFN_DOWN_EXP, i, "scale"), (d.n_expert,), "norm")
    return b.model("gemma4" if scaled else "gemma4-unscaled", list(range(d.n_layer)),
                   notes=("as released: a per-expert scale of the down projection; " if scaled else
                          "without the per-expert down scale; ")
                   + "gate and up experts merged, a dense FFN beside the experts, sliding-window attention")


def _nemotron_h_moe(d: Dims, per_layer_k: bool) -> ArchModel:
    """Nemotron-H MoE: Mamba-2 layers, attention layers and MoE layers, each its own block; experts without a
    gate (up, then squared ReLU, then down) beside a gate-less shared expert; sigmoid gating with a selection
    bias. Which block a layer is follows from its per-layer head_count_kv and feed_forward_length."""
    b = _Builder("nemotron_h_moe", d)
    kinds = ["ssm", "moe", "attn", "moe"][: d.n_layer]
    d_inner, d_state, n_group, n_ssm_head = 2 * d.n_embd, 16, 1, 8
    b.base_keys()
    b.keys = [k for k in b.keys if k[0] not in {t.format(arch="nemotron_h_moe") for t in (
        Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT_KV, Keys.LLM.EXPERT_USED_COUNT)}]
    b.key(Keys.LLM.FEED_FORWARD_LENGTH, [d.n_ff if k == "moe" else 0 for k in kinds], GGUFValueType.ARRAY)
    b.key(Keys.Attention.HEAD_COUNT_KV, [d.n_head_kv if k == "attn" else 0 for k in kinds], GGUFValueType.ARRAY)
    if per_layer_k:  # as the heterogeneous (Puzzle) models store it: 0 in the layers without experts
        b.key(Keys.LLM.EXPERT_USED_COUNT, [d.n_expert_used if k == "moe" else 0 for k in kinds], GGUFValueType.ARRAY)
    else:
        b.key(Keys.LLM.EXPERT_USED_COUNT, d.n_expert_used, U32)
    b.key(Keys.Attention.LAYERNORM_EPS, 1e-5, F32)
    b.moe_keys(shared_ff=2 * d.n_ff_exp, gating=GATING_SIGMOID, norm=True, scale=2.5)
    b.key(Keys.SSM.CONV_KERNEL, 4, U32)
    b.key(Keys.SSM.INNER_SIZE, d_inner, U32)
    b.key(Keys.SSM.STATE_SIZE, d_state, U32)
    b.key(Keys.SSM.TIME_STEP_RANK, n_ssm_head, U32)
    b.key(Keys.SSM.GROUP_COUNT, n_group, U32)
    b.embeddings()
    for i, kind in enumerate(kinds):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        if kind == "ssm":
            _mamba2(b, i, d_inner, d_state, n_group, n_ssm_head)
        elif kind == "attn":
            n_q, n_kv = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
            b.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, n_q), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_K, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_V, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_OUT, i), (n_q, d.n_embd), "mat")
        else:
            b.t(tn(MODEL_TENSOR.FFN_GATE_INP, i), (d.n_embd, d.n_expert), "router")
            b.t(tn(MODEL_TENSOR.FFN_EXP_PROBS_B, i, "bias"), (d.n_expert,), "sel_bias")
            b.t(tn(MODEL_TENSOR.FFN_DOWN_EXP, i), (d.n_ff_exp, d.n_embd, d.n_expert), "exps_down")
            b.t(tn(MODEL_TENSOR.FFN_UP_EXP, i), (d.n_embd, d.n_ff_exp, d.n_expert), "exps")
            b.t(tn(MODEL_TENSOR.FFN_DOWN_SHEXP, i), (2 * d.n_ff_exp, d.n_embd), "mat")
            b.t(tn(MODEL_TENSOR.FFN_UP_SHEXP, i), (d.n_embd, 2 * d.n_ff_exp), "mat")
    return b.model("nemotron_h_moe-per-layer-k" if per_layer_k else "nemotron_h_moe",
                   [i for i, k in enumerate(kinds) if k == "moe"],
                   notes="gate-less experts (squared ReLU) and a gate-less shared expert; Mamba-2, attention and "
                   "MoE blocks" + ("; experts per token stored per layer, 0 in the first" if per_layer_k else ""))


def _kimi_linear(d: Dims) -> ArchModel:
    """Kimi Linear: KDA linear-attention layers (per-layer head_count_kv 0) with one MLA layer in four, a
    dense first layer, sigmoid gating with a selection bias, a shared expert."""
    b = _Builder("kimi-linear", d)
    kinds = ["kda", "kda", "kda", "mla"][: d.n_layer]
    kda, kv_lora, rope, nope, v = 32, 64, 16, 32, 32
    b.base_keys()
    b.keys = [k for k in b.keys if k[0] not in {t.format(arch="kimi-linear") for t in (
        Keys.Attention.HEAD_COUNT_KV, Keys.Attention.KEY_LENGTH, Keys.Attention.VALUE_LENGTH)}]
    b.key(Keys.Attention.HEAD_COUNT_KV, [1 if k == "mla" else 0 for k in kinds], GGUFValueType.ARRAY)
    b.key(Keys.Attention.KEY_LENGTH, kv_lora + rope, U32)
    b.key(Keys.Attention.VALUE_LENGTH, kv_lora, U32)
    b.key(Keys.Attention.KEY_LENGTH_MLA, nope + rope, U32)
    b.key(Keys.Attention.VALUE_LENGTH_MLA, v, U32)
    b.key(Keys.Attention.KV_LORA_RANK, kv_lora, U32)
    b.key(Keys.Rope.DIMENSION_COUNT, rope, U32)
    b.key(Keys.SSM.CONV_KERNEL, 4, U32)
    b.key("{arch}.kda.head_dim", kda, U32)  # the base's key; the published gguf-py 0.19.0 has no constant for it
    b.moe_keys(lead=1, shared=1, scale=2.5, gating=GATING_SIGMOID)
    b.embeddings()
    proj = kda * d.n_head
    for i, kind in enumerate(kinds):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        if kind == "kda":
            for t in (MODEL_TENSOR.SSM_CONV1D_Q, MODEL_TENSOR.SSM_CONV1D_K, MODEL_TENSOR.SSM_CONV1D_V):
                b.t(tn(t, i), (4, 1, proj), "mat_f32")
            for t in (MODEL_TENSOR.ATTN_Q, MODEL_TENSOR.ATTN_K, MODEL_TENSOR.ATTN_V):
                b.t(tn(t, i), (d.n_embd, proj), "mat")
            b.t(tn(MODEL_TENSOR.SSM_F_A, i), (d.n_embd, kda), "mat")
            b.t(tn(MODEL_TENSOR.SSM_F_B, i), (kda, proj), "mat")
            b.t(tn(MODEL_TENSOR.SSM_BETA, i), (d.n_embd, d.n_head), "mat_f32")
            b.t(tn(MODEL_TENSOR.SSM_A, i, None), (1, d.n_head), "neg_ones")
            b.t(tn(MODEL_TENSOR.SSM_DT, i, "bias"), (proj,), "bias")
            b.t(tn(MODEL_TENSOR.SSM_G_A, i), (d.n_embd, kda), "mat")
            b.t(tn(MODEL_TENSOR.SSM_G_B, i), (kda, proj), "mat")
            b.t(tn(MODEL_TENSOR.SSM_NORM, i), (kda,), "norm")
            b.t(tn(MODEL_TENSOR.ATTN_OUT, i), (proj, d.n_embd), "mat")
        else:
            b.mla(i, 0, kv_lora, rope, nope, v)
        b.ffn(i, probs_b=True, shexp=d.n_ff_exp)
    return b.model("kimi-linear", list(range(1, d.n_layer)),
                   notes="hybrid: KDA linear attention in three layers of four, MLA in the fourth; sigmoid gating "
                   "with a selection bias, a shared expert, a dense first layer")


def _arctic(d: Dims) -> ArchModel:
    """Snowflake Arctic: a dense residual FFN (n_embd wide) beside the routed experts in every layer, the
    experts fed from the layer's input through their own norm."""
    b = _Builder("arctic", d)
    b.base_keys(n_ff=d.n_ff_exp)  # its experts take feed_forward_length
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm=None)
        b.t(tn(MODEL_TENSOR.FFN_NORM, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.FFN_GATE, i), (d.n_embd, d.n_embd), "mat")
        b.t(tn(MODEL_TENSOR.FFN_DOWN, i), (d.n_embd, d.n_embd), "mat")
        b.t(tn(MODEL_TENSOR.FFN_UP, i), (d.n_embd, d.n_embd), "mat")
        b.t(tn(MODEL_TENSOR.FFN_NORM_EXP, i), (d.n_embd,), "norm")
        b.moe(i, norm=False)
    return b.model("arctic", list(range(d.n_layer)),
                   notes="a dense residual FFN beside the experts, which take the layer's input through their own norm")


def _dbrx(d: Dims) -> ArchModel:
    b = _Builder("dbrx", d)
    b.base_keys(n_ff=d.n_ff_exp)
    b.key(Keys.Attention.LAYERNORM_EPS, 1e-5, F32)
    b.key(Keys.Attention.CLAMP_KQV, 8.0, F32)
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm=None, merged=True)
        b.t(tn(MODEL_TENSOR.ATTN_OUT_NORM, i), (d.n_embd,), "norm")
        b.moe(i, norm=False)
    return b.model("dbrx", list(range(d.n_layer)), notes="layer norms, a merged QKV clamped, no shared expert")


def _deepseek(d: Dims) -> ArchModel:
    b = _Builder("deepseek", d)
    b.base_keys()
    b.moe_keys(lead=1, shared=2, scale=1.0)
    b.layers(attention=dict(qk_norm=None), lead=1, shexp=2 * d.n_ff_exp)
    return b.model("deepseek", list(range(1, d.n_layer)),
                   notes="DeepSeek-MoE (V1): softmax gating, two shared experts, a dense first layer")


def _grok(d: Dims) -> ArchModel:
    """Grok: GELU experts beside a dense GELU FFN (Grok 2; their sum scaled by 1/sqrt 2), soft-capped
    attention and router logits, norms after attention and after the FFN."""
    b = _Builder("grok", d)
    b.base_keys()
    b.key(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, 30.0, F32)
    b.key(Keys.LLM.ROUTER_LOGIT_SOFTCAPPING, 30.0, F32)
    b.key(Keys.LLM.EMBEDDING_SCALE, 1.0, F32)
    b.key(Keys.LLM.LOGIT_SCALE, 1.0, F32)
    b.key(Keys.Attention.OUTPUT_SCALE, 1.0, F32)
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm=None)
        b.t(tn(MODEL_TENSOR.ATTN_OUT_NORM, i), (d.n_embd,), "norm")
        b.dense_ffn(i)
        b.moe(i, norm=False)
        b.t(tn(MODEL_TENSOR.LAYER_OUT_NORM, i), (d.n_embd,), "norm")
    return b.model("grok", list(range(d.n_layer)),
                   notes="GELU experts beside a dense FFN (Grok 2), soft-capped attention and router logits")


def _phimoe(d: Dims) -> ArchModel:
    b = _Builder("phimoe", d)
    b.base_keys(n_ff=d.n_ff_exp)
    b.embeddings()
    b.t(tn(MODEL_TENSOR.OUTPUT_NORM, None, "bias"), (d.n_embd,), "bias")
    b.t(tn(MODEL_TENSOR.OUTPUT, None, "bias"), (-1,), "bias")
    for i in range(d.n_layer):
        b.attention(i, qk_norm=None, bias=True, out_bias=True)
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i, "bias"), (d.n_embd,), "bias")
        b.moe(i)
        b.t(tn(MODEL_TENSOR.FFN_NORM, i, "bias"), (d.n_embd,), "bias")
    return b.model("phimoe", list(range(d.n_layer)),
                   notes="norms with biases, q/k/v and output biases, no shared expert")


def _qwen3vlmoe(d: Dims) -> ArchModel:
    b = _Builder("qwen3vlmoe", d)
    b.base_keys()
    b.key(Keys.Rope.DIMENSION_SECTIONS, [6, 5, 5, 0], GGUFValueType.ARRAY)
    b.layers(attention=dict(qk_norm="head"))
    return b.model("qwen3vlmoe", list(range(d.n_layer)),
                   notes="the text model of Qwen3-VL MoE: Qwen3 MoE layers with multi-section RoPE")


def _bailingmoe(d: Dims) -> ArchModel:
    b = _Builder("bailingmoe", d)
    b.base_keys()
    b.moe_keys(shared=1, norm=True)
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm=None)  # the converter splits Ling's merged QKV
        b.moe(i, shexp=d.n_ff_exp)
    return b.model("bailingmoe", list(range(d.n_layer)),
                   notes="Ling: softmax gating with normalised weights, a shared expert")


def _mistral3(d: Dims) -> ArchModel:
    b = _Builder("mistral3", d)
    b.base_keys(n_ff=d.n_ff_exp)  # its experts take feed_forward_length
    b.layers(attention=dict(qk_norm=None))
    return b.model("mistral3", list(range(d.n_layer)),
                   notes="the MoE branch of Mistral 3's loader: the layout of `llama` (Mixtral), its own graph")


def _smallthinker(d: Dims) -> ArchModel:
    """SmallThinker: the router reads the layer's input before attention; the experts (ReLU) take its
    probabilities after it."""
    b = _Builder("smallthinker", d)
    b.base_keys()
    b.key(Keys.LLM.EXPERT_GATING_FUNC, GATING_SOFTMAX, U32)
    b.layers(attention=dict(qk_norm=None))
    return b.model("smallthinker", list(range(d.n_layer)),
                   notes="routing computed before attention from the layer's input; ReLU experts")


def _exaone_moe(d: Dims) -> ArchModel:
    b = _Builder("exaone-moe", d)
    b.base_keys()
    b.key(Keys.Attention.SLIDING_WINDOW, 64, U32)
    b.moe_keys(lead=1, shared=1, shared_ff=d.n_ff_exp, gating=GATING_SIGMOID, norm=True, scale=2.5)
    b.layers(attention=dict(qk_norm="head"), lead=1, probs_b=True, shexp=d.n_ff_exp)
    return b.model("exaone-moe", list(range(1, d.n_layer)),
                   notes="sigmoid gating with a selection bias, a shared expert, a dense first layer; sliding-window "
                   "attention in three layers of four")


def _afmoe(d: Dims) -> ArchModel:
    b = _Builder("afmoe", d)
    b.base_keys()
    b.key(Keys.Attention.SLIDING_WINDOW, 64, U32)
    b.moe_keys(lead=1, shared=1, gating=GATING_SIGMOID, norm=True, scale=2.5)
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm="head")
        b.t(tn(MODEL_TENSOR.ATTN_POST_NORM, i), (d.n_embd,), "norm")
        b.t(tn(MODEL_TENSOR.ATTN_GATE, i), (d.n_embd, d.n_head * d.head_dim), "mat")
        b.t(tn(MODEL_TENSOR.FFN_POST_NORM, i), (d.n_embd,), "norm")
        b.ffn(i, probs_b=True, shexp=d.n_ff_exp)
    return b.model("afmoe", list(range(1, d.n_layer)),
                   notes="sigmoid gating with a selection bias, a shared expert, a dense first layer; gated attention, "
                   "sliding windows")


def _mimo2(d: Dims) -> ArchModel:
    """MiMo-V2: sliding-window attention with sinks in most layers, a dense first layer, sigmoid gating with
    a selection bias."""
    b = _Builder("mimo2", d)
    b.base_keys()
    b.key(Keys.Attention.SLIDING_WINDOW, 64, U32)
    b.key(Keys.Attention.SLIDING_WINDOW_PATTERN, [i % 4 != 0 for i in range(d.n_layer)], GGUFValueType.ARRAY)
    b.key(Keys.Rope.FREQ_BASE_SWA, 10000.0, F32)
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm=None)
        b.t(tn(MODEL_TENSOR.ATTN_SINKS, i), (d.n_head,), "bias")
        b.ffn(i, probs_b=True)
    return b.model("mimo2", list(range(1, d.n_layer)),
                   notes="sigmoid gating with a selection bias, a dense first layer; sliding-window attention with "
                   "sinks")


def _step35(d: Dims) -> ArchModel:
    """Step 3.5: a dense first layer, then routed experts (their SwiGLU clamped) beside a shared expert,
    sigmoid gating with a selection bias; a head-wise attention gate, sliding windows, half RoPE in the
    full-attention layers."""
    b = _Builder("step35", d)
    b.base_keys()
    b.moe_keys(shared_ff=d.n_ff_exp, gating=GATING_SIGMOID, norm=True, scale=2.5)
    b.key(Keys.Attention.SLIDING_WINDOW, 64, U32)
    b.key(Keys.Attention.SLIDING_WINDOW_PATTERN, [i % 4 != 0 for i in range(d.n_layer)], GGUFValueType.ARRAY)
    b.key(Keys.Rope.FREQ_BASE_SWA, 10000.0, F32)
    # the released model clamps at 7; 1 bites on these unit-size activations, so a cache path without the clamp
    # would show
    b.key(Keys.LLM.SWIGLU_CLAMP_EXP, [0.0] + [1.0] * (d.n_layer - 1), GGUFValueType.ARRAY)
    b.embeddings()
    for i in range(d.n_layer):
        b.attention(i, qk_norm="head")
        b.t(tn(MODEL_TENSOR.ATTN_GATE, i), (d.n_embd, d.n_head), "mat_f32")
        b.ffn(i, probs_b=True, shexp=d.n_ff_exp)
    return b.model("step35", list(range(1, d.n_layer)),
                   notes="sigmoid gating with a selection bias, clamped SwiGLU experts, a shared expert, a dense first "
                   "layer; a head-wise attention gate, sliding windows")


def _glm_dsa(d: Dims) -> ArchModel:
    """GLM-5 (DeepSeek sparse attention): MLA whose keys a lightning indexer selects (top 32 of the context),
    sigmoid gating with a selection bias, a shared expert, a dense first layer."""
    b = _Builder("glm-dsa", d)
    # the indexer's keys are rotated in blocks of 64: its head is at least that wide
    kv_lora, q_lora, rope, nope, v, idx_heads, idx_dim = 64, 64, 16, 32, 32, 4, 64
    b.base_keys()
    b.keys = [k for k in b.keys if k[0] not in {t.format(arch="glm-dsa") for t in (
        Keys.Attention.KEY_LENGTH, Keys.Attention.VALUE_LENGTH, Keys.Attention.HEAD_COUNT_KV)}]
    b.key(Keys.Attention.KEY_LENGTH, kv_lora + rope, U32)
    b.key(Keys.Attention.VALUE_LENGTH, kv_lora, U32)
    b.key(Keys.Attention.HEAD_COUNT_KV, 1, U32)
    b.key(Keys.Attention.Q_LORA_RANK, q_lora, U32)
    b.key(Keys.Attention.KV_LORA_RANK, kv_lora, U32)
    b.key(Keys.Attention.KEY_LENGTH_MLA, nope + rope, U32)
    b.key(Keys.Attention.VALUE_LENGTH_MLA, v, U32)
    b.key(Keys.Rope.DIMENSION_COUNT, rope, U32)
    b.key(Keys.Attention.Indexer.HEAD_COUNT, idx_heads, U32)
    b.key(Keys.Attention.Indexer.KEY_LENGTH, idx_dim, U32)
    b.key(Keys.Attention.Indexer.TOP_K, 32, U32)
    b.moe_keys(lead=1, shared=1, scale=2.5, norm=True, gating=GATING_SIGMOID)
    b.embeddings()
    for i in range(d.n_layer):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        b.mla(i, q_lora, kv_lora, rope, nope, v)
        b.t(tn(MODEL_TENSOR.INDEXER_K_NORM, i), (idx_dim,), "norm")
        b.t(tn(MODEL_TENSOR.INDEXER_K_NORM, i, "bias"), (idx_dim,), "bias")
        b.t(tn(MODEL_TENSOR.INDEXER_PROJ, i), (d.n_embd, idx_heads), "mat_f32")
        b.t(tn(MODEL_TENSOR.INDEXER_ATTN_K, i), (d.n_embd, idx_dim), "mat")
        b.t(tn(MODEL_TENSOR.INDEXER_ATTN_Q_B, i), (q_lora, idx_heads * idx_dim), "mat")
        b.ffn(i, probs_b=True, shexp=d.n_ff_exp)
    return b.model("glm-dsa", list(range(1, d.n_layer)),
                   notes="MLA with a lightning indexer (sparse attention, top 32 keys), sigmoid gating with a "
                   "selection bias, a shared expert, a dense first layer")


def _mamba2(b: _Builder, i: int, d_inner: int, d_state: int, n_group: int, n_ssm_head: int) -> None:
    d = b.d
    b.t(tn(MODEL_TENSOR.SSM_IN, i), (d.n_embd, 2 * d_inner + 2 * n_group * d_state + n_ssm_head), "mat")
    b.t(tn(MODEL_TENSOR.SSM_CONV1D, i), (4, d_inner + 2 * n_group * d_state), "mat_f32")
    # optional to the loader, but llama.cpp's Mamba-2 layer adds it
    b.t(tn(MODEL_TENSOR.SSM_CONV1D, i, "bias"), (d_inner + 2 * n_group * d_state,), "bias")
    b.t(tn(MODEL_TENSOR.SSM_DT, i, "bias"), (n_ssm_head,), "bias")
    b.t(tn(MODEL_TENSOR.SSM_A, i, None), (1, n_ssm_head), "neg_ones")
    b.t(tn(MODEL_TENSOR.SSM_D, i, None), (1, n_ssm_head), "norm")
    b.t(tn(MODEL_TENSOR.SSM_NORM, i), (d_inner // n_group, n_group), "norm")
    b.t(tn(MODEL_TENSOR.SSM_OUT, i), (d_inner, d.n_embd), "mat")


def _granitehybrid(d: Dims) -> ArchModel:
    """Granite 4.0-H: Mamba-2 layers and attention layers (head_count_kv 0 marks the Mamba ones), an MoE
    FFN with a shared expert in every layer, Granite's scales."""
    b = _Builder("granitehybrid", d)
    kinds = ["ssm", "attn", "ssm", "ssm"][: d.n_layer]
    d_inner, d_state, n_group, n_ssm_head = 2 * d.n_embd, 16, 1, 8
    b.base_keys(n_ff=d.n_ff_exp)  # its experts take feed_forward_length
    b.keys = [k for k in b.keys if k[0] != Keys.Attention.HEAD_COUNT_KV.format(arch="granitehybrid")]
    b.key(Keys.Attention.HEAD_COUNT_KV, [d.n_head_kv if k == "attn" else 0 for k in kinds], GGUFValueType.ARRAY)
    b.key(Keys.LLM.LOGIT_SCALE, 4.0, F32)
    b.key(Keys.LLM.RESIDUAL_SCALE, 0.25, F32)
    b.key(Keys.LLM.EMBEDDING_SCALE, 8.0, F32)
    b.key(Keys.Attention.SCALE, 1.0 / d.head_dim, F32)
    b.key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 2 * d.n_ff_exp, U32)
    b.key(Keys.SSM.CONV_KERNEL, 4, U32)
    b.key(Keys.SSM.INNER_SIZE, d_inner, U32)
    b.key(Keys.SSM.STATE_SIZE, d_state, U32)
    b.key(Keys.SSM.TIME_STEP_RANK, n_ssm_head, U32)
    b.key(Keys.SSM.GROUP_COUNT, n_group, U32)
    b.embeddings()
    n_q, n_kv = d.n_head * d.head_dim, d.n_head_kv * d.head_dim
    for i, kind in enumerate(kinds):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        if kind == "ssm":
            _mamba2(b, i, d_inner, d_state, n_group, n_ssm_head)
        else:
            b.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, n_q), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_K, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_V, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_OUT, i), (n_q, d.n_embd), "mat")
        b.moe(i, shexp=2 * d.n_ff_exp)
    return b.model("granitehybrid", list(range(d.n_layer)),
                   notes="hybrid: Mamba-2 in three layers of four, attention in the other; experts and a shared expert "
                   "in every layer, Granite's scales")


def _jamba(d: Dims) -> ArchModel:
    """Jamba: Mamba (1) layers with one attention layer in four (no RoPE), MoE in every other layer and a
    dense FFN between, softmax gating without weight normalisation."""
    b = _Builder("jamba", d)
    kinds = ["ssm", "ssm", "attn", "ssm"][: d.n_layer]
    d_inner, d_state, dt_rank, d_conv = 2 * d.n_embd, 16, 8, 4
    d = replace(d, n_ff=d.n_ff_exp)  # experts and dense FFNs both take feed_forward_length
    b.d = d
    b.base_keys(rope=False)
    b.keys = [k for k in b.keys if k[0] != Keys.Attention.HEAD_COUNT_KV.format(arch="jamba")]
    b.key(Keys.Attention.HEAD_COUNT_KV, [d.n_head_kv if k == "attn" else 0 for k in kinds], GGUFValueType.ARRAY)
    b.key(Keys.SSM.CONV_KERNEL, d_conv, U32)
    b.key(Keys.SSM.INNER_SIZE, d_inner, U32)
    b.key(Keys.SSM.STATE_SIZE, d_state, U32)
    b.key(Keys.SSM.TIME_STEP_RANK, dt_rank, U32)
    b.embeddings()
    n_kv = d.n_head_kv * d.head_dim
    for i, kind in enumerate(kinds):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        if kind == "ssm":
            b.t(tn(MODEL_TENSOR.SSM_IN, i), (d.n_embd, 2 * d_inner), "mat")
            b.t(tn(MODEL_TENSOR.SSM_CONV1D, i), (d_conv, d_inner), "mat_f32")
            b.t(tn(MODEL_TENSOR.SSM_CONV1D, i, "bias"), (d_inner,), "bias")
            b.t(tn(MODEL_TENSOR.SSM_X, i), (d_inner, dt_rank + 2 * d_state), "mat")
            b.t(tn(MODEL_TENSOR.SSM_DT_NORM, i), (dt_rank,), "norm")
            b.t(tn(MODEL_TENSOR.SSM_DT, i), (dt_rank, d_inner), "mat_f32")
            b.t(tn(MODEL_TENSOR.SSM_DT, i, "bias"), (d_inner,), "bias")
            b.t(tn(MODEL_TENSOR.SSM_B_NORM, i), (d_state,), "norm")
            b.t(tn(MODEL_TENSOR.SSM_C_NORM, i), (d_state,), "norm")
            b.t(tn(MODEL_TENSOR.SSM_A, i, None), (d_state, d_inner), "neg_ones")
            b.t(tn(MODEL_TENSOR.SSM_D, i, None), (d_inner,), "norm")
            b.t(tn(MODEL_TENSOR.SSM_OUT, i), (d_inner, d.n_embd), "mat")
        else:
            b.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, d.n_embd), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_K, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_V, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_OUT, i), (d.n_embd, d.n_embd), "mat")
        if i % 2:
            b.moe(i)
        else:
            b.dense_ffn(i)
    return b.model("jamba", [i for i in range(d.n_layer) if i % 2],
                   notes="hybrid: Mamba in three layers of four, attention without RoPE in the other; MoE every other "
                   "layer (dense between), softmax gating without weight normalisation")


def _lfm2moe(d: Dims) -> ArchModel:
    """LFM2-MoE: short-convolution layers and attention layers (head_count_kv 0 marks the convolutions), a
    dense first layer, sigmoid gating with a selection bias."""
    b = _Builder("lfm2moe", d)
    kinds = ["conv", "conv", "attn", "conv"][: d.n_layer]
    l_cache = 3
    b.base_keys()
    b.keys = [k for k in b.keys if k[0] != Keys.Attention.HEAD_COUNT_KV.format(arch="lfm2moe")]
    b.key(Keys.Attention.HEAD_COUNT_KV, [d.n_head_kv if k == "attn" else 0 for k in kinds], GGUFValueType.ARRAY)
    b.key(Keys.ShortConv.L_CACHE, l_cache, U32)
    b.moe_keys(lead=1, gating=GATING_SIGMOID)
    b.t(tn(MODEL_TENSOR.TOKEN_EMBD), (d.n_embd, -1), "embd")
    b.t(tn(MODEL_TENSOR.TOKEN_EMBD_NORM), (d.n_embd,), "norm")  # LFM2's final norm, under this name
    n_kv = d.n_head_kv * d.head_dim
    for i, kind in enumerate(kinds):
        b.t(tn(MODEL_TENSOR.ATTN_NORM, i), (d.n_embd,), "norm")
        if kind == "conv":
            b.t(tn(MODEL_TENSOR.SHORTCONV_CONV, i), (l_cache, d.n_embd), "mat_f32")
            b.t(tn(MODEL_TENSOR.SHORTCONV_INPROJ, i), (d.n_embd, 3 * d.n_embd), "mat")
            b.t(tn(MODEL_TENSOR.SHORTCONV_OUTPROJ, i), (d.n_embd, d.n_embd), "mat")
        else:
            b.t(tn(MODEL_TENSOR.ATTN_Q, i), (d.n_embd, d.n_embd), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_K, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_V, i), (d.n_embd, n_kv), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_OUT, i), (d.n_embd, d.n_embd), "mat")
            b.t(tn(MODEL_TENSOR.ATTN_Q_NORM, i), (d.head_dim,), "norm")
            b.t(tn(MODEL_TENSOR.ATTN_K_NORM, i), (d.head_dim,), "norm")
        b.ffn(i, probs_b=True)
    return b.model("lfm2moe", list(range(1, d.n_layer)),
                   notes="hybrid: short convolutions in three layers of four, attention in the other; sigmoid gating "
                   "with a selection bias, a dense first layer, tied embeddings")


def _grovemoe(d: Dims) -> ArchModel:
    """GroveMoE: beside the routed experts, smaller "adjugate" experts, one per group of two routed ones
    (ffn_*_chexps), run with the same router's probabilities and added scaled; both from one router
    computed outside build_moe_ffn."""
    b = _Builder("grovemoe", d)
    per_group = 2
    b.base_keys()
    b.key(Keys.LLM.EXPERT_CHUNK_FEED_FORWARD_LENGTH, d.n_ff_exp // 2, U32)
    b.key(Keys.LLM.EXPERT_GROUP_SCALE, 0.05, F32)
    b.key(Keys.LLM.EXPERTS_PER_GROUP, per_group, U32)
    b.embeddings()
    n_ch = d.n_expert // per_group
    for i in range(d.n_layer):
        b.attention(i, qk_norm="head")
        b.moe(i)
        b.t(tn(MODEL_TENSOR.FFN_GATE_CHEXP, i), (d.n_embd, d.n_ff_exp // 2, n_ch), "exps")
        b.t(tn(MODEL_TENSOR.FFN_DOWN_CHEXP, i), (d.n_ff_exp // 2, d.n_embd, n_ch), "exps_down")
        b.t(tn(MODEL_TENSOR.FFN_UP_CHEXP, i), (d.n_embd, d.n_ff_exp // 2, n_ch), "exps")
    return b.model("grovemoe", list(range(d.n_layer)),
                   notes="adjugate (chunk) experts, one per group of two routed ones, beside the routed experts; the "
                   "router computed outside build_moe_ffn")


CONFIGS: dict[str, Callable[[Dims], ArchModel]] = {
    "kimi-linear": _kimi_linear,
    "nemotron_h_moe": lambda d: _nemotron_h_moe(d, False),
    "nemotron_h_moe-per-layer-k": lambda d: _nemotron_h_moe(d, True),
    "gemma4": lambda d: _gemma4(d, True),
    "gemma4-unscaled": lambda d: _gemma4(d, False),
    "qwen3next": lambda d: _qwen3next(d, "qwen3next"),
    "qwen35moe": lambda d: _qwen3next(d, "qwen35moe"),
    "qwen2moe": _qwen2moe,
    "olmoe": _olmoe,
    "llama": _mixtral,
    "granitemoe": lambda d: _granitemoe(d, False),
    "granitemoe-shared": lambda d: _granitemoe(d, True),
    "ernie4_5-moe": _ernie,
    "dots1": _dots1,
    "hunyuan-moe": _hunyuan,
    "bailingmoe2": _bailingmoe2,
    "minimax-m2": _minimax_m2,
    "glm4moe": lambda d: _glm4moe(d, False),
    "glm4moe-mtp": lambda d: _glm4moe(d, True),
    "deepseek2": lambda d: _deepseek2(d, "v3"),
    "deepseek2-lite": lambda d: _deepseek2(d, "lite"),
    "deepseek2-fused": lambda d: _deepseek2(d, "fused"),
    "llama4": _llama4,
    "arctic": _arctic,
    "dbrx": _dbrx,
    "deepseek": _deepseek,
    "grok": _grok,
    "phimoe": _phimoe,
    "qwen3vlmoe": _qwen3vlmoe,
    "bailingmoe": _bailingmoe,
    "mistral3": _mistral3,
    "smallthinker": _smallthinker,
    "exaone-moe": _exaone_moe,
    "afmoe": _afmoe,
    "mimo2": _mimo2,
    "step35": _step35,
    "glm-dsa": _glm_dsa,
    "granitehybrid": _granitehybrid,
    "jamba": _jamba,
    "lfm2moe": _lfm2moe,
    "grovemoe": _grovemoe,
}


def arch_model(config: str, dims: Dims | None = None) -> ArchModel:
    try:
        make = CONFIGS[config]
    except KeyError:
        raise LlamaMoeError(f"unknown architecture {config!r}: one of qwen3moe, gpt-oss, {', '.join(CONFIGS)}") from None
    return make(dims or Dims())


# --- values ----------------------------------------------------------------------------------


def values(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Float values of a tensor, numpy order (ne reversed). Scales keep a random model's activations near
    unit size through the layers: matrices 1/sqrt(fan-in), norms one, biases small, routers peaked."""
    shape = spec.ne[::-1]
    fan_in = spec.ne[0]
    if spec.kind == "norm":
        return np.ones(shape, np.float32)
    if spec.kind == "neg_ones":
        return -np.ones(shape, np.float32)
    if spec.kind in ("bias", "sel_bias"):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02 if spec.kind == "bias" else 0.05)
    if spec.kind == "router":
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(3.0 / np.sqrt(fan_in))
    if spec.kind == "embd":
        return rng.standard_normal(shape, dtype=np.float32)
    if spec.kind in ("mat", "mat_f32", "out"):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(fan_in))
    raise LlamaMoeError(f"no values for tensor kind {spec.kind!r}")


def expert_scale(spec: TensorSpec) -> float:
    # gate/up pre-activations of unit size; down projections small, so the residual stays led by attention
    return (0.1 if spec.kind == "exps_down" else 1.0) / float(np.sqrt(spec.ne[0]))


def chunks_of_experts(spec: TensorSpec, make: Callable[[int], np.ndarray]) -> Iterator[np.ndarray]:
    for e in range(spec.ne[2]):
        yield make(e)
