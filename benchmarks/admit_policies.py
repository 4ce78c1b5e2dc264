"""Held-out hit rates of the hybrid's policies on the synthetic models' calibrated routing, per document of the
embedded corpus (leave one document out): the profile is ranked on the other documents' paragraphs, then each
policy replays the held-out document's paragraphs as one stream of one-token decodes, from that profile:

- static: the hybrid from the profile (nothing moves);
- adaptive: the hybrid that swaps by heat (``--moe-cache-adaptive``);
- admitN: the hybrid with admission of N missed experts per layer and decode (``--moe-cache-admit N``);
- lru: the upload mode (every miss uploaded, waited on, but those its split leaves to the CPU), for contrast;
- belady: the ceiling of a cache that knows the future.

Every hit rate counts every lookup (hits / (hits + misses)); the misses upload mode's split computes on the
CPU (lru's n_cpu: a token's experts beyond its layer's slots) are summed over the folds in the last column; the
interval is a 95% t interval over the held-out documents.

``--eviction`` also replays the admitting hybrid (at ``--eviction-admit`` uploads) with other victims than
the least recently used slot, to compare (their code is here, not in the library: none of them is an engine
mode):

- ``slru:P``: segmented LRU, a share P of the slots protected (experts hit since their admission); the victim
  is the least recently used unprotected slot;
- ``lrfu:H``: the slot whose expert's selections, each fading with a half-life of H tokens, weigh least
  (the expert's whole history counts, held or not);
- ``arc``: ARC's two lists (seen once, seen again) with ghosts of the evicted that move the split between them
  (``arc.py``, shared with ``ram_tier_policies.py``).

    python benchmarks/admit_policies.py [--shapes qwen3-30b-a3b,gpt-oss-120b] [--pcts 12.5,25,50]
        [--policies ...] [--eviction slru:0.5,lrfu:16,arc]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator

import numpy as np

from llama_moe.tools.routing.heldout import t_interval
from llama_moe.tools.routing.policies import run_policy
from llama_moe.tools.routing.ranking import prefill_resident, rank_pairs
from llama_moe.tools.routing.routes import Routes
from llama_moe.tools.synth import SHAPES, sample_routes
from llama_moe.tools.synth.corpus import load_corpus, paragraphs

from arc import Arc  # the one ARC of the studies (ram_tier_policies' too)

DEFAULT_POLICIES = "static,adaptive,admit1,admit2,admit4,lru,belady"


def routes_of(paragraphs_: list[np.ndarray], n_layer: int) -> Routes:
    x = np.concatenate(paragraphs_)
    return Routes(tuple(range(n_layer)), x, np.arange(len(x) + 1, dtype=np.int64))


def documents(paras: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The corpus's paragraphs grouped by document (topic), in corpus order."""
    out, at = [], 0
    for text in load_corpus().values():
        n = len(paragraphs(text))
        out.append(paras[at:at + n])
        at += n
    return out


def evicting_admit(stream: np.ndarray, n_slots: int, n_expert: int, filled: dict[int, list[int]], admit: int,
                   kind: str, param: float) -> tuple[int, int]:
    """(hits, misses) of the admitting hybrid over ``stream`` [n, n_layer, k] of one-token decodes: hits and
    misses as ``policies.admit`` counts them; after each decode up to ``admit`` of a layer's misses (first
    missed first) take a free slot, else the victim ``kind`` picks. ``lru`` is ``policies.admit``'s rule."""
    hits = misses = 0
    fade = 0.5 ** (1.0 / param) if kind == "lrfu" else 1.0
    for j in range(stream.shape[1]):
        col = stream[:, j, :].tolist()
        f = filled[j]
        if kind == "arc":  # the admitted misses enter, and ARC's victim may be one the decode used
            arc = Arc(n_slots, f, protect=False, admit=admit)
            for row in col:
                h, m = arc.token(row)
                hits, misses = hits + h, misses + m
            continue
        expert_in = f + [-1] * (n_slots - len(f))
        slot_of = {e: s for s, e in enumerate(f)}
        last = [0] * n_slots
        protected = [False] * n_slots
        cap = int(round(param * n_slots)) if kind == "slru" else 0
        weight: dict[int, tuple[float, int]] = {}  # lrfu: expert -> (faded count, at token)
        clock = 0
        for t, row in enumerate(col):
            clock += 1
            queue = []
            for e in dict.fromkeys(row):  # distinct, in the router's order
                if kind == "lrfu":
                    w, at = weight.get(e, (0.0, t))
                    weight[e] = (w * fade ** (t - at) + 1.0, t)
                s = slot_of.get(e, -1)
                if s >= 0:
                    last[s] = clock
                    hits += 1
                    if kind == "slru" and not protected[s]:
                        protected[s] = True
                        held = [c for c in range(n_slots) if protected[c]]
                        if len(held) > cap:  # the protected segment's least recent goes back to probation
                            protected[min(held, key=lambda c: (last[c], c))] = False
                else:
                    misses += 1
                    queue.append(e)
            clock += 1
            for e in queue[:admit]:
                free = [c for c in range(n_slots) if expert_in[c] < 0]
                if free:
                    victim = free[0]
                elif kind == "lru":
                    victim = min(range(n_slots), key=lambda c: (last[c], c))
                elif kind == "slru":
                    pool = [c for c in range(n_slots) if not protected[c]] or list(range(n_slots))
                    victim = min(pool, key=lambda c: (last[c], c))
                else:  # lrfu
                    def now(c: int) -> float:
                        w, at = weight.get(expert_in[c], (0.0, t))
                        return w * fade ** (t - at)
                    victim = min(range(n_slots), key=lambda c: (now(c), last[c], c))
                if expert_in[victim] >= 0:
                    del slot_of[expert_in[victim]]
                expert_in[victim], slot_of[e], last[victim], protected[victim] = e, victim, clock, False
    return hits, misses


