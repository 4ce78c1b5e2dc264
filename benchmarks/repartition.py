"""The admitting hybrid's slots per layer moved online from the miss curves it observes, against equal slots
and against the offline per-layer split, held out, on the synthetic models' calibrated routing.

For each document of the embedded corpus (leave one document out): the other documents give the profile and
every layer's LRU miss curve, and the offline split of the same total of slots (``split_slots``, each layer at
least k, as benchmarks/per_layer_slots.py); the held-out document is then replayed as one stream of one-token
decodes by the hybrid admitting ``--admit`` experts per layer and decode:

- equal: the same slots in every layer;
- offline: the split from the other documents' curves;
- online R: equal slots at the start, re-partitioned every R decodes from the shadow LRU stacks' miss curves
  (the engine's ``--moe-cache-repartition R``, replayed by ``llama_moe.policy_replay``: the simulator's
  ``admitN-repartR``);
- offline + online R: the offline split at the start, then re-partitioned online.

Misses per token count every lookup the slots did not serve; the intervals are 95% t intervals over the
held-out documents; "moved" is the slots moved per 1000 tokens (mean over the documents).

    python benchmarks/repartition.py [--shapes qwen3-30b-a3b,gpt-oss-120b] [--pcts 25,50] [--periods 64,256]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from llama_moe.tools.routing.misscurves import lru_miss_curves, split_slots
from llama_moe.policy_replay import ReplayPolicy
from llama_moe.tools.routing.policies import drive
from llama_moe.tools.routing.policies.engine import ENGINE_CHUNK_TOKENS, EngineReplay
from llama_moe.tools.routing.ranking import rank_pairs

from admit_policies import cell, held_out, shape_arguments, shape_documents, sizes  # the same corpus folds and cells as the admission tables


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(ap)
    ap.add_argument("--periods", default="64,256")
    ap.add_argument("--admit", type=int, default=2)
    ap.add_argument("--no-offline-online", action="store_true", help="leave out the offline + online rows")
    a = ap.parse_args()
    periods = [int(r) for r in a.periods.split(",")]
    for name in a.shapes.split(","):
        t0 = time.monotonic()
        n_l, n_e, k, docs = shape_documents(name, a.seed, f"; admit{a.admit}")
        print("| slots per layer | start | re-partition | misses/token | change against equal | hit rate | "
              "slots moved per 1000 tokens |")
        print("|---|---|---|---|---|---|---|")
        for pct, n_slots, equal in sizes(a.pcts, n_l, n_e, k):
            variants = [("equal", 0)] + [("equal", r) for r in periods] + [("offline", 0)]
            if not a.no_offline_online:
                variants += [("offline", r) for r in periods]
            res: dict[tuple[str, int], dict[str, list[float]]] = {v: {"m": [], "h": [], "ch": [], "mv": []}
                                                                  for v in variants}
            for train, test in held_out(docs, n_l):
                profile = rank_pairs(train, n_e)
                split = split_slots(lru_miss_curves(train, n_e).total(), range(n_l), n_slots * n_l, k)
                base = None
                for start, r in variants:
                    slots = equal if start == "equal" else split
                    rep = EngineReplay(f"admit{a.admit}-repart{r}", test.layers, k, slots, n_e, profile,
                                       ReplayPolicy("hybrid", admit=a.admit, repartition=r))
                    out = drive(rep, test, ENGINE_CHUNK_TOKENS, None)
                    m = out.n_miss / test.n_tokens
                    base = m if (start, r) == ("equal", 0) else base
                    v = res[(start, r)]
                    v["m"].append(m)
                    v["h"].append(out.hit_rate or 0.0)
                    v["ch"].append(m / base - 1.0)
                    v["mv"].append(1000.0 * out.n_moved / test.n_tokens)
            for start, r in variants:
                v = res[(start, r)]
                print(f"| {n_slots} of {n_e} ({pct:g}%) | {start} | {f'every {r} decodes' if r else 'none'} | "
                      f"{cell(v['m'], 2)} | {100 * np.mean(v['ch']):+.1f}% | {cell(v['h'])} | "
                      f"{np.mean(v['mv']):.0f} |", flush=True)
        print(f"\n{name}: {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
