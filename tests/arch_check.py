"""The cache's checks on one architecture's tiny model, in one process (tests/test_architectures.py starts one
per architecture, so a crash in the engine fails that architecture alone).

    python tests/arch_check.py MODEL.gguf CONFIG OUT.json

Every mode decodes the same prompt (over 32 tokens) and then N_GEN greedy tokens, on the CPU with the cache in
RAM (moe_cache_device="CPU"), and is compared with no cache: the tokens and the final logits must be
identical. Each check is written to OUT.json as {"ok": bool, "detail": str}, whether it passed or not.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.cache_sizes import mib_for_slots  # noqa: E402

from llama_moe import Context, ContextParams, Model, ModelParams  # noqa: E402
from oracles.lru import simulate_lru  # noqa: E402
from llama_moe.tools.experts import ExpertLayout, expert_layout  # noqa: E402
from llama_moe.gguf_files import read_gguf  # noqa: E402
from llama_moe.params import EXPERTS_REGEX  # noqa: E402
from llama_moe.formats.profile import Profile, write_profile  # noqa: E402
from llama_moe.tools.routing.budget import engine_slots, mib_to_bytes  # noqa: E402

N_GEN = 128
RAM = ModelParams(cpu_moe=True, repack=False)
# a paragraph of the embedded corpus's register, over 32 tokens
PROMPT = ("The ship left the harbour at dawn, and the crew watched the lighthouse fall behind them while the "
          "captain read the charts of the northern coast, where the winter storms had moved the sandbanks again.")


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []  # since the last clear()
        self.all: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.all.append(record.getMessage())


class Checks:
    def __init__(self) -> None:
        self.results: dict[str, dict[str, Any]] = {}

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.results[name] = {"ok": bool(ok), "detail": detail}


def _ctx(**kw: Any) -> ContextParams:
    # two threads: the default (one per core, and batch threads) oversubscribes a shared 2-core machine 200x
    return ContextParams(n_ctx=512, n_threads=2, n_threads_batch=2, moe_cache_device="CPU", **kw)


def _run(model: Model, cp: ContextParams, trace: bool = False) -> dict[str, Any]:
    with Context(model, cp) as ctx:
        if trace:
            ctx.start_trace()
        tokens = list(ctx.generate(PROMPT, max_tokens=N_GEN, stop_at_eog=False))
        out = {"tokens": tokens, "logits": ctx.logits().copy(), "stats": ctx.moe_cache_stats(),
               "layers": ctx.layer_stats(), "records": ctx.stop_trace() if trace else [],
               "resident": {l.il: set(ctx.resident(l.il).tolist()) for l in ctx.layer_stats()}}
    return out


def _same(checks: Checks, mode: str, run: dict[str, Any], ref: dict[str, Any]) -> None:
    first = next((i for i, (a, b) in enumerate(zip(run["tokens"], ref["tokens"])) if a != b), None)
    checks.add(f"{mode}: tokens identical", run["tokens"] == ref["tokens"],
               f"{len(ref['tokens'])} tokens" + ("" if first is None else f", first differs at {first}"))
    diff = float(np.max(np.abs(run["logits"] - ref["logits"])))
    checks.add(f"{mode}: final logits identical", bool(np.array_equal(run["logits"], ref["logits"])),
               f"max |diff| {diff:.3g}")


def _engaged(checks: Checks, mode: str, run: dict[str, Any], expect: list[int], slots: dict[int, int]) -> None:
    stats, layers = run["stats"], run["layers"]
    if stats is None:
        checks.add(f"{mode}: cache on", False, "moe_cache_stats() is None: the cache is off")
        return
    served = sorted(l.il for l in layers)
    checks.add(f"{mode}: cached layers are the MoE layers", served == expect, f"served {served}, expected {expect}")
    cold = [l.il for l in layers if l.n_hit == 0]
    checks.add(f"{mode}: hits in every cached layer", bool(layers) and not cold,
               f"hits {[l.n_hit for l in layers]}" + (f"; none in layers {cold}" if cold else ""))
    got = {l.il: l.n_slots for l in layers}
    checks.add(f"{mode}: slots per layer as the planner predicts", got == {il: slots[il] for il in served},
               f"engine {got}, planner {slots}")


def _coldest_first(layout: ExpertLayout, records: list, out: Path, n: int) -> tuple[Path, dict[int, set[int]]]:
    """A profile of each layer's ``n`` least used experts (from a trace), for more slots than that: the hybrid
    still hits, and the adaptive cache has free slots to fill and hotter experts to swap in."""
    ranked = []
    for l in layout.layers:
        counts = np.zeros(layout.n_expert, dtype=np.int64)
        for r in records:
            if r.il == l.il and r.n_tokens <= 32:  # the lookups' ubatches (the prompt's is not looked up)
                np.add.at(counts, r.experts.ravel(), 1)
        # the least used of those used at all: a concentrated routing never uses its coldest experts
        ranked.append([int(e) for e in np.lexsort((np.arange(layout.n_expert), counts, counts == 0))])
    pairs = tuple((l.il, order[i]) for i in range(n) for l, order in zip(layout.layers, ranked))
    write_profile(out, Profile(layout.n_layer, layout.n_expert, n, pairs))
    return out, {l.il: set(order[:n]) for l, order in zip(layout.layers, ranked)}


def check(model_path: Path, config: str, moe_layers: list[int], out: Path) -> dict[str, Any]:
    """Runs the modes one after the other, writing what is known to ``out`` before each: an engine crash
    leaves the checks done so far and the stage it died in."""
    log = _Log()
    logging.getLogger("llama_moe.native").addHandler(log)
    logging.getLogger("llama_moe.native").setLevel(logging.INFO)
    checks = Checks()
    t0 = time.monotonic()
    layout = expert_layout(model_path)
    checks.add("layout: the tools count the MoE layers", [l.il for l in layout.layers] == moe_layers,
               f"expert_layout {[l.il for l in layout.layers]}, expected {moe_layers}; n_layer {layout.n_layer}")
    k = layout.n_expert_used
    slots = 2 * k
    import llama_moe

    native = llama_moe.native_version()
    info: dict[str, Any] = {"config": config, "arch": read_gguf(model_path).architecture, "n_layer": layout.n_layer,
                            "n_expert": layout.n_expert, "k": k, "moe_layers": moe_layers, "slots": slots,
                            "patch_hash": native["patch_hash"], "variant": native["variant"]}

    def stage(name: str) -> None:
        info["stage"] = name  # "done" at the end; otherwise where it died
        info["seconds"] = round(time.monotonic() - t0, 1)
        info["cache_warnings"] = sorted({l.strip() for l in log.all if "llama_moe_cache" in l and
                                         ("keep llama.cpp" in l or "is off" in l)})
        out.write_text(json.dumps({"info": info, "checks": checks.results}, indent=1, default=str))

    mib = mib_for_slots(model_path, slots)
    hmib = mib_for_slots(model_path, slots, hybrid=True)
    planned = engine_slots(layout, mib_to_bytes(mib), False)
    hplanned = engine_slots(layout, mib_to_bytes(hmib), True)

    with Model(model_path, RAM) as model:
        stage("no cache")
        ref = _run(model, _ctx())
        n_prompt = len(model.tokenize(PROMPT))
        info["prompt_tokens"] = n_prompt
        checks.add("the prompt is over 32 tokens", n_prompt > 32, f"{n_prompt} tokens")

        stage("upload")
        up = _run(model, _ctx(moe_cache_mib=mib), trace=True)
        _same(checks, "upload", up, ref)
        _engaged(checks, "upload", up, moe_layers, planned)
        recs = up["records"]
        traced = sorted({r.il for r in recs})
        shapes_ok = all(r.experts.shape[1] == k and r.experts.min() >= 0 and r.experts.max() < layout.n_expert
                        for r in recs)
        n_first = sum(r.n_tokens for r in recs if r.il == moe_layers[0])
        checks.add("trace: records every MoE layer's routing", traced == moe_layers and shapes_ok and
                   n_first == n_prompt + N_GEN, f"layers {traced}, {len(recs)} records of {k} experts per token, "
                   f"{n_first} tokens in layer {moe_layers[0]}")
        if up["stats"] is not None:
            sim = simulate_lru(recs, {il: planned[il] for il in moe_layers}, layout.n_expert)
            s = up["stats"]
            checks.add("upload: counters match a replay of the trace", (s.n_hit, s.n_miss, s.n_cpu, s.n_refused) ==
                       (sim.n_hit, sim.n_miss, sim.n_cpu, 0),
                       f"engine {(s.n_hit, s.n_miss, s.n_cpu, s.n_refused)}, replay {(sim.n_hit, sim.n_miss, sim.n_cpu, 0)}")

        profile, resident = _coldest_first(layout, recs, out.parent / "p.strp", slots - 2)
        hybrid = dict(moe_cache_mib=hmib, moe_cache_profile=profile, moe_cache_hybrid=True)

        stage("hybrid")
        hyb = _run(model, _ctx(**hybrid))
        _same(checks, "hybrid", hyb, ref)
        _engaged(checks, "hybrid", hyb, moe_layers, hplanned)
        if hyb["stats"] is not None:
            checks.add("hybrid: the profile fills each layer, nothing is uploaded",
                       hyb["resident"] == {il: resident[il] for il in hyb["resident"]} and hyb["stats"].n_bytes_upload == 0
                       and hyb["stats"].n_prefilled == (slots - 2) * len(moe_layers),
                       f"prefilled {hyb['stats'].n_prefilled}")

        stage("adaptive")
        ada = _run(model, _ctx(moe_cache_adaptive=True, **hybrid))
        _same(checks, "adaptive", ada, ref)
        _engaged(checks, "adaptive", ada, moe_layers, hplanned)
        if ada["stats"] is not None:
            checks.add("adaptive: fills and swaps while generating", ada["stats"].n_swap >= 2 * len(moe_layers),
                       f"{ada['stats'].n_swap} admitted, {2 * len(moe_layers)} slots free after the profile")

    # --n-cpu-moe N: the experts of the first N layers in RAM. On a CPU-only build every other layer's are in
    # RAM too (there is no GPU to put them on), so the cache serves every MoE layer; what is checked here is
    # that the patterns name exactly those layers' expert tensors in this architecture's naming, and that
    # the cache gives the same output with them (the split itself needs a GPU: benchmarks/cuda)
    n_cpu = moe_layers[len(moe_layers) // 2]
    stage(f"n_cpu_moe {n_cpu}")
    part = ModelParams(n_cpu_moe=n_cpu, repack=False)
    names = [t.name for t in read_gguf(model_path).tensors]
    matched = sorted({n for p in part.override_patterns(layout.n_layer) for n in names if re.search(p, n)})
    wanted = sorted(n for n in names if re.match(r"blk\.(\d+)\.", n) and int(n.split(".")[1]) < n_cpu
                    and re.search(EXPERTS_REGEX, n))
    checks.add(f"n_cpu_moe {n_cpu}: its patterns name the experts of layers 0-{n_cpu - 1}",
               matched == wanted and bool(wanted), f"{len(matched)} tensors matched, {len(wanted)} expected")
    with Model(model_path, part) as model:
        pref = _run(model, _ctx())
        some = _run(model, _ctx(moe_cache_mib=mib))
    _same(checks, f"n_cpu_moe {n_cpu}", some, pref)
    _engaged(checks, f"n_cpu_moe {n_cpu}", some, moe_layers, planned)

    # last: the mode that has crashed the engine on some layouts
    stage("mailbox")
    log.lines.clear()
    with Model(model_path, RAM) as model:
        # one graph thread: the mailbox's CPU thread spins on the other core (two graph threads beside it
        # on two cores took 20x longer)
        mbx = _run(model, ContextParams(n_ctx=512, n_threads=1, n_threads_batch=2, moe_cache_device="CPU",
                                        moe_cache_mailbox_on_cpu=True, **hybrid))
    _same(checks, "mailbox", mbx, ref)
    _engaged(checks, "mailbox", mbx, moe_layers, hplanned)
    handover = [l for l in log.lines if "mailbox: " in l and " layers hand over to " in l]
    checks.add("mailbox: the layers hand over to the CPU threads",
               bool(handover) and handover[-1].split("mailbox: ")[1].startswith(f"{len(moe_layers)} layers"),
               handover[-1] if handover else "no hand-over line in the log")
    if mbx["stats"] is not None and hyb["stats"] is not None:
        a, b = mbx["stats"], hyb["stats"]
        checks.add("mailbox: counts what the split counts", (a.n_hit, a.n_miss, a.n_bytes_cpu) ==
                   (b.n_hit, b.n_miss, b.n_bytes_cpu), f"mailbox {(a.n_hit, a.n_miss)}, split {(b.n_hit, b.n_miss)}")
    stage("done")
    return {"info": info, "checks": checks.results}


def main(argv: list[str]) -> int:
    model_path, config, out = Path(argv[0]), argv[1], Path(argv[2])
    moe_layers = [int(x) for x in argv[3].split(",")]
    result = check(model_path, config, moe_layers, out)
    failed = [name for name, c in result["checks"].items() if not c["ok"]]
    print(f"{config}: {len(result['checks']) - len(failed)} of {len(result['checks'])} checks passed"
          + (f"; failed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
