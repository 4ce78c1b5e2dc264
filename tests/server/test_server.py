"""llama-server with the MoE cache, as an operator runs it: /metrics (llama_moe.tools.server.metrics, ``stats
--server``), the per-request log line and the audit log. The parsers are tested on fixed text first; then a
real llama-server (patch 0005) serves the tiny model on 127.0.0.1 with the cache in RAM."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from support.llama_server import find_server_binary, free_port, start_server, stop_server
import requests

from llama_moe.formats.audit import ExitRecord, LoadRecord, ReadyRecord, RequestRecord, read_audit
from llama_moe.tools.server.audit import check_audit
from llama_moe.tools.server.metrics import (ALL_SERIES, PREFIX, MetricsError, MoeCacheMetrics, ServerError,
                                            UPLOAD_LINE_RE, fetch_server_metrics, parse_moe_cache,
                                            parse_prometheus, parse_request_log_line, parse_server_metrics)

# What llama-server --metrics writes, trimmed to two layers; values as its C++ stream prints doubles.
METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 24
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.017289
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 48
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 0.021228
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
# HELP llamacpp:moe_cache_hits_total MoE cache: selected experts the cache held
# TYPE llamacpp:moe_cache_hits_total counter
llamacpp:moe_cache_hits_total 1.23457e+06
# TYPE llamacpp:moe_cache_hits_profile_total counter
llamacpp:moe_cache_hits_profile_total 0
# TYPE llamacpp:moe_cache_misses_total counter
llamacpp:moe_cache_misses_total 412
# TYPE llamacpp:moe_cache_refused_total counter
llamacpp:moe_cache_refused_total 88
# TYPE llamacpp:moe_cache_upload_bytes_total counter
llamacpp:moe_cache_upload_bytes_total 10758144
# TYPE llamacpp:moe_cache_cpu_bytes_total counter
llamacpp:moe_cache_cpu_bytes_total 0
# TYPE llamacpp:moe_cache_copies_total counter
llamacpp:moe_cache_copies_total 7
# TYPE llamacpp:moe_cache_swaps_total counter
llamacpp:moe_cache_swaps_total 0
# TYPE llamacpp:moe_cache_admissions_total counter
llamacpp:moe_cache_admissions_total 0
# TYPE llamacpp:moe_cache_cpu_total counter
llamacpp:moe_cache_cpu_total 0
# TYPE llamacpp:moe_cache_uploads_total counter
llamacpp:moe_cache_uploads_total 412
# TYPE llamacpp:moe_cache_admitted_total counter
llamacpp:moe_cache_admitted_total 412
# TYPE llamacpp:moe_cache_repartitions_total counter
llamacpp:moe_cache_repartitions_total 0
# TYPE llamacpp:moe_cache_slots_moved_total counter
llamacpp:moe_cache_slots_moved_total 0
# TYPE llamacpp:moe_cache_peer_hits_total counter
llamacpp:moe_cache_peer_hits_total 0
# TYPE llamacpp:moe_cache_peer_slots gauge
llamacpp:moe_cache_peer_slots 0
# TYPE llamacpp:moe_cache_hit_ratio gauge
llamacpp:moe_cache_hit_ratio 0.999595
# TYPE llamacpp:moe_cache_slots gauge
llamacpp:moe_cache_slots 78
# TYPE llamacpp:moe_cache_resident gauge
llamacpp:moe_cache_resident 78
# TYPE llamacpp:moe_cache_prefilled gauge
llamacpp:moe_cache_prefilled 0
# TYPE llamacpp:moe_cache_bytes gauge
llamacpp:moe_cache_bytes 2036736
# TYPE llamacpp:moe_cache_hybrid gauge
llamacpp:moe_cache_hybrid 0
# TYPE llamacpp:moe_cache_layer_hits_total counter
llamacpp:moe_cache_layer_hits_total{layer="0"} 1234000
llamacpp:moe_cache_layer_hits_total{layer="1"} 570
# TYPE llamacpp:moe_cache_layer_hits_profile_total counter
llamacpp:moe_cache_layer_hits_profile_total{layer="0"} 0
llamacpp:moe_cache_layer_hits_profile_total{layer="1"} 0
# TYPE llamacpp:moe_cache_layer_misses_total counter
llamacpp:moe_cache_layer_misses_total{layer="0"} 100
llamacpp:moe_cache_layer_misses_total{layer="1"} 312
# TYPE llamacpp:moe_cache_layer_refused_total counter
llamacpp:moe_cache_layer_refused_total{layer="0"} 0
llamacpp:moe_cache_layer_refused_total{layer="1"} 88
"""


