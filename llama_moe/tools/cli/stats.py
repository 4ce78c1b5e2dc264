"""``python -m llama_moe stats [MODEL]``: the main job. Runs a prompt and a generation with the experts in
RAM, without the cache and with it (a cache of half the experts unless ``--moe-cache-mib`` says otherwise; in RAM
where there is no GPU), and reports what happened: throughput, the model's MoE geometry, what the cache did
layer by layer and whether the tokens stayed the same."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from ..bench.stats import format_comparison, format_report, run_main_job, run_stats
from ...devices import gpus
from ..experts import expert_layout
from ...context import Sampling
from ..default_model import default_model_path, default_prompt
from ...errors import ParameterError
from ..errors import ServerError
from ...params import ContextParams, ModelParams
from ..server.metrics import fetch_server_metrics
from ..server.report import format_server_report


def run_server(args: argparse.Namespace) -> int:
    metrics = fetch_server_metrics(args.server, api_key=args.api_key or os.environ.get("LLAMA_API_KEY"))
    if args.json:
        json.dump({"server": args.server, **dataclasses.asdict(metrics)}, sys.stdout, indent=2)
        print()
    else:
        print(format_server_report(args.server, metrics))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="run a prompt and a generation and report what happened (the main job)")
    p.add_argument("model", nargs="?", help="a GGUF MoE model (default: the embedded tiny synthetic model, made on first use)")
    p.add_argument("-p", "--prompt", help="prompt text (default: a passage of the embedded corpus)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: one per core)")
    p.add_argument("-c", "--ctx", type=int, default=2048, help="context size (default 2048)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="layers on the GPU (default: all)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--n-cpu-moe", type=int, help="keep the experts of the first N layers in RAM")
    where.add_argument("--no-cpu-moe", action="store_true", help="do not keep experts in RAM")
    p.add_argument("--moe-cache-mib", type=float, default=None,
                   help="a MoE expert cache of this many MiB (default: half the experts' bytes; 0: no cache, one run)")
    p.add_argument("--no-compare", action="store_true",
                   help="run once, with the cache as given, instead of beside a run without it")
    p.add_argument("--moe-cache-profile", help="fill the cache from this STRP profile")
    p.add_argument("--moe-cache-hybrid", action="store_true", help="the CPU computes the experts the cache lacks (no uploads)")
    p.add_argument("--moe-cache-adaptive", action="store_true",
                   help="with --moe-cache-hybrid: swap the experts the router picks most into the cache while generating")
    p.add_argument("--moe-cache-admit", type=admit_count, default=0, metavar="N|auto",
                   help="with --moe-cache-hybrid: upload at most N of each layer's missed experts between two decodes, "
                        "into its least recently used slots; auto: as many as the measured copies fit in half a "
                        "decode (default 0: none)")
    p.add_argument("--moe-cache-repartition", type=int, default=0, metavar="N",
                   help="with --moe-cache-admit: move slots between layers every N decodes, to where the observed miss "
                        "curves gain most (default 0: never)")
    p.add_argument("--moe-cache-peer", metavar="DEVICE",
                   help="with --moe-cache-hybrid and a profile or admission: a second device (e.g. CUDA1, RPC1) holds "
                        "experts the cache lacks (the profile's next, those admission evicts) and computes them")
    p.add_argument("--moe-cache-device", metavar="DEVICE",
                   help="the device that holds the cache (e.g. CUDA1; CPU: in RAM; default: the GPU, and in RAM where "
                        "there is none)")
    p.add_argument("--moe-ram-mib", metavar="N|auto", type=ram_mib,
                   help="a RAM tier of N MiB instead of the device cache: expert slots in locked RAM, read from the "
                        "model's file (the experts mapped untouched, as for a model bigger than RAM); compared with none")
    p.add_argument("--no-repack", action="store_true", help="keep CPU weights in their file layout (the cache needs it on a CPU-only build)")
    p.add_argument("--temp", type=float, default=0.8,
                   help="sampling temperature (default 0.8, seeded; 0 is greedy, which loops on the synthetic models)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--server", metavar="URL", help="report a running llama-server's cache from its /metrics "
                                                   "(started with --metrics) instead of running the model here")
    p.add_argument("--api-key", help="with --server: the server's --api-key (default: $LLAMA_API_KEY)")
    p.set_defaults(func=run)


def admit_count(value: str) -> int | str:
    """--moe-cache-admit's value: "auto" or a count of experts (argparse reports a ValueError as a bad value)."""
    return "auto" if value == "auto" else int(value)


