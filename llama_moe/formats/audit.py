"""The MoE cache's JSONL audit log (``--moe-cache-audit FILE``), record by record: the typed records, each
validated against the field list of docs/formats.md ("Audit log"), and the file read as a whole (a last line cut
short by a killed process is a warning, never an error). The invariants between records are checked by
``llama_moe.tools.server.audit``."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import AuditError, problems_text

EVENTS = ("load", "ready", "request", "exit")
_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}")  # hash_sha256_hex writes lower case
# the context's counters since its creation, in every record (the C API's llama_moe_cache_stats)
# (every miss is uploaded, computed on the CPU or by the peer: misses = uploads + cpu + peer_hits; admitted = uploads
# + swaps + admissions, the experts brought into slots while running)
COUNTERS = ("hits", "hits_profile", "misses", "bytes_upload", "bytes_cpu", "copies", "bytes_copy", "swaps", "refused",
            "uploads", "cpu", "peer_hits", "admissions", "admitted", "disk_reads", "bytes_disk", "disk_wait_us",
            "ram_hits", "ram_misses")
# of them, those the context's creation may count: the RAM tier reads what it holds whole, and a device cache over
# it fills its slots through it
CREATION_COUNTERS = ("disk_reads", "bytes_disk", "disk_wait_us", "ram_hits", "ram_misses")
# a request's own counters: the context's counters at its end minus those at its start
REQUEST_COUNTERS = ("req_hits", "req_hits_profile", "req_misses", "req_bytes_upload", "req_bytes_cpu", "req_refused",
                    "req_uploads", "req_cpu", "req_peer_hits", "req_admissions", "req_bytes_disk", "req_disk_wait_us")
# a request's own share (its sequence's, llama_moe_cache_get_seq_stats): each lookup charged to one request, so the
# requests' own add up to the context's; absent from the logs of builds before it
OWN_COUNTERS = ("own_hits", "own_misses", "own_refused", "own_bytes_upload", "own_bytes_cpu", "own_uploads", "own_cpu",
                "own_peer_hits")
# counters added after the first audit logs: a log written by an earlier build lacks them, and they read as 0
LATER_COUNTERS = ("refused", "req_refused", "moe_cache_admit", "moe_cache_repartition",  # fields of later builds: 0 when absent
                  "uploads", "cpu", "peer_hits", "admissions", "admitted", "req_uploads", "req_cpu", "req_peer_hits",
                  "req_admissions", "own_uploads", "own_cpu", "own_peer_hits", "disk_reads", "bytes_disk", "disk_wait_us",
                  "req_bytes_disk", "req_disk_wait_us", "ram_hits", "ram_misses")
_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}(Z|\+00:00)$")


# ----------------------------------------------------------------------------------------------- records

@dataclass(frozen=True)
class Counters:
    hits: int
    hits_profile: int
    misses: int
    bytes_upload: int
    bytes_cpu: int
    copies: int
    bytes_copy: int
    swaps: int
    refused: int = 0   # upload mode: selected experts of the lookups refused (more per ubatch than a layer's slots)
    uploads: int = 0   # of the misses, those uploaded when looked up (upload mode)
    cpu: int = 0       # of the misses, those the CPU computed
    peer_hits: int = 0  # of the misses, those the peer tier computed
    admissions: int = 0  # missed experts the hybrid uploaded between decodes
    admitted: int = 0  # experts brought into slots while running: uploads + swaps + admissions
    disk_reads: int = 0  # the RAM tier: expert tensors read from the model's file
    bytes_disk: int = 0  # and their bytes
    disk_wait_us: int = 0  # the time decodes waited for them
    ram_hits: int = 0    # the RAM tier's lookups (alone: the cache's hits and misses; under a device cache, three
    ram_misses: int = 0  #   tiers: the experts the device's slots lacked)

    def __sub__(self, other: "Counters") -> "Counters":
        return Counters(*(getattr(self, f) - getattr(other, f) for f in COUNTERS))

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses + refused); 0.0 before the first lookup."""
        n = self.hits + self.misses + self.refused
        return self.hits / n if n else 0.0


@dataclass(frozen=True)
class RequestCounters:
    """A request's own counters (``req_*``); with several slots busy they include the others' lookups."""

    hits: int
    hits_profile: int
    misses: int
    bytes_upload: int
    bytes_cpu: int
    refused: int = 0
    uploads: int = 0
    cpu: int = 0
    peer_hits: int = 0
    admissions: int = 0
    bytes_disk: int = 0  # the RAM tier's reads while the request ran
    disk_wait_us: int = 0


