"""The monitor (``python -m llama_moe monitor``, monitor.html) against a stub /metrics server that stands in for
llama-server: the proxy, the command, and the page itself rendered by a real headless Chromium."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from llama_moe.server.monitor import MonitorServer, monitor_html
from llama_moe.server.metrics import MoeCacheMetrics, parse_moe_cache

LAYERS = 6
EXPERT = 26112


def metrics_text(scrape: int, cache: bool = True) -> str:
    """What llama-server --metrics writes for a tiny model with a 2 MiB upload cache, after `scrape` polls'
    worth of generation: the counters grow, and the deeper layers miss more."""
    lines: list[str] = []

    def series(name: str, kind: str, values: dict[str, float] | float, help_: str) -> None:
        lines.extend([f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}"])
        if isinstance(values, dict):
            lines.extend(f'llamacpp:{name}{{layer="{il}"}} {v:g}' for il, v in values.items())
        else:
            lines.append(f"llamacpp:{name} {values:g}")

    n = 10 + 4 * scrape
    series("prompt_tokens_total", "counter", 8 * n, "Number of prompt tokens processed, excluding cached tokens")
    series("prompt_seconds_total", "counter", 0.006 * n, "Total time spent processing prompts")
    series("tokens_predicted_total", "counter", 16 * n, "Number of generation tokens processed")
    series("tokens_predicted_seconds_total", "counter", 0.0071 * n, "Total time spent generating tokens")
    series("n_decode_total", "counter", 20 * n, "Total number of llama_decode() calls")
    # the gauge llama-server resets at every scrape: the page must not read it
    series("predicted_tokens_seconds", "gauge", 0 if scrape % 2 else 2119.84, "Average generation throughput in tokens/s")
    series("requests_processing", "gauge", 1, "Number of requests processing")
    if cache:
        hits = {il: (60 - 7 * il) * n for il in range(LAYERS)}
        prof = {il: 0 for il in range(LAYERS)}
        miss = {il: (4 + 6 * il) * n + scrape * il for il in range(LAYERS)}
        refused = {il: (3 * n if il < LAYERS - 1 else 0) for il in range(LAYERS)}  # prompts; the last layer has one token
        h, m, r = sum(hits.values()), sum(miss.values()), sum(refused.values())
        series("moe_cache_hits_total", "counter", h, "MoE cache: selected experts the cache held")
        series("moe_cache_hits_profile_total", "counter", 0, "MoE cache: hits on experts the profile put there")
        series("moe_cache_misses_total", "counter", m, "MoE cache: selected experts the cache did not hold")
        series("moe_cache_refused_total", "counter", r, "MoE cache: selected experts of the lookups refused")
        series("moe_cache_upload_bytes_total", "counter", m * EXPERT, "MoE cache: bytes uploaded")
        series("moe_cache_cpu_bytes_total", "counter", 0, "MoE cache: bytes of the experts the CPU computed")
        series("moe_cache_copies_total", "counter", 3 * n, "MoE cache: experts large batches copied from the cache")
        series("moe_cache_swaps_total", "counter", 0, "MoE cache: experts the adaptive cache swapped in")
        series("moe_cache_admissions_total", "counter", 0, "MoE cache: missed experts the hybrid uploaded between decodes")
        series("moe_cache_cpu_total", "counter", 0, "MoE cache: upload mode's misses the CPU computed")
        series("moe_cache_repartitions_total", "counter", 0, "MoE cache: rounds that moved slots between layers")
        series("moe_cache_slots_moved_total", "counter", 0, "MoE cache: slots those rounds moved")
        series("moe_cache_peer_hits_total", "counter", 0, "MoE cache: of the misses, those the peer computed")
        series("moe_cache_peer_slots", "gauge", 0, "MoE cache: the peer tier's expert slots")
        series("moe_cache_hit_ratio", "gauge", h / (h + m + r), "MoE cache: hits / (hits + misses + refused)")
        series("moe_cache_slots", "gauge", 78, "MoE cache: expert slots")
        series("moe_cache_resident", "gauge", 75, "MoE cache: slots that hold an expert now")
        series("moe_cache_prefilled", "gauge", 0, "MoE cache: slots the profile filled")
        series("moe_cache_bytes", "gauge", 2 << 20, "MoE cache: device memory")
        series("moe_cache_hybrid", "gauge", 0, "MoE cache: 1 in hybrid mode")
        series("moe_cache_layer_hits_total", "counter", hits, "MoE cache: hits per layer")
        series("moe_cache_layer_hits_profile_total", "counter", prof, "MoE cache: profile hits per layer")
        series("moe_cache_layer_misses_total", "counter", miss, "MoE cache: misses per layer")
        series("moe_cache_layer_refused_total", "counter", refused, "MoE cache: refused selections per layer")
    return "\n".join(lines) + "\n"


class StubLlamaServer(ThreadingHTTPServer):
    """Serves /metrics like llama-server (counters growing with each scrape, CORS open); remembers what it
    served. ``status`` 501 plays a server started without --metrics."""

    daemon_threads = True

    def __init__(self, cache: bool = True, status: int = 200) -> None:
        self.cache, self.status = cache, status
        self.served: list[str] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _StubHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _StubHandler(BaseHTTPRequestHandler):
    server: StubLlamaServer

    def do_GET(self) -> None:  # noqa: N802
        s = self.server
        if self.path != "/metrics":
            body, status = b"not found", 404
        elif s.status != 200:
            body, status = b'{"error":{"code":501,"message":"This server does not support metrics endpoint."}}', s.status
        else:
            with s.lock:
                text = metrics_text(len(s.served), s.cache)
                s.served.append(text)
            body, status = text.encode(), 200
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Access-Control-Allow-Origin", "*")   # llama-server's default --cors-origins
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub():
    s = StubLlamaServer()
    yield s
    s.shutdown()
    s.server_close()


@pytest.fixture
def monitor(stub: StubLlamaServer):
    m = MonitorServer(stub.url, port=0)
    m.start()
    yield m
    m.shutdown()
    m.server_close()


def test_the_stub_speaks_the_reference_series() -> None:
    c = parse_moe_cache(metrics_text(2))
    assert isinstance(c, MoeCacheMetrics) and sorted(c.layers) == list(range(LAYERS))
    assert c.n_hit == sum(h for h, _, _ in c.layers.values()) and c.hit_ratio == pytest.approx(c.hit_rate, abs=1e-5)
    assert c.n_refused == sum(c.layers_refused.values()) > 0
    assert parse_moe_cache(metrics_text(2, cache=False)) is None


def test_the_monitor_serves_the_page_and_proxies_metrics(stub: StubLlamaServer, monitor: MonitorServer) -> None:
    page = requests.get(monitor.url, timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert page.content == monitor_html() == requests.get(monitor.url + "monitor.html", timeout=10).content
    for needle in ('id="chart-hit"', 'id="chart-bytes"', 'id="layers"', 'id="hit-ratio"'):
        assert needle in page.text
    # self-contained: nothing loaded from anywhere else
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text)
    r = requests.get(monitor.url + "metrics", timeout=10)
    assert r.status_code == 200 and r.text == stub.served[-1]
    assert r.headers["X-Llama-Moe-Server"] == stub.url
    assert requests.get(monitor.url + "nothing", timeout=10).status_code == 404


def test_the_proxy_passes_errors_on() -> None:
    no_metrics = StubLlamaServer(status=501)
    try:
        with MonitorServer(no_metrics.url, port=0) as m:
            m.start()
            r = requests.get(m.url + "metrics", timeout=10)
            assert r.status_code == 501 and "metrics" in r.text
            m.shutdown()
    finally:
        no_metrics.shutdown()
        no_metrics.server_close()
    down_port = _free_port()
    with MonitorServer(f"http://127.0.0.1:{down_port}", port=0, timeout=2) as m:
        m.start()
        r = requests.get(m.url + "metrics", timeout=10)
        assert r.status_code == 502 and f"cannot reach http://127.0.0.1:{down_port}" in r.text
        m.shutdown()


def test_the_monitor_command(stub: StubLlamaServer) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "llama_moe", "monitor", "--server", stub.url, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()   # the first line names the URL
        m = re.match(r"monitor: (http://127\.0\.0\.1:\d+/) \(reading (\S+)/metrics", line)
        assert m and m.group(2) == stub.url, line
        assert requests.get(m.group(1) + "metrics", timeout=10).text == stub.served[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    busy = subprocess.run([sys.executable, "-m", "llama_moe", "monitor", "--server", stub.url, "--port",
                           str(stub.server_address[1])], capture_output=True, text=True, timeout=30)
    assert busy.returncode == 2 and "cannot listen on 127.0.0.1:" in busy.stderr


# ----------------------------------------------------------------------------------------------- the browser

def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no headless browser: Chromium is not installed (apt-get install -y chromium)")


def _browse(tmp_path: Path, url: str, *extra: str) -> str:
    """Runs the page in headless Chromium for 5 s of virtual time (about five polls) and returns stdout."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,1000",
           "--virtual-time-budget=5000", *extra, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class _Dom(HTMLParser):
    """The text and attributes of every element with an id or a data-layer."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.cells: dict[tuple[int, str], str] = {}
        self.hidden: set[str] = set()
        self.attrs: dict[str, dict] = {}
        self._open: list[tuple[str, dict]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if "hidden" in a and "id" in a:
            self.hidden.add(a["id"])
        self._open.append((tag, a))
        if "id" in a:
            self.by_id.setdefault(a["id"], "")
            self.attrs[a["id"]] = a
        if "data-layer" in a and tag == "td":
            self.cells[(int(a["data-layer"]), a["data-kind"])] = ""

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, a in self._open:
            if "id" in a:
                self.by_id[a["id"]] += data
            if "data-layer" in a and "data-kind" in a:
                self.cells[(int(a["data-layer"]), a["data-kind"])] += data


def _fmt_count(n: int) -> str:   # monitor.html's fmtCount
    if n < 10000:
        return str(n)
    for d, u in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= d:
            return f"{n / d:#.3g}".rstrip(".") + u
    raise AssertionError


def _check_dom(dom: _Dom, stub: StubLlamaServer) -> None:
    served = [parse_moe_cache(t) for t in stub.served]
    assert len(served) >= 2, "the page polled fewer than twice"
    shown = dom.by_id["hit-ratio"]
    # the last poll the page rendered (one more may have been in flight when Chromium stopped)
    c = next((c for c in reversed(served) if f"{c.hit_ratio:.3f}" == shown), None)
    assert c is not None, f"hit ratio {shown!r} is none of those served"
    assert dom.by_id["misses"] == _fmt_count(c.n_miss) and dom.by_id["hits"] == _fmt_count(c.n_hit)
    assert dom.by_id["refused"] == _fmt_count(c.n_refused) and c.n_refused > 0
    assert dom.by_id["lookups"] == (f"{_fmt_count(c.n_hit)} hits of {_fmt_count(c.n_lookup)} lookups "
                                    f"({_fmt_count(c.n_miss)} admitted, {_fmt_count(c.n_refused)} refused, "
                                    f"cache {100 * 75 / 78:.2f}% full)")
    assert re.fullmatch(r"0\.\d{3}", dom.by_id["hit-ratio-recent"]), dom.by_id["hit-ratio-recent"]
    assert dom.by_id["cache-size"] == "2.00 MiB" and dom.by_id["slots"] == "78"
    assert dom.by_id["mode"] == "upload mode" and "live" in dom.by_id["status"]
    assert re.fullmatch(r"\d+\.\d\d MiB", dom.by_id["bytes-upload"])
    assert set(dom.cells) == {(il, k) for il in range(LAYERS) for k in ("rate", "recent", "hits", "misses", "refused")}
    for il, (hits, _, misses) in c.layers.items():
        refused = c.layers_refused[il]
        assert dom.cells[(il, "hits")] == _fmt_count(hits) and dom.cells[(il, "misses")] == _fmt_count(misses)
        assert dom.cells[(il, "refused")] == _fmt_count(refused)
        assert dom.cells[(il, "rate")] == f"{hits / (hits + misses + refused):.2f}"
        assert re.fullmatch(r"[01]\.\d\d", dom.cells[(il, "recent")])
    assert "notice" in dom.hidden
    # generation from the counters (the stub's gauge, reset by every scrape, alternates 0 and 2119.84)
    assert dom.by_id["gen-tps"] == f"{16 / 0.0071:.0f} tok/s", dom.by_id["gen-tps"]
    heat = dom.attrs["chart-heat"]
    assert heat["data-layers"] == str(LAYERS) and int(heat["data-columns"]) >= 1
    assert re.fullmatch(r"([01]\.\d\d,){%d}[01]\.\d\d" % (LAYERS - 1), heat["data-newest"]), heat["data-newest"]


@pytest.mark.slow
def test_the_page_in_a_browser_through_the_proxy(tmp_path: Path, stub: StubLlamaServer, monitor: MonitorServer) -> None:
    dom = _Dom(_browse(tmp_path, monitor.url, "--dump-dom"))
    _check_dom(dom, stub)
    assert dom.by_id["server"] == stub.url   # from the proxy's X-Llama-Moe-Server header


@pytest.mark.slow
def test_the_page_in_a_browser_reading_the_server_directly(tmp_path: Path, stub: StubLlamaServer,
                                                          monitor: MonitorServer) -> None:
    dom = _Dom(_browse(tmp_path, f"{monitor.url}monitor.html?server={stub.url}", "--dump-dom"))
    _check_dom(dom, stub)
    assert dom.by_id["server"] == stub.url


@pytest.mark.slow
def test_the_page_says_when_there_is_no_cache(tmp_path: Path) -> None:
    plain = StubLlamaServer(cache=False)
    try:
        with MonitorServer(plain.url, port=0) as m:
            m.start()
            dom = _Dom(_browse(tmp_path, m.url, "--dump-dom"))
            m.shutdown()
    finally:
        plain.shutdown()
        plain.server_close()
    assert "notice" not in dom.hidden and "no MoE cache" in dom.by_id["notice"]
    assert dom.cells == {}


@pytest.mark.slow
def test_the_page_renders(tmp_path: Path, stub: StubLlamaServer, monitor: MonitorServer) -> None:
    shot = tmp_path / "monitor.png"
    _browse(tmp_path, monitor.url, f"--screenshot={shot}")
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000   # charts and a heat map, not a blank page


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_page_against_a_live_llama_server(tmp_path: Path, lib, tiny_model_path: Path) -> None:
    """A real llama-server with the cache (in RAM) under requests, the monitor in front of it, headless Chromium
    reading the page: the numbers shown are the server's, and they move while requests run."""
    from support.llama_server import find_server_binary, start_server, stop_server

    binary = find_server_binary()
    proc, url = start_server(binary, ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib", "2",
                                      "--metrics", "-c", "512"], tmp_path / "server.log")
    m = MonitorServer(url, port=0)
    m.start()
    try:
        requests.post(url + "/completion", json={"prompt": "The ship", "n_predict": 16}, timeout=60).raise_for_status()
        before = parse_moe_cache(requests.get(url + "/metrics", timeout=30).text)
        first = _Dom(_browse(tmp_path, m.url, "--dump-dom"))
        assert first.by_id["hit-ratio"] == f"{before.hit_ratio:.3f}" and first.by_id["hits"] == _fmt_count(before.n_hit)
        assert {il for il, _ in first.cells} == set(before.layers) and "live" in first.by_id["status"]
        requests.post(url + "/completion", json={"prompt": "To grow tomatoes", "n_predict": 16}, timeout=60).raise_for_status()
        after = parse_moe_cache(requests.get(url + "/metrics", timeout=30).text)
        second = _Dom(_browse(tmp_path, m.url, "--dump-dom"))
        assert after.n_hit > before.n_hit and second.by_id["hits"] == _fmt_count(after.n_hit)
        html = (Path(__file__).resolve().parents[2] / "llama_moe" / "server" / "monitor" / "monitor.html").read_text()
        # nothing the page fetches leaves 127.0.0.1: no absolute URLs to anywhere else
        assert not [u for u in re.findall(r"https?://[^\s\"'<>)]+", html) if not u.startswith("http://127.0.0.1")]
    finally:
        m.shutdown()
        m.server_close()
        stop_server(proc)


