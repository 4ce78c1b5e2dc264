"""Slots per layer from miss curves against equal slots, held out, on the synthetic models' calibrated routing.

For each document of the embedded corpus (leave one document out): the other documents' paragraphs, as one
stream of one-token decodes, give every layer's miss curve (``llama_moe.tools.routing.misscurves``: LRU stack
distances, or the static profile's counts) and the profile; the same total of slots as ``pct`` percent of the
experts in every layer is split across the layers by those curves (``split_slots``, each layer at least k);
then the held-out document is replayed with the equal and the split slots:

- lru: the upload mode, split by the LRU curves;
- admit2: the hybrid admitting 2 experts per layer and decode, split by the LRU curves;
- static: the hybrid from the profile, split by the static curves.

Misses per token count those upload mode's split computes on the CPU too (hits / (hits + misses) for the hit
rates); the intervals are 95% t intervals over the held-out documents.

    python benchmarks/per_layer_slots.py [--shapes qwen3-30b-a3b,gpt-oss-120b] [--pcts 25,50]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from llama_moe.tools.routing.misscurves import lru_miss_curves, split_slots, static_curves
from llama_moe.tools.routing.policies import run_policy
from llama_moe.tools.routing.ranking import pair_counts, rank_pairs

from admit_policies import cell, held_out, shape_arguments, shape_documents, sizes  # the same corpus folds and cells as the admission tables


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(ap)
    ap.add_argument("--policies", default="lru,admit2,static")
    a = ap.parse_args()
    policies = a.policies.split(",")
    for name in a.shapes.split(","):
        t0 = time.monotonic()
        n_l, n_e, k, docs = shape_documents(name, a.seed)
        print("| slots per layer | policy | misses/token, equal | misses/token, per layer | change | "
              "hit rate, equal | hit rate, per layer | slots per layer, split |")
        print("|---|---|---|---|---|---|---|---|")
        for pct, n_slots, equal in sizes(a.pcts, n_l, n_e, k):
            res: dict[str, dict[str, list[float]]] = {p: {"me": [], "ms": [], "he": [], "hs": [], "ch": []}
                                                       for p in policies}
            spread: list[int] = []
            for train, test in held_out(docs, n_l):
                profile = rank_pairs(train, n_e)
                lru_split = split_slots(lru_miss_curves(train, n_e).total(), range(n_l), n_slots * n_l, k)
                static_split = split_slots(static_curves(pair_counts(train, n_e)), range(n_l), n_slots * n_l, k)
                spread += list(lru_split.values())
                for pol in policies:
                    split = static_split if pol == "static" else lru_split
                    eq = run_policy(pol, test, equal, n_e, profile)
                    sp = run_policy(pol, test, split, n_e, profile)
                    lost_eq = eq.n_miss / test.n_tokens
                    lost_sp = sp.n_miss / test.n_tokens
                    r = res[pol]
                    r["me"].append(lost_eq)
                    r["ms"].append(lost_sp)
                    r["ch"].append(lost_sp / lost_eq - 1.0)
                    r["he"].append(eq.hit_rate or 0.0)
                    r["hs"].append(sp.hit_rate or 0.0)
            for pol in policies:
                r = res[pol]
                what = f"{min(spread)}-{max(spread)} (lru curves)" if pol != "static" else "(static curves)"
                print(f"| {n_slots} of {n_e} ({pct:g}%) | {pol} | {cell(r['me'], 2)} | {cell(r['ms'], 2)} | "
                      f"{100 * np.mean(r['ch']):+.1f}% | {cell(r['he'])} | {cell(r['hs'])} | {what} |", flush=True)
        print(f"\n{name}: {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
