"""The MoE cache's JSONL audit log (``--moe-cache-audit FILE``): read it, validate every record against the
reference's field list, check the invariants between records, and summarize each run.

A run is one context's life in one process: a ``load`` record, then ``ready`` (servers only), ``request``
records, and ``exit`` (absent when the process was killed). One process can hold several runs in turn (a
server that unloads and reloads its model), and several processes can share one file; their records
interleave, told apart by ``pid``."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import AuditError, problems_text

EVENTS = ("load", "ready", "request", "exit")
# the context's counters since its creation, in every record (the C API's llama_moe_cache_stats)
COUNTERS = ("hits", "hits_profile", "misses", "bytes_upload", "bytes_cpu", "copies", "bytes_copy", "swaps", "refused")
# a request's own counters: the context's counters at its end minus those at its start
REQUEST_COUNTERS = ("req_hits", "req_hits_profile", "req_misses", "req_bytes_upload", "req_bytes_cpu", "req_refused")
# counters added after the first audit logs: a log written by an earlier build lacks them, and they read as 0
LATER_COUNTERS = ("refused", "req_refused")
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


@dataclass(frozen=True)
class LayerSnapshot:
    il: int
    slots: int
    hits: int
    hits_profile: int
    misses: int
    resident: tuple[int, ...]
    refused: int = 0


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


@dataclass(frozen=True)
class ExitRecord(AuditRecord):
    layers: tuple[LayerSnapshot, ...]
    perf: PerfInfo


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
        if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in resident):
            f.problems.append((where + ".resident", "expected a list of expert ids (integers >= 0)"))
            resident = []
        lf.done()
        out.append(LayerSnapshot(il, slots, hits, prof, miss, tuple(resident), refused))
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
                            p.int("n_threads_batch"), p.int("n_ctx"), p.int("n_batch"), p.int("n_ubatch"), patterns)
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
            profile = ProfileInfo(pf.str("path"), pf.int("bytes"), pf.str("sha256"))
        pf.done()
    return LoadRecord(**base, model=model, params=params, cache=cache, load_ms=f.num("load_ms"),
                      devices=tuple(devices), profile=profile, layers=_layers(f, "layers"))


def _request(f: _Fields, base: dict) -> RequestRecord:
    return RequestRecord(**base, slot=f.int("slot"), task=f.int("task"), n_prompt=f.int("n_prompt"),
                         n_gen=f.int("n_gen"), t_prompt_ms=f.num("t_prompt_ms"), t_gen_ms=f.num("t_gen_ms"),
                         req=RequestCounters(*(f.int(n) for n in REQUEST_COUNTERS)))


def _exit(f: _Fields, base: dict) -> ExitRecord:
    layers = _layers(f, "layers")
    p = f.obj_("perf")
    perf = PerfInfo(0, 0, 0.0, 0.0, 0.0, 0.0)
    if p:
        perf = PerfInfo(p.int("n_prompt"), p.int("n_gen"), p.num("t_prompt_ms"), p.num("t_gen_ms"),
                        p.num("prompt_tps"), p.num("gen_tps"))
        p.done()
    return ExitRecord(**base, layers=layers, perf=perf)


def _parse(obj: Any, line: int, extra: list[str]) -> AuditRecord:
    """One record, or AuditError listing every field that breaks the reference; unknown fields go to extra."""
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
            issues.append(Issue(n, "warning", "fields the reference does not list: " + ", ".join(extra)))
        if not terminated:
            issues.append(Issue(n, "warning", "no newline after the last record"))
    return AuditFile(str(path), tuple(records), tuple(issues))


# ----------------------------------------------------------------------------------------------- runs

@dataclass(frozen=True)
class Run:
    """One context's records in one process, from its load record on."""

    pid: int
    records: tuple[AuditRecord, ...]

    @property
    def load(self) -> LoadRecord | None:
        r = self.records[0]
        return r if isinstance(r, LoadRecord) else None

    @property
    def ready(self) -> ReadyRecord | None:
        return next((r for r in self.records if isinstance(r, ReadyRecord)), None)

    @property
    def requests(self) -> tuple[RequestRecord, ...]:
        return tuple(r for r in self.records if isinstance(r, RequestRecord))

    @property
    def exit(self) -> ExitRecord | None:
        return next((r for r in self.records if isinstance(r, ExitRecord)), None)