def test_prometheus_text_is_parsed() -> None:
    samples = parse_prometheus('# HELP a:b x y\n# TYPE a:b counter\na:b 3\nc{l="x\\"y",m="2"} NaN\n\nd +Inf 1700000000\n')
    assert [(s.name, s.labels) for s in samples] == [("a:b", ()), ("c", (("l", 'x"y'), ("m", "2"))), ("d", ())]
    assert samples[0].value == 3 and samples[1].value != samples[1].value and samples[2].value == float("inf")
    for bad, msg in (("a b c", "not a Prometheus sample"), ("a{l=x} 1", "malformed labels"), ("a one", "a has the value 'one', not a number"),
                     ("# TYPE a countr", "unknown metric type")):
        with pytest.raises(MetricsError, match=f"line 1: {msg}"):
            parse_prometheus(bad)


def test_the_moe_cache_series_are_read_by_name() -> None:
    c = parse_moe_cache(METRICS)
    assert isinstance(c, MoeCacheMetrics)
    assert (c.n_hit, c.n_hit_profile, c.n_miss, c.n_bytes_upload, c.n_bytes_cpu, c.n_copy, c.n_swap) == (
        1234570, 0, 412, 10758144, 0, 7, 0)
    assert (c.n_slots, c.n_prefilled, c.n_bytes_cache, c.hybrid, c.hit_ratio) == (78, 0, 2036736, False, 0.999595)
    assert c.layers == {0: (1234000, 0, 100), 1: (570, 0, 312)}
    assert (c.n_refused, c.n_resident, c.layers_refused) == (88, 78, {0: 0, 1: 88})
    assert c.hit_rate == pytest.approx(1234570 / (1234570 + 412 + 88))   # refused lookups in the denominator
    assert c.hit_rate == pytest.approx(c.hit_ratio, abs=1e-6)
    s = parse_server_metrics(METRICS)
    assert (s.prompt_tokens, s.tokens_predicted, s.requests_processing) == (24, 48, 0)
    assert s.gen_tps == pytest.approx(48 / 0.021228) and s.moe_cache == c
    # the MoeCacheStats names, less n_bytes_copy, which /metrics does not carry
    from llama_moe.stats import MoeCacheStats
    ours = {f.name for f in dataclasses.fields(MoeCacheMetrics)}
    assert {f.name for f in dataclasses.fields(MoeCacheStats)} - ours == {"n_bytes_copy"}
    assert c.n_admit == 0


def test_no_series_means_no_cache_and_some_means_all() -> None:
    plain = "\n".join(l for l in METRICS.splitlines() if "moe_cache" not in l)
    assert parse_moe_cache(plain) is None and parse_server_metrics(plain).moe_cache is None
    with pytest.raises(MetricsError, match="lacks llamacpp:moe_cache_swaps_total"):
        parse_moe_cache(METRICS.replace("llamacpp:moe_cache_swaps_total 0\n", ""))
    with pytest.raises(MetricsError, match=r'lacks llamacpp:moe_cache_layer_misses_total\{layer="1"\}'):
        parse_moe_cache(METRICS.replace('llamacpp:moe_cache_layer_misses_total{layer="1"} 312\n', ""))
    with pytest.raises(MetricsError, match="needs a layer"):
        parse_moe_cache(METRICS.replace('{layer="1"} 312', '{il="1"} 312'))
    # a server built before the refused counters: said so, not read as a cache that refused nothing
    older = "\n".join(l for l in METRICS.splitlines() if "refused" not in l and "resident" not in l)
    with pytest.raises(MetricsError, match=r"lacks llamacpp:moe_cache_refused_total, llamacpp:moe_cache_resident, "
                                           r"llamacpp:moe_cache_layer_refused_total: a llama-server built from older"):
        parse_moe_cache(older)


