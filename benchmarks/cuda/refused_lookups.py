"""On a CUDA build: upload-mode lookups the cache refuses (a ubatch whose tokens x k exceed a layer's slots) with
the cache in VRAM. The prompt goes in ubatches of 4 tokens; at 2 k slots a layer refuses them and serves the
generated tokens, at k / 2 it refuses every lookup. Checks that hits + misses + refused are the selections, per
layer and in all, that they are what the replay of the engine's own routing counts, and that the tokens are
those of no cache (by llama_moe.equivalence's rule: identical, or parting at a near tie).

python benchmarks/cuda/refused_lookups.py [MODEL]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.equivalence import PROMPTS
from llama_moe.experts import expert_layout
from llama_moe.routing.budget import cache_bytes_for_slots

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # tests/: the independent replay the engine is held to
from oracles.lru import simulate_lru  # noqa: E402

PIECES = dict(n_batch=4, n_ubatch=4)


def run(path: Path, mib: float, n_gen: int):
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model, \
         Context(model, ContextParams(n_ctx=512, moe_cache_mib=mib, **PIECES)) as ctx:
        ctx.start_trace()
        tokens = list(ctx.generate(PROMPTS[0], max_tokens=n_gen, stop_at_eog=False))
        return tokens, ctx.stop_trace(), ctx.moe_cache_stats(), ctx.layer_stats()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("-n", type=int, default=48)
    args = ap.parse_args()
    if args.model:
        path = Path(args.model)
    else:
        from llama_moe.synth import synthesize

        path = Path(tempfile.mkdtemp()) / "tiny.gguf"
        synthesize(path, shape="tiny", expert_type="q8_0", seed=0)
    layout = expert_layout(path)
    k = layout.n_expert_used
    plain, *_ = run(path, 0, args.n)
    ok = True
    for slots in (2 * k, k // 2):
        mib = (cache_bytes_for_slots(layout, slots, False) + layout.layers[0].bytes_per_expert) / 2**20
        tokens, records, s, layers = run(path, mib, args.n)
        sim = simulate_lru(records, {l.il: slots for l in layout.layers}, layout.n_expert)
        selected = {l.il: 0 for l in layout.layers}
        for r in records:
            if r.n_tokens <= 32:
                selected[r.il] += len(np.unique(r.experts))
        same = next((i for i, (a, b) in enumerate(zip(tokens, plain)) if a != b), None)
        checks = {
            "refused > 0": s.n_refused > 0,
            "hits + misses + refused = selections, per layer": all(
                l.n_hit + l.n_miss + l.n_refused == selected[l.il] for l in layers),
            "the replay's hits, misses, refused": (s.n_hit, s.n_miss, s.n_refused) == (sim.n_hit, sim.n_miss, sim.n_refused),
            "the replay's per layer": all((l.n_hit, l.n_miss) == sim.per_layer[l.il] and
                                          l.n_refused == sim.per_layer_refused[l.il] for l in layers),
        }
        good = all(checks.values())
        ok &= good
        print(f"{slots} slots per layer: {s.n_hit} hits, {s.n_miss} misses, {s.n_refused} refused of "
              f"{sum(selected.values())} selections, hit rate {s.hit_rate:.4f}; tokens "
              f"{'identical to no cache' if same is None else f'part from no cache at {same}'} -> "
              f"{'ok' if good else 'WRONG: ' + ', '.join(n for n, v in checks.items() if not v)}")
    print("REFUSED OK" if ok else "REFUSED WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