@dataclass(frozen=True)
class OwnCounters:
    """A request's own share of the lookups (``own_*``): every lookup of the context is charged to exactly one
    request (the one whose token selected the expert first in its ubatch), so these add up over the requests."""

    hits: int
    misses: int
    refused: int
    bytes_upload: int
    bytes_cpu: int
    uploads: int = 0
    cpu: int = 0
    peer_hits: int = 0


@dataclass(frozen=True)
class ModelInfo:
    path: str
    bytes: int
    name: str
    n_layer: int


@dataclass(frozen=True)
class LoadParams:
    build: str
    moe_cache_mib: float
    moe_cache_hybrid: bool
    moe_cache_adaptive: bool
    n_gpu_layers: int
    n_threads: int
    n_threads_batch: int
    n_ctx: int
    n_batch: int
    n_ubatch: int
    tensor_overrides: tuple[str, ...]
    moe_cache_admit: int = 0  # later builds: the hybrid's admissions per layer between decodes (-1: auto)
    moe_cache_repartition: int = 0  # later builds: decodes between moves of slots between layers (0: never)
    moe_cache_peer: str = ""  # later builds: the peer tier's device ("" none)
    moe_cache_mib_auto: bool = False  # later builds: --moe-cache-mib auto (moe_cache_mib is then what the cache took)
    moe_cache_mode: str = "flags"  # later builds: --moe-cache-mode's word, "flags" without one


@dataclass(frozen=True)
class PeerInfo:
    """The peer tier (--moe-cache-peer): its device, slots and memory (not in the cache's bytes)."""

    device: str
    slots: int
    bytes: int


@dataclass(frozen=True)
class CacheInfo:
    slots: int
    prefilled: int
    bytes: int


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    description: str
    mib_free: float
    mib_total: float


@dataclass(frozen=True)
class ProfileInfo:
    path: str
    bytes: int | None = None
    sha256: str | None = None
    error: str | None = None     # set when the profile could not be read
    refused: str | None = None   # read, but the engine refused it (why): the cache started empty


@dataclass(frozen=True)
class LayerSnapshot:
    il: int
    slots: int
    hits: int
    hits_profile: int
    misses: int
    resident: tuple[int, ...]
    refused: int = 0
    device: str | None = None  # the device that holds its slots (None in a log of a build before devices)


@dataclass(frozen=True)
class CacheDevice:
    """A device that holds slots (``cache_devices``): the layers whose slots it holds, its slots per layer and
    in all, its memory for the cache, and its layers' counters when the record was written."""
    name: str
    description: str
    layers: tuple[int, ...]
    slots: int
    slots_total: int
    bytes: int
    hits: int
    misses: int
    cpu: int


@dataclass(frozen=True)
class PerfInfo:
    n_prompt: int
    n_gen: int
    t_prompt_ms: float
    t_gen_ms: float
    prompt_tps: float
    gen_tps: float


@dataclass(frozen=True)
class AuditRecord:
    line: int            # 1-based line in the file
    event: str
    time: str            # as written: UTC, ISO 8601, milliseconds
    pid: int
    hybrid: bool
    counters: Counters


@dataclass(frozen=True)
class LoadRecord(AuditRecord):
    model: ModelInfo
    params: LoadParams
    cache: CacheInfo
    load_ms: float
    devices: tuple[DeviceInfo, ...]
    profile: ProfileInfo | None
    layers: tuple[LayerSnapshot, ...]
    cache_devices: tuple[CacheDevice, ...] = ()  # empty in a log of a build before devices
    peer: PeerInfo | None = None  # the peer tier, None without one (or in a log of a build before it)


@dataclass(frozen=True)
class ReadyRecord(AuditRecord):
    pass


@dataclass(frozen=True)
class RequestRecord(AuditRecord):
    slot: int
    task: int
    n_prompt: int
    n_gen: int
    t_prompt_ms: float
    t_gen_ms: float
    req: RequestCounters
    own: OwnCounters | None = None   # None in the log of a build before requests had their own share


@dataclass(frozen=True)
class ExitRecord(AuditRecord):
    layers: tuple[LayerSnapshot, ...]
    perf: PerfInfo
    cache_devices: tuple[CacheDevice, ...] = ()


# ----------------------------------------------------------------------------------------------- validation

