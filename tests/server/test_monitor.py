"""The monitor (``python -m llama_moe monitor``, monitor.html): the proxy, the command, and the page itself
rendered by a real headless Chromium, against a stub /metrics server that stands in for llama-server and against
real llama-servers (the admitting hybrid, and the admitting hybrid with a peer on two rpc-servers), whose every
tile must be the value of its /metrics series."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from llama_moe.tools.server.monitor import MonitorServer, monitor_html
from llama_moe.tools.server.metrics import PREFIX, MoeCacheMetrics, parse_moe_cache, parse_prometheus

LAYERS = 6
EXPERT = 26112


def metrics_text(scrape: int, cache: bool = True, peer: bool = False) -> str:
    """What llama-server --metrics writes for a tiny model with a 2 MiB upload cache (``peer``: the admitting
    hybrid with a peer tier, and the series of later builds: the misses uploaded, what was admitted, the peer's
    bytes), after `scrape` polls' worth of generation: the counters grow, and the deeper layers miss more."""
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
        # upload mode: a fifth of the misses split to the CPU, the others uploaded; the hybrid: the peer computes a
        # third of them, the CPU the others, and admission uploads 12345 a poll (five digits, so that the page's
        # count shows every one)
        peer_misses = m // 3 if peer else 0
        cpu_misses = m - peer_misses if peer else m // 5
        admissions = 12345 * (scrape + 1) if peer else 0
        uploads = 0 if peer else m - cpu_misses
        series("moe_cache_upload_bytes_total", "counter", (admissions + uploads) * EXPERT, "MoE cache: bytes uploaded for misses")
        series("moe_cache_cpu_bytes_total", "counter", cpu_misses * EXPERT, "MoE cache: bytes of the experts the CPU computed")
        series("moe_cache_copies_total", "counter", 3 * n, "MoE cache: experts large batches copied from the cache")
        series("moe_cache_swaps_total", "counter", 0, "MoE cache: experts the adaptive cache swapped in")
        series("moe_cache_admissions_total", "counter", admissions,
               "MoE cache: missed experts the hybrid uploaded between decodes (--moe-cache-admit)")
        if peer:
            series("moe_cache_uploads_total", "counter", uploads, "MoE cache: upload mode's misses uploaded when looked up")
            series("moe_cache_cpu_total", "counter", cpu_misses, "MoE cache: misses the CPU computed (upload mode: a "
                   "ubatch that selects more experts than a layer's slots; the hybrid: every miss the peer does not compute)")
            series("moe_cache_admitted_total", "counter", admissions,
                   "MoE cache: experts brought into slots while running (uploads, swaps and admissions)")
        else:
            series("moe_cache_cpu_total", "counter", cpu_misses, "MoE cache: upload mode's misses the CPU computed (a "
                   "ubatch that selects more experts than a layer's slots: the slots serve what they can, the CPU the rest)")
        series("moe_cache_repartitions_total", "counter", 0, "MoE cache: rounds that moved slots between layers")
        series("moe_cache_slots_moved_total", "counter", 0, "MoE cache: slots those rounds moved")
        series("moe_cache_peer_hits_total", "counter", peer_misses, "MoE cache: of the misses, those the peer computed")
        series("moe_cache_peer_slots", "gauge", 48 if peer else 0, "MoE cache: the peer tier's expert slots")
        if peer:
            series("moe_cache_peer_bytes", "gauge", 48 * EXPERT, "MoE cache: the peer tier's memory (--moe-cache-peer)")
        series("moe_cache_hit_ratio", "gauge", h / (h + m + r), "MoE cache: hits / (hits + misses + refused)")
        series("moe_cache_slots", "gauge", 78, "MoE cache: expert slots")
        series("moe_cache_resident", "gauge", 75, "MoE cache: slots that hold an expert now")
        series("moe_cache_prefilled", "gauge", 0, "MoE cache: slots the profile filled")
        series("moe_cache_bytes", "gauge", 2 << 20, "MoE cache: device memory")
        series("moe_cache_hybrid", "gauge", 1 if peer else 0, "MoE cache: 1 in hybrid mode")
        series("moe_cache_layer_hits_total", "counter", hits, "MoE cache: hits per layer")
        series("moe_cache_layer_hits_profile_total", "counter", prof, "MoE cache: profile hits per layer")
        series("moe_cache_layer_misses_total", "counter", miss, "MoE cache: misses per layer")
        series("moe_cache_layer_refused_total", "counter", refused, "MoE cache: refused selections per layer")
    return "\n".join(lines) + "\n"


