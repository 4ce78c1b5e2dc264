"""On a CUDA build: the MoE cache on the GPU against llama.cpp's own CPU path for experts in RAM, by
llama_moe.tools.equivalence's rule (tokens identical, or parting only at a near tie with teacher-forced logits within
the model's device tolerance of the largest: DEVICE_TOLERANCE, or more where the GPU's kernels alone move this model's
logits more, as the same model all in VRAM shows against no cache), the hybrid through the mailbox against the hybrid through the scheduler (the same kernels on
both sides: bit-identical tokens and logits), and the prompt copies (bit-identical logits).

python benchmarks/cuda/equivalence.py [MODEL] [-n 256]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import numpy as np

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe._native.env import environment
from llama_moe.batch import generate_batch
from llama_moe.tools.equivalence import (DEVICE_TOLERANCE, PROMPTS, Mode, compare, compare_mode, greedy_steps, max_rel_diff,
                                         reference, top_gap)
from llama_moe.tools.experts import expert_layout


def prompt_copies(path: Path, total_mib: float, profile: Path) -> bool:
    """A prompt longer than 32 tokens keeps llama.cpp's path, but the experts the cache holds come from their
    slots (n_copy): the same bytes, so the prompt's logits must be bit-identical to no cache."""
    ok = True
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model:
        text = " ".join(PROMPTS) * 8
        tokens = model.tokenize(text)[:200]
        results = {}
        for name, mib, cache in [("none", 0, {}), ("upload", total_mib / 2, {"moe_cache_profile": profile}),
                                 ("hybrid", total_mib / 2, {"moe_cache_hybrid": True, "moe_cache_profile": profile})]:
            with Context(model, ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, moe_cache_mib=mib, **cache)) as ctx:
                ctx.decode(tokens)
                results[name] = (ctx.logits(), ctx.moe_cache_stats())
        ref = results["none"][0]
        for name in ("upload", "hybrid"):
            logits, stats = results[name]
            diff = float(np.max(np.abs(logits - ref)))
            good = diff == 0 and stats.n_copy > 0
            ok &= good
            print(f"prompt of {len(tokens)} tokens, {name} cache at 50%: {stats.n_copy} experts ({stats.n_bytes_copy / 2**20:.1f} MiB) "
                  f"copied from the cache, logits max |diff| {diff:.3g} -> {'ok' if good else 'WRONG'}")
    return ok


def ram_tier_check(path: Path, prompts: list[str], n: int, pcts: list[int]) -> bool:
    """The RAM tier on a GPU build: the experts stay on the CPU, read from the model's file into the tier's slots
    (the model loaded with lazy experts), the rest of the model on the GPU. Against the same model without a tier:
    the CPU computes the same experts from the same bytes, so the tokens must be identical; the logits are held to
    the device tolerance (a prompt's experts may go to the GPU by llama.cpp's op offload on either side) and the
    largest difference is printed."""
    from llama_moe.tools.routing.budget import mib_for_slots

    layout = expert_layout(path)
    ok = True
    with Model(path, ModelParams(cpu_moe=True, lazy_experts=True, repack=False)) as model:
        for prompt in prompts:
            ref = reference(model, prompt, n)
            for pct in pcts:
                slots = max(layout.n_expert_used, min(layout.n_expert - 1, round(layout.n_expert * pct / 100)))
                cp = ContextParams(n_ctx=1024, moe_ram_mib=mib_for_slots(layout, slots, False))
                c = compare(model, ref, cp, prompt, DEVICE_TOLERANCE)
                s = c.stats
                good = c.ok and c.identical and s is not None and s.ram_tier and s.n_disk_reads > 0
                ok &= good
                print(f"{prompt[:30]!r:34} ram-tier     {pct:3d}%: {c.describe()} over {n} -> {'ok' if good else 'WRONG'}; "
                      + (f"hit rate {s.hit_rate:.3f}, {s.n_disk_reads} reads, {s.n_bytes_disk / 2**20:.1f} MiB from the file, "
                         f"{s.n_bytes_disk_prompt / 2**20:.1f} MiB of it for prompts, {s.n_slots} slots"
                         if s else "no tier (the engine turned it off)"))
    return ok


