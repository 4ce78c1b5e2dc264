"""``python -m llama_moe synth``: write a synthetic qwen3moe or gpt-oss model, or a tiny one of another
MoE architecture (archs.py)."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from typing import Any, TextIO

from llama_moe.errors import LlamaMoeError
from llama_moe.tools.synth.calibration import calibration_of, custom_shape_warning
from llama_moe.tools.synth.config import RoutingConfig, routing_for
from llama_moe.tools.synth.shapes import SHAPES, parse_shape
from llama_moe.tools.synth.archs import CONFIGS as ARCH_CONFIGS
from llama_moe.tools.synth.synthesize import EXPERT_TYPES, SynthInfo, synthesize, synthesize_arch


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``synth`` subcommand to an argparse subparsers object; its handler is ``run``."""
    p = subparsers.add_parser(
        "synth",
        help="write a synthetic qwen3moe or gpt-oss GGUF model",
        description="Write a synthetic qwen3moe or gpt-oss GGUF (the gpt-oss-* shapes) with a real tokenizer, "
        "corpus-like text and realistic expert routing (see llama_moe/tools/synth/routing.py).",
    )
    p.add_argument("out", metavar="OUT.gguf", help="output file")
    p.add_argument("--arch", default=None, metavar="NAME",
                   help="qwen3moe (the default) or gpt-oss: the designed models of --shape; or one of "
                   f"{', '.join(ARCH_CONFIGS)}: a tiny random-weight model of that llama.cpp architecture "
                   "(--shape tiny only; docs/architectures.md)")
    p.add_argument("--shape", default="tiny",
                   help=f"a preset ({', '.join(SHAPES)}) or k=v,... overrides (e.g. 'small,n_layer=4')")
    p.add_argument("--experts", default=None, choices=sorted(EXPERT_TYPES),
                   help="expert tensor type (default: mxfp4 for gpt-oss shapes, as the real models ship, else q8_0)")
    p.add_argument("--seed", type=int, default=0)
    _routing_options(p)
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


ROUTING_HELP = {
    "skew": "hot-expert bias", "topic": "topic affinity", "recency": "recent-token term",
    "recency_tokens": "time constant of the recency head, tokens", "token": "token-identity term",
    "first": "depth profile at the first layer", "last": "depth profile at the last layer",
    "rise": "relative depth where the profile reaches 1", "fall": "relative depth where it starts to fall",
}


def _routing_options(p: argparse.ArgumentParser) -> None:
    for name, text in ROUTING_HELP.items():
        p.add_argument(f"--{name.replace('_', '-')}", dest=f"routing_{name}", type=float, default=None,
                       help=f"router knob: {text} (default: the shape's calibration, config.py)")


def routing_from(values: dict[str, float | None], shape: object) -> RoutingConfig:
    """The shape's calibrated routing with the knobs given (not None) replaced."""
    given = {k: v for k, v in values.items() if v is not None}
    return replace(routing_for(shape), **given)


def _given(args: argparse.Namespace) -> dict[str, float | None]:
    return {name: getattr(args, f"routing_{name}") for name in ROUTING_HELP}


def run(args: argparse.Namespace) -> int:
    bar = None
    try:
        t0 = time.monotonic()
        if args.arch in ARCH_CONFIGS:
            if args.shape != "tiny":
                raise LlamaMoeError(f"--arch {args.arch} has the tiny shape only, got --shape {args.shape}")
            if any(v is not None for v in _given(args).values()):
                raise LlamaMoeError(f"--arch {args.arch}: the router knobs shape the designed routing of qwen3moe "
                                    "and gpt-oss only; this model's weights are random")
            bar = None if args.quiet else ProgressBar()
            info = synthesize_arch(args.out, args.arch, args.experts or "q8_0", args.seed, progress=bar)
            return _wrote(info, t0)
        spec = _shape_for(args.arch, args.shape)
        shape = parse_shape(spec)
        _warn_if_custom("synth", spec)
        routing = routing_from(_given(args), shape)
        shape_arg = spec if spec in SHAPES else shape
        bar = None if args.quiet else ProgressBar()
        experts = args.experts or ("mxfp4" if shape.arch == "gpt-oss" else "q8_0")
        info = synthesize(args.out, shape_arg, experts, args.seed, routing, progress=bar)
    except (LlamaMoeError, OSError, MemoryError) as e:  # one line, as every command's (llama_moe/tools/cli/__init__.py)
        from llama_moe.tools.cli import one_line

        drawn = bar is not None and bar.start is not None  # the bar's line is ended first
        print(f"{chr(10) if drawn else ''}llama_moe synth: error: {one_line(e)}", file=sys.stderr)
        return 2
    return _wrote(info, t0)


