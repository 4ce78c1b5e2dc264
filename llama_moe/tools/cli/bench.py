"""``python -m llama_moe bench MODEL``: decode and prompt throughput of each way to run a MoE model whose
experts live in RAM, side by side in one invocation, on the same model and the same real text."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bench.plot import plot_decode, require_matplotlib
from ..bench.throughput import MODES, bench_model, load_rows, parse_modes, rows_json, to_markdown
from ...errors import ParameterError
from ..errors import PlotUnavailableError
from ...formats.atomic import write_text


def png_path(value: str) -> Path:
    """argparse ``type`` of ``--png``: refuses the option before any measurement when matplotlib is missing."""
    try:
        require_matplotlib()
    except PlotUnavailableError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return Path(value)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="decode and prompt throughput: experts in RAM, cached, all in VRAM")
    p.add_argument("model", nargs="?", help="the GGUF to measure (not with --merge)")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="run nothing: one table (and --json, --png) from the rows of earlier --json files, of one "
                        "model on one machine, every row bounded by the all-in-VRAM row among them")
    p.add_argument("--cache-pct", type=float, nargs="*", default=[25, 50, 75], help="cache sizes in %% of the experts")
    p.add_argument("-t", "--threads", type=int, nargs="+", default=[8])
    p.add_argument("-n", "--n-gen", type=int, default=128)
    p.add_argument("--pp", type=int, default=512)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--no-vram", action="store_true", help="skip the all-in-VRAM ceiling")
    p.add_argument("--modes", default="cpu-moe,n-cpu-moe,upload,hybrid,hybrid-adaptive,hybrid-admit,vram",
                   help="comma-separated, of: " + ", ".join(MODES))
    p.add_argument("--profile", help="the hybrid modes' profile (default: made from the corpus's train paragraphs)")
    p.add_argument("--cache-device", metavar="DEVICE", help="the device that holds the cache (moe_cache_device; CPU: in "
                   "RAM, which runs every lookup and speeds nothing up; default: the GPU)")
    p.add_argument("--profile-stride", type=int, default=1, metavar="K",
                   help="without --profile: make it from every K-th train paragraph of each topic (default 1: all)")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--md", help="write a Markdown table here")
    p.add_argument("--png", metavar="PATH", type=png_path,
                   help="write a plot of decode tok/s against cache size here (needs matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.merge:
        if args.model:
            raise ParameterError("--merge runs nothing: give it the JSON files, not a model")
        rows = load_rows([Path(p) for p in args.merge])
    else:
        if not args.model:
            raise ParameterError("bench needs a model (or --merge JSON...)")
        rows = bench_model(Path(args.model), args.cache_pct, args.threads, args.n_gen, args.pp, args.runs,
                           not args.no_vram, parse_modes(args.modes), Path(args.profile) if args.profile else None,
                           args.profile_stride, log, cache_device=args.cache_device)
    table = to_markdown(rows, args.pp)
    print(table)
    if args.md:
        write_text(args.md, table + "\n")
    if args.json:
        write_text(args.json, rows_json(rows))
    # last: the table and the JSON are written even if drawing fails
    if args.png:
        plot_decode(rows, Path(args.png))
    return 0