def three_tiers_check(path: Path, prompts: list[str], n: int, pcts: list[int], profile: Path) -> bool:
    """Three tiers on a GPU build: the device cache over the RAM tier (the model loaded with lazy experts), in
    upload mode, the hybrid with a profile, the admitting hybrid (its uploads between decodes: the tier fetches on
    the graph's thread) and the adaptive hybrid, each at pct% of the experts in VRAM over a tier of a quarter of
    them. Against no cache, by the device rule (the GPU computes the cached experts); the tier's lookups and reads
    must be there."""
    from llama_moe.tools.routing.budget import mib_for_slots

    layout = expert_layout(path)
    quarter = max(layout.n_expert_used, layout.n_expert // 4)
    hybrid = {"moe_cache_hybrid": True, "moe_cache_profile": str(profile)}
    modes = {"upload": {}, "hybrid": hybrid, "admit": {**hybrid, "moe_cache_admit": 1},
             "adaptive": {"moe_cache_hybrid": True, "moe_cache_adaptive": True}}
    ok = True
    with Model(path, ModelParams(cpu_moe=True, lazy_experts=True, repack=False)) as model:
        for prompt in prompts:
            ref = reference(model, prompt, n)
            for (name, mode), pct in [(m, p) for m in modes.items() for p in pcts]:
                slots = max(1, min(layout.n_expert - 1, round(layout.n_expert * pct / 100)))
                cp = ContextParams(n_ctx=1024, moe_cache_mib=mib_for_slots(layout, slots, name != "upload"),
                                   moe_ram_mib=mib_for_slots(layout, quarter, False), **mode)
                c = compare(model, ref, cp, prompt, DEVICE_TOLERANCE)
                s = c.stats
                good = c.ok and s is not None and s.ram_below and s.n_ram_hit + s.n_ram_miss > 0
                ok &= good
                print(f"{prompt[:30]!r:34} three tiers {name:8} {pct:3d}%: {c.describe()} over {n} -> {'ok' if good else 'WRONG'}; "
                      + (f"VRAM hit rate {s.hit_rate:.3f}, RAM tier {s.n_ram_hit} hits {s.n_ram_miss} misses, "
                         f"{s.n_bytes_disk / 2**20:.1f} MiB from the file" if s else "no cache (the engine turned it off)"))
    return ok


# a cache mode mixes experts computed by the GPU's kernels and by the CPU's: its logits may stand as far from no
# cache's as all in VRAM does (every expert on the GPU), with headroom for the mix; an expert computed wrongly
# moves them by tenths of the largest, far beyond
NOISE_HEADROOM = 1.5


def device_noise(path: Path, ref: tuple[list[int], np.ndarray], prompt: str) -> float:
    """All in VRAM (no expert in RAM, no cache), fed no cache's tokens: its largest logit difference from no
    cache, of the largest |logit|."""
    with Model(path, ModelParams(use_mmap=False)) as gpu:
        _, steps, _ = greedy_steps(gpu, ContextParams(n_ctx=1024), prompt, len(ref[0]), forced=ref[0])
    return max_rel_diff(steps, ref[1])


def batch_check(model: Model, modes: dict, mib_at, pcts: list[int], n: int) -> bool:
    """Several sequences at once: a 154-token prompt (llama.cpp's path, with the copies from the cache) beside a
    short one (the cache's path), greedy, in each mode against the same batch without a cache. Where a sequence's
    tokens part, no cache's top-two gap at that step (that sequence decoded alone, teacher-forced) says whether it
    is a near tie."""
    from llama_moe.tools.synth.corpus import load_corpus, paragraphs

    texts = [p for t in load_corpus().values() for p in paragraphs(t)]
    prompts: list = [model.tokenize(texts[45] + " " + texts[46], add_special=False)[:154], PROMPTS[0]]

    def batch(cp: ContextParams) -> tuple[list[list[int]], object]:
        with Context(model, cp) as ctx:
            res = generate_batch(ctx, prompts, n, stop_at_eog=False)
            return [list(c.tokens) for c in res.completions], ctx.moe_cache_stats()

    ref, _ = batch(ContextParams(n_ctx=1024, n_seq_max=2))
    ok = True
    for name, pct in [(m, p) for m in modes for p in pcts]:
        with environment(**modes[name].env):
            got, s = batch(ContextParams(n_ctx=1024, n_seq_max=2, moe_cache_mib=mib_at(pct), **modes[name].cache))
        parts = []
        good = s is not None and s.n_hit + s.n_miss > 0
        for i, (a, b) in enumerate(zip(got, ref)):
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if k is None:
                continue
            with Context(model, ContextParams(n_ctx=1024)) as ctx:
                p = prompts[i] if isinstance(prompts[i], list) else model.tokenize(prompts[i])
                ctx.decode(p + b[:k])
                logits = ctx.logits()
            gap = top_gap(logits) / (float(np.max(np.abs(logits))) or 1.0)
            good &= gap <= DEVICE_TOLERANCE
            parts.append(f"sequence {i} parts at {k} (top two {gap:.1e} apart{', a near tie' if gap <= DEVICE_TOLERANCE else ''})")
        ok &= good
        print(f"batch of 2 (154 and {len(model.tokenize(PROMPTS[0]))} tokens) {name:12} {pct:3d}%: "
              f"{'; '.join(parts) or 'tokens identical'} over {n} -> {'ok' if good else 'WRONG'}; "
              f"{s.n_hit if s else 0} hits, {s.n_miss if s else 0} misses, {s.n_admit if s else 0} admitted")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--prompt-only", action="store_true", help="only the prompt copies (n_copy) check")
    ap.add_argument("--no-prompt", action="store_true", help="skip the prompt copies (n_copy) check")
    ap.add_argument("--shape", default="tiny", help="without a model: the synthetic shape (gpt-oss-tiny: expert biases)")
    ap.add_argument("--experts", default="q8_0", help="without a model: the experts' type")
    ap.add_argument("--arch", help="without a model: a tiny random-weight model of this architecture (synth --arch)")
    ap.add_argument("--modes", help="the modes to compare with no cache, comma-separated (default: all)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the prompts")
    ap.add_argument("--pcts", default="25,50,100", help="the cache sizes, in percent of the experts")
    ap.add_argument("--batch", action="store_true", help="only several sequences at once (batch_check)")
    ap.add_argument("--ram-tier", action="store_true", help="only the RAM tier against no tier (ram_tier_check)")
    ap.add_argument("--three-tiers", action="store_true", help="only the device cache over the RAM tier (three_tiers_check)")
    args = ap.parse_args()
    import logging
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.model:
        path = Path(args.model)
    elif args.arch:
        from llama_moe.tools.synth.synthesize import synthesize_arch
        path = Path(tempfile.mkdtemp()) / f"{args.arch}-{args.experts}.gguf"
        synthesize_arch(path, args.arch, expert_type=args.experts, seed=0)
    else:
        from llama_moe.tools.synth.synthesize import synthesize
        path = Path(tempfile.mkdtemp()) / f"{args.shape}-{args.experts}.gguf"
        synthesize(path, shape=args.shape, expert_type=args.experts, seed=0)
    layout = expert_layout(path)
    total = layout.total_expert_bytes / 2**20

    def mib_at(pct: int) -> float:
        """The cache for pct% of each layer's experts (below 100, at least one expert short of the whole layer,
        so the cache's path runs and the layers are not simply held whole). Sized by the engine's arithmetic: a
        fixed +1 MiB holds every expert of the small architectures' tiny models."""
        if pct >= 100:
            return total + 1
        from llama_moe.tools.routing.budget import cache_bytes_for_slots
        slots = max(1, min(layout.n_expert - 1, round(layout.n_expert * pct / 100)))
        half = sum(l.bytes_per_expert for l in layout.layers) // 2
        return (cache_bytes_for_slots(layout, slots, True) + half) / 2**20
    from llama_moe.tools.bench.corpus_profile import train_profile

    # short windows: on the tiny model (head_dim 32, no flash attention on CUDA) tracing in 4096-token windows
    # traps the device with CUDA graphs, on the unpatched base too (benchmarks/cuda/results/2026-12-01-h200-mailbox-ring/trap.md)
    profile = train_profile(path, Path(tempfile.mkdtemp()) / "train.strp", log=lambda s: None, n_ctx=512)
    # hybrid and adaptive hand over through the mailbox on CUDA; hybrid-split through the scheduler
    hybrid = {"moe_cache_hybrid": True, "moe_cache_profile": profile}
    # (the mailbox's device reads its default share of the misses from the host copy; gpu-reads-all every one)
    modes = {"upload": Mode(), "hybrid": Mode(hybrid), "hybrid-split": Mode({**hybrid, "moe_cache_mailbox": False}),
             "gpu-reads-all": Mode({**hybrid, "moe_cache_mailbox_gpu_share": 1}),
             "cpu-reads-all": Mode({**hybrid, "moe_cache_mailbox_gpu_share": 0}),
             "adaptive": Mode({"moe_cache_hybrid": True, "moe_cache_adaptive": True}),
             "adaptive-profile": Mode({**hybrid, "moe_cache_adaptive": True}),
             # the admitting hybrid: misses uploaded into the least recently used slots between decodes
             "admit": Mode({**hybrid, "moe_cache_admit": 1}),
             "admit4": Mode({**hybrid, "moe_cache_admit": 4}),
             # the engine chooses the budget from the measured upload time and the decode's
             "admit-auto": Mode({**hybrid, "moe_cache_admit": "auto"}),
             # the uploads between decodes instead of in the background (the default on a GPU)
             "admit-sync": Mode({**hybrid, "moe_cache_admit": 1, "moe_cache_admit_async": False}),
             "admit-split": Mode({**hybrid, "moe_cache_admit": 1, "moe_cache_mailbox": False}),
             # slots moved between layers every 16 decodes, with the uploads in the background and between decodes
             "admit-repart": Mode({**hybrid, "moe_cache_admit": 2, "moe_cache_repartition": 16}),
             "admit-repart-sync": Mode({**hybrid, "moe_cache_admit": 2, "moe_cache_repartition": 16,
                                        "moe_cache_admit_async": False})}
    if args.modes:
        modes = {name: modes[name] for name in args.modes.split(",")}
    if args.ram_tier:
        ok = ram_tier_check(path, PROMPTS[:args.prompts], args.n, [int(p) for p in args.pcts.split(",") if int(p) < 100])
        print("EQUIVALENT" if ok else "DIFFERENT")
        return 0 if ok else 1
    if args.three_tiers:
        ok = three_tiers_check(path, PROMPTS[:args.prompts], args.n, [int(p) for p in args.pcts.split(",") if int(p) < 100],
                               profile)
        print("EQUIVALENT" if ok else "DIFFERENT")
        return 0 if ok else 1
    if args.batch:
        with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model:
            ok = batch_check(model, modes, mib_at, [int(p) for p in args.pcts.split(",") if int(p) < 100], args.n)
        print("EQUIVALENT" if ok else "DIFFERENT")
        return 0 if ok else 1
    ok = True if args.no_prompt else prompt_copies(path, total, profile)
    if args.prompt_only:
        return 0 if ok else 1
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model:
        pcts = [int(p) for p in args.pcts.split(",")]
        for prompt in PROMPTS[:args.prompts]:
            ref = reference(model, prompt, args.n)
            noise = device_noise(path, ref, prompt)
            tolerance = max(DEVICE_TOLERANCE, NOISE_HEADROOM * noise)
            print(f"{prompt[:30]!r:34} all in VRAM: logits within {noise:.1e} of the largest from no cache's; "
                  f"the modes held to {tolerance:.1e}")
            for mode, pct in [(m, p) for m in modes for p in pcts]:
                c = compare_mode(model, ref, modes[mode], mib_at(pct), prompt, tolerance)
                ok &= c.ok
                s = c.stats
                cache = (f"hit rate {s.hit_rate:.3f}, {s.n_miss} misses ({s.n_cpu} split to the CPU), {s.n_swap} swaps, "
                         f"{s.n_admit} admitted, {s.n_slots} slots, {s.n_moved} moved" if s
                         else "no cache (the engine turned it off)")
                print(f"{prompt[:30]!r:34} {mode:12} {pct:3d}%: {c.describe()} over {args.n} -> {'ok' if c.ok else 'WRONG'}; {cache}")
            # the mailbox with the CPU computing every miss changes where the CPU's experts are computed and how they
            # come back, nothing else
            for pct in [p for p in pcts if p < 100]:
                cp = ContextParams(n_ctx=1024, moe_cache_mib=mib_at(pct), **hybrid)
                mailbox = greedy_steps(model, dataclasses.replace(cp, moe_cache_mailbox_gpu_share=0), prompt, args.n)
                split = greedy_steps(model, dataclasses.replace(cp, moe_cache_mailbox=False), prompt, args.n)
                same = mailbox[0] == split[0] and np.array_equal(mailbox[1], split[1])
                ok &= same
                print(f"{prompt[:30]!r:34} mailbox against the scheduler {pct:3d}%: tokens and logits over {args.n} "
                      f"{'bit-identical' if same else 'DIFFERENT'}; {mailbox[2].n_miss} misses -> {'ok' if same else 'WRONG'}")
    print("EQUIVALENT" if ok else "DIFFERENT")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