# ----------------------------------------------------------------------------------------------- the script under node

# A stand-in for the few DOM calls monitor.html makes, so that its script runs under node on a /metrics text
# where no browser is installed; prints every element's text and the heat map's cells as JSON.
_NODE_HARNESS = r"""
const fs = require("fs");
const html = fs.readFileSync(process.argv[2], "utf8");
const texts = process.argv.slice(3).map((f) => fs.readFileSync(f, "utf8"));
let polls = 0, clock = 1700000000000;
Date.now = () => clock;   // one second between polls
const els = {};
const el = (id) => els[id] || (els[id] = {textContent: "", innerHTML: "", hidden: false, className: "",
  tHead: {innerHTML: ""}, tBodies: [{innerHTML: ""}], clientWidth: 600, clientHeight: 220, dataset: {},
  getContext: () => new Proxy({}, {get: () => () => {}, set: () => true})});
global.document = {getElementById: el, documentElement: {}};
global.window = {devicePixelRatio: 1, addEventListener() {}};
global.location = {search: "", host: "stub"};
global.getComputedStyle = () => ({getPropertyValue: () => "#000"});
global.setTimeout = (f) => { if (polls < texts.length) setImmediate(f); else setImmediate(done); };
global.fetch = async () => { const text = texts[polls++]; clock += 1000;
  return {status: 200, ok: true, text: async () => text, headers: {get: () => null}}; };
eval(html.match(/<script>([\s\S]*)<\/script>/)[1]);
function done() {
  const cells = {};
  for (const m of el("layers").tBodies[0].innerHTML.matchAll(/data-layer="(\d+)" data-kind="(\w+)"[^>]*>([^<]*)</g))
    cells[m[1] + "/" + m[2]] = m[3];
  const text = {};
  for (const [id, e] of Object.entries(els)) text[id] = e.textContent;
  console.log(JSON.stringify({text, cells, heat: el("chart-heat").dataset}));
}
"""


