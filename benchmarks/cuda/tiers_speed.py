"""Three tiers on a GPU: the hybrid's decode with a share of the experts in VRAM, a share in the RAM tier and the rest
read from the model's file, against the same hybrid whose other experts are all in RAM (the model mapped and in
the page cache). Each setting in a process of its own model load; greedy decoding of N tokens after a prompt,
timed from the second token. The RAM tier's reads are direct (O_DIRECT): the file's place in the page cache does
not help them.

python benchmarks/cuda/tiers_speed.py MODEL --profile P [--settings 50:0,50:25,50:50,25:25] [-n 128] [--free-gib G]

A setting is VRAM%:RAM% of each layer's experts (RAM 0: no tier, the experts in RAM through the mapping), with
":s" after it for the hybrid through the scheduler (the mailbox off; with it, the mailbox's CPU side reads a
token's experts into the tier's slots and computes them there).

--free-gib G makes RAM scarce for each setting as benchmarks/ram_tier.py does: the model's pages are dropped from
the page cache, and a balloon process locks all the available memory but G GiB, so that the mapping's experts
(no tier) and the tier's locked slots get the same RAM.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ram_tier import GiB, Balloon, drop_cache, meminfo  # noqa: E402  (the balloon's one home)

from llama_moe import Context, ContextParams, Model, ModelParams  # noqa: E402
from llama_moe.tools.equivalence import PROMPTS  # noqa: E402
from llama_moe.tools.experts import expert_layout  # noqa: E402
from llama_moe.tools.routing.budget import mib_for_slots  # noqa: E402


def slots_at(layout, pct: int) -> int:
    return max(1, min(layout.n_expert - 1, round(layout.n_expert * pct / 100)))


def run(model_path: Path, profile: Path, vram: int, ram: int, n: int, device: str | None, mailbox: bool = True) -> str:
    layout = expert_layout(model_path)
    cp = ContextParams(n_ctx=2048, moe_cache_mib=mib_for_slots(layout, slots_at(layout, vram), True),
                       moe_cache_hybrid=True, moe_cache_profile=str(profile), moe_cache_mailbox=mailbox,
                       **({"moe_cache_device": device} if device else {}),
                       **({"moe_ram_mib": mib_for_slots(layout, slots_at(layout, ram), False)} if ram else {}))
    mp = ModelParams(cpu_moe=True, lazy_experts=ram > 0, repack=False)
    with Model(model_path, mp) as model, Context(model, cp) as ctx:
        prompt = ctx.tokenize(PROMPTS[0])
        times = []
        t0 = time.perf_counter()
        first = None  # the counters after the prompt and the first token: the load's fill and the prompt's reads
        for _ in ctx.generate(prompt, max_tokens=n):
            times.append(time.perf_counter())
            first = first or ctx.moe_cache_stats()
        s = ctx.moe_cache_stats()
    tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    tier = "no tier (the rest in RAM, mapped)" + ("" if mailbox else "; through the scheduler")
    if s is not None and s.ram_below and first is not None:
        # the decode's own share, after the first token (the context's creation fills the device's slots through
        # the tier, and the prompt reads what it selects)
        steps = max(len(times) - 1, 1)
        hits, misses = s.n_ram_hit - first.n_ram_hit, s.n_ram_miss - first.n_ram_miss
        tier = (f"RAM tier hit rate {hits / max(hits + misses, 1):.3f} of {(hits + misses) / steps:.1f} lookups/token, "
                f"{(s.n_bytes_disk - first.n_bytes_disk) / steps / 1e6:.1f} MB/token from the file, "
                f"{(s.disk_wait_us - first.disk_wait_us) / 1000 / steps:.2f} ms/token waited; before the first token "
                f"{first.n_bytes_disk / 1e6:.0f} MB read, {times[0] - t0:.2f} s"
                + ("" if mailbox else "; through the scheduler"))
    hit = f"VRAM hit rate {s.hit_rate:.3f}" if s is not None else "no cache"
    return f"| {vram}% | {ram}% | {tps:.2f} | {hit} | {tier} |"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--settings", default="50:0,50:25,50:50,25:25")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--device", help="the cache's device (CPU: a check of the script without a GPU)")
    ap.add_argument("--free-gib", type=float, help="leave this much RAM to each setting (a balloon locks the rest)")
    a = ap.parse_args()
    if a.free_gib is not None:
        print(f"each setting with {a.free_gib:g} GiB of RAM left (the model's pages dropped first)")
    print("| VRAM | RAM tier | decode tok/s | device cache | RAM tier |")
    print("|---|---|---|---|---|")
    for item in a.settings.split(","):
        vram, ram, *rest = item.split(":")
        balloon = None
        if a.free_gib is not None:
            drop_cache(a.model)
            balloon = Balloon(meminfo()["MemAvailable"] - int(a.free_gib * GiB))
        try:
            print(run(a.model, a.profile, int(vram), int(ram), a.n, a.device, mailbox=rest != ["s"]), flush=True)
        finally:
            if balloon:
                balloon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
