"""``python -m llama_moe predict MODEL T.bin``: per MoE layer, how well its experts are guessed from the
previous layer's routing of the same token (a co-occurrence predictor ranked on the first traces, scored on
the others; a single trace's first half, scored on its second), against the layer's most frequent experts."""
from __future__ import annotations

import argparse

from .common import add_output_options, emit, model_layout, progress, rate, read_traces
from ..routing.prediction import PredictReport, predict_routes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="how well a layer's experts are guessed from the previous layer's routing",
                       description=__doc__.replace("``", ""))
    p.add_argument("model", help="a GGUF MoE model")
    p.add_argument("traces", nargs="+", metavar="T.bin", help="routing traces (python -m llama_moe trace), one after another")
    p.add_argument("--top", type=int, help="experts guessed per token and layer (default: the model's k)")
    add_output_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    layout = model_layout(args.model)
    routes = read_traces(args, args.traces, layout)
    bar = progress(args, "% of the tokens scored", percent=True)
    try:
        report = predict_routes(args.model, routes, layout.n_expert, args.top, bar)
    finally:
        bar.close()
    emit(args, report, format_report)
    return 0


def format_report(r: PredictReport) -> str:
    lines = [f"model      {r.model}: trained on tokens 0..{r.n_train - 1}, scored on the {r.n_test} after; "
             f"{r.top} guesses per token, {r.k} experts selected",
             f"held out   {r.held_out}",
             "           share of a layer's selected experts among the guesses: from the previous layer's routing "
             "(predictor) and the layer's most frequent experts (baseline)", "",
             "layer  from  predictor  baseline    lift"]
    for l in r.layers:
        lift = "      -" if l.lift is None else f"{l.lift:+7.4f}"
        src = "    -" if l.prev_il is None else f"{l.prev_il:5d}"
        lines.append(f"{l.il:5d} {src}     {rate(l.predictor)}    {rate(l.baseline)} {lift}")
    lines.append(f" mean             {rate(r.mean_predictor)}    {rate(r.mean_baseline)}")
    return "\n".join(lines)