def _run_page_script(tmp_path: Path, *metrics: str) -> dict:
    """The page's script polling each metrics text in turn, one second apart."""
    import json

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    harness = tmp_path / "harness.js"
    harness.write_text(_NODE_HARNESS)
    texts = []
    for i, m in enumerate(metrics):
        texts.append(tmp_path / f"metrics-{i}.txt")
        texts[-1].write_text(m)
    page = Path(__file__).resolve().parents[2] / "llama_moe" / "server" / "monitor" / "monitor.html"
    done = subprocess.run([node, str(harness), str(page), *map(str, texts)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_page_script_shows_refused_lookups(tmp_path: Path) -> None:
    """The page's own script (run under node, no browser needed) on a server's metrics: the refused tile, the
    lookups line, and per-layer hit rates with the refused selections in their denominator."""
    metrics = metrics_text(3)
    c = parse_moe_cache(metrics)
    out = _run_page_script(tmp_path, metrics)
    text, cells = out["text"], out["cells"]
    assert text["refused"] == _fmt_count(c.n_refused) and text["hit-ratio"] == f"{c.hit_ratio:.3f}"
    assert text["lookups"] == (f"{_fmt_count(c.n_hit)} hits of {_fmt_count(c.n_lookup)} lookups ({_fmt_count(c.n_miss)} "
                               f"admitted, {_fmt_count(c.n_refused)} refused, cache {100 * 75 / 78:.2f}% full)")
    for il, (hits, _, misses) in c.layers.items():
        refused = c.layers_refused[il]
        assert cells[f"{il}/refused"] == _fmt_count(refused)
        assert cells[f"{il}/rate"] == f"{hits / (hits + misses + refused):.2f}"
    # a server built before refused lookups were counted: the page says it does not know, and still works
    older = "\n".join(l for l in metrics.splitlines() if "refused" not in l and "resident" not in l) + "\n"
    out = _run_page_script(tmp_path, older)
    assert out["text"]["refused"] == "\u2013" and "? refused, cache ? full" in out["text"]["lookups"]
    assert out["cells"]["0/rate"] == f"{c.layers[0][0] / (c.layers[0][0] + c.layers[0][2]):.2f}"


def test_generation_comes_from_the_counters_not_the_gauge(tmp_path: Path) -> None:
    """Five polls a second apart: tok/s is tokens over generating seconds between the counters (16 / 0.0071 a
    step here), tokens and decodes per second of the clock too; the gauge, which llama-server resets at every
    scrape (0 on every other poll here), is not what the tile shows."""
    out = _run_page_script(tmp_path, *(metrics_text(i) for i in range(5)))
    text = out["text"]
    assert text["gen-tps"] == f"{16 / 0.0071:.0f} tok/s", text["gen-tps"]
    assert text["gen-tokens-rate"] == f"{16 * 4:.1f}" and text["decode-rate"] == f"{20 * 4:.1f}"
    one = _run_page_script(tmp_path, metrics_text(0))["text"]
    assert one["gen-tps"] == "\u2013"   # one poll: no rate yet, not the gauge's 2119.84


def test_the_heat_map_over_time_has_a_column_per_poll_and_a_row_per_layer(tmp_path: Path) -> None:
    """Layers x time: each column the hit rate of each layer's lookups between two polls, refused included."""
    out = _run_page_script(tmp_path, *(metrics_text(i) for i in range(4)))
    heat = out["heat"]
    assert heat["columns"] == "3" and heat["layers"] == str(LAYERS)
    a, b = parse_moe_cache(metrics_text(2)), parse_moe_cache(metrics_text(3))
    want = []
    for il in range(LAYERS):
        h = b.layers[il][0] - a.layers[il][0]
        m = b.layers[il][2] - a.layers[il][2]
        r = b.layers_refused[il] - a.layers_refused[il]
        want.append(f"{h / (h + m + r):.2f}")
    assert heat["newest"] == ",".join(want)