def check_cache_options(mib: float, profile: str | None, admit: int | str = 0, repartition: int = 0) -> None:
    """The --moe-cache-* values of a command line, each in its range (refused with its own name); the rules
    between the options are the engine's, which says what it does not apply (a MoeCacheWarning)."""
    if not mib >= 0 or mib > 1 << 24:  # also NaN
        raise ParameterError(f"--moe-cache-mib must be from 0 to {1 << 24} (MiB), got {mib:g}")
    if admit != "auto" and not 0 <= int(admit) <= 9999:
        raise ParameterError(f"--moe-cache-admit must be a count of experts from 0 to 9999, got {admit}")
    if not 0 <= repartition <= 999999:
        raise ParameterError(f"--moe-cache-repartition must be a number of decodes from 0 to 999999, got {repartition}")
    if profile is not None and not Path(profile).is_file():
        raise ParameterError(f"--moe-cache-profile {profile}: no such file")


def ram_mib(value: str) -> float | str:
    if value == "auto":
        return value
    try:
        mib = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of MiB nor auto: {value!r}") from None
    if not 0 < mib <= 1 << 24:
        raise argparse.ArgumentTypeError(f"a RAM tier of {value} MiB: give more than 0 and at most {1 << 24}")
    return mib


def run(args: argparse.Namespace) -> int:
    if args.server:
        if args.model:
            raise ServerError("stats takes a MODEL or --server URL, not both")
        return run_server(args)
    explicit_mib = args.moe_cache_mib is not None
    check_cache_options(args.moe_cache_mib if explicit_mib else 1, args.moe_cache_profile, args.moe_cache_admit,
                        args.moe_cache_repartition)
    for flag, value, low in (("-n/--n-gen", args.n_gen, 1), ("-c/--ctx", args.ctx, 0), ("--n-cpu-moe", args.n_cpu_moe, 0)):
        if value is not None and value < low:
            raise ParameterError(f"{flag} must be >= {low}, got {value}")
    model_path = Path(args.model) if args.model else default_model_path()
    mib = args.moe_cache_mib if explicit_mib else expert_layout(model_path).total_expert_bytes / 2 / 2**20
    repack, where, device = not args.no_repack, None, args.moe_cache_device
    if mib > 0 and not gpus():
        # The cache's copies need a device; without a GPU the engine takes RAM when asked to, and the CPU's
        # repacked layout of the experts is one the cache cannot copy from.
        device = device or "CPU"
        repack = False
        where = ("no GPU: the cache is in RAM (--moe-cache-device CPU) and the experts keep their file layout "
                 "(--no-repack): its speed says nothing of a GPU's, but every lookup is real")
    mp = ModelParams(n_gpu_layers=args.n_gpu_layers,
                     cpu_moe=not args.no_cpu_moe and args.n_cpu_moe is None,
                     n_cpu_moe=args.n_cpu_moe or 0, repack=repack,
                     use_mmap=False)  # experts in RAM are read faster from a (pinned, on a GPU build) copy than from mmap
    cp = ContextParams(n_ctx=args.ctx, n_threads=args.threads, moe_cache_mib=mib,
                       moe_cache_profile=args.moe_cache_profile, moe_cache_hybrid=args.moe_cache_hybrid,
                       moe_cache_adaptive=args.moe_cache_adaptive, moe_cache_admit=args.moe_cache_admit,
                       moe_cache_repartition=args.moe_cache_repartition, moe_cache_peer=args.moe_cache_peer,
                       moe_cache_device=device)
    if args.moe_ram_mib is not None and explicit_mib:
        where = (f"three tiers: {where}; under it a RAM tier of expert slots in locked RAM, read from the model's file "
                 "(the experts mapped untouched)")
        mp = dataclasses.replace(mp, lazy_experts=True, repack=False, use_mmap=True)
        cp = dataclasses.replace(cp, moe_ram_mib=args.moe_ram_mib)
    elif args.moe_ram_mib is not None:
        mib = 1  # compared with no tier
        where = "the RAM tier: expert slots in locked RAM, read from the model's file (the experts mapped untouched)"
        mp = dataclasses.replace(mp, cpu_moe=False, n_cpu_moe=0, lazy_experts=True, repack=False, use_mmap=True)
        cp = dataclasses.replace(cp, moe_cache_mib=0, moe_cache_device=None, moe_ram_mib=args.moe_ram_mib)
    prompt, sampling = args.prompt or default_prompt(), Sampling(temperature=args.temp, seed=args.seed)
    return _run_and_print(args, model_path, mp, cp, prompt, sampling, mib, where)


def _run_and_print(args: argparse.Namespace, model_path: Path, mp: ModelParams, cp: ContextParams, prompt: str,
                   sampling: Sampling, mib: float, where: str | None) -> int:
    if mib == 0 or args.no_compare:
        report = run_stats(model_path, mp, cp, prompt, args.n_gen, sampling)
        if args.json:
            json.dump(dataclasses.asdict(report), sys.stdout, indent=2)
            print()
        else:
            print(format_report(report))
        return 0
    both = run_main_job(model_path, mp, cp, prompt, args.n_gen, sampling)
    if args.json:
        json.dump({"no_cache": dataclasses.asdict(both.plain), "cache": dataclasses.asdict(both.cached),
                   "identical": both.identical, "n_same": both.n_same, "where": where}, sys.stdout, indent=2)
        print()
    else:
        print(format_comparison(both, where))
    return 0
