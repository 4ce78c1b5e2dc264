"""Decode speed of a model whose experts do not fit in the RAM left to the process: llama.cpp's mmap (the page
cache) against the RAM tier (``--moe-ram-mib``) at shares of the experts, each with the same free RAM, and the
bound (the warm decode plus the tier's misses read at the disk's direct-read bandwidth).

RAM is made scarce honestly: a balloon process locks all the memory but the row's budget (the tier, the model's
other weights and 1 GiB), so the page cache gets only what is left. Each measurement runs in a process of its
own, started after the model's pages were dropped from the page cache: a load, then the embedded corpus's text
decoded one token at a time (the synthetic router is calibrated on it; a model's own greedy text loops, and its
routing with it), ``--warm`` tokens to settle, then ``--tokens`` timed, and with ``--prompt-tokens`` a prompt of
other text in one batch. The disk bytes a token are what the kernel read for the process (/proc/self/io's
read_bytes: page faults and readahead for mmap, the direct reads for the tier).

    python benchmarks/ram_tier.py [--model PATH] [--pcts 25,50,75] [--tokens 16] [--warm 8] [--threads 2]

Without --model it synthesizes the Qwen3-30B-A3B shape with 24 layers, Q4_0 (8.7 GB), into the cache folder.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
GiB = 1 << 30
MiB = 1 << 20
SHAPE = "qwen3-30b-a3b,n_layer=24"


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0]) * 1024
    return out


def read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def drop_cache(path: Path) -> None:
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def direct_read_gbps(path: Path, piece: int, threads: int = 8, seconds: float = 4.0) -> float:
    """Reads of ``piece`` bytes at random aligned offsets, O_DIRECT, on ``threads`` threads: the disk's rate for
    the tier's kind of reads, GB/s."""
    size = path.stat().st_size
    align = 4096
    n = (piece + align - 1) // align * align
    done = [0] * threads
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, n)
        rng = random.Random(i)
        try:
            while time.monotonic() < stop:
                off = rng.randrange(0, max(1, size - n)) // align * align
                done[i] += os.preadv(fd, [buf], off)
        finally:
            os.close(fd)
            buf.close()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done) / (time.monotonic() - t0) / 1e9