def test_the_request_log_lines_of_the_reference() -> None:
    up = parse_request_log_line("slot print_timing: id  0 | task 2 | MoE cache hits = 61.3 % "
                                "(38 hit, 4 from the profile, 24 uploaded: 0.60 MiB, 1.92 GiB/s)")
    assert up is not None and not up.hybrid
    assert (up.rate_pct, up.hits, up.hits_profile, up.misses, up.mib, up.gib_s) == (61.3, 38, 4, 24, 0.60, 1.92)
    assert up.refused is None   # the line of a build before refused lookups were counted
    up = parse_request_log_line("MoE cache hits = 55.1 % (38 hit, 4 from the profile, 24 uploaded: 0.60 MiB, "
                                "1.92 GiB/s), 7 refused")
    assert up is not None and (up.rate_pct, up.hits, up.misses, up.refused) == (55.1, 38, 24, 7)
    hy = parse_request_log_line("MoE cache hits = 75.0 % (hybrid: 30 on the GPU, 10 on the CPU, which read 0.25 MiB)")
    assert hy is not None and hy.hybrid and (hy.hits, hy.misses, hy.mib, hy.hits_profile, hy.refused) == (
        30, 10, 0.25, None, None)
    assert parse_request_log_line("slot print_timing: id  0 | task 2 | total time = 12.94 ms") is None


class _Fixed(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = self.server.body  # type: ignore[attr-defined]
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fixed_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Fixed)
    httpd.body, httpd.status = METRICS.encode(), 200  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _stats(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_moe", "stats", "--server", url, *extra],
                          capture_output=True, text=True, timeout=60)


def test_stats_server_on_fixed_metrics(fixed_server: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{fixed_server.server_address[1]}"
    out = _stats(url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:7] == [
        f"server       {url} (0 requests processing)",
        "prompt       24 tokens at 1388.2 tok/s",
        "generation   48 tokens at 2261.2 tok/s",
        "MoE cache    upload mode, 1.94 MiB, 78 slots, 0 prefilled by the profile",
        "             hit rate 1.000 (1234570 hits, 0 from the profile, 412 misses), 10.26 MiB uploaded",
        "             1234570 hits of 1235070 lookups = 0.9996 (412 admitted, 88 refused, cache 100.00% full)",
        "             7 experts copied from the cache by large batches, 0 swapped in"]
    assert out.stdout.splitlines()[-3:] == ["layer   hits  from profile  misses  refused  hit rate",
                                            "    0  1234000             0     100        0     1.000",
                                            "    1    570             0     312       88     0.588"]
    js = json.loads(_stats(url, "--json").stdout)
    assert js["moe_cache"]["n_hit"] == 1234570 and js["moe_cache"]["layers"]["1"] == [570, 0, 312]
    assert js["moe_cache"]["n_refused"] == 88 and js["moe_cache"]["layers_refused"]["1"] == 88
    fixed_server.status = 501  # type: ignore[attr-defined]
    out = _stats(url)
    assert out.returncode == 2 and "start llama-server with --metrics" in out.stderr
    with pytest.raises(ServerError, match="cannot reach"):
        fetch_server_metrics(f"http://127.0.0.1:{free_port()}", timeout=2)


# ----------------------------------------------------------------------------------------------- a real server

N_REQUESTS, N_PREDICT = 3, 16
PROMPTS = ("The ship left the harbour at dawn, and the crew", "To grow tomatoes in a cold spring, gardeners",
           "The orchestra tuned while the conductor")


@pytest.fixture(scope="module")
def server_binary(lib) -> Path:
    return find_server_binary()


@dataclass
class Served:
    url: str
    model: Path
    audit: Path
    log: str                 # the server's stderr
    returncode: int          # after SIGTERM
    metrics_idle: str        # /metrics after the load, before any request
    metrics: str             # /metrics after the requests
    completions: list[dict]
    stats_text: subprocess.CompletedProcess
    stats_json: subprocess.CompletedProcess


def _serve(binary: Path, model: Path, d: Path, *extra: str) -> Served:
    """One server's life: load, 3 requests, /metrics and stats --server, SIGTERM; everything it showed."""
    audit, log = d / "audit.jsonl", d / "server.log"
    proc, url = start_server(binary, ["-m", str(model), "--cpu-moe", "--no-repack", "--moe-cache-mib", "2", *extra,
                                "--metrics", "--moe-cache-audit", str(audit), "-c", "512", "-np", "1"], log)
    try:
        idle = requests.get(url + "/metrics", timeout=30).text
        completions = []
        for prompt in PROMPTS[:N_REQUESTS]:
            r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0},
                              timeout=120)
            assert r.status_code == 200, r.text
            completions.append(r.json())
        metrics = requests.get(url + "/metrics", timeout=30).text
        stats_text, stats_json = _stats(url), _stats(url, "--json")
    finally:
        rc = stop_server(proc)
    return Served(url, model, audit, log.read_text(errors="replace"), rc, idle, metrics, completions, stats_text, stats_json)


