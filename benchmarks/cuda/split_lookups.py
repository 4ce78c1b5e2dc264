"""On a CUDA build: upload mode's split with the cache in VRAM against the package's replay of the engine's own
routing. A ubatch that selects more distinct experts of a layer than its slots takes its hits from the slots,
uploads misses into the slots it does not use while any is left, and leaves the others to the CPU (n_cpu). Runs
at 2 k slots (one token fits, a ubatch of 4 tokens may not) and at k / 2 (no token fits): one sequence whose
prompt goes in ubatches of 4 tokens, and three sequences decoded together. Checks that nothing is refused, that
hits + misses are the distinct selections per layer, that the bytes the CPU read are n_cpu experts', and that the
engine's hits, misses and n_cpu, in all and per layer, are what ``llama_moe.tools.routing.lru`` counts on the engine's
trace (and the independent replay of tests/oracles/lru.py); the tokens are compared with no cache's (by
llama_moe.tools.equivalence's rule: identical, or parting at a near tie).

python benchmarks/cuda/split_lookups.py [MODEL]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.tools.equivalence import PROMPTS
from llama_moe.tools.experts import expert_layout
from llama_moe.tools.routing import lru, routes_from_records
from llama_moe.tools.routing.budget import cache_bytes_for_slots
from llama_moe.batch import stream_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # tests/: the independent replay the engine is held to
from oracles.lru import simulate_lru  # noqa: E402

RUNS = {  # name: (context parameters, prompts)
    "one sequence, prompt in ubatches of 4": (dict(n_ctx=512, n_batch=4, n_ubatch=4), PROMPTS[:1]),
    "three sequences at once": (dict(n_ctx=1536, n_seq_max=3), PROMPTS[:3]),
}


def run(model: Model, mib: float, n_gen: int, params: dict, prompts: list[str]):
    with Context(model, ContextParams(moe_cache_mib=mib, **params)) as ctx:
        ctx.start_trace()
        if len(prompts) == 1:
            tokens = list(ctx.generate(prompts[0], max_tokens=n_gen, stop_at_eog=False))
        else:
            tokens = list(stream_batch(ctx, prompts, n_gen, stop_at_eog=False))
        return tokens, ctx.stop_trace(), ctx.moe_cache_stats(), ctx.layer_stats()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("-n", type=int, default=48)
    args = ap.parse_args()
    if args.model:
        path = Path(args.model)
    else:
        from llama_moe.tools.synth import synthesize

        path = Path(tempfile.mkdtemp()) / "tiny.gguf"
        synthesize(path, shape="tiny", expert_type="q8_0", seed=0)
    layout = expert_layout(path)
    k = layout.n_expert_used
    expert_bytes = {l.il: l.bytes_per_expert for l in layout.layers}
    ok = True
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model:
        for name, (params, prompts) in RUNS.items():
            plain, *_ = run(model, 0, args.n, params, prompts)
            for n_slots in (2 * k, max(1, k // 2)):
                slots = {l.il: n_slots for l in layout.layers}
                mib = (cache_bytes_for_slots(layout, n_slots, False) + layout.layers[0].bytes_per_expert) / 2**20
                tokens, records, s, layers = run(model, mib, args.n, params, prompts)
                got = lru(routes_from_records(records), slots, layout.n_expert)
                sim = simulate_lru(records, slots, layout.n_expert)
                selected = {l.il: 0 for l in layout.layers}
                for r in records:
                    if r.n_tokens <= 32:
                        selected[r.il] += len(np.unique(r.experts))
                engine = {l.il: (l.n_hit, l.n_miss, l.n_cpu) for l in layers}
                same = next((i for i, (a, b) in enumerate(zip(tokens, plain)) if a != b), None)
                checks = {
                    "the cache has the slots asked": {l.n_slots for l in layers} == {n_slots},
                    "n_cpu > 0, nothing refused": s.n_cpu > 0 and s.n_refused == 0 and all(l.n_refused == 0 for l in layers),
                    "hits + misses = distinct selections, per layer": all(
                        l.n_hit + l.n_miss == selected[l.il] for l in layers),
                    "bytes read by the CPU = n_cpu experts'": s.n_bytes_cpu == sum(
                        l.n_cpu * expert_bytes[l.il] for l in layers),
                    "the package's replay: hits, misses, n_cpu": (s.n_hit, s.n_miss, s.n_cpu) == (
                        got.n_hit, got.n_miss, got.n_cpu),
                    "the package's replay per layer": engine == {
                        il: (*got.per_layer[il], got.per_layer_cpu[il]) for il in got.per_layer},
                    "the oracle's replay per layer": engine == {
                        il: (*sim.per_layer[il], sim.per_layer_cpu[il]) for il in sim.per_layer},
                }
                good = all(checks.values())
                ok &= good
                print(f"{name}, {n_slots} slots per layer: {s.n_hit} hits, {s.n_miss} misses of which {s.n_cpu} on "
                      f"the CPU in {got.n_split_lookups} split lookups (replay: {got.n_hit}, {got.n_miss}, {got.n_cpu}), "
                      f"{sum(selected.values())} selections, hit rate {s.hit_rate:.4f}; tokens "
                      f"{'identical to no cache' if same is None else f'part from no cache at {same}'} -> "
                      f"{'ok' if good else 'WRONG: ' + ', '.join(n for n, v in checks.items() if not v)}", flush=True)
    print("SPLIT OK" if ok else "SPLIT WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