class _Fields:
    """Reads typed fields out of one JSON object, collecting every problem (named by its dotted path)
    instead of stopping at the first, and remembering which keys it read so the rest can be reported."""

    def __init__(self, obj: dict, prefix: str, problems: list[tuple[str | None, str]],
                 extra: list[str]) -> None:
        self.obj, self.prefix, self.problems, self.extra = obj, prefix, problems, extra
        self.seen: set[str] = set()

    def _get(self, name: str) -> tuple[bool, Any]:
        self.seen.add(name)
        if name not in self.obj:
            self.problems.append((self.prefix + name, "missing"))
            return False, None
        return True, self.obj[name]

    def _bad(self, name: str, want: str, value: Any) -> None:
        self.problems.append((self.prefix + name, f"expected {want}, got {_describe(value)}"))

    def int(self, name: str, minimum: int | None = 0) -> int:
        if name in LATER_COUNTERS and name not in self.obj:
            self.seen.add(name)
            return 0   # an earlier build's record
        ok, v = self._get(name)
        # JSON true/false are ints to Python; a counter written as a bool or a float is a bug
        if ok and (not isinstance(v, int) or isinstance(v, bool)):
            self._bad(name, "an integer", v)
        elif ok and minimum is not None and v < minimum:
            self._bad(name, f"an integer >= {minimum}", v)
        else:
            return v if ok else 0
        return 0

    def num(self, name: str) -> float:
        ok, v = self._get(name)
        if ok and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            self._bad(name, "a number", v)
            return 0.0
        return float(v) if ok else 0.0

    def bool(self, name: str) -> bool:
        ok, v = self._get(name)
        if ok and not isinstance(v, bool):
            self._bad(name, "true or false", v)
            return False
        return bool(v)

    def str(self, name: str) -> str:
        ok, v = self._get(name)
        if ok and not isinstance(v, str):
            self._bad(name, "a string", v)
            return ""
        return v if ok else ""

    def obj_(self, name: str, nullable: bool = False) -> "_Fields | None":
        ok, v = self._get(name)
        if not ok or (v is None and nullable):
            return None
        if not isinstance(v, dict):
            self._bad(name, "an object" + (" or null" if nullable else ""), v)
            return None
        return _Fields(v, f"{self.prefix}{name}.", self.problems, self.extra)

    def list_(self, name: str) -> list:
        ok, v = self._get(name)
        if ok and not isinstance(v, list):
            self._bad(name, "a list", v)
            return []
        return v if ok else []

    def done(self) -> None:
        self.extra.extend(self.prefix + k for k in self.obj if k not in self.seen)


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object",
            type(None): "null"}.get(type(value), type(value).__name__)
    text = json.dumps(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def _layers(f: _Fields, name: str) -> tuple[LayerSnapshot, ...]:
    out = []
    for i, item in enumerate(f.list_(name)):
        where = f"{f.prefix}{name}[{i}]"
        if not isinstance(item, dict):
            f.problems.append((where, f"expected an object, got {_describe(item)}"))
            continue
        lf = _Fields(item, where + ".", f.problems, f.extra)
        il, slots = lf.int("il"), lf.int("slots")
        hits, prof, miss, refused = lf.int("hits"), lf.int("hits_profile"), lf.int("misses"), lf.int("refused")
        resident = lf.list_("resident")
        if not all(isinstance(e, int) and not isinstance(e, bool) for e in resident):
            f.problems.append((where + ".resident", f"expected a list of expert ids (integers), got "
                                                    f"{_describe(resident)}"))
            resident = []
        # ids out of range (negative, or not below the layer's n_expert) are the checker's: the record stays
        device = None
        if "device" in item:
            ok, device = lf._get("device")
            if device is not None and not isinstance(device, str):
                lf._bad("device", "a string or null", device)
                device = None
        lf.done()
        out.append(LayerSnapshot(il, slots, hits, prof, miss, tuple(resident), refused, device))
    return tuple(out)


def _cache_devices(f: _Fields) -> tuple[CacheDevice, ...]:
    """``cache_devices``, where the record has it (a build before devices wrote none)."""
    if "cache_devices" not in f.obj:
        return ()
    out = []
    for i, item in enumerate(f.list_("cache_devices")):
        where = f"{f.prefix}cache_devices[{i}]"
        if not isinstance(item, dict):
            f.problems.append((where, f"expected an object, got {_describe(item)}"))
            continue
        df = _Fields(item, where + ".", f.problems, f.extra)
        layers = df.list_("layers")
        if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in layers):
            f.problems.append((where + ".layers", "expected a list of layer numbers (integers >= 0)"))
            layers = []
        out.append(CacheDevice(df.str("name"), df.str("description"), tuple(layers), df.int("slots"),
                               df.int("slots_total"), df.int("bytes"), df.int("hits"), df.int("misses"), df.int("cpu")))
        df.done()
    return tuple(out)


