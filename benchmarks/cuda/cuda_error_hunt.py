"""One experiment of the CUDA crash hunt (run each in its own process: a CUDA error aborts it).
python benchmarks/cuda/cuda_error_hunt.py MODEL EXPERIMENT"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

from llama_moe import Context, ContextParams, Model, ModelParams  # noqa: E402
from llama_moe.tools.experts import expert_layout  # noqa: E402

path, what = Path(sys.argv[1]), sys.argv[2]
text = ("The ship left the harbour at dawn, and the crew sang as the sails filled with the morning wind. " * 12)


def decode(mp: ModelParams, cp: ContextParams, ubatch: int, trace: bool) -> None:
    with Model(path, mp) as model, Context(model, cp) as ctx:
        tokens = model.tokenize(text)[:200]
        if trace:
            ctx.start_trace()
        for a in range(0, len(tokens), ubatch):
            ctx.decode(tokens[a:a + ubatch], all_logits=True)
        n = len(ctx.stop_trace()) if trace else 0
        s = ctx.moe_cache_stats()
        print(f"{what}: ok, {n} trace records, n_copy {s.n_copy if s else '-'}", flush=True)


total = expert_layout(path).total_expert_bytes / 2**20
mmap, pinned = ModelParams(cpu_moe=True, repack=False), ModelParams(cpu_moe=True, use_mmap=False, repack=False)
if what == "plain-mmap-u32":
    decode(mmap, ContextParams(n_ctx=1024, n_batch=32, n_ubatch=32), 32, False)
elif what == "plain-pinned-u512":
    decode(pinned, ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512), 200, False)
elif what == "trace-mmap-u32":
    decode(mmap, ContextParams(n_ctx=1024, n_batch=32, n_ubatch=32), 32, True)
elif what == "trace-mmap-u16":
    decode(mmap, ContextParams(n_ctx=1024, n_batch=16, n_ubatch=16), 16, True)
elif what == "trace-long":  # what train_profile does: 4096-token windows of the corpus, 32 tokens a decode
    from llama_moe.tools.bench.corpus_profile import train_profile
    train_profile(path, Path("/tmp/bisect.strp"), log=lambda s: None)
    print(f"{what}: ok", flush=True)
elif what in ("plain-long", "plain-long-last"):  # trace-long's decodes without the trace (every logit, or the last)
    from llama_moe.tools.synth.corpus import split_paragraphs
    split = split_paragraphs()
    text = "\n\n".join(p for topic in sorted(split.train) for p in split.train[topic])
    with Model(path, mmap) as model, Context(model, ContextParams(n_ctx=4096, n_batch=32, n_ubatch=32)) as ctx:
        tokens = model.tokenize(text)
        for start in range(0, len(tokens), 4096):
            window = tokens[start:start + 4096]
            ctx.reset()
            for a in range(0, len(window), 32):
                ctx.decode(window[a:a + 32], all_logits=what == "plain-long")
    print(f"{what}: ok, {len(tokens)} tokens", flush=True)
elif what == "plain-u32-ctx4096":  # trace-long's context without the trace
    decode(mmap, ContextParams(n_ctx=4096, n_batch=32, n_ubatch=32), 32, False)
elif what == "trace-u32-ctx4096":
    decode(mmap, ContextParams(n_ctx=4096, n_batch=32, n_ubatch=32), 32, True)
elif what == "trace-512":
    from llama_moe.tools.bench.corpus_profile import train_profile
    train_profile(path, Path("/tmp/bisect.strp"), log=lambda s: None, n_ctx=512)
    print(f"{what}: ok", flush=True)
elif what == "hybrid-u16":  # ubatches of 9-32 tokens on the device: MMQ, where repeated null slots went wrong
    decode(pinned, ContextParams(n_ctx=1024, n_batch=16, n_ubatch=16, moe_cache_mib=total / 2, moe_cache_hybrid=True,
                                 moe_cache_adaptive=True), 16, False)
elif what == "upload-pinned-u512":
    decode(pinned, ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, moe_cache_mib=total / 2), 200, False)
elif what == "hybrid-pinned-u512":
    decode(pinned, ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, moe_cache_mib=total / 2, moe_cache_hybrid=True,
                                 moe_cache_adaptive=True), 200, False)
elif what == "hybrid-pinned-u1":
    decode(pinned, ContextParams(n_ctx=1024, moe_cache_mib=total / 2, moe_cache_hybrid=True, moe_cache_adaptive=True), 1, False)
