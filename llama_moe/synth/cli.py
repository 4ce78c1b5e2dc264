"""``python -m llama_moe synth``: write a synthetic qwen3moe or gpt-oss model."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Any, TextIO

from llama_moe.errors import LlamaMoeError
from llama_moe.synth.config import RoutingConfig
from llama_moe.synth.shapes import SHAPES, parse_shape
from llama_moe.synth.synthesize import EXPERT_TYPES, synthesize


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``synth`` subcommand to an argparse subparsers object; its handler is ``run``."""
    p = subparsers.add_parser(
        "synth",
        help="write a synthetic qwen3moe or gpt-oss GGUF model",
        description="Write a synthetic qwen3moe or gpt-oss GGUF (the gpt-oss-* shapes) with a real tokenizer, "
        "corpus-like text and realistic expert routing (see llama_moe/synth/routing.py).",
    )
    p.add_argument("out", metavar="OUT.gguf", help="output file")
    p.add_argument("--shape", default="tiny",
                   help=f"a preset ({', '.join(SHAPES)}) or k=v,... overrides (e.g. 'small,n_layer=4')")
    p.add_argument("--experts", default=None, choices=sorted(EXPERT_TYPES),
                   help="expert tensor type (default: mxfp4 for gpt-oss shapes, as the real models ship, else q8_0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skew", type=float, default=None,
                   help=f"router hot-expert bias scale (default {RoutingConfig().skew})")
    p.add_argument("--locality", type=float, default=None,
                   help=f"router topic/context scale (default {RoutingConfig().locality})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


class ProgressBar:
    """One self-overwriting line on a terminal stream: percent, bytes, rate and ETA."""

    def __init__(self, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.start: float | None = None  # set at the first call: the design is built by then
        self.start_bytes = 0
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.start is None:
            self.start, self.start_bytes = now, done
        if done < total and now - self.last < 0.2:
            return
        self.last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        elapsed = max(now - self.start, 1e-9)
        rate = (done - self.start_bytes) / elapsed
        eta = (total - done) / rate if rate > 0 else 0.0
        line = (f"\r[{'#' * fill}{'.' * (self.width - fill)}] {frac * 100:5.1f}% "
                f"{_size(done)}/{_size(total)} {_size(rate)}/s ETA {eta:4.0f}s")
        self.stream.write(line)
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


def run(args: argparse.Namespace) -> int:
    try:
        shape = parse_shape(args.shape)
        routing = RoutingConfig()
        if args.skew is not None:
            routing = replace(routing, skew=args.skew)
        if args.locality is not None:
            routing = replace(routing, locality=args.locality)
        shape_arg = args.shape if args.shape in SHAPES else shape
        bar = None if args.quiet else ProgressBar()
        t0 = time.monotonic()
        experts = args.experts or ("mxfp4" if shape.arch == "gpt-oss" else "q8_0")
        info = synthesize(args.out, shape_arg, experts, args.seed, routing, progress=bar)
    except (LlamaMoeError, OSError) as e:
        print(f"\nsynth: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {info.path}: {info.shape.arch}, {_size(info.file_bytes)}, {info.shape.n_layer} layers x {info.shape.n_expert} "
          f"experts ({info.expert_type}, {_size(info.expert_bytes)} per expert), {info.n_vocab_used} of "
          f"{info.shape.n_vocab} tokens used, seed {info.seed}, {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m llama_moe.synth.cli``) for use before the lead's CLI."""
    ap = argparse.ArgumentParser(prog="llama_moe")
    sub = ap.add_subparsers(dest="command", required=True)
    register(sub)
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