def split_runs(records: Iterable[AuditRecord]) -> tuple[Run, ...]:
    """Group records per pid, starting a new run at each load (counters restart with a new context).
    Records of a pid seen before its first load form a run without a load, which check reports."""
    runs: list[list[AuditRecord]] = []
    open_run: dict[int, list[AuditRecord]] = {}
    for r in records:
        cur = open_run.get(r.pid)
        if cur is None or r.event == "load":
            cur = []
            runs.append(cur)
            open_run[r.pid] = cur
        cur.append(r)
    return tuple(Run(rs[0].pid, tuple(rs)) for rs in runs)


def _check_layers(r: LoadRecord | ExitRecord, issues: list[Issue]) -> None:
    for name, total in (("hits", r.counters.hits), ("hits_profile", r.counters.hits_profile),
                        ("misses", r.counters.misses), ("refused", r.counters.refused)):
        per_layer = sum(getattr(l, name) for l in r.layers)
        if r.layers and per_layer != total:
            issues.append(Issue(r.line, "error", f"field 'layers': the layers' {name} add up to {per_layer}, "
                                                 f"but field '{name}' is {total}"))
    for l in r.layers:
        if len(l.resident) > l.slots:
            issues.append(Issue(r.line, "error", f"field 'layers': layer {l.il} holds {len(l.resident)} experts "
                                                 f"in {l.slots} slots"))
        if l.hits_profile > l.hits:
            issues.append(Issue(r.line, "error", f"field 'layers': layer {l.il} has more hits_profile "
                                                 f"({l.hits_profile}) than hits ({l.hits})"))


def _exact_one_slot(run: Run) -> bool:
    """Whether the request counters must add up exactly: every request on the same slot, so none overlapped."""
    return len({r.slot for r in run.requests}) <= 1


def check_run(run: Run) -> list[Issue]:
    """The invariants between one run's records."""
    issues: list[Issue] = []
    first = run.records[0]
    if not isinstance(first, LoadRecord):
        issues.append(Issue(first.line, "error", f"'{first.event}' record of pid {run.pid} before any 'load' "
                                                 f"record of that pid"))
    else:
        for name in COUNTERS:
            if getattr(first.counters, name):
                issues.append(Issue(first.line, "error", f"field '{name}': {getattr(first.counters, name)} at load, "
                                                         f"but load is written before any decode (expected 0)"))
        _check_layers(first, issues)
    ready_seen = exited = False
    prev = first
    for r in run.records[1:] if isinstance(first, LoadRecord) else run.records:
        if exited:
            issues.append(Issue(r.line, "error", f"'{r.event}' record of pid {run.pid} after its 'exit' (line "
                                                 f"{run.exit.line if run.exit else '?'})"))
        if r.event == "ready":
            if ready_seen:
                issues.append(Issue(r.line, "error", f"a second 'ready' record for pid {run.pid}"))
            ready_seen = True
        elif r.event == "request" and not ready_seen:
            issues.append(Issue(r.line, "error", f"'request' record of pid {run.pid} before its 'ready' record"))
        elif r.event == "exit":
            exited = True
        if r.hybrid != first.hybrid:
            issues.append(Issue(r.line, "error", f"field 'hybrid': {str(r.hybrid).lower()}, but the run's first "
                                                 f"record (line {first.line}) says {str(first.hybrid).lower()}"))
        if r is not prev:
            for name in COUNTERS:
                a, b = getattr(prev.counters, name), getattr(r.counters, name)
                if b < a:
                    issues.append(Issue(r.line, "error", f"field '{name}' went down from {a} (line {prev.line}) "
                                                         f"to {b} within pid {run.pid}"))
        if r.counters.hits_profile > r.counters.hits:
            issues.append(Issue(r.line, "error", f"field 'hits_profile': {r.counters.hits_profile} is more than "
                                                 f"hits ({r.counters.hits})"))
        if r.hybrid and (r.counters.refused or (isinstance(r, RequestRecord) and r.req.refused)):
            issues.append(Issue(r.line, "error", f"field 'refused': {r.counters.refused} in a hybrid run, which "
                                                 f"refuses no lookup (the CPU computes what the cache lacks)"))
        if isinstance(r, RequestRecord) and r.req.hits_profile > r.req.hits:
            issues.append(Issue(r.line, "error", f"field 'req_hits_profile': {r.req.hits_profile} is more than "
                                                 f"req_hits ({r.req.hits})"))
        if isinstance(r, ExitRecord):
            _check_layers(r, issues)
            load = run.load
            if load and r.layers and [(l.il, l.slots) for l in r.layers] != [(l.il, l.slots) for l in load.layers]:
                issues.append(Issue(r.line, "error", f"field 'layers': not the layers and slots of the load record "
                                                     f"(line {load.line})"))
        prev = r
    issues += _check_request_sums(run)
    return issues