def _load(f: _Fields, base: dict) -> LoadRecord:
    m = f.obj_("model")
    model = ModelInfo(m.str("path"), m.int("bytes"), m.str("name"), m.int("n_layer")) if m else ModelInfo("", 0, "", 0)
    if m:
        m.done()
    p = f.obj_("params")
    params = LoadParams("", 0.0, False, False, 0, 0, 0, 0, 0, 0, ())
    if p:
        # llama.cpp's build is a number (LLAMA_BUILD_NUMBER) or a commit string; either reads as text
        has_build, build = p._get("build")
        if has_build and (not isinstance(build, (str, int)) or isinstance(build, bool)):
            p._bad("build", "a string or an integer", build)
            build = None
        overrides = p.list_("tensor_overrides")
        # the patterns, as strings; a {pattern, buffer type} object is shown by its pattern
        patterns = tuple(str(o.get("pattern", o)) if isinstance(o, dict) else str(o) for o in overrides)
        params = LoadParams("" if build is None else str(build), p.num("moe_cache_mib"), p.bool("moe_cache_hybrid"),
                            p.bool("moe_cache_adaptive"), p.int("n_gpu_layers", minimum=None), p.int("n_threads"),
                            p.int("n_threads_batch"), p.int("n_ctx"), p.int("n_batch"), p.int("n_ubatch"), patterns,
                            p.int("moe_cache_admit", minimum=-1),  # -1: auto, the engine chooses
                            p.int("moe_cache_repartition"),
                            p.str("moe_cache_peer") if "moe_cache_peer" in p.obj else "",
                            p.bool("moe_cache_mib_auto") if "moe_cache_mib_auto" in p.obj else False,
                            p.str("moe_cache_mode") if "moe_cache_mode" in p.obj else "flags")
        p.done()
    c = f.obj_("cache")
    cache = CacheInfo(c.int("slots"), c.int("prefilled"), c.int("bytes")) if c else CacheInfo(0, 0, 0)
    if c:
        c.done()
    devices = []
    for i, d in enumerate(f.list_("devices")):
        if not isinstance(d, dict):
            f.problems.append((f"devices[{i}]", f"expected an object, got {_describe(d)}"))
            continue
        df = _Fields(d, f"devices[{i}].", f.problems, f.extra)
        devices.append(DeviceInfo(df.str("name"), df.str("description"), df.num("mib_free"), df.num("mib_total")))
        df.done()
    pf = f.obj_("profile", nullable=True)
    profile = None
    if pf:
        if "error" in pf.obj:
            profile = ProfileInfo(pf.str("path"), error=pf.str("error"))
        else:
            sha256 = pf.str("sha256")
            if "sha256" in pf.obj and isinstance(pf.obj["sha256"], str) and not _SHA256_RE.fullmatch(sha256):
                pf._bad("sha256", "64 hex digits (the profile's SHA-256)", sha256)
            profile = ProfileInfo(pf.str("path"), pf.int("bytes"), sha256,
                                  refused=pf.str("refused") if "refused" in pf.obj else None)
        pf.done()
    peer = None
    if "peer" in f.obj:  # later builds
        pe = f.obj_("peer", nullable=True)
        if pe:
            peer = PeerInfo(pe.str("device"), pe.int("slots"), pe.int("bytes"))
            pe.done()
    return LoadRecord(**base, model=model, params=params, cache=cache, load_ms=f.num("load_ms"),
                      devices=tuple(devices), profile=profile, layers=_layers(f, "layers"), cache_devices=_cache_devices(f),
                      peer=peer)


def _request(f: _Fields, base: dict) -> RequestRecord:
    # all of the own counters or none (an earlier build): some of them is a broken record
    own = OwnCounters(*(f.int(n) for n in OWN_COUNTERS)) if any(n in f.obj for n in OWN_COUNTERS) else None
    return RequestRecord(**base, slot=f.int("slot"), task=f.int("task"), n_prompt=f.int("n_prompt"),
                         n_gen=f.int("n_gen"), t_prompt_ms=f.num("t_prompt_ms"), t_gen_ms=f.num("t_gen_ms"),
                         req=RequestCounters(*(f.int(n) for n in REQUEST_COUNTERS)), own=own)


def _exit(f: _Fields, base: dict) -> ExitRecord:
    layers = _layers(f, "layers")
    p = f.obj_("perf")
    perf = PerfInfo(0, 0, 0.0, 0.0, 0.0, 0.0)
    if p:
        perf = PerfInfo(p.int("n_prompt"), p.int("n_gen"), p.num("t_prompt_ms"), p.num("t_gen_ms"),
                        p.num("prompt_tps"), p.num("gen_tps"))
        p.done()
    return ExitRecord(**base, layers=layers, perf=perf, cache_devices=_cache_devices(f))