def shape_arguments(ap: argparse.ArgumentParser, pcts: str = "25,50") -> None:
    """--shapes, --seed and --pcts (slots per layer in percent of a layer's experts), as every table here takes."""
    ap.add_argument("--shapes", default="qwen3-30b-a3b,gpt-oss-120b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pcts", default=pcts, help="slots per layer, in percent of its experts")


def sizes(pcts: str, n_layer: int, n_expert: int, floor: int) -> Iterator[tuple[float, int, dict[int, int]]]:
    """(percent, slots per layer, equal slots per layer) for each of --pcts; at least floor slots a layer."""
    for pct in (float(p) for p in pcts.split(",")):
        n_slots = max(floor, round(n_expert * pct / 100))
        yield pct, n_slots, {il: n_slots for il in range(n_layer)}


def held_out(docs: list[list[np.ndarray]], n_layer: int) -> Iterator[tuple[Routes, Routes]]:
    """Each document held out in turn: (the other documents' routes, its own)."""
    for i in range(len(docs)):
        yield (routes_of([p for j, d in enumerate(docs) if j != i for p in d], n_layer), routes_of(docs[i], n_layer))


def shape_documents(name: str, seed: int, note: str = "") -> tuple[int, int, int, list[list[np.ndarray]]]:
    """A shape's layers, experts and experts a token, and its routing's documents, after a line saying so."""
    shape = SHAPES[name]
    docs = documents(sample_routes(name, seed=seed))
    print(f"\n{name}: {shape.n_layer} layers, {shape.n_expert} experts, {shape.n_expert_used} a token; "
          f"{len(docs)} documents, {sum(len(p) for d in docs for p in d)} tokens{note}\n")
    return shape.n_layer, shape.n_expert, shape.n_expert_used, docs


def cell(values: list[float], digits: int = 3) -> str:
    """A mean with its 95% t interval."""
    e = t_interval(values)
    return f"{e.mean:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(ap, pcts="12.5,25,50")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--eviction", default="", help="victim rules for the admitting hybrid, e.g. slru:0.5,lrfu:16,arc")
    ap.add_argument("--eviction-admit", type=int, default=2, help="uploads per layer and decode for --eviction")
    a = ap.parse_args()
    policies = a.policies.split(",")
    rules = [r for r in a.eviction.split(",") if r]
    for name in a.shapes.split(","):
        shape = SHAPES[name]
        t0 = time.monotonic()
        paras = sample_routes(name, seed=a.seed)
        docs = documents(paras)
        n_tokens = sum(len(p) for p in paras)
        print(f"\n{name}: {shape.n_layer} layers, {shape.n_expert} experts, {shape.n_expert_used} a token; "
              f"{len(paras)} paragraphs, {n_tokens} tokens, {len(docs)} documents (routing in "
              f"{time.monotonic() - t0:.0f} s)\n")
        print("| slots per layer | " + " | ".join(policies) + " | admit2 / lru | lru on the CPU |")
        print("|---|" + "---|" * (len(policies) + 2))
        ev_rows = []
        for pct, n_slots, slots in sizes(a.pcts, shape.n_layer, shape.n_expert, 1):
            rates: dict[str, list[float]] = {p: [] for p in policies}
            ev_rates: dict[str, list[float]] = {r: [] for r in ["lru", *rules]}
            on_cpu = 0
            for i in range(len(docs)):
                train = routes_of([p for j, d in enumerate(docs) if j != i for p in d], shape.n_layer)
                test = routes_of(docs[i], shape.n_layer)
                profile = rank_pairs(train, shape.n_expert)
                for pol in policies:
                    r = run_policy(pol, test, slots, shape.n_expert, profile)
                    rates[pol].append(r.hit_rate or 0.0)
                    on_cpu += r.n_cpu
                if rules:
                    filled = prefill_resident(profile, slots, shape.n_expert)
                    stream = test.experts.astype(np.int64)
                    for rule in ev_rates:
                        kind, _, param = rule.partition(":")
                        h, m = evicting_admit(stream, n_slots, shape.n_expert, filled, a.eviction_admit, kind,
                                              float(param or 0))
                        ev_rates[rule].append(h / (h + m))
                    want = f"admit{a.eviction_admit}"
                    if want in rates and not math.isclose(ev_rates["lru"][-1], rates[want][-1]):
                        raise SystemExit(f"the eviction replay's lru ({ev_rates['lru'][-1]}) is not {want}'s "
                                         f"({rates[want][-1]})")
            ratio = ""
            if "admit2" in rates and "lru" in rates:
                ratio = f"{np.mean(rates['admit2']) / np.mean(rates['lru']):.3f}"
            print(f"| {n_slots} of {shape.n_expert} ({pct:g}%) | " + " | ".join(cell(rates[p]) for p in policies)
                  + f" | {ratio} | {on_cpu} |", flush=True)
            if rules:
                ev_rows.append(f"| {n_slots} of {shape.n_expert} ({pct:g}%) | "
                               + " | ".join(cell(v) for v in ev_rates.values()) + " |")
        if rules:
            print(f"\nthe admitting hybrid at {a.eviction_admit} uploads per layer and decode, by victim rule:\n")
            print("| slots per layer | " + " | ".join(["lru", *rules]) + " |")
            print("|---|" + "---|" * (len(rules) + 1))
            print("\n".join(ev_rows))
        print(f"\n{name}: {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