class StubLlamaServer(ThreadingHTTPServer):
    """Serves /metrics like llama-server (counters growing with each scrape, CORS open); remembers what it
    served. ``status`` 501 plays a server started without --metrics."""

    daemon_threads = True

    def __init__(self, cache: bool = True, status: int = 200, peer: bool = False) -> None:
        self.cache, self.status, self.peer = cache, status, peer
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
                text = metrics_text(len(s.served), s.cache, s.peer)
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
        self.texts: list[str] = []   # all the text, in order
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
        self.texts.append(data)
        for _, a in self._open:
            if "id" in a:
                self.by_id[a["id"]] += data
            if "data-layer" in a and "data-kind" in a:
                self.cells[(int(a["data-layer"]), a["data-kind"])] += data


# The series the page shows in its tiles (monitor.html's data-series, each a llamacpp:moe_cache_* name): every
# one must be the server's value, as it wrote it. Those of later builds, by the element hidden while the server
# does not write them.
TILE_SERIES = {"hit_ratio", "hits_total", "hits_profile_total", "misses_total", "admissions_total", "cpu_total",
               "peer_hits_total", "peer_slots", "refused_total", "upload_bytes_total", "cpu_bytes_total",
               "copies_total", "swaps_total", "bytes", "slots", "resident", "prefilled"}
LATER_TILE_SERIES = {"uploads_total": "uploads-tile", "admitted_total": "admitted-tile", "peer_bytes": "peer-bytes-line",
                     "disk_bytes_total": "disk-tile", "disk_reads_total": "disk-tile",
                     "disk_prompt_bytes_total": "disk-tile", "disk_wait_seconds_total": "disk-tile",
                     "ram_hits_total": "ram-line", "ram_misses_total": "ram-line"}
BYTE_SERIES = {"upload_bytes_total", "cpu_bytes_total", "bytes", "peer_bytes", "disk_bytes_total", "disk_prompt_bytes_total"}


