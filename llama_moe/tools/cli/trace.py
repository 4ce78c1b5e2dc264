"""``python -m llama_moe trace MODEL TEXT.txt OUT.bin``: runs the engine over a text and writes which experts
every MoE layer selected, one record per token and layer (the routing trace format of docs/formats.md)."""
from __future__ import annotations

import argparse

from ..routing.tracing import DEFAULT_UBATCH, TraceReport, trace_to_file
from .common import add_output_options, emit, model_layout, progress, read_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="record which experts every MoE layer selects over a text (routing trace)",
                       description=__doc__.replace("``", ""))
    p.add_argument("model", help="a GGUF MoE model")
    p.add_argument("text", help="a UTF-8 text file")
    p.add_argument("out", help="the trace to write (int32 layer, int32 k, k expert ids, k float32 weights = 0)")
    p.add_argument("-c", "--ctx", type=int, default=4096,
                   help="context size: the text is cut into windows of this many tokens (default 4096)")
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: one per core)")
    p.add_argument("--ubatch", type=int, default=DEFAULT_UBATCH,
                   help=f"tokens per decode (default {DEFAULT_UBATCH}; 1 is decode-like and slow; the routing is the same)")
    add_output_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    layout = model_layout(args.model)
    text = read_text(args.text)
    bar = progress(args, "tokens traced")
    try:  # written whole or not at all (write_trace)
        report = trace_to_file(args.model, text, args.text, args.out, layout, args.ctx, args.threads, args.ubatch, bar)
    finally:
        bar.close()
    emit(args, report, format_report)
    return 0


def format_report(r: TraceReport) -> str:
    return (f"wrote {r.out}: {r.n_tokens} tokens x {r.n_layers} MoE layers, {r.k} experts each "
            f"({r.n_records} records, {r.bytes / 2**20:.2f} MiB) in {r.seconds:.1f} s ({r.tokens_per_s:.0f} tokens/s)")