def _shape_for(arch: str | None, spec: str) -> str:
    """--arch qwen3moe / gpt-oss with a shape: the tiny gpt-oss shape is gpt-oss-tiny; a shape of the other
    architecture is refused rather than converted silently."""
    if arch is None:
        return spec
    if arch not in ("qwen3moe", "gpt-oss"):
        raise LlamaMoeError(f"unknown architecture {arch!r}: one of qwen3moe, gpt-oss, {', '.join(ARCH_CONFIGS)}")
    if arch == "gpt-oss" and spec == "tiny":
        return "gpt-oss-tiny"
    shape = parse_shape(spec)
    if shape.arch != arch:
        raise LlamaMoeError(f"--shape {spec} is a {shape.arch} shape, not {arch}")
    return spec


def _wrote(info: SynthInfo, t0: float) -> int:
    arch = info.arch or info.shape.arch
    print(f"wrote {info.path}: {arch}{f' ({info.config})' if info.config and info.config != arch else ''}, "
          f"{_size(info.file_bytes)}, {info.shape.n_layer} layers x {info.shape.n_expert} "
          f"experts ({info.expert_type}, {_size(info.expert_bytes)} per expert), {info.n_vocab_used} of "
          f"{info.shape.n_vocab} tokens used, seed {info.seed}, {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


def register_report(subparsers: Any) -> argparse.ArgumentParser:
    """``synth-report``: the synthetic routing beside published measurements of real routing."""
    p = subparsers.add_parser(
        "synth-report",
        help="the synthetic routing's cache hit rates and locality beside real routing's (numpy only)",
        description="Route the embedded corpus (each paragraph one prompt) through a synthetic shape's routers in "
        "numpy and print per-layer LRU and Belady hit rates at 6.25/12.5/25/50%% of the experts, adjacent-token "
        "overlap by depth, per-prompt concentration and what shuffling the tokens costs, beside the figures the "
        "shape is held to, and the shape's calibration (what it is calibrated against, or 'not calibrated', and "
        "what real traces say of it; a k=v shape is never calibrated). No native library needed.",
    )
    p.add_argument("--shape", default="qwen3-30b-a3b", help="a preset or k=v,... (default qwen3-30b-a3b)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, pooled (default 0,1,2)")
    p.add_argument("--search", action="store_true", help="coordinate-descend the router knobs toward the published figures")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _routing_options(p)
    p.set_defaults(func=run_report)
    return p


def run_report(args: argparse.Namespace) -> int:
    from llama_moe.tools.synth import calibrate

    try:
        shape = parse_shape(args.shape)
        _warn_if_custom("synth-report", args.shape)
        seeds = _seeds(args.seeds)
        routing = routing_from(_given(args), shape)
        name = args.shape if args.shape in SHAPES else shape
        if args.search:
            routing, rep = calibrate.search(name, seeds, routing, log=lambda m: print(m, file=sys.stderr, flush=True))
        else:
            rep = calibrate.measure(name, seeds, routing)
    except (ValueError, LlamaMoeError) as e:
        print(f"llama_moe synth-report: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        import json
        from dataclasses import asdict

        cal = calibration_of(rep.shape)
        print(json.dumps(dict(asdict(rep), checks=[asdict(c) for c in rep.checks()],
                              calibration=dict(asdict(cal), label=rep.calibration_label())), indent=1))
    else:
        print(rep.format())
    return 0


def _warn_if_custom(command: str, spec: str) -> None:
    """A --shape that is no preset: its routing is not calibrated (llama_moe/tools/synth/calibration.py)."""
    text = custom_shape_warning(spec)
    if text is not None:
        logging.getLogger(__name__).warning("llama_moe %s: warning: %s", command, text)


def _seeds(text: str) -> tuple[int, ...]:
    """``--seeds``: whole numbers separated by commas."""
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise LlamaMoeError(f"--seeds must be whole numbers separated by commas, got {text!r}") from None