def _to_fixed(x: float, digits: int) -> str:
    """JavaScript's Number.prototype.toFixed: the exact value of the double, a tie rounded up."""
    return str(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _fmt_count(n: float) -> str:   # monitor.html's fmtCount: every digit, grouped by three
    return f"{round(n):,}"


def _fmt_bytes(b: float) -> str:   # monitor.html's fmtBytes
    for d, u in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if b >= d:
            return f"{_to_fixed(b / d, 2)} {u}"
    return f"{round(b)} B"


def _as_shown(series: str, value: float) -> str:
    if series == "hit_ratio":
        return _to_fixed(value, 3)
    if series == "disk_wait_seconds_total":
        return _to_fixed(value, 2 if value < 10 else 0) + " s"
    return _fmt_bytes(value) if series in BYTE_SERIES else _fmt_count(value)


def _series(text: str) -> dict[str, float]:
    """A /metrics text's llamacpp:moe_cache_* series without labels, by their names without the prefix."""
    return {s.name[len(PREFIX):]: s.value for s in parse_prometheus(text) if s.name.startswith(PREFIX) and not s.labels}


def _help(text: str, name: str) -> str:
    """The HELP text the server wrote for llamacpp:moe_cache_<name>, without its "MoE cache: "."""
    m = re.search(rf"^# HELP {re.escape(PREFIX + name)} (?:MoE cache: )?(.*)$", text, re.M)
    assert m, f"no HELP for {PREFIX}{name}"
    return m.group(1)


def _tiles(dom: _Dom) -> dict[str, tuple[str, str | None, str]]:
    """{element id: (series, the value the page read, the text it shows)} of every element that shows a series."""
    return {i: (a["data-series"], a.get("data-value"), dom.by_id[i].strip()) for i, a in dom.attrs.items() if "data-series" in a}


def _titles(dom: _Dom) -> dict[str, str]:
    return {i: a.get("title", "") for i, a in dom.attrs.items() if "data-series" in a}


def _short_help(text: str, name: str) -> str:   # monitor.html's helpShort
    return _help(text, name).split(" (")[0]


def _check_tiles(tiles: dict[str, tuple[str, str | None, str]], text: str, hidden: set[str],
                 titles: dict[str, str] | None = None) -> None:
    """Every tile is its series as the server wrote it in ``text``: the value the page read, exactly, and the text
    it shows, that value formatted (its tooltip, where ``titles`` are given, the series' name and HELP); every
    series of TILE_SERIES has its tile, and one of a later build that the server does not write is hidden."""
    series = _series(text)
    assert {s for s, _, _ in tiles.values()} == TILE_SERIES | set(LATER_TILE_SERIES)
    for element, (name, value, shown) in tiles.items():
        if name not in series:
            assert name in LATER_TILE_SERIES, f"#{element} shows {PREFIX}{name}, which the server does not write"
            assert (value, shown) == ("NaN", "\u2013") and LATER_TILE_SERIES[name] in hidden, element
            continue
        if LATER_TILE_SERIES.get(name) == "disk-tile":
            # every build of the RAM tier writes its series; the tile is shown for a RAM tier only
            assert ("disk-tile" in hidden) == (series.get("ram_tier") != 1), f"#{element}: ram_tier {series.get('ram_tier')}"
        else:
            assert LATER_TILE_SERIES.get(name) not in hidden, f"#{element}: {PREFIX}{name} is written, and hidden"
        assert value is not None and float(value) == series[name], \
            f"#{element} read {value} where {PREFIX}{name} is {series[name]}"
        assert shown == _as_shown(name, series[name]), f"#{element} shows {shown!r}, {PREFIX}{name} is {series[name]}"
        if titles is not None:
            assert titles[element] == f"{PREFIX}{name}: {_help(text, name)}", titles[element]


def _check_layers(dom: _Dom, c: MoeCacheMetrics) -> None:
    assert {il for il, _ in dom.cells} == set(c.layers)
    for il, (hits, _, misses) in c.layers.items():
        refused = c.layers_refused[il]
        assert dom.cells[(il, "hits")] == _fmt_count(hits) and dom.cells[(il, "misses")] == _fmt_count(misses)
        assert dom.cells[(il, "refused")] == _fmt_count(refused)
        looked = hits + misses + refused
        assert dom.cells[(il, "rate")] == (_to_fixed(hits / looked, 2) if looked else "\u2013")


def _rendered(dom: _Dom, served: list[str]) -> str:
    """The scrape the page rendered last (one more may have been in flight when Chromium stopped)."""
    assert len(served) >= 2, "the page polled fewer than twice"
    shown = dom.attrs["hits"].get("data-value")
    text = next((t for t in reversed(served) if str(_series(t)["hits_total"]) == str(float(shown or "nan"))), None)
    assert text is not None, f"hits {shown!r} is none of those served"
    return text


def _check_dom(dom: _Dom, stub: StubLlamaServer) -> None:
    text = _rendered(dom, stub.served)
    c = parse_moe_cache(text)
    _check_tiles(_tiles(dom), text, dom.hidden, _titles(dom))
    _check_layers(dom, c)
    assert c.n_refused > 0 and c.n_cpu > 0 and c.n_admit == 0
    assert "lookups" not in dom.by_id and "admitted" not in dom.by_id["cpu-misses-what"]
    assert dom.by_id["cpu-misses-what"] == "upload mode's misses the CPU computed" and "peer-tile" in dom.hidden
    assert re.fullmatch(r"0\.\d{3}", dom.by_id["hit-ratio-recent"]), dom.by_id["hit-ratio-recent"]
    assert dom.by_id["mode"] == "upload mode" and "live" in dom.by_id["status"]
    assert set(dom.cells) == {(il, k) for il in range(LAYERS) for k in ("rate", "recent", "hits", "misses", "refused")}
    assert all(re.fullmatch(r"[01]\.\d\d", dom.cells[(il, "recent")]) for il in range(LAYERS))
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


# ----------------------------------------------------------------------------------------------- real servers

PROMPTS = ("The ship left the harbour at dawn, and the crew", "To grow tomatoes in a cold spring, gardeners",
           "The orchestra tuned while the conductor")


def _stats(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_moe", "stats", "--server", url, *extra],
                          capture_output=True, text=True, timeout=60)


@dataclass
class Watched:
    """What the page showed of an idle server, the /metrics scrapes around it, and what stats --server said."""

    url: str
    dom: _Dom
    metrics: str        # scraped right after Chromium dumped the page
    stats_text: str
    stats_json: dict
    log: str            # the server's log, after it stopped


def _serve_and_watch(tmp_path: Path, start, n_predict: int = 32) -> Watched:
    """Starts a server (``start() -> (RunningServer)``), sends PROMPTS one after the other, then, with the server
    idle: a /metrics scrape, the page in Chromium through the monitor, a scrape again (the same cache series:
    nothing moved), stats --server; stops the server with one SIGTERM so that it logs its exit lines."""
    server = start()
    m = MonitorServer(server.url, port=0)
    m.start()
    try:
        for i, prompt in enumerate(PROMPTS):
            r = requests.post(server.url + "/completion", json={"prompt": prompt, "n_predict": n_predict,
                                                                 "temperature": 0.8, "seed": i}, timeout=300)
            assert r.status_code == 200, r.text
        before = requests.get(server.url + "/metrics", timeout=30).text
        dom = _Dom(_browse(tmp_path, m.url, "--dump-dom"))
        after = requests.get(server.url + "/metrics", timeout=30).text
        assert _series(after) == _series(before), "the server moved while the page was read: it must be idle"
        text, js = _stats(server.url), _stats(server.url, "--json")
        assert text.returncode == 0 and js.returncode == 0, text.stderr + js.stderr
    finally:
        m.shutdown()
        m.server_close()
        assert server.stop() == 0
    return Watched(server.url, dom, after, text.stdout, json.loads(js.stdout), server.log.read_text(errors="replace"))


def _check_stats(w: Watched) -> None:
    """stats --server says the same series: its JSON field by field, its lines with the values of the scrape,
    and its lookups line is the one the engine logged at exit (nothing decoded in between)."""
    series, c = _series(w.metrics), parse_moe_cache(w.metrics)
    js = w.stats_json["moe_cache"]
    for name, field in (("hits_total", "n_hit"), ("hits_profile_total", "n_hit_profile"), ("misses_total", "n_miss"),
                        ("refused_total", "n_refused"), ("admissions_total", "n_admit"), ("cpu_total", "n_cpu"),
                        ("peer_hits_total", "n_hit_peer"), ("peer_slots", "n_slots_peer"),
                        ("upload_bytes_total", "n_bytes_upload"), ("cpu_bytes_total", "n_bytes_cpu"),
                        ("copies_total", "n_copy"), ("swaps_total", "n_swap"), ("hit_ratio", "hit_ratio"),
                        ("slots", "n_slots"), ("resident", "n_resident"), ("prefilled", "n_prefilled"),
                        ("bytes", "n_bytes_cache")):
        assert js[field] == series[name], f"stats --server --json {field} = {js[field]}, {PREFIX}{name} = {series[name]}"
    lines = w.stats_text.splitlines()
    assert f"hit rate {series['hit_ratio']:.3f} ({c.n_hit} hits, {c.n_hit_profile} from the profile, {c.n_miss} misses)" in lines[4]
    assert (f"{c.n_admit} admitted between decodes ({c.n_bytes_upload / 2**20:.2f} MiB uploaded)" in lines[4]) == (c.n_admit > 0)
    assert f"{c.n_copy} experts copied from the cache by large batches, {c.n_swap} swapped in" in w.stats_text
    exit_line = re.findall(r"llama_moe_cache: (\d+ hits of \d+ lookups = .*)$", w.log, re.M)
    assert exit_line and lines[5].strip() == exit_line[-1].strip(), (lines[5], exit_line)
    table = lines[lines.index("layer   hits  from profile  misses  refused  hit rate") + 1:]
    assert [tuple(map(int, l.split()[1:5])) for l in table] == \
        [(h, p, m, c.layers_refused[il]) for il, (h, p, m) in c.layers.items()]


@pytest.mark.slow
def test_the_page_shows_the_admitting_hybrid_s_series(tmp_path: Path, lib, tiny_model_path: Path) -> None:
    """A real llama-server with the admitting hybrid (its cache in RAM) after a few requests, idle; the page in
    headless Chromium through the monitor: each tile is exactly its /metrics series of a scrape taken right after
    (admissions, the misses computed on the CPU, refused, bytes, the hit ratio gauge), the per-layer table the
    layers' series; and stats --server says the same."""
    from support.llama_server import find_server_binary
    from llama_moe.tools.server import process as server_process

    binary = find_server_binary()
    args = ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib", "2", "--moe-cache-hybrid",
            "--moe-cache-admit", "2", "--metrics", "-c", "512", "-np", "1", "-v"]
    w = _serve_and_watch(tmp_path, lambda: server_process.start_server(
        binary, args, tmp_path / "server.log", env={"LLAMA_ARG_MOE_CACHE_DEVICE": "CPU"}))
    c = parse_moe_cache(w.metrics)
    assert c is not None and c.hybrid and c.n_admit > 0 and c.n_hit > 0 and c.n_miss > 0
    # no count of the page's own beside the series: whatever says "N admitted" says the series
    page = " ".join(w.dom.texts)
    said = re.findall(r"\d[\d,.]*k? admitted", page)
    assert all(n == f"{_fmt_count(c.n_admit)} admitted" for n in said), f"{said}: {PREFIX}admissions_total is {c.n_admit}"
    tiles = _tiles(w.dom)
    _check_tiles(tiles, w.metrics, w.dom.hidden, _titles(w.dom))
    _check_layers(w.dom, c)
    assert tiles["admissions"] == ("admissions_total", str(c.n_admit), _fmt_count(c.n_admit))
    assert w.dom.by_id["mode"] == "hybrid mode" and "live" in w.dom.by_id["status"]
    assert "peer-tile" in w.dom.hidden and c.n_slots_peer == 0
    assert w.dom.by_id["cpu-misses-what"] == _short_help(w.metrics, "cpu_total")
    assert w.dom.by_id["requests"] == "0"
    _check_stats(w)