class Balloon:
    """A child process that locks ``nbytes`` of anonymous memory until closed."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(0, nbytes)
        code = ("import mmap,sys,ctypes\n"
                f"n={self.nbytes}\n"
                "m=mmap.mmap(-1,max(n,4096),flags=mmap.MAP_PRIVATE|mmap.MAP_ANONYMOUS)\n"
                "libc=ctypes.CDLL(None,use_errno=True)\n"
                "a=ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
                "assert n==0 or libc.mlock(ctypes.c_void_p(a),ctypes.c_size_t(n))==0, ctypes.get_errno()\n"
                "print('ready',flush=True)\n"
                "sys.stdin.read()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the balloon could not lock {self.nbytes / GiB:.1f} GiB")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run_one(model: Path, kind: str, ram_mib: float, n_tokens: int, warm: int, threads: int, prompt_tokens: int) -> dict:
    """In this process: load, settle, time; a JSON line on stdout."""
    from llama_moe import Context, ContextParams, Model, ModelParams

    t0 = time.monotonic()
    mp = ModelParams(lazy_experts=True, repack=False) if kind == "tier" else ModelParams(cpu_moe=True, repack=False)
    cp = ContextParams(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads,
                       **({"moe_ram_mib": ram_mib} if kind == "tier" else {}))
    out: dict = {"kind": kind, "ram_mib": ram_mib}
    from llama_moe.tools.synth.corpus import load_corpus

    texts = list(load_corpus().values())
    with Model(model, mp) as m, Context(m, cp) as ctx:
        out["load_s"] = time.monotonic() - t0
        # the corpus's text, one token a decode (the synthetic router's routing is calibrated on it; a model's own
        # greedy text loops, and its routing with it)
        tokens = m.tokenize(" ".join(texts[len(texts) // 2:]))[:warm + n_tokens]
        for t in tokens[:warm]:
            ctx.decode([t])
        before, s0, t1 = read_bytes(), ctx.moe_cache_stats(), time.monotonic()
        for t in tokens[warm:]:
            ctx.decode([t])
        dt = time.monotonic() - t1
        n = len(tokens) - warm
        after, s1 = read_bytes(), ctx.moe_cache_stats()
        out.update(tokens=n, tok_s=n / dt, disk_bytes_per_token=(after - before) / max(n, 1))
        if s1 is not None and s0 is not None:
            out.update(tier_bytes_per_token=(s1.n_bytes_disk - s0.n_bytes_disk) / max(n, 1),
                       misses_per_token=(s1.n_miss - s0.n_miss) / max(n, 1),
                       hit_rate=(s1.n_hit - s0.n_hit) / max(1, (s1.n_hit - s0.n_hit) + (s1.n_miss - s0.n_miss)),
                       disk_wait_ms_per_token=(s1.disk_wait_us - s0.disk_wait_us) / 1000 / max(n, 1),
                       direct=ctx.cache_status().disk_direct)
        if prompt_tokens:
            ctx.reset()
            prompt = m.tokenize(" ".join(texts[:len(texts) // 2]))[:prompt_tokens]
            b0, t2 = read_bytes(), time.monotonic()
            ctx.decode(prompt)
            out["pp_tok_s"] = len(prompt) / (time.monotonic() - t2)
            out["pp_disk_bytes"] = read_bytes() - b0
    print(json.dumps(out), flush=True)
    return out


def measure(model: Path, kind: str, ram_mib: float, free: int | None, args: argparse.Namespace, drop: bool = True) -> dict:
    """One run in a process of its own, with ``free`` bytes of RAM left by a balloon (None: no balloon), after
    dropping the model's pages from the page cache (``drop``)."""
    if drop:
        drop_cache(model)
    balloon = None
    if free is not None:
        avail = meminfo()["MemAvailable"]
        balloon = Balloon(avail - free)
    try:
        cmd = [sys.executable, str(HERE), "--model", str(model), "--run", kind, "--ram-mib", str(ram_mib),
               "--tokens", str(args.tokens), "--warm", str(args.warm), "--threads", str(args.threads),
               "--prompt-tokens", str(args.prompt_tokens)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
        if res.returncode != 0 or not lines:
            return {"kind": kind, "ram_mib": ram_mib, "error": (res.stderr or res.stdout)[-800:]}
        return json.loads(lines[-1])
    except subprocess.TimeoutExpired:
        return {"kind": kind, "ram_mib": ram_mib, "error": f"timed out after {args.timeout} s"}
    finally:
        if balloon:
            balloon.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--pcts", default="25,50,75")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=0, help="also time a prompt of this many tokens (pp)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--run", choices=["mmap", "tier"], help=argparse.SUPPRESS)
    ap.add_argument("--ram-mib", type=float, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        run_one(args.model, args.run, args.ram_mib, args.tokens, args.warm, args.threads, args.prompt_tokens)
        return

    from llama_moe import paths
    from llama_moe.tools.experts import expert_layout
    from llama_moe.tools.synth import synthesize

    model = args.model
    if model is None:
        model = paths.cache_dir() / "models" / "qwen3-30b-a3b-24l-q4_0.gguf"
        if not model.is_file():
            model.parent.mkdir(parents=True, exist_ok=True)
            print(f"synthesizing {SHAPE} Q4_0 into {model}", flush=True)
            synthesize(model, SHAPE, "q4_0", seed=0)
    layout = expert_layout(model)
    experts = sum(l.bytes_per_expert * l.n_expert for l in layout.layers)
    others = model.stat().st_size - experts
    per_expert = layout.layers[0].bytes_per_expert
    gbps = direct_read_gbps(model, per_expert // 3)
    print(f"model {model} ({model.stat().st_size / 1e9:.2f} GB, experts {experts / 1e9:.2f} GB); direct reads of "
          f"{per_expert // 3 / MiB:.2f} MiB on 8 threads: {gbps:.2f} GB/s", flush=True)
    warm = measure(model, "mmap", 0, None, args)  # no balloon: the whole file ends in the page cache
    if "error" not in warm:  # a second run finds the pages cached: the warm compute
        warm = measure(model, "mmap", 0, None, args, drop=False)
    print(json.dumps({"row": "warm", **warm}), flush=True)
    rows = []
    for pct in [float(p) for p in args.pcts.split(",")]:
        tier = experts * pct / 100
        free = int(tier + others + GiB)
        ram_mib = tier / MiB
        mm = measure(model, "mmap", 0, free, args)
        tr = measure(model, "tier", ram_mib, free, args)
        bound = None
        if "error" not in tr and "error" not in warm:
            t_tok = 1 / warm["tok_s"] + tr["misses_per_token"] * per_expert / (gbps * 1e9)
            bound = 1 / t_tok
        row = {"pct": pct, "free_gib": free / GiB, "mmap": mm, "tier": tr, "bound_tok_s": bound}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| RAM tier | free RAM | mmap tok/s | mmap disk MB/token | tier tok/s | tier disk MB/token | tier misses/token "
          "| bound tok/s | tier / mmap | tier / bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mm, tr, b = r["mmap"], r["tier"], r["bound_tok_s"]
        f = lambda d, k, s="{:.2f}": s.format(d[k]) if k in d else "error"  # noqa: E731
        ratio = f"{tr['tok_s'] / mm['tok_s']:.1f}x" if "tok_s" in tr and "tok_s" in mm else "-"
        of_bound = f"{tr['tok_s'] / b:.0%}" if b and "tok_s" in tr else "-"
        print(f"| {r['pct']:.0f}% | {r['free_gib']:.1f} GiB | {f(mm, 'tok_s')} | {mm.get('disk_bytes_per_token', 0) / 1e6:.1f} "
              f"| {f(tr, 'tok_s')} | {tr.get('disk_bytes_per_token', 0) / 1e6:.1f} | {f(tr, 'misses_per_token', '{:.1f}')} "
              f"| {b:.2f} | {ratio} | {of_bound} |" if b else
              f"| {r['pct']:.0f}% | {r['free_gib']:.1f} GiB | {f(mm, 'tok_s')} | - | {f(tr, 'tok_s')} | - | - | - | {ratio} | - |")


if __name__ == "__main__":
    main()
