"""Held-out hit rates of the hybrid's policies on a synthetic model's routing (the calibrated routers), per
topic of the embedded corpus: the profile is ranked on the other topics' paragraphs (leave one topic out), then
each policy replays the held-out topic's paragraphs as one stream of one-token decodes, from that profile:

- static: the hybrid from the profile (nothing moves);
- adaptive: the hybrid that swaps by heat (``--moe-cache-adaptive``);
- admitN: the hybrid with admission of N missed experts per layer and decode (``--moe-cache-admit N``);
- lru: the upload mode (every miss uploaded, waited on), for contrast;
- belady: the ceiling of a cache that knows the future.

Every hit rate counts every lookup (hits / (hits + misses + refused)); the interval is a t interval over the
held-out topics.

    python benchmarks/admit_policies.py [--shape qwen3-30b-a3b] [--pcts 25,50,75] [--policies ...]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from llama_moe.routing.heldout import t_interval
from llama_moe.routing.policies import run_policy
from llama_moe.routing.ranking import rank_pairs
from llama_moe.routing.routes import Routes
from llama_moe.synth import SHAPES, sample_routes
from llama_moe.synth.corpus import TOPICS

DEFAULT_POLICIES = "static,adaptive,admit1,admit2,admit4,admit8,lru,belady"


def routes_of(paragraphs: list[np.ndarray], n_layer: int) -> Routes:
    x = np.concatenate(paragraphs)
    return Routes(tuple(range(n_layer)), x, np.arange(len(x) + 1, dtype=np.int64))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pcts", default="25,50,75", help="slots per layer, in percent of its experts")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    a = ap.parse_args()
    shape = SHAPES[a.shape]
    t0 = time.monotonic()
    paras = sample_routes(a.shape, seed=a.seed)
    per_topic = len(paras) // len(TOPICS)
    topics = [paras[per_topic * i:per_topic * (i + 1)] for i in range(len(TOPICS))]
    n_tokens = sum(len(p) for p in paras)
    print(f"{a.shape}: {shape.n_layer} layers, {shape.n_expert} experts, {shape.n_expert_used} a token; "
          f"{len(paras)} paragraphs, {n_tokens} tokens, {len(TOPICS)} topics (routing in {time.monotonic() - t0:.0f} s)")
    policies = a.policies.split(",")
    print()
    print("| slots per layer | " + " | ".join(policies) + " |")
    print("|---|" + "---|" * len(policies))
    for pct in (int(p) for p in a.pcts.split(",")):
        n_slots = max(1, round(shape.n_expert * pct / 100))
        slots = {il: n_slots for il in range(shape.n_layer)}
        rates: dict[str, list[float]] = {p: [] for p in policies}
        for i in range(len(TOPICS)):
            train = routes_of([p for j, t in enumerate(topics) if j != i for p in t], shape.n_layer)
            test = routes_of(topics[i], shape.n_layer)
            profile = rank_pairs(train, shape.n_expert)
            for name in policies:
                r = run_policy(name, test, slots, shape.n_expert, profile)
                rates[name].append(r.hit_rate or 0.0)
        cells = []
        for name in policies:
            e = t_interval(rates[name])
            cells.append(f"{e.mean:.3f} [{e.low:.3f}, {e.high:.3f}]")
        print(f"| {n_slots} of {shape.n_expert} ({pct}%) | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
