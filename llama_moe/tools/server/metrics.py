"""llama-server's view of the MoE cache: the ``llamacpp:moe_cache_*`` series of ``/metrics`` (``--metrics``)
and the per-request log line, parsed into the same counter names as :class:`llama_moe.stats.MoeCacheStats`."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import MetricsError, ServerError
from ...stats import CacheDevice, HitRate

PREFIX = "llamacpp:moe_cache_"
# series name (without PREFIX) -> the MoeCacheMetrics field it fills; docs/formats.md's "Server metrics" table
SCALARS = {
    "hits_total": "n_hit",
    "hits_profile_total": "n_hit_profile",
    "misses_total": "n_miss",
    "refused_total": "n_refused",
    "upload_bytes_total": "n_bytes_upload",
    "cpu_bytes_total": "n_bytes_cpu",
    "copies_total": "n_copy",
    "swaps_total": "n_swap",
    "admissions_total": "n_admit",
    "cpu_total": "n_cpu",
    "repartitions_total": "n_repartition",
    "slots_moved_total": "n_moved",
    "peer_hits_total": "n_hit_peer",
    "peer_slots": "n_slots_peer",
    "hit_ratio": "hit_ratio",
    "slots": "n_slots",
    "resident": "n_resident",
    "prefilled": "n_prefilled",
    "bytes": "n_bytes_cache",
    "hybrid": "hybrid",
}
# series of later builds still, read when present (None from a server built before them)
OPTIONAL = {"uploads_total": "n_upload", "admitted_total": "n_admitted", "peer_bytes": "n_bytes_peer",
            "ram_tier": "ram_tier", "disk_reads_total": "n_disk_reads", "disk_bytes_total": "n_bytes_disk",
            "disk_prompt_bytes_total": "n_bytes_disk_prompt", "ram_below": "ram_below", "ram_hits_total": "n_ram_hit",
            "ram_misses_total": "n_ram_miss"}
# seconds, kept as whole microseconds as the engine counts them
OPTIONAL_SECONDS = {"disk_wait_seconds_total": "disk_wait_us"}
PER_LAYER = ("layer_hits_total", "layer_hits_profile_total", "layer_misses_total", "layer_refused_total")
# series later than the first llama-server with a cache: their absence means a server built from older patches
LATER_SERIES = ("refused_total", "resident", "layer_refused_total", "admissions_total", "cpu_total",
                "repartitions_total", "slots_moved_total", "peer_hits_total", "peer_slots")
COUNTER_SERIES = tuple(PREFIX + s for s in SCALARS if s.endswith("_total")) + tuple(PREFIX + s for s in PER_LAYER)
ALL_SERIES = tuple(PREFIX + s for s in SCALARS) + tuple(PREFIX + s for s in PER_LAYER)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_META_RE = re.compile(rf"^#\s+(HELP|TYPE)\s+({_NAME})(?:\s+(.*))?$")
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_prometheus(text: str) -> tuple[Sample, ...]:
    """The samples of a Prometheus text exposition: ``# HELP``/``# TYPE`` lines, ``name value`` and
    ``name{label="v",...} value`` (what llama-server writes). MetricsError names the bad line."""
    samples = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            meta = _META_RE.match(line)
            if meta and meta.group(1) == "TYPE" and (meta.group(3) or "").strip() not in _TYPES:
                raise MetricsError(f"line {n}: unknown metric type in {line!r}")
            continue   # HELP text, or a plain comment
        m = _SAMPLE_RE.match(line)
        if not m:
            raise MetricsError(f"line {n}: not a Prometheus sample: {line!r}")
        name, label_text, value_text = m.groups()
        labels = []
        if label_text:
            pos = 0
            while pos < len(label_text):
                lm = _LABEL_RE.match(label_text, pos)
                if not lm or lm.end() == pos:
                    raise MetricsError(f"line {n}: malformed labels in {line!r}")
                labels.append((lm.group(1), _unescape(lm.group(2))))
                pos = lm.end()
        try:
            value = float(value_text)   # also "NaN", "+Inf" and the 6-digit "1.23457e+06" of a C++ stream
        except ValueError:
            raise MetricsError(f"line {n}: {name} has the value {value_text!r}, not a number") from None
        samples.append(Sample(name, tuple(labels), value))
    return tuple(samples)


def _count(value: float, name: str) -> int:
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise MetricsError(f"{name} is {value}, not a count")
    return int(round(value))


@dataclass(frozen=True)
class MoeCacheMetrics(HitRate):
    """The MoE cache as llama-server's /metrics reports it: MoeCacheStats's counters (no n_bytes_copy: the
    server does not export it), the server's own hit ratio (hits / (hits + misses + refused)),
    {layer: (hits, hits_profile, misses)} and {layer: refused}."""

    n_hit: int
    n_hit_profile: int
    n_miss: int
    n_bytes_upload: int
    n_bytes_cpu: int
    hybrid: bool
    n_copy: int
    n_slots: int
    n_prefilled: int
    n_bytes_cache: int
    n_swap: int
    hit_ratio: float
    layers: dict[int, tuple[int, int, int]]
    n_refused: int = 0
    n_resident: int = 0
    layers_refused: dict[int, int] = field(default_factory=dict)
    n_admit: int = 0
    n_cpu: int = 0
    n_repartition: int = 0
    n_moved: int = 0
    n_hit_peer: int = 0
    n_slots_peer: int = 0
    devices: tuple["DeviceMetrics", ...] = ()
    n_upload: int | None = None     # the engine's own figures (None: a server from patches before them)
    n_admitted: int | None = None
    n_bytes_peer: int | None = None  # the devices that hold slots (a server from older patches: none)
    ram_tier: int | None = None      # 1: the cache is the RAM tier (--moe-ram-mib); its reads of the model's file
    n_disk_reads: int | None = None
    n_bytes_disk: int | None = None
    disk_wait_us: int | None = None
    n_bytes_disk_prompt: int | None = None
    ram_below: int | None = None     # 1: the RAM tier is under the device cache (three tiers)
    n_ram_hit: int | None = None     # the RAM tier's lookups (MoeCacheStats.n_ram_hit, n_ram_miss)
    n_ram_miss: int | None = None

    @property
    def hit_rate(self) -> float:
        """The server's own hit ratio gauge: the engine's figure, read without a local build."""
        return self.hit_ratio


@dataclass(frozen=True)
class DeviceMetrics(CacheDevice):
    """One device of the cache as /metrics reports it (``moe_cache_device_*{device="..."}``): the layers whose
    slots it holds, its slots and bytes, and its layers' counters, which add up to the totals; the fields are
    the engine's own (``CacheDevice``)."""


