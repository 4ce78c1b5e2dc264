"""Writes the architecture table of docs/architectures.md from a run of tests/test_architectures.py:

    LLAMA_MOE_ARCH_REPORT=/tmp/arch python -m pytest -q tests/test_architectures.py
    python tests/arch_table.py /tmp/arch [docs/architectures.md]

The table goes between the two marker lines of the file; the rest of it is left as it is.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_architectures import NEEDS_ENGINE  # noqa: E402

from llama_moe.tools.synth.archs import CONFIGS, arch_model  # noqa: E402

BEGIN, END = "<!-- architecture table: begin -->", "<!-- architecture table: end -->"
DESIGNED = {"qwen3moe": "designed routing (docs/synthetic-models.md); 6 layers x 32 experts",
            "gpt-oss": "designed routing; expert biases, MXFP4 experts, sliding windows and sinks"}


def _row(config: str, result: dict | None) -> str:
    arch = config if config in DESIGNED else arch_model(config).arch
    notes = DESIGNED.get(config) or arch_model(config).notes
    if result is None:
        return f"| `{config}` | {arch} | yes | not run | | | {notes} |"
    info, checks = result["info"], result["checks"]
    failed = [name for name, c in checks.items() if not c["ok"]]
    if "crashed" in info or info.get("stage") != "done":
        tested = f"crashed in {info.get('stage', 'setup')}"
    else:
        tested = f"{len(checks) - len(failed)} of {len(checks)} checks"
    on = [c for name, c in checks.items() if name.endswith(": cached layers are the MoE layers")]
    cached = "yes" if on and all(c["ok"] for c in on) else "no"
    same = [c for name, c in checks.items() if "identical" in name]
    identical = "yes" if same and all(c["ok"] for c in same) else "no"
    if cached == "no":
        identical = "(cache off)"
    elif info.get("stage") != "done" and identical == "yes":
        identical = "yes, until the crash"
    why = NEEDS_ENGINE.get(config)
    extra = f" **Engine fix needed:** {why}." if why else ""
    if failed and not why:
        extra += " Failed: " + "; ".join(failed) + "."
    if cached == "no" and info.get("cache_warnings"):
        extra += " The engine said: " + " / ".join(f"`{w}`" for w in info["cache_warnings"])
    return f"| `{config}` | {arch} | yes | {tested} | {cached} | {identical} | {notes}.{extra} |"


def table(report: Path) -> str:
    rows = []
    meta = None
    for config in ["qwen3moe", "gpt-oss", *CONFIGS]:
        f = report / f"{config}.json"
        result = json.loads(f.read_text()) if f.is_file() else None
        if result and "patch_hash" in result["info"]:
            meta = result["info"]
        rows.append(_row(config, result))
    stamp = (f"{datetime.date.today().isoformat()}, {os.cpu_count()}-core {platform.machine()} machine, "
             f"{meta['variant'] if meta else 'unknown'} build" + (f", patches `{meta['patch_hash']}`" if meta else ""))
    head = ("| configuration | llama.cpp architecture | made | tested | cached | bit-identical | notes |\n"
            "|---|---|---|---|---|---|---|")
    return (f"Measured {stamp}: `LLAMA_MOE_ARCH_REPORT=DIR python -m pytest -q tests/test_architectures.py`, then "
            f"`python tests/arch_table.py DIR`.\n\n{head}\n" + "\n".join(rows) + "\n")


def main(argv: list[str]) -> int:
    report = Path(argv[0])
    doc = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent / "docs" / "architectures.md"
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        print(f"{doc}: no {BEGIN} ... {END} lines to write the table between", file=sys.stderr)
        return 2
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    doc.write_text(text[:start] + "\n" + table(report) + text[end:])
    print(f"wrote the table of {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