def _check_request_sums(run: Run) -> list[Issue]:
    """With one slot the requests never overlap, so each request's req_* counters are exactly what the
    context's counters moved since the record before it, and they add up to exit minus ready."""
    ready, reqs, end = run.ready, run.requests, run.exit
    if ready is None or not reqs:
        return []
    issues: list[Issue] = []
    pairs = [(n, n.removeprefix("req_")) for n in REQUEST_COUNTERS]
    exact = _exact_one_slot(run)
    if exact:
        prev: AuditRecord = ready
        for r in reqs:
            for req_name, name in pairs:
                moved = getattr(r.counters, name) - getattr(prev.counters, name)
                own = getattr(r.req, name)
                if own != moved:
                    issues.append(Issue(r.line, "error", f"field '{req_name}': {own}, but the context's {name} moved "
                                                         f"by {moved} since line {prev.line} (one slot: they must be equal)"))
            prev = r
    last = end if end is not None else reqs[-1]
    for req_name, name in pairs:
        total = sum(getattr(r.req, name) for r in reqs)
        delta = getattr(last.counters, name) - getattr(ready.counters, name)
        what = "exit" if end is not None else f"the last request (line {last.line}, no exit record)"
        if exact and total != delta:
            issues.append(Issue(last.line, "error", f"field '{req_name}': the {len(reqs)} requests of pid {run.pid} "
                                                    f"add up to {total}, but {name} moved by {delta} from ready "
                                                    f"(line {ready.line}) to {what}"))
        elif not exact and total < delta:
            # overlapping requests each count the others' lookups, so together they can only count more
            issues.append(Issue(last.line, "error", f"field '{req_name}': the requests of pid {run.pid} add up to "
                                                    f"{total}, less than the {delta} {name} moved from ready to {what}"))
    return issues


