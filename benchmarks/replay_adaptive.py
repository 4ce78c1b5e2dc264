"""bench-adaptive's protocol replayed: a synthetic shape's own routing (synth/routing.py) of the corpus through the
static and adaptive policies, replayed by the engine's own policies (llama_moe.policy_replay). Seconds where the
engine takes an hour on a GPU; to weigh the adaptive cache's constants (llama-moe-policy.h), change them there,
rebuild, and run this again.

    python benchmarks/replay_adaptive.py --shape qwen3-30b-a3b --cache-pct 50 [--warmup 256]
        [--measure 0] [--order interleaved|topic]

Prints the feed's hit rates after the warm-up for the five configurations and the recovery of the gap between a
profile of other text (wrong) and of the decoded topics' train text (right)."""
from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from llama_moe.tools.bench.adaptive import CONFIGS, held_out_paragraphs, recovery
from llama_moe.tools.synth.corpus import TOPICS, split_paragraphs
from llama_moe.tools.synth.design import build_design
from llama_moe.tools.synth.routing import route
from llama_moe.tools.synth.shapes import get_shape
from llama_moe.tools.routing.policies import adaptive, static
from llama_moe.tools.routing.routes import Routes


def _routes(seqs: list[np.ndarray], layers: tuple[int, ...]) -> Routes:
    """One token per ubatch, as the feed decodes."""
    experts = np.concatenate(seqs, axis=0)
    return Routes(layers, experts, np.arange(experts.shape[0] + 1, dtype=np.int64))


def _ranked(seqs: list[np.ndarray], layers: tuple[int, ...]) -> list[tuple[int, int]]:
    """(layer, expert) by how many tokens selected it, hottest first: a profile ranked per token."""
    counts: Counter[tuple[int, int]] = Counter()
    for s in seqs:
        for j, il in enumerate(layers):
            counts.update((il, int(e)) for e in s[:, j, :].ravel())
    return [pair for pair, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--cache-pct", type=float, default=50)
    ap.add_argument("--warmup", type=int, default=256)
    ap.add_argument("--measure", type=int, default=0, help="tokens measured after the warm-up (0: all the rest)")
    ap.add_argument("--order", default="interleaved")
    args = ap.parse_args()

    shape = get_shape(args.shape)
    design = build_design(shape)
    tok = design.tokenizer
    layers = tuple(range(shape.n_layer))
    split = split_paragraphs()
    topics, others = TOPICS[:4], TOPICS[-4:]

    def seqs_of(paragraphs: list[str]) -> list[np.ndarray]:
        return [route(ids, design) for ids in (tok.encode(p) for p in paragraphs) if ids]

    right = _ranked(seqs_of([p for t in topics for p in split.train[t]]), layers)
    wrong = _ranked(seqs_of([p for t in others for p in split.train[t]]), layers)
    feed = _routes(seqs_of(held_out_paragraphs(split, topics, args.order)), layers)
    slots = {il: min(max(1, round(shape.n_expert * args.cache_pct / 100)), shape.n_expert) for il in layers}
    if not 0 <= args.warmup < feed.n_tokens or args.measure < 0:
        ap.error(f"--warmup must be in 0..{feed.n_tokens - 1} and --measure >= 0")
    end = feed.n_tokens if args.measure == 0 else min(feed.n_tokens, args.warmup + args.measure)
    fed, warm = feed.tokens(0, end), feed.tokens(0, args.warmup) if args.warmup else None
    print(f"{args.shape}: {shape.n_layer} layers x {shape.n_expert} experts, top-{shape.n_expert_used}, "
          f"{slots[0]} slots a layer; {end} of {feed.n_tokens} tokens fed ({args.order}), {args.warmup} of them "
          f"warm-up")

    def measured(run) -> float:
        a = run(fed)
        if warm is None:
            return a.n_hit / max(1, a.n_hit + a.n_miss)
        b = run(warm)
        return (a.n_hit - b.n_hit) / max(1, (a.n_hit + a.n_miss) - (b.n_hit + b.n_miss))

    static_rates = {name: measured(lambda r, p=p: static(r, slots, shape.n_expert, p)) for name, p in (("wrong", wrong), ("right", right))}
    rates = dict(static_rates)
    for name, p in (("empty+adaptive", []), ("wrong+adaptive", wrong), ("right+adaptive", right)):
        rates[name] = measured(lambda r, p=p: adaptive(r, slots, shape.n_expert, p))
    rec = recovery(rates["wrong"], rates["wrong+adaptive"], rates["right"])
    print(", ".join(f"{c} {rates[c]:.3f}" for c in CONFIGS) + f"; recovery {'-' if rec is None else f'{100 * rec:.0f}%'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
