"""Every reader of the MoE cache's counters says what the engine counted, in one run each of the two modes where
misses go several ways: upload mode with its split (uploaded, or computed on the CPU) and the admitting hybrid
with a peer tier on a second rpc-server (computed on the CPU, or by the peer; admissions between decodes). A real
llama-server on 127.0.0.1: its request lines and their own parts, the audit log's request, exit and load records,
/metrics, the exit line, `audit check`, `audit summary` and `stats --server` must all agree, and the misses must
add up to where they went."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from llama_moe.formats.audit import ExitRecord, LoadRecord, ReadyRecord, RequestRecord, read_audit
from llama_moe.tools.server.audit import check_audit, summarize
from llama_moe.tools.server.metrics import parse_moe_cache, parse_request_log_line
from support.llama_server import find_server_binary, start_server, stop_server

PROMPTS = ["The ship left the harbour at dawn, and the crew", "Bread rises when the yeast", "A comet's tail points"]


@dataclass(frozen=True)
class Served:
    log: str
    audit: Path
    metrics: str
    stats: dict


def _serve(tmp_path: Path, args: list[str], start=start_server) -> Served:
    audit, log = tmp_path / "audit.jsonl", tmp_path / "server.log"
    proc, url = start(find_server_binary(), [*args, "--metrics", "--moe-cache-audit", str(audit), "-c", "512",
                                             "-np", "1", "-t", "2", "-v"], log)
    try:
        for p in PROMPTS:
            r = requests.post(url + "/completion", json={"prompt": p, "n_predict": 24}, timeout=300)
            r.raise_for_status()
        metrics = requests.get(url + "/metrics", timeout=30).text
        out = subprocess.run([sys.executable, "-m", "llama_moe", "stats", "--server", url, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    finally:
        assert stop_server(proc) == 0
    return Served(log.read_text(errors="replace"), audit, metrics, json.loads(out.stdout)["moe_cache"])


def _agree(s: Served, peer: bool) -> None:
    records = read_audit(s.audit).records
    load, ready, end = records[0], next(r for r in records if isinstance(r, ReadyRecord)), records[-1]
    reqs = [r for r in records if isinstance(r, RequestRecord)]
    assert isinstance(load, LoadRecord) and isinstance(end, ExitRecord) and len(reqs) == len(PROMPTS)
    c = parse_moe_cache(s.metrics)
    assert c is not None
    # the exit record and /metrics (nothing decoded after the scrape)
    e = end.counters
    assert (e.hits, e.misses, e.uploads, e.cpu, e.peer_hits, e.admissions, e.admitted, e.bytes_upload, e.bytes_cpu) == \
        (c.n_hit, c.n_miss, c.n_upload, c.n_cpu, c.n_hit_peer, c.n_admit, c.n_admitted, c.n_bytes_upload, c.n_bytes_cpu)
    assert e.misses == e.uploads + e.cpu + e.peer_hits and e.admitted == e.uploads + e.swaps + e.admissions
    # the exit line
    (line,) = re.findall(r"llama_moe_cache: (\d+) hits of (\d+) lookups = \S+ \((\d+) admitted", s.log)
    assert tuple(map(int, line)) == (e.hits, e.hits + e.misses + e.refused, e.admitted)
    # each request line and its record, the line's own part and the record's own share
    lines = [p for p in map(parse_request_log_line, s.log.splitlines()) if p is not None]
    assert len(lines) == len(reqs)
    for l, r in zip(lines, reqs):
        assert (l.hits, l.misses, l.uploaded, l.cpu, l.peer) == (r.req.hits, r.req.misses, r.req.uploads, r.req.cpu,
                                                                 r.req.peer_hits)
        assert r.req.misses == r.req.uploads + r.req.cpu + r.req.peer_hits
        assert l.own is not None and r.own is not None
        assert (l.own.hits, l.own.misses, l.own.uploaded, l.own.cpu, l.own.peer) == (
            r.own.hits, r.own.misses, r.own.uploads, r.own.cpu, r.own.peer_hits)
    # one slot: the requests' own shares are everything the context counted between ready and exit
    moved = end.counters - ready.counters
    for name in ("hits", "misses", "uploads", "cpu", "peer_hits"):
        assert sum(getattr(r.own, name) for r in reqs) == getattr(moved, name), name
    # the checker, the summary and stats --server
    result = check_audit(s.audit)
    assert result.ok, [str(i) for i in result.errors]
    (summary,) = summarize(s.audit)
    assert (summary.admitted, summary.cpu, summary.peer_hits) == (e.admitted, e.cpu, e.peer_hits)
    for field in ("n_hit", "n_miss", "n_upload", "n_cpu", "n_hit_peer", "n_admit", "n_admitted", "n_bytes_peer"):
        assert s.stats[field] == getattr(c, field), field
    # the peer's memory apart from the cache's
    assert (load.peer is not None) == peer and (c.n_bytes_peer > 0) == peer
    if peer:
        assert load.peer.bytes == c.n_bytes_peer and load.peer.slots == c.n_slots_peer
        assert load.params.moe_cache_peer == load.peer.device
        assert load.cache.bytes == c.n_bytes_cache == sum(d.n_bytes for d in c.devices)


@pytest.mark.slow
def test_upload_mode_with_its_split(tmp_path: Path, lib, tiny_model_path: Path) -> None:
    """Upload mode at 2 slots a layer, fewer than a token's 4 experts: every ubatch is split, its misses uploaded
    or computed on the CPU."""
    from support.cache_sizes import mib_for_slots

    s = _serve(tmp_path, ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib",
                          f"{mib_for_slots(tiny_model_path, 2):.4f}"])
    c = parse_moe_cache(s.metrics)
    assert c is not None and not c.hybrid and c.n_upload > 0 and c.n_cpu > 0 and c.n_hit_peer == 0
    _agree(s, peer=False)


@pytest.mark.slow
def test_the_admitting_hybrid_with_a_peer(tmp_path: Path, lib, tiny_model_path: Path) -> None:
    """The model's layers on one rpc-server, its experts in RAM, the cache there with admission and the peer tier
    on a second rpc-server: misses computed on the CPU or by the peer, admissions between decodes."""
    from support.rpc_servers import find_rpc_server_binary, start_rpc_server
    from llama_moe.tools.server import process as server_process

    rpc = [start_rpc_server(find_rpc_server_binary(), tmp_path / f"rpc{i}.log") for i in range(2)]

    def start(binary: Path, args: list[str], log: Path):
        server = server_process.start_server(binary, args, log)
        return server.detach(), server.url

    try:
        s = _serve(tmp_path, ["-m", str(tiny_model_path), "--rpc", ",".join(x.endpoint for x in rpc), "-ts", "1,0",
                              "-ngl", "99", "--cpu-moe", "--no-repack", "--moe-cache-mib", "1", "--moe-cache-hybrid",
                              "--moe-cache-admit", "2", "--moe-cache-peer", "RPC1"], start)
    finally:
        for x in rpc:
            x.stop()
    c = parse_moe_cache(s.metrics)
    assert c is not None and c.hybrid and c.n_upload == 0
    assert c.n_cpu > 0 and c.n_hit_peer > 0 and c.n_admit > 0, c
    _agree(s, peer=True)