@dataclass(frozen=True)
class CheckResult:
    path: str
    n_records: int
    runs: tuple[Run, ...]
    issues: tuple[Issue, ...]

    @property
    def errors(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")

    @property
    def ok(self) -> bool:
        return not self.errors


def check_audit(path: str | Path) -> CheckResult:
    """Every record against the field list, and every run's invariants: ordering (load, ready, request...,
    exit), counters that never go down, zero counters at load, per-layer sums, and with one slot the request
    counters adding up exactly to exit minus ready. Issues are sorted by line."""
    audit = read_audit(path, strict=False)
    runs = split_runs(audit.records)
    issues = list(audit.issues)
    for run in runs:
        issues += check_run(run)
        if run.exit is None and run.load is not None:
            issues.append(Issue(run.load.line, "warning", f"pid {run.pid}'s run has no exit record "
                                                          f"(killed, or still running)"))
        if run.requests and not _exact_one_slot(run):
            slots = sorted({r.slot for r in run.requests})
            issues.append(Issue(run.records[0].line, "warning", f"pid {run.pid} served requests on slots {slots}: "
                                                                f"overlapping requests count each other's lookups, "
                                                                f"so only sum >= exit - ready is checked"))
    issues.sort(key=lambda i: (i.line, i.severity != "error"))
    return CheckResult(audit.path, len(audit.records), runs, tuple(issues))


# ----------------------------------------------------------------------------------------------- summary

@dataclass(frozen=True)
class RunSummary:
    pid: int
    first_line: int
    start: str
    end: str
    model: str
    exited: bool
    hybrid: bool
    cache_bytes: int
    slots: int
    prefilled: int
    requests: int
    n_prompt: int           # over the requests
    n_gen: int
    hits: int               # the context's counters at the run's last record (the warmup does not count)
    hits_profile: int
    misses: int
    hit_rate: float          # hits / (hits + misses + refused)
    request_hit_rate: float  # over the requests' own counters
    bytes_upload: int
    bytes_cpu: int
    copies: int
    bytes_copy: int
    swaps: int
    gen_tps: float | None   # llama.cpp's perf at exit
    refused: int = 0        # upload mode: selections of the lookups refused


def summarize_run(run: Run) -> RunSummary:
    last, load, reqs = run.records[-1], run.load, run.requests
    c = last.counters
    rh = sum(r.req.hits for r in reqs)
    looked = sum(r.req.hits + r.req.misses + r.req.refused for r in reqs)
    return RunSummary(
        pid=run.pid, first_line=run.records[0].line, start=run.records[0].time, end=last.time,
        model=(load.model.name or Path(load.model.path).name) if load else "?", exited=run.exit is not None,
        hybrid=run.records[0].hybrid, cache_bytes=load.cache.bytes if load else 0,
        slots=load.cache.slots if load else 0, prefilled=load.cache.prefilled if load else 0,
        requests=len(reqs), n_prompt=sum(r.n_prompt for r in reqs), n_gen=sum(r.n_gen for r in reqs),
        hits=c.hits, hits_profile=c.hits_profile, misses=c.misses, hit_rate=c.hit_rate,
        request_hit_rate=rh / looked if looked else 0.0, bytes_upload=c.bytes_upload, bytes_cpu=c.bytes_cpu,
        copies=c.copies, bytes_copy=c.bytes_copy, swaps=c.swaps,
        gen_tps=run.exit.perf.gen_tps if run.exit else None, refused=c.refused)


def summarize(path: str | Path) -> tuple[RunSummary, ...]:
    """One summary per run; malformed records raise AuditError (run check to list them all)."""
    return tuple(summarize_run(run) for run in split_runs(read_audit(path).records))


def format_summary(runs: Iterable[RunSummary]) -> str:
    header = ("pid", "start", "model", "mode", "requests", "prompt", "gen", "hit rate", "refused", "uploaded",
              "CPU read", "copies", "swaps", "exit")
    rows = [header]
    for s in runs:
        rows.append((str(s.pid), s.start, s.model, "hybrid" if s.hybrid else "upload", str(s.requests),
                     str(s.n_prompt), str(s.n_gen), f"{s.hit_rate:.3f}", str(s.refused), f"{s.bytes_upload / 2**20:.2f} MiB",
                     f"{s.bytes_cpu / 2**20:.2f} MiB", str(s.copies), str(s.swaps), "yes" if s.exited else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    left = {1, 2, 3, 13}   # text columns; numbers align right
    return "\n".join("  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip() for r in rows)

