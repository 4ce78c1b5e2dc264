"""The admitting hybrid's slots moved between layers online over one long conversation: the embedded corpus's
documents one after another as one stream of one-token decodes (7510 tokens), against equal slots over the same
stream. Moving slots online learns from the past alone, so the whole stream is held out for it; the offline
split needs other text, hence the per-document table of benchmarks/repartition.py for that one.

    python benchmarks/repartition_stream.py [--shapes qwen3-30b-a3b,gpt-oss-120b] [--pcts 25,50] [--periods 64]
"""
from __future__ import annotations

import argparse
import sys

from llama_moe.policy_replay import ReplayPolicy
from llama_moe.tools.routing.policies import drive
from llama_moe.tools.routing.policies.engine import ENGINE_CHUNK_TOKENS, EngineReplay
from llama_moe.tools.synth import SHAPES, sample_routes

from admit_policies import documents, routes_of, shape_arguments, sizes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(ap)
    ap.add_argument("--periods", default="64")
    ap.add_argument("--admit", type=int, default=2)
    a = ap.parse_args()
    print("| shape | slots per layer | re-partition | misses/token | change against equal | second half: change | "
          "slots per layer at the end |")
    print("|---|---|---|---|---|---|---|")
    for name in a.shapes.split(","):
        shape = SHAPES[name]
        n_l, n_e, k = shape.n_layer, shape.n_expert, shape.n_expert_used
        docs = documents(sample_routes(name, seed=a.seed))
        halves = [routes_of([p for d in docs[:len(docs) // 2] for p in d], n_l),
                  routes_of([p for d in docs[len(docs) // 2:] for p in d], n_l)]
        for pct, n_slots, equal in sizes(a.pcts, n_l, n_e, k):
            base = None
            for r in [0] + [int(x) for x in a.periods.split(",")]:
                rep = EngineReplay(f"admit{a.admit}-repart{r}", halves[0].layers, k, equal, n_e, [],
                                   ReplayPolicy("hybrid", admit=a.admit, repartition=r))
                first = drive(rep, halves[0], ENGINE_CHUNK_TOKENS, None).n_miss
                total = drive(rep, halves[1], ENGINE_CHUNK_TOKENS, None).n_miss
                n_tok = halves[0].n_tokens + halves[1].n_tokens
                second = total - first
                if r == 0:
                    base = (total, second)
                now = rep.slots_now()
                print(f"| {name} | {n_slots} of {n_e} ({pct:g}%) | {f'every {r} decodes' if r else 'none'} | "
                      f"{total / n_tok:.2f} | {100 * (total / base[0] - 1):+.1f}% | "
                      f"{100 * (second / base[1] - 1):+.1f}% | "
                      f"{min(now.values())}-{max(now.values()) if r else n_slots} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