# series name (without PREFIX) -> the DeviceMetrics field it fills
PER_DEVICE = {
    "device_layer_slots": "n_slots",
    "device_slots": "n_slots_total",
    "device_bytes": "n_bytes",
    "device_hits_total": "n_hit",
    "device_misses_total": "n_miss",
    "device_cpu_total": "n_cpu",
}


def layer_runs(text: str) -> tuple[int, ...]:
    """"0-2,5" -> (0, 1, 2, 5); MetricsError for anything else."""
    out: list[int] = []
    for part in text.split(",") if text else ():
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise MetricsError(f"layers={text!r}: not runs of layers such as 0-2,5")
        out += range(int(lo), int(hi or lo) + 1)
    return tuple(out)


def _devices(ours: list[Sample]) -> tuple[DeviceMetrics, ...]:
    info = [s for s in ours if s.name == PREFIX + "device_info"]
    values: dict[str, dict[str, int]] = {}
    for s in ours:
        short = s.name[len(PREFIX):]
        if short in PER_DEVICE:
            dev = s.label("device")
            if dev is None:
                raise MetricsError(f"{s.name} needs a device=\"NAME\" label, got {dict(s.labels)}")
            values.setdefault(dev, {})[PER_DEVICE[short]] = _count(s.value, s.name)
    out = []
    for s in info:
        name = s.label("device") or ""
        got = values.get(name, {})
        missing = [PREFIX + k for k, f in PER_DEVICE.items() if f not in got]
        if missing:
            raise MetricsError(f"the server's /metrics lacks {', '.join(missing)} for device {name!r}")
        out.append(DeviceMetrics(name, s.label("description") or "", layer_runs(s.label("layers") or ""), **got))
    return tuple(out)


@dataclass(frozen=True)
class ServerMetrics:
    """What ``stats --server`` reports: llama-server's own throughput counters and the MoE cache."""

    prompt_tokens: int
    prompt_seconds: float
    tokens_predicted: int
    tokens_predicted_seconds: float
    requests_processing: int
    moe_cache: MoeCacheMetrics | None

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def gen_tps(self) -> float:
        return self.tokens_predicted / self.tokens_predicted_seconds if self.tokens_predicted_seconds else 0.0