@pytest.mark.slow
def test_the_page_shows_the_peer_s_series(tmp_path: Path, lib, tiny_model_path: Path) -> None:
    """The admitting hybrid with a peer tier: the model's layers on one rpc-server, its experts in RAM, the cache
    there and the peer on a second rpc-server. The peer's tile appears, and it and every other tile are exactly
    the /metrics series; stats --server says the same."""
    from support.llama_server import find_server_binary
    from support.rpc_servers import find_rpc_server_binary, start_rpc_server
    from llama_moe.tools.server import process as server_process

    rpc = [start_rpc_server(find_rpc_server_binary(), tmp_path / f"rpc{i}.log") for i in range(2)]
    try:
        args = ["-m", str(tiny_model_path), "--rpc", ",".join(s.endpoint for s in rpc), "-ts", "1,0", "-ngl", "99",
                "--cpu-moe", "--no-repack", "--moe-cache-mib", "1", "--moe-cache-hybrid", "--moe-cache-admit", "2",
                "--moe-cache-peer", "RPC1", "--metrics", "-c", "512", "-t", "2", "-np", "1", "-v"]
        w = _serve_and_watch(tmp_path, lambda: server_process.start_server(
            find_server_binary(), args, tmp_path / "server.log"), n_predict=16)
    finally:
        for s in rpc:
            s.stop()
    c = parse_moe_cache(w.metrics)
    assert c is not None and c.hybrid and c.n_slots_peer > 0 and c.n_hit_peer > 0 and c.n_admit > 0
    tiles = _tiles(w.dom)
    _check_tiles(tiles, w.metrics, w.dom.hidden, _titles(w.dom))
    _check_layers(w.dom, c)
    assert "peer-tile" not in w.dom.hidden
    assert tiles["peer-hits"] == ("peer_hits_total", str(c.n_hit_peer), _fmt_count(c.n_hit_peer))
    assert w.dom.by_id["cpu-misses-what"] == _short_help(w.metrics, "cpu_total")
    _check_stats(w)
    assert f"the peer tier computed {c.n_hit_peer} of the {c.n_miss} misses in its {c.n_slots_peer} slots" in w.stats_text


