"""llama-server with the RAM tier (--moe-ram-mib): a real server on 127.0.0.1 answers as one without it (greedy),
and every reader of the tier's reads agrees: /metrics, the request lines, the audit log's records and the exit
line."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import requests

from llama_moe.formats.audit import ExitRecord, ReadyRecord, RequestRecord, read_audit
from llama_moe.tools.server.metrics import parse_moe_cache
from support.cache_sizes import mib_for_slots
from support.llama_server import find_server_binary, start_server, stop_server

PROMPTS = ["The ship left the harbour at dawn, and the crew", "Bread rises when the yeast", "A comet's tail points"]


def _serve(tmp_path: Path, name: str, args: list[str]) -> tuple[list[str], str, str, Path]:
    audit, log = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.log"
    proc, url = start_server(find_server_binary(), [*args, "--metrics", "--moe-cache-audit", str(audit), "-c", "512",
                                                    "-np", "1", "-t", "2", "--no-repack", "-v"], log)
    try:
        texts = []
        for p in PROMPTS:
            r = requests.post(url + "/completion", json={"prompt": p, "n_predict": 24, "temperature": 0}, timeout=300)
            r.raise_for_status()
            texts.append(r.json()["content"])
        metrics = requests.get(url + "/metrics", timeout=30).text
    finally:
        assert stop_server(proc) == 0
    return texts, metrics, log.read_text(errors="replace"), audit


def test_the_tier_answers_as_without_it_and_its_readers_agree(tmp_path: Path, lib, tiny_model_path: Path) -> None:
    plain, _, _, _ = _serve(tmp_path, "plain", ["-m", str(tiny_model_path), "--cpu-moe"])
    mib = mib_for_slots(tiny_model_path, 8)
    texts, metrics, log, audit = _serve(tmp_path, "tier", ["-m", str(tiny_model_path), "--moe-ram-mib", f"{mib:.4f}"])
    assert texts == plain
    c = parse_moe_cache(metrics)
    # short prompts: every read is a miss's, into its slot or (beyond a ubatch's slots) for the ubatch alone
    assert c is not None and c.ram_tier == 1 and c.n_disk_reads == 3 * c.n_miss
    assert c.n_bytes_disk == c.n_bytes_upload + c.n_bytes_cpu > 0
    assert "the RAM tier: " in log and "lazy read enabled" in log  # --moe-ram-mib loads with --lazy-mode experts
    records = read_audit(audit).records
    ready = next(r for r in records if isinstance(r, ReadyRecord))
    reqs = [r for r in records if isinstance(r, RequestRecord)]
    end = records[-1]
    assert isinstance(end, ExitRecord) and len(reqs) == len(PROMPTS)
    e = end.counters
    assert (e.bytes_disk, e.disk_reads) == (c.n_bytes_disk, c.n_disk_reads)
    # each request's reads, in its line and its record, add up to what the context read while serving
    lines = [float(m) for m in re.findall(r"MoE RAM tier: ([0-9.]+) MiB read from the model's file", log)]
    assert len(lines) == len(reqs)
    for mib_read, r in zip(lines, reqs):
        assert abs(mib_read - r.req.bytes_disk / 2**20) < 0.06
    assert sum(r.req.bytes_disk for r in reqs) == e.bytes_disk - ready.counters.bytes_disk
    (exit_line,) = re.findall(r"the RAM tier read (\d+) expert tensors \(([0-9.]+) MiB\)", log)
    assert int(exit_line[0]) == e.disk_reads


def test_three_tiers_answer_as_without_a_cache_and_metrics_say_the_tiers(tmp_path: Path, lib, tiny_model_path: Path) -> None:
    plain, _, _, _ = _serve(tmp_path, "plain", ["-m", str(tiny_model_path), "--cpu-moe"])
    dev, ram = mib_for_slots(tiny_model_path, 8, hybrid=True), mib_for_slots(tiny_model_path, 8)
    texts, metrics, log, audit = _serve(tmp_path, "three", ["-m", str(tiny_model_path), "--cpu-moe", "--moe-cache-device",
                                                            "CPU", "--moe-cache-mib", f"{dev:.4f}", "--moe-cache-hybrid",
                                                            "--moe-cache-admit", "2", "--moe-ram-mib", f"{ram:.4f}"])
    assert texts == plain
    c = parse_moe_cache(metrics)
    assert c is not None and c.ram_below == 1 and c.ram_tier == 1 and c.hybrid
    # the tier looks up what the device lacked: the misses, and the admissions between decodes
    assert c.n_ram_hit + c.n_ram_miss == c.n_miss + c.n_admit > 0
    assert c.n_disk_reads == 3 * c.n_ram_miss and c.n_bytes_disk > 0
    assert "the RAM tier under the cache held" in log
    # the audit log's exit record reads the same counters, and the log checks clean
    end = read_audit(audit).records[-1]
    assert isinstance(end, ExitRecord)
    assert (end.counters.ram_hits, end.counters.ram_misses, end.counters.bytes_disk) == (c.n_ram_hit, c.n_ram_miss, c.n_bytes_disk)
    check = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(audit), "--model", str(tiny_model_path)],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    (held,) = re.findall(r"the RAM tier under the cache held (\d+) of the (\d+) experts", log)
    assert (int(held[0]), int(held[1])) == (c.n_ram_hit, c.n_ram_hit + c.n_ram_miss)