def moe_cache_from_samples(samples: tuple[Sample, ...]) -> MoeCacheMetrics | None:
    """None when the server has no MoE cache (no llamacpp:moe_cache_* series); MetricsError when it has some
    of them but not all."""
    ours = [s for s in samples if s.name.startswith(PREFIX)]
    if not ours:
        return None
    scalars: dict[str, float] = {}
    optional: dict[str, int] = {}
    layers: dict[int, list[int | None]] = {}
    for s in ours:
        short = s.name[len(PREFIX):]
        if short in SCALARS:
            scalars[SCALARS[short]] = s.value
        elif short in OPTIONAL and not s.labels:
            optional[OPTIONAL[short]] = _count(s.value, s.name)
        elif short in OPTIONAL_SECONDS and not s.labels:
            optional[OPTIONAL_SECONDS[short]] = round(s.value * 1e6)
        elif short in PER_LAYER:
            layer = s.label("layer")
            if layer is None or not layer.isdigit():
                raise MetricsError(f"{s.name} needs a layer=\"N\" label, got {dict(s.labels)}")
            layers.setdefault(int(layer), [None] * len(PER_LAYER))[PER_LAYER.index(short)] = _count(s.value, s.name)
        # other moe_cache_* series: newer than this parser; ignored
    missing = [k for k, v in SCALARS.items() if v not in scalars]
    missing += [k for k in PER_LAYER if layers and all(v[PER_LAYER.index(k)] is None for v in layers.values())]
    if missing:
        older = (": a llama-server built from older patches than this llama_moe (rebuild it: python -m llama_moe build)"
                 if set(missing) <= set(LATER_SERIES) else "")
        raise MetricsError("the server's /metrics has MoE cache series but lacks "
                           + ", ".join(PREFIX + k for k in missing) + older)
    for il, values in layers.items():
        for name, v in zip(PER_LAYER, values):
            if v is None:
                raise MetricsError(f"the server's /metrics lacks {PREFIX}{name}{{layer=\"{il}\"}}")
    ints = {k: _count(v, PREFIX + k) for k, v in scalars.items() if k not in ("hit_ratio", "hybrid")}
    ordered = sorted(layers.items())
    return MoeCacheMetrics(**ints, hybrid=scalars["hybrid"] != 0, hit_ratio=scalars["hit_ratio"],
                           layers={il: (v[0], v[1], v[2]) for il, v in ordered},  # type: ignore[misc]
                           layers_refused={il: v[3] for il, v in ordered},  # type: ignore[misc]
                           devices=_devices(ours), **optional)


def parse_moe_cache(text: str) -> MoeCacheMetrics | None:
    """The MoE cache counters of a /metrics text; None when the server has no cache."""
    return moe_cache_from_samples(parse_prometheus(text))


def parse_server_metrics(text: str) -> ServerMetrics:
    samples = parse_prometheus(text)
    plain = {s.name: s.value for s in samples if not s.labels}

    def get(name: str) -> float:
        return plain.get("llamacpp:" + name, 0.0)

    return ServerMetrics(_count(get("prompt_tokens_total"), "prompt_tokens_total"), get("prompt_seconds_total"),
                         _count(get("tokens_predicted_total"), "tokens_predicted_total"),
                         get("tokens_predicted_seconds_total"),
                         _count(get("requests_processing"), "requests_processing"), moe_cache_from_samples(samples))


def fetch_metrics_text(server: str, timeout: float = 10.0, api_key: str | None = None) -> str:
    """GET <server>/metrics; ServerError says why it failed (not reachable, no --metrics, API key)."""
    import requests

    url = server.rstrip("/") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = requests.get(url, timeout=timeout, headers=headers)
    except requests.RequestException as exc:
        raise ServerError(f"cannot reach {url}: {exc}") from exc
    if r.status_code == 501:
        raise ServerError(f"{server} does not serve /metrics: start llama-server with --metrics")
    if r.status_code == 401:
        raise ServerError(f"{url} wants an API key (the server's --api-key): pass --api-key or set LLAMA_API_KEY")
    if r.status_code != 200:
        raise ServerError(f"{url} answered HTTP {r.status_code}: {r.text[:200]}")
    return r.text


def fetch_server_metrics(server: str, timeout: float = 10.0, api_key: str | None = None) -> ServerMetrics:
    return parse_server_metrics(fetch_metrics_text(server, timeout, api_key))


# ----------------------------------------------------------------------------------------------- log lines

