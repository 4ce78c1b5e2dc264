"""Where a hybrid's counted hits are computed: on a CUDA build, logits that stay bit-identical to no cache's (the
CPU's path) mean that no expert ran on the GPU's kernels, whatever the counters say. For each setup, 64 greedy
steps against no cache, teacher-forced on no cache's tokens: the first step whose logits differ, the largest
difference, the counters and each layer's resident experts.

python benchmarks/cuda/adaptive_probe.py MODEL [--pct 50] [--profile P] [--poison]

Setups: the adaptive hybrid without a profile, through the mailbox and through the scheduler; the plain hybrid
without a profile whose slots are filled between decodes by admit_experts (filled after creation, no
rebalance); the adaptive hybrid rebalanced by hand after the prompt; with --profile, the control: the plain
hybrid whose slots the profile filled at load, whose hits the GPU computes. Where the GPU's kernels sum a row in
the CPU's order (rows of a few blocks, as the tiny model's) bit-identical logits prove nothing: the control says
whether they part on the model given (a wide one: synth's shape "tiny,n_embd=1024,n_ff_exp=1024").

--poison tells where the hits are computed without comparing kernels (tests/engine/test_hits_from_slots.py on a
GPU): after the slots are filled (at load by the profile, or by admit_experts after the prompt; the mailbox on
and off), the model file's bytes of every expert the cache holds are zeroed while a copy of the model is mapped
(no repack). Hits computed from the slots give the same decode logits as before the zeros; any computed from the
mapping differ. A context without a cache, which reads the zeros, shows the zeros are seen.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.tools.equivalence import PROMPTS, forced_steps, greedy_steps
from llama_moe.tools.experts import expert_layout, zeroed_experts
from llama_moe.tools.routing.budget import mib_for_slots


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--pct", type=int, default=50)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--device", help="the cache's device (CPU: a check of the script without a GPU)")
    ap.add_argument("--profile", type=Path, help="a profile of the model: adds the control setup, filled at load")
    ap.add_argument("--poison", action="store_true", help="zero the file's bytes of the cached experts (see above)")
    a = ap.parse_args()
    if a.poison:
        return poison(a)
    layout = expert_layout(a.model)
    slots = max(1, min(layout.n_expert - 1, round(layout.n_expert * a.pct / 100)))
    mib = mib_for_slots(layout, slots, True)
    prompt = PROMPTS[0]
    hybrid = dict(moe_cache_mib=mib, moe_cache_hybrid=True, **({"moe_cache_device": a.device} if a.device else {}))
    setups = [("adaptive, mailbox", dict(hybrid, moe_cache_adaptive=True), None),
              ("adaptive, scheduler", dict(hybrid, moe_cache_adaptive=True, moe_cache_mailbox=False), None),
              ("hybrid, filled by admit_experts", hybrid, "admit"),
              ("adaptive, rebalanced after the prompt", dict(hybrid, moe_cache_adaptive=True), "rebalance")]
    if a.profile:
        setups.insert(0, ("control: hybrid, filled at load by the profile", dict(hybrid, moe_cache_profile=str(a.profile)), None))
    with Model(a.model, ModelParams(cpu_moe=True, use_mmap=False)) as model:
        ref_tokens, ref, _ = greedy_steps(model, ContextParams(n_ctx=1024), prompt, a.n)
        for name, cp, fill in setups:
            with Context(model, ContextParams(n_ctx=1024, **cp)) as ctx:
                ctx.decode(model.tokenize(prompt))
                if fill == "admit":
                    filled = sum(ctx.admit_experts(l.il, range(l.n_slots)) for l in ctx.layer_stats())
                elif fill == "rebalance":
                    filled = ctx.rebalance(1 << 20)
                else:
                    filled = 0
                diffs = []
                for i in range(a.n):
                    logits = ctx.logits()
                    diffs.append(float(np.max(np.abs(logits - ref[i]))))
                    ctx.decode([ref_tokens[i]])
                s = ctx.moe_cache_stats()
                first = next((i for i, d in enumerate(diffs) if d), None)
                print(f"{name}: filled {filled}; logits first differ at step {first}, largest difference {max(diffs):.3g}; "
                      f"{s.n_hit} hits, {s.n_miss} misses, {s.n_swap} swaps, {s.n_admit} admitted, "
                      f"{s.n_bytes_upload / 2**20:.2f} MiB uploaded", flush=True)
                for l in ctx.layer_stats()[:3]:
                    print(f"    layer {l.il}: {l.n_hit} hits, {l.n_miss} misses, {l.n_cpu} on the CPU; resident "
                          f"{ctx.resident(l.il).tolist()}", flush=True)
    print("PROBE: DONE")
    return 0


def poison(a: argparse.Namespace) -> int:
    layout = expert_layout(a.model)
    slots = max(1, min(layout.n_expert - 1, round(layout.n_expert * a.pct / 100)))
    copy = a.model.with_name(a.model.stem + "-poison.gguf")
    shutil.copyfile(a.model, copy)
    hybrid = dict(n_ctx=1024, moe_cache_mib=mib_for_slots(layout, slots, True), moe_cache_hybrid=True,
                  **({"moe_cache_device": a.device} if a.device else {}))
    setups = [("hybrid, filled by admit_experts, mailbox", hybrid, True),
              ("hybrid, filled by admit_experts, scheduler", dict(hybrid, moe_cache_mailbox=False), True)]
    if a.profile:
        setups += [("hybrid, filled at load by the profile, mailbox", dict(hybrid, moe_cache_profile=str(a.profile)), False),
                   ("hybrid, filled at load by the profile, scheduler",
                    dict(hybrid, moe_cache_profile=str(a.profile), moe_cache_mailbox=False), False)]
    prompt = PROMPTS[0]
    ok = True
    with Model(copy, ModelParams(cpu_moe=True, repack=False, use_mmap=True)) as model:
        steps = model.tokenize(" ".join(PROMPTS[1:]), add_special=False)[: a.n]
        for name, cp, admit in setups:
            got = []
            for zero in (False, True):
                with Context(model, ContextParams(**cp)) as ctx:
                    ctx.decode(model.tokenize(prompt))
                    if admit:
                        for l in ctx.layer_stats():
                            ctx.admit_experts(l.il, [(3 * l.il + 5 * i) % layout.n_expert for i in range(l.n_slots)])
                    resident = {l.il: ctx.resident(l.il).tolist() for l in ctx.layer_stats()}
                    h0 = ctx.moe_cache_stats().n_hit
                    if zero:
                        with zeroed_experts(copy, resident) as n_bytes:
                            logits = forced_steps(ctx, steps)
                    else:
                        logits = forced_steps(ctx, steps)
                    got.append((logits, ctx.moe_cache_stats().n_hit - h0, resident))
            (clean, hits, res0), (zeroed, hits_z, res1) = got
            same = bool(np.array_equal(clean, zeroed))
            ok &= same and res0 == res1
            print(f"{name}: {hits} hits over {len(steps)} steps ({hits_z} with the zeros); "
                  f"{sum(map(len, res1.values()))} experts zeroed ({n_bytes / 2**20:.1f} MiB); decode logits "
                  f"{'identical' if same else 'DIFFER'} (largest difference {float(np.max(np.abs(clean - zeroed))):.3g})", flush=True)
        diffs = []
        for zero in (False, True):
            with Context(model, ContextParams(n_ctx=1024)) as ctx:
                ctx.decode(model.tokenize(prompt))
                if zero:
                    with zeroed_experts(copy, res1):
                        diffs.append(forced_steps(ctx, steps[:8]))
                else:
                    diffs.append(forced_steps(ctx, steps[:8]))
        seen = not np.array_equal(diffs[0], diffs[1])
        print(f"no cache, the same experts zeroed: logits {'differ (the zeros are read)' if seen else 'UNCHANGED (the check sees nothing)'} "
              f"(largest difference {float(np.max(np.abs(diffs[0] - diffs[1]))):.3g})")
        ok &= seen
    copy.unlink()
    print("POISON: " + ("EVERY HIT FROM THE SLOTS" if ok else "SOME HIT NOT FROM THE SLOTS, OR THE CHECK SAW NOTHING"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
