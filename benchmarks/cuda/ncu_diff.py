"""Per-kernel time of the tokens between two ncu runs of one_token_kernels.py (--csv --metrics
gpu__time_duration.sum): for each kernel name, its count and total microseconds in the second run minus the
first, divided by the tokens between them; the largest first, and the sum."""
from __future__ import annotations

import csv
import sys
from collections import defaultdict


def sums(path: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"].split("(")[0][:70]
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        us = value / 1000 if unit in ("nsecond", "ns") else value * 1000 if unit in ("msecond", "ms") else value
        out[name][0] += 1
        out[name][1] += us
    return out


def main() -> None:
    a, b, tokens = sums(sys.argv[1]), sums(sys.argv[2]), int(sys.argv[3])
    rows = [(name, (b[name][0] - a.get(name, [0, 0])[0]) / tokens, (b[name][1] - a.get(name, [0, 0])[1]) / tokens)
            for name in b]
    rows.sort(key=lambda r: -r[2])
    total_n = sum(r[1] for r in rows)
    total_us = sum(r[2] for r in rows)
    print(f"per token: {total_n:.0f} kernels, {total_us:.1f} us of kernel time")
    for name, n, us in rows[:25]:
        print(f"  {us:8.1f} us  {n:6.1f}x  {name}")


if __name__ == "__main__":
    main()