@dataclass(frozen=True)
class RequestLogLine:
    """llama-server's per-request line. Every miss is said where it went: ``misses`` = ``uploaded`` + ``cpu`` +
    ``peer``. Upload mode: hits, hits_profile, uploaded (mib their bytes, gib_s over the request's time), cpu (the
    split's misses the CPU computed, cpu_mib what it read), refused (None in the line of a build before it was
    counted). Hybrid: hits (on the GPU), cpu (on the CPU, cpu_mib what it read), peer (computed by the peer tier;
    0 without one); hits_profile, gib_s and refused None (the hybrid refuses nothing). A line of an older build
    (no CPU part in upload mode) reads cpu 0. The rate is hits / (hits + misses + refused)."""

    hybrid: bool
    rate_pct: float
    hits: int
    misses: int
    mib: float                      # upload mode: MiB uploaded; hybrid: MiB the CPU read (cpu_mib)
    hits_profile: int | None = None
    gib_s: float | None = None
    refused: int | None = None
    own: "OwnShare | None" = None   # the request's own share (later builds), None in a line without it
    uploaded: int = 0
    cpu: int = 0
    cpu_mib: float = 0.0
    peer: int = 0


@dataclass(frozen=True)
class OwnShare:
    """The "; own: ..." part of the per-request line: the lookups charged to this request alone (each lookup of
    the context is one request's), its misses split as the line's (misses = uploaded + cpu + peer). Upload mode:
    hits, uploaded (mib their bytes), cpu (cpu_mib), refused; hybrid: hits (on the GPU), cpu (mib and cpu_mib what
    the CPU read), peer, refused 0."""

    rate_pct: float
    hits: int
    misses: int
    mib: float
    refused: int
    uploaded: int = 0
    cpu: int = 0
    cpu_mib: float = 0.0
    peer: int = 0


_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+|nan|inf)"
UPLOAD_LINE_RE = re.compile(rf"MoE cache hits = (?P<rate>{_NUM}) % \((?P<hits>\d+) hit, (?P<prof>\d+) from the "
                            rf"profile, (?P<miss>\d+) uploaded: (?P<mib>{_NUM}) MiB, (?P<gibs>{_NUM}) GiB/s\)"
                            rf"(?:, (?P<cpu>\d+) on the CPU, which read (?P<cpumib>{_NUM}) MiB)?"
                            rf"(?:, (?P<refused>\d+) refused)?")
OWN_UPLOAD_RE = re.compile(rf"; own: (?P<rate>{_NUM}) % \((?P<hits>\d+) hit, (?P<miss>\d+) uploaded: (?P<mib>{_NUM}) MiB, "
                           rf"(?:(?P<cpu>\d+) on the CPU, which read (?P<cpumib>{_NUM}) MiB, )?(?P<refused>\d+) refused\)")
OWN_HYBRID_RE = re.compile(rf"; own: (?P<rate>{_NUM}) % \((?P<hits>\d+) on the GPU, (?P<miss>\d+) on the CPU, which read "
                           rf"(?P<mib>{_NUM}) MiB(?:, (?P<peer>\d+) on the peer)?\)")
HYBRID_LINE_RE = re.compile(rf"MoE cache hits = (?P<rate>{_NUM}) % \(hybrid: (?P<hits>\d+) on the GPU, "
                            rf"(?P<miss>\d+) on the CPU, which read (?P<mib>{_NUM}) MiB(?:, (?P<peer>\d+) on the peer)?\)")


def _int(m: re.Match, name: str) -> int:
    return int(m[name]) if m[name] is not None else 0


def _float(m: re.Match, name: str) -> float:
    return float(m[name]) if m[name] is not None else 0.0


def parse_request_log_line(line: str) -> RequestLogLine | None:
    """The per-request MoE cache line anywhere in a log line, or None."""
    if m := UPLOAD_LINE_RE.search(line):
        o = OWN_UPLOAD_RE.search(line, m.end())
        own = None
        if o:
            own = OwnShare(float(o["rate"]), int(o["hits"]), int(o["miss"]) + _int(o, "cpu"), float(o["mib"]),
                           int(o["refused"]), int(o["miss"]), _int(o, "cpu"), _float(o, "cpumib"))
        uploaded, cpu = int(m["miss"]), _int(m, "cpu")
        return RequestLogLine(False, float(m["rate"]), int(m["hits"]), uploaded + cpu, float(m["mib"]),
                              int(m["prof"]), float(m["gibs"]), None if m["refused"] is None else int(m["refused"]), own,
                              uploaded, cpu, _float(m, "cpumib"))
    if m := HYBRID_LINE_RE.search(line):
        o = OWN_HYBRID_RE.search(line, m.end())
        own = None
        if o:
            own = OwnShare(float(o["rate"]), int(o["hits"]), int(o["miss"]) + _int(o, "peer"), float(o["mib"]), 0,
                           0, int(o["miss"]), float(o["mib"]), _int(o, "peer"))
        cpu, peer = int(m["miss"]), _int(m, "peer")
        return RequestLogLine(True, float(m["rate"]), int(m["hits"]), cpu + peer, float(m["mib"]), own=own,
                              cpu=cpu, cpu_mib=float(m["mib"]), peer=peer)
    return None