def _parse(obj: Any, line: int, extra: list[str]) -> AuditRecord:
    """One record, or AuditError listing every field that breaks the field list; unknown fields go to extra."""
    if not isinstance(obj, dict):
        raise AuditError(line, [(None, f"expected a JSON object, got {_describe(obj)}")])
    problems: list[tuple[str | None, str]] = []
    f = _Fields(obj, "", problems, extra)
    event = f.str("event")
    if event and event not in EVENTS:
        raise AuditError(line, [("event", f"unknown event {event!r} (expected one of {', '.join(EVENTS)})")])
    time = f.str("time")
    if time and not _TIME_RE.match(time):
        problems.append(("time", f"expected UTC ISO 8601 with milliseconds (2026-01-31T12:00:00.000Z), got {time!r}"))
    base = dict(line=line, event=event, time=time, pid=f.int("pid"), hybrid=f.bool("hybrid"),
                counters=Counters(*(f.int(n) for n in COUNTERS)))
    record: AuditRecord
    if event == "load":
        record = _load(f, base)
    elif event == "request":
        record = _request(f, base)
    elif event == "exit":
        record = _exit(f, base)
    else:
        record = ReadyRecord(**base)
    if problems:
        raise AuditError(line, problems)
    f.done()
    return record


def parse_record(obj: Any, line: int = 0) -> AuditRecord:
    """One decoded JSON record as a typed record; AuditError names the line and every offending field."""
    return _parse(obj, line, [])


# ----------------------------------------------------------------------------------------------- the file

@dataclass(frozen=True)
class Issue:
    line: int            # 0: not tied to one line
    severity: str        # "error" or "warning"
    message: str
    path: str = ""       # the file, when several are checked as one log

    def __str__(self) -> str:
        return f"{self.severity}: " + (f"line {self.line}: " if self.line else "") + self.message


@dataclass(frozen=True)
class AuditFile:
    path: str
    records: tuple[AuditRecord, ...]
    issues: tuple[Issue, ...]       # malformed lines, a truncated last line, unknown fields

    @property
    def errors(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")


def _lines(data: bytes) -> Iterable[tuple[int, bytes, bool]]:
    """(line number, text, whether a newline ended it)."""
    parts = data.split(b"\n")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if last and not part:
            return
        yield i + 1, part, not last


def _after_cut(raw: bytes) -> Any:
    """The record after a partial one on the same line, if the line is exactly that; else None."""
    pos = raw.rfind(b'{"event"')
    if pos <= 0:
        return None
    try:
        obj = json.loads(raw[pos:].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def read_audit(path: str | Path, strict: bool = True) -> AuditFile:
    """Read and validate every record. A last line cut short without its newline (a process killed while
    writing) is reported as a warning and skipped, never raised. With strict, the first malformed line
    raises AuditError; without, it becomes an error Issue and reading goes on."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AuditError(0, [(None, f"cannot read the audit log: {exc}")], str(path)) from exc
    records: list[AuditRecord] = []
    issues: list[Issue] = []
    for n, raw, terminated in _lines(data):
        if not raw.strip():
            issues.append(Issue(n, "warning", "empty line"))
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            rest = _after_cut(raw)
            if rest is not None and terminated:
                # a killed process's partial record, then the next process's first one on the same line
                issues.append(Issue(n, "warning", "a record cut short (a process killed while writing it), "
                                                  "followed on the same line by the next one; the cut one is ignored"))
                obj = rest
            elif not terminated:
                issues.append(Issue(n, "warning", f"truncated last record ({len(raw)} bytes, no newline at the end "
                                                  f"of the file): the process was killed while writing it; ignored"))
                continue
            else:
                err = AuditError(n, [(None, f"not a JSON object ({exc})")], str(path))
                if strict:
                    raise err from exc
                issues.append(Issue(n, "error", f"not a JSON object ({exc})"))
                continue
        extra: list[str] = []
        try:
            records.append(_parse(obj, n, extra))
        except AuditError as exc:
            if strict:
                raise AuditError(n, list(exc.problems), str(path)) from None
            issues.append(Issue(n, "error", problems_text(list(exc.problems))))
            continue
        if extra:
            issues.append(Issue(n, "warning", "fields docs/formats.md does not list: " + ", ".join(extra)))
        if not terminated:
            issues.append(Issue(n, "warning", "no newline after the last record"))
    return AuditFile(str(path), tuple(records), tuple(issues))
