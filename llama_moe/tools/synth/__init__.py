"""Synthetic qwen3moe GGUF models: a real BPE tokenizer, a bigram language model of an embedded
English corpus, and routers calibrated against real routing: hot experts, topics, token-to-token recency and a
depth profile (see config.py, recency.py and docs/synthetic-models.md)."""
from __future__ import annotations

# Bumped when the same arguments would write different bytes: the cached default model is remade then.
SYNTH_VERSION = 4

from llama_moe.tools.synth.config import RoutingConfig
from llama_moe.tools.synth.corpus import CorpusSplit, load_corpus, paragraphs, split_paragraphs
from llama_moe.tools.synth.design import Design, build_design
from llama_moe.tools.synth.hitrate import lru_hit_rate, static_hit_rate
from llama_moe.tools.synth.routing import corpus_routes, next_token_logits, route, router_logits, sample_routes
from llama_moe.tools.synth.shapes import SHAPES, Shape, get_shape, parse_shape
from llama_moe.tools.synth.synthesize import SynthInfo, load_design, synthesize
from llama_moe.tools.synth.tokenizer import CHAT_TEMPLATE, BpeTokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "SHAPES",
    "BpeTokenizer",
    "CorpusSplit",
    "Design",
    "RoutingConfig",
    "Shape",
    "SynthInfo",
    "build_design",
    "corpus_routes",
    "get_shape",
    "load_corpus",
    "load_design",
    "lru_hit_rate",
    "next_token_logits",
    "paragraphs",
    "parse_shape",
    "route",
    "router_logits",
    "sample_routes",
    "split_paragraphs",
    "static_hit_rate",
    "synthesize",
]