@pytest.fixture(scope="module")
def served(server_binary: Path, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Served:
    return _serve(server_binary, tiny_model_path, tmp_path_factory.mktemp("server"))


@pytest.fixture(scope="module")
def served_hybrid(server_binary: Path, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Served:
    """The adaptive hybrid without a profile: it starts empty and swaps experts in while generating."""
    return _serve(server_binary, tiny_model_path, tmp_path_factory.mktemp("hybrid"), "--moe-cache-hybrid",
                  "--moe-cache-adaptive")


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


@pytest.mark.slow
def test_metrics_carry_every_series_of_the_reference(served: Served) -> None:
    names = {s.name for s in parse_prometheus(served.metrics)}
    assert set(ALL_SERIES) <= names, sorted(set(ALL_SERIES) - names)
    types = _types(served.metrics)
    for name in ALL_SERIES:
        want = "counter" if name.endswith("_total") else "gauge"
        assert types.get(name) == want, f"{name}: # TYPE {types.get(name)}, the reference says {want}"
    c = parse_moe_cache(served.metrics)
    load = read_audit(served.audit).records[0]
    assert isinstance(c, MoeCacheMetrics) and isinstance(load, LoadRecord)
    assert sorted(c.layers) == [l.il for l in load.layers] and len(c.layers) == 6
    assert (c.n_slots, c.n_prefilled, c.n_bytes_cache, c.hybrid) == (load.cache.slots, 0, load.cache.bytes, False)
    assert c.n_miss > 0 and c.n_hit > 0, "a 2 MiB cache on the tiny model's 5 MiB of experts must hit and miss"
    # its 13 slots a layer cannot take a prompt's ubatch (4 experts a token) at once: split, never refused
    assert c.n_refused == 0 and all(v == 0 for v in c.layers_refused.values())
    assert 0 < c.n_cpu <= c.n_miss
    assert c.hit_ratio == pytest.approx(c.hit_rate, abs=1e-5)
    assert c.hit_ratio == pytest.approx(c.n_hit / (c.n_hit + c.n_miss + c.n_refused), abs=1e-5)
    assert 0 < c.n_resident <= c.n_slots
    assert parse_moe_cache(served.metrics_idle) is not None


@pytest.mark.slow
def test_metrics_agree_with_the_audit_log(served: Served) -> None:
    """Nothing decodes between the last request and the scrape, nor between the scrape and the exit."""
    records = read_audit(served.audit).records
    last_request = [r for r in records if isinstance(r, RequestRecord)][-1]
    end = records[-1]
    assert isinstance(end, ExitRecord)
    c = parse_moe_cache(served.metrics)
    assert c is not None
    for field, counter in (("n_hit", "hits"), ("n_hit_profile", "hits_profile"), ("n_miss", "misses"),
                           ("n_bytes_upload", "bytes_upload"), ("n_bytes_cpu", "bytes_cpu"), ("n_copy", "copies"),
                           ("n_swap", "swaps"), ("n_refused", "refused")):
        assert getattr(c, field) == getattr(last_request.counters, counter) == getattr(end.counters, counter), field
    assert c.layers == {l.il: (l.hits, l.hits_profile, l.misses) for l in end.layers}
    assert c.layers_refused == {l.il: l.refused for l in end.layers} and end.counters.refused == 0
    assert c.n_resident == sum(len(l.resident) for l in end.layers)


@pytest.mark.slow
def test_metrics_of_a_server_without_the_cache(server_binary: Path, tiny_model_path: Path,
                                               tmp_path: Path) -> None:
    proc, url = start_server(server_binary, ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--metrics",
                                       "-c", "512", "-np", "1"], tmp_path / "server.log")
    try:
        r = requests.post(url + "/completion", json={"prompt": PROMPTS[0], "n_predict": 4}, timeout=120)
        assert r.status_code == 200
        text = requests.get(url + "/metrics", timeout=30).text
        out = _stats(url)
    finally:
        stop_server(proc)
    assert "llamacpp:prompt_tokens_total" in text
    assert PREFIX not in text and parse_moe_cache(text) is None
    assert out.returncode == 0 and "MoE cache    none (--moe-cache-mib N turns it on)" in out.stdout


@pytest.mark.slow
def test_stats_server_reports_the_running_server(served: Served) -> None:
    assert served.stats_text.returncode == 0, served.stats_text.stderr
    c = parse_moe_cache(served.metrics)
    assert c is not None
    lines = served.stats_text.stdout.splitlines()
    assert lines[0] == f"server       {served.url} (0 requests processing)"
    assert f"hit rate {c.hit_rate:.3f} ({c.n_hit} hits, {c.n_hit_profile} from the profile, {c.n_miss} misses)" in lines[4]
    assert lines[3].startswith(f"MoE cache    upload mode, {c.n_bytes_cache / 2**20:.2f} MiB, {c.n_slots} slots")
    assert lines[5].strip() == (f"{c.n_hit} hits of {c.n_lookup} lookups = {c.n_hit / c.n_lookup:.4f} ({c.n_admitted} admitted, "
                                f"{c.n_refused} refused, cache {100 * c.n_resident / c.n_slots:.2f}% full)")
    table = lines[lines.index("layer   hits  from profile  misses  refused  hit rate") + 1:]
    assert [int(l.split()[0]) for l in table] == sorted(c.layers)
    js = json.loads(served.stats_json.stdout)
    assert js["moe_cache"]["n_hit"] == c.n_hit and js["tokens_predicted"] >= N_REQUESTS


@pytest.mark.slow
def test_each_request_logs_its_cache_line(served: Served) -> None:
    lines = [p for p in map(parse_request_log_line, served.log.splitlines()) if p is not None]
    requests_ = [r for r in read_audit(served.audit).records if isinstance(r, RequestRecord)]
    assert len(lines) == N_REQUESTS == len(requests_), served.log[-3000:]
    raw = [m for m in map(UPLOAD_LINE_RE.search, served.log.splitlines()) if m]
    for line, m, rec in zip(lines, raw, requests_):
        assert not line.hybrid
        assert (line.hits, line.hits_profile, line.misses) == (rec.req.hits, rec.req.hits_profile, rec.req.misses)
        assert line.refused == rec.req.refused == 0   # a prompt with too many experts is split, not refused
        n = rec.req.hits + rec.req.misses + rec.req.refused
        # the numbers printed are the request's counters, rounded to the digits shown
        assert m["mib"] == _as_printed(rec.req.bytes_upload / 2**20, m["mib"])
        assert m["rate"] == _as_printed(100 * rec.req.hits / n if n else 0.0, m["rate"])


def _as_printed(value: float, like: str) -> str:
    return f"{value:.{len(like.partition('.')[2])}f}"


@pytest.mark.slow
def test_the_audit_log_checks_out(served: Served) -> None:
    assert served.returncode == 0, served.log[-3000:]
    result = check_audit(served.audit)
    assert result.ok, "\n".join(map(str, result.issues))
    assert [i for i in result.issues if i.severity == "warning"] == []
    (run,) = result.runs
    assert [r.event for r in run.records] == ["load", "ready"] + ["request"] * N_REQUESTS + ["exit"]
    load, ready, end = run.load, run.ready, run.exit
    assert isinstance(load, LoadRecord) and isinstance(ready, ReadyRecord) and isinstance(end, ExitRecord)
    import llama_moe

    assert load.pid > 0 and load.model.path == str(served.model) and load.model.n_layer == 6
    assert load.params.moe_cache_mib == 2 and load.params.n_ctx == 512 and not load.params.moe_cache_hybrid
    assert load.profile is None and load.cache.slots > 0
    if llama_moe.native_version().get("variant") == "cpu":
        assert load.devices == ()
    assert load.counters.hits == load.counters.misses == 0
    # the reference's promise, in so many words: with one slot, the requests add up to exit minus ready
    moved = end.counters - ready.counters
    for name in ("hits", "hits_profile", "misses", "bytes_upload", "bytes_cpu", "refused"):
        assert sum(getattr(r.req, name) for r in run.requests) == getattr(moved, name), name
    assert all(sum(getattr(l, n) for l in end.layers) == getattr(end.counters, n) for n in ("hits", "misses", "refused"))
    for rec, completion in zip(run.requests, served.completions):
        assert rec.slot == 0 and rec.n_gen == completion["tokens_predicted"] and rec.n_prompt > 0
    assert end.perf.n_gen > 0 and end.perf.gen_tps > 0
    cli = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(served.audit)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and cli.stdout.endswith("OK\n"), cli.stdout + cli.stderr


@pytest.mark.slow
def test_the_adaptive_hybrid_server(served_hybrid: Served) -> None:
    s = served_hybrid
    assert s.returncode == 0, s.log[-3000:]
    result = check_audit(s.audit)
    assert result.ok, "\n".join(map(str, result.issues))
    (run,) = result.runs
    end = run.exit
    c = parse_moe_cache(s.metrics)
    assert c is not None and end is not None and run.load is not None
    assert c.hybrid and end.hybrid and run.load.params.moe_cache_hybrid and run.load.params.moe_cache_adaptive
    assert c.n_bytes_upload == 0 and c.n_bytes_cpu == end.counters.bytes_cpu > 0
    assert c.n_swap == end.counters.swaps > 0, "an adaptive cache without a profile fills itself by swaps"
    assert c.n_refused == end.counters.refused == 0, "the hybrid refuses no lookup"
    lines = [p for p in map(parse_request_log_line, s.log.splitlines()) if p is not None]
    assert len(lines) == N_REQUESTS and all(l.hybrid for l in lines)
    for line, rec in zip(lines, run.requests):
        assert (line.hits, line.misses) == (rec.req.hits, rec.req.misses)
        assert line.mib == pytest.approx(rec.req.bytes_cpu / 2**20, abs=0.051)
    assert "hybrid mode" in s.stats_text.stdout and f"{c.n_swap} swapped in" in s.stats_text.stdout