# ----------------------------------------------------------------------------------------------- the script under node

# A stand-in for the few DOM calls monitor.html makes, so that its script runs under node on a /metrics text
# where no browser is installed; prints every element's text, the value it read (data-value), whether it is
# hidden, its tooltip, and the heat map's cells as JSON.
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
  const text = {}, values = {}, hidden = {}, titles = {};
  for (const [id, e] of Object.entries(els)) {
    text[id] = e.textContent; values[id] = e.dataset.value; hidden[id] = e.hidden; titles[id] = e.title;
  }
  console.log(JSON.stringify({text, values, hidden, titles, cells, heat: el("chart-heat").dataset,
                              charts: {hit: el("chart-hit").dataset, bytes: el("chart-bytes").dataset}}));
}
"""


def _run_page_script(tmp_path: Path, *metrics: str) -> dict:
    """The page's script polling each metrics text in turn, one second apart."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    harness = tmp_path / "harness.js"
    harness.write_text(_NODE_HARNESS)
    texts = []
    for i, m in enumerate(metrics):
        texts.append(tmp_path / f"metrics-{i}.txt")
        texts[-1].write_text(m)
    page = tmp_path / "monitor.html"
    page.write_bytes(monitor_html())
    done = subprocess.run([node, str(harness), str(page), *map(str, texts)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _script_tiles(out: dict) -> dict[str, tuple[str, str | None, str]]:
    """_tiles of the node run: the elements that show a series are those of the page with a data-series."""
    static = _Dom(monitor_html().decode())
    return {i: (a["data-series"], out["values"].get(i), out["text"].get(i, "")) for i, a in static.attrs.items()
            if "data-series" in a}


def test_the_page_script_shows_the_series_as_they_are(tmp_path: Path) -> None:
    """The page's own script (run under node, no browser needed), four polls a second apart: every tile is its
    series as the last poll read it (upload mode with its split to the CPU; the admitting hybrid with a peer),
    the rates are the series' per second, and the per-layer hit rates have the refused selections in their
    denominator, as the server's gauge."""
    for peer in (False, True):
        polls = [metrics_text(i, peer=peer) for i in range(4)]
        out = _run_page_script(tmp_path, *polls)
        _check_tiles(_script_tiles(out), polls[-1], {i for i, h in out["hidden"].items() if h}, out["titles"])
        c = parse_moe_cache(polls[-1])
        text, cells = out["text"], out["cells"]
        assert out["hidden"]["peer-tile"] is not peer
        assert text["admission-rate"] == ("12345.0" if peer else "0.0")
        assert text["peer-hit-rate"] == (f"{(c.n_hit_peer - parse_moe_cache(polls[0]).n_hit_peer) / 3:.1f}" if peer else "0.0")
        assert text["cpu-misses-what"] == ("misses the CPU computed" if peer else "upload mode's misses the CPU computed")
        assert text["uploads-what"] == ("upload mode's misses uploaded when looked up" if peer else "uploaded when looked up")
        assert text["admitted-what"] == ("experts brought into slots while running" if peer else "experts brought into slots")
        assert text["mode"] == ("hybrid mode" if peer else "upload mode")
        for il, (hits, _, misses) in c.layers.items():
            refused = c.layers_refused[il]
            assert cells[f"{il}/refused"] == _fmt_count(refused)
            assert cells[f"{il}/rate"] == _to_fixed(hits / (hits + misses + refused), 2)
    # a server built before refused lookups, the split, admission and the peer: those tiles say they do not know
    metrics = metrics_text(3)
    later = ("refused", "resident", "admissions_total", "cpu_total", "peer_", "repartitions", "slots_moved")
    older = "\n".join(l for l in metrics.splitlines() if not any(k in l for k in later)) + "\n"
    out = _run_page_script(tmp_path, older)
    for element in ("refused", "resident", "admissions", "cpu-misses", "peer-hits"):
        assert out["text"][element] == "\u2013" and out["values"][element] == "NaN", element
    assert out["text"]["hit-ratio"] == _to_fixed(_series(metrics)["hit_ratio"], 3) and out["hidden"]["peer-tile"]
    hits, _, misses = parse_moe_cache(metrics).layers[0]
    assert out["cells"]["0/rate"] == _to_fixed(hits / (hits + misses), 2)


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


def test_the_page_names_the_ram_tier(tmp_path: Path) -> None:
    """A server whose cache is the RAM tier (llamacpp:moe_cache_ram_tier 1): the page says so, and its uploads are
    the reads of the model's file; the tiles stay the series as written."""
    def tier(i: int) -> str:
        # the reads grow 96 MiB and 0.5 s of waiting a poll, 40 MiB of them a prompt's
        return (metrics_text(i) + "# TYPE llamacpp:moe_cache_ram_tier gauge\nllamacpp:moe_cache_ram_tier 1\n"
                + "".join(f"# HELP llamacpp:moe_cache_{name} MoE cache: the RAM tier's {name}\n"
                          f"# TYPE llamacpp:moe_cache_{name} counter\nllamacpp:moe_cache_{name} {v:g}\n"
                          for name, v in [("disk_reads_total", 1234 * (i + 1)), ("disk_bytes_total", 96 * 2**20 * (i + 1)),
                                          ("disk_prompt_bytes_total", 40 * 2**20 * (i + 1)),
                                          ("disk_wait_seconds_total", 0.5 * (i + 1)),
                                          ("ram_hits_total", 300 * (i + 1)), ("ram_misses_total", 100 * (i + 1))]))
    polls = [tier(i) for i in range(2)]
    out = _run_page_script(tmp_path, *polls)
    assert out["text"]["mode"] == "RAM tier (upload mode in RAM)"
    assert out["text"]["bytes-upload-label"] == "bytes read into the slots"
    hidden = {i for i, h in out["hidden"].items() if h}
    assert "disk-tile" not in hidden
    _check_tiles(_script_tiles(out), polls[-1], hidden, out["titles"])
    # the share of the wall clock the decodes waited for the disk, between the two polls
    share = out["text"]["disk-wait-share"]
    assert share.endswith("%") and float(share[:-1]) > 0
    # the tier's lookups: 300 held and 100 missed a poll
    assert out["text"]["ram-held-share"] == "75.0%" and "ram-line" not in hidden
    # the charts draw the tier's series beside the cache's: its held share and its reads per second
    assert _chart(out, "hit")["ram"] == "0.75" and "legend-ram" not in hidden
    read = float(f"{96 * 2**20 * 2:g}") - float(f"{96 * 2**20:g}")   # the series as written, one second apart
    assert float(_chart(out, "bytes")["disk"]) == pytest.approx(read) and "legend-disk" not in hidden
    plain = _run_page_script(tmp_path, metrics_text(0), metrics_text(1))
    assert plain["text"]["mode"] == "upload mode" and plain["text"]["bytes-upload-label"] == "bytes uploaded"
    assert set(_chart(plain, "hit")) == {"ratio", "recent"} and set(_chart(plain, "bytes")) == {"up", "cpu"}
    assert plain["hidden"]["legend-ram"] and plain["hidden"]["legend-disk"]


def _chart(out: dict, which: str) -> dict[str, str]:
    """A line chart's series as the page drew them: name -> its newest value."""
    d = out["charts"][which]
    return dict(zip(d["lines"].split(","), d["newest"].split(",")))


def test_the_page_names_three_tiers(tmp_path: Path) -> None:
    """A hybrid device cache over the RAM tier (llamacpp:moe_cache_ram_below 1): the page names the device's mode
    over the tier, its uploads stay the device's, and the tier's tile shows its reads and lookups."""
    def three(i: int) -> str:
        text = metrics_text(i).replace("llamacpp:moe_cache_hybrid 0", "llamacpp:moe_cache_hybrid 1")
        return (text + "# TYPE llamacpp:moe_cache_ram_tier gauge\nllamacpp:moe_cache_ram_tier 1\n"
                + "# TYPE llamacpp:moe_cache_ram_below gauge\nllamacpp:moe_cache_ram_below 1\n"
                + "".join(f"# HELP llamacpp:moe_cache_{name} MoE cache: the RAM tier's {name}\n"
                          f"# TYPE llamacpp:moe_cache_{name} counter\nllamacpp:moe_cache_{name} {v:g}\n"
                          for name, v in [("disk_reads_total", 60 * (i + 1)), ("disk_bytes_total", 8 * 2**20 * (i + 1)),
                                          ("disk_prompt_bytes_total", 2**20 * (i + 1)), ("disk_wait_seconds_total", 0.1 * (i + 1)),
                                          ("ram_hits_total", 90 * (i + 1)), ("ram_misses_total", 10 * (i + 1))]))
    polls = [three(i) for i in range(2)]
    assert "llamacpp:moe_cache_hybrid 1" in polls[0]
    out = _run_page_script(tmp_path, *polls)
    assert out["text"]["mode"] == "hybrid mode over a RAM tier"
    assert out["text"]["bytes-upload-label"] == "bytes uploaded"
    hidden = {i for i, h in out["hidden"].items() if h}
    assert "disk-tile" not in hidden and "ram-line" not in hidden
    assert out["text"]["ram-held-share"] == "90.0%"
    hit = _chart(out, "hit")
    assert hit["ram"] == "0.9" and float(hit["recent"]) == pytest.approx(float(out["text"]["hit-ratio-recent"]), abs=1e-3)
    assert float(_chart(out, "bytes")["disk"]) == pytest.approx(float(f"{8 * 2**20 * 2:g}") - float(f"{8 * 2**20:g}"))
    _check_tiles(_script_tiles(out), polls[-1], hidden, out["titles"])
