"""The MoE cache's audit log as runs (``python -m llama_moe audit check|summary FILE``): the invariants between
its records (llama_moe.formats.audit reads and validates each one), and a summary of each run.

A run is one context's life in one process: a ``load`` record, then ``ready`` (servers only), ``request``
records, and ``exit`` (absent when the process was killed). One process can hold several runs in turn (a
server that unloads and reloads its model), and several processes can share one file; their records
interleave, told apart by ``pid``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ...errors import AuditError, GgufError
from ...formats.audit import (COUNTERS, CREATION_COUNTERS, REQUEST_COUNTERS, AuditRecord, ExitRecord, Issue, LoadRecord, ReadyRecord,
                              RequestRecord, read_audit)


# ----------------------------------------------------------------------------------------------- runs

@dataclass(frozen=True)
class Run:
    """One context's records in one process, from its load record on. ``partial``: the records start mid-run,
    at the top of the first file checked (its load record is in an earlier, rotated file)."""

    pid: int
    records: tuple[AuditRecord, ...]
    partial: bool = False

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


def split_runs(records: Iterable[AuditRecord], first_file_lines: int = 0) -> tuple[Run, ...]:
    """Group records per pid, starting a new run at each load (counters restart with a new context).
    Records of a pid seen before its first load form a run without a load: one that begins within the first
    ``first_file_lines`` lines (the top of a file whose earlier records were rotated away) is partial, which
    check warns about; any other is an error."""
    runs: list[list[AuditRecord]] = []
    open_run: dict[int, list[AuditRecord]] = {}
    for r in records:
        cur = open_run.get(r.pid)
        if cur is None or r.event == "load":
            cur = []
            runs.append(cur)
            open_run[r.pid] = cur
        cur.append(r)
    return tuple(Run(rs[0].pid, tuple(rs), partial=rs[0].event != "load" and rs[0].line <= first_file_lines)
                 for rs in runs)


def _check_resident(r: LoadRecord | ExitRecord, issues: list[Issue], n_expert: Mapping[int, int] | None) -> None:
    """Each layer's resident expert ids: none negative, none twice, and each below the layer's n_expert (the
    model's, ``n_expert``: layer -> experts, when the model is known; the record does not say)."""
    for i, l in enumerate(r.layers):
        where = f"field 'layers[{i}].resident'"
        n = n_expert.get(l.il) if n_expert is not None else None
        bad = [e for e in l.resident if e < 0 or (n is not None and e >= n)]
        if bad:
            ids = f"expert id{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}"
            issues.append(Issue(r.line, "error", f"{where}: layer {l.il} holds {ids}, outside 0..{n - 1} (the "
                                                 f"model's layer {l.il} has {n} experts)" if n is not None else
                                                 f"{where}: layer {l.il} holds {ids}: an expert id is >= 0"))
        twice = sorted({e for e in l.resident if l.resident.count(e) > 1})
        if twice:
            issues.append(Issue(r.line, "error", f"{where}: layer {l.il} holds expert "
                                                 f"{', '.join(map(str, twice))} in more than one slot"))


def _check_layers(r: LoadRecord | ExitRecord, issues: list[Issue], n_expert: Mapping[int, int] | None = None) -> None:
    _check_resident(r, issues, n_expert)
    for name, total in (("hits", r.counters.hits), ("hits_profile", r.counters.hits_profile),
                        ("misses", r.counters.misses), ("refused", r.counters.refused)):
        per_layer = sum(getattr(l, name) for l in r.layers)
        if r.layers and per_layer != total:
            issues.append(Issue(r.line, "error", f"field 'layers': the layers' {name} add up to {per_layer}, "
                                                 f"but field '{name}' is {total}"))
    by_il = {l.il: l for l in r.layers}
    for d in r.cache_devices:
        mine = [by_il[il] for il in d.layers if il in by_il]
        if len(mine) != len(d.layers) or any(l.device not in (None, d.name) for l in mine):
            issues.append(Issue(r.line, "error", f"field 'cache_devices': {d.name}'s layers {list(d.layers)} are not the "
                                                 f"layers that name it"))
        for name in ("hits", "misses"):
            if mine and sum(getattr(l, name) for l in mine) != getattr(d, name):
                issues.append(Issue(r.line, "error", f"field 'cache_devices': {d.name}'s layers' {name} add up to "
                                                     f"{sum(getattr(l, name) for l in mine)}, but its {name} is {getattr(d, name)}"))
        if d.slots_total != sum(l.slots for l in mine):
            issues.append(Issue(r.line, "error", f"field 'cache_devices': {d.name} has {d.slots_total} slots, its layers "
                                                 f"{sum(l.slots for l in mine)}"))
    if r.cache_devices and sum(d.bytes for d in r.cache_devices) != getattr(getattr(r, "cache", None), "bytes",
                                                                            sum(d.bytes for d in r.cache_devices)):
        issues.append(Issue(r.line, "error", "field 'cache_devices': the devices' bytes do not add up to the cache's"))
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


def check_run(run: Run, n_expert: Mapping[int, int] | None = None) -> list[Issue]:
    """The invariants between one run's records; ``n_expert`` (layer -> the model's experts), when known,
    bounds the layers' resident expert ids."""
    issues: list[Issue] = []
    first = run.records[0]
    if run.partial:
        # rotated: its load (and maybe its ready) are in an earlier file; what follows is checked from here on
        issues.append(Issue(first.line, "warning", f"pid {run.pid}'s run starts mid-way, with a '{first.event}' "
                                                   f"record: its load record is in an earlier file (rotated); give "
                                                   f"the files in order to check it whole"))
    elif not isinstance(first, LoadRecord):
        issues.append(Issue(first.line, "error", f"'{first.event}' record of pid {run.pid} before any 'load' "
                                                 f"record of that pid"))
    else:
        for name in COUNTERS:
            # the RAM tier's reads and lookups may count the context's creation (layers held whole, a profile's
            # fill of the device's slots through the tier): the others start at 0
            if getattr(first.counters, name) and name not in CREATION_COUNTERS:
                issues.append(Issue(first.line, "error", f"field '{name}': {getattr(first.counters, name)} at load, "
                                                         f"but load is written before any decode (expected 0)"))
        _check_layers(first, issues, n_expert)
    # a partial run's first record is the top of the file (its ready, if not that record, is in the earlier file)
    ready_seen, exited = run.partial, run.partial and first.event == "exit"
    prev = first
    for r in run.records[1:] if isinstance(first, LoadRecord) or run.partial else run.records:
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
        _check_destinations(r, issues)
        if r.counters.hits_profile > r.counters.hits:
            issues.append(Issue(r.line, "error", f"field 'hits_profile': {r.counters.hits_profile} is more than "
                                                 f"hits ({r.counters.hits})"))
        if r.hybrid and (r.counters.refused or (isinstance(r, RequestRecord) and r.req.refused)):
            issues.append(Issue(r.line, "error", f"field 'refused': {r.counters.refused} in a hybrid run, which "
                                                 f"refuses no lookup (the CPU computes what the cache lacks)"))
        if isinstance(r, RequestRecord) and r.req.hits_profile > r.req.hits:
            issues.append(Issue(r.line, "error", f"field 'req_hits_profile': {r.req.hits_profile} is more than "
                                                 f"req_hits ({r.req.hits})"))
        if isinstance(r, RequestRecord) and r.own is not None:
            # its own lookups are some of those the context made while it ran
            for name in OWN_NAMES:
                own, req = getattr(r.own, name), getattr(r.req, name)
                if own > req:
                    issues.append(Issue(r.line, "error", f"field 'own_{name}': {own} is more than req_{name} ({req}), "
                                                         f"what the context counted while the request ran"))
        if isinstance(r, ExitRecord):
            _check_layers(r, issues, n_expert)
            load = run.load
            if load and r.layers and [(l.il, l.slots) for l in r.layers] != [(l.il, l.slots) for l in load.layers]:
                issues.append(Issue(r.line, "error", f"field 'layers': not the layers and slots of the load record "
                                                     f"(line {load.line})"))
        prev = r
    issues += _check_request_sums(run)
    issues += _check_own_sums(run)
    return issues


OWN_NAMES = ("hits", "misses", "refused", "bytes_upload", "bytes_cpu")


def _check_destinations(r: AuditRecord, issues: list[Issue]) -> None:
    """Every miss went somewhere: misses = uploads + cpu + peer_hits (and admitted = uploads + swaps + admissions),
    in the context's counters, a request's and its own share. A log of a build before these fields has them all
    0, and is not held to it."""
    def one(prefix: str, misses: int, uploads: int, cpu: int, peer: int) -> None:
        if uploads + cpu + peer and uploads + cpu + peer != misses:
            issues.append(Issue(r.line, "error", f"field '{prefix}misses': {misses}, but {prefix}uploads + {prefix}cpu + "
                                                 f"{prefix}peer_hits = {uploads} + {cpu} + {peer} = {uploads + cpu + peer}"))
    c = r.counters
    one("", c.misses, c.uploads, c.cpu, c.peer_hits)
    if c.admitted and c.admitted != c.uploads + c.swaps + c.admissions:
        issues.append(Issue(r.line, "error", f"field 'admitted': {c.admitted}, but uploads + swaps + admissions = "
                                             f"{c.uploads + c.swaps + c.admissions}"))
    if isinstance(r, RequestRecord):
        one("req_", r.req.misses, r.req.uploads, r.req.cpu, r.req.peer_hits)
        if r.own is not None:
            one("own_", r.own.misses, r.own.uploads, r.own.cpu, r.own.peer_hits)


def _has_own(run: Run) -> bool:
    return bool(run.requests) and all(r.own is not None for r in run.requests)


def _check_own_sums(run: Run) -> list[Issue]:
    """Each lookup is charged to one request, so the requests' own counters add up exactly to what the context's
    moved from ready to exit, whatever the slots (a request still running at exit writes no record). Not a
    request's: the hybrid's uploads between decodes (admissions, swaps), so a hybrid's own bytes_upload stay 0."""
    ready, reqs, end = run.ready, run.requests, run.exit
    if ready is None and run.partial:
        if not _exact_one_slot(run):
            # the requests running at the top of a rotated file began in the earlier one: their own counters hold
            # lookups from before this file's first record, so nothing here adds up to what moved after it
            return []
        ready, reqs = run.records[0], run.requests[1:] if isinstance(run.records[0], RequestRecord) else run.requests
    if ready is None or not reqs or not all(r.own is not None for r in reqs):
        return []
    issues: list[Issue] = []
    last = end if end is not None else reqs[-1]
    for name in OWN_NAMES:
        total = sum(getattr(r.own, name) for r in reqs)
        delta = getattr(last.counters, name) - getattr(ready.counters, name)
        if name == "bytes_upload" and run.records[0].hybrid:
            if total:
                issues.append(Issue(last.line, "error", f"field 'own_bytes_upload': the requests of pid {run.pid} add "
                                                        f"up to {total}, but a hybrid uploads for no request"))
            continue
        if end is not None and total != delta:
            issues.append(Issue(last.line, "error", f"field 'own_{name}': the {len(reqs)} requests of pid {run.pid} "
                                                    f"add up to {total}, but {name} moved by {delta} from "
                                                    f"{ready.event} (line {ready.line}) to exit: each lookup is one "
                                                    f"request's"))
        elif end is None and total > delta:
            issues.append(Issue(last.line, "error", f"field 'own_{name}': the requests of pid {run.pid} add up to "
                                                    f"{total}, more than the {delta} {name} moved from {ready.event} "
                                                    f"to the last request (line {last.line})"))
    return issues


def _check_request_sums(run: Run) -> list[Issue]:
    """With one slot the requests never overlap, so each request's req_* counters are exactly what the
    context's counters moved since the record before it, and they add up to exit minus ready."""
    ready, reqs, end = run.ready, run.requests, run.exit
    if ready is None and run.partial:
        # the ready record is in an earlier file: the sums run from this file's first record, which is counted
        # as the baseline (its own request counters are the earlier file's)
        ready, reqs = run.records[0], run.requests[1:] if isinstance(run.records[0], RequestRecord) else run.requests
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
                                                    f"add up to {total}, but {name} moved by {delta} from "
                                                    f"{ready.event} (line {ready.line}) to {what}"))
        elif not exact and total < delta:
            # overlapping requests each count the others' lookups, so together they can only count more
            issues.append(Issue(last.line, "error", f"field '{req_name}': the requests of pid {run.pid} add up to "
                                                    f"{total}, less than the {delta} {name} moved from {ready.event} "
                                                    f"to {what}"))
    return issues


@dataclass(frozen=True)
class CheckResult:
    path: str
    n_records: int
    runs: tuple[Run, ...]
    issues: tuple[Issue, ...]
    notes: tuple[str, ...] = ()   # what could not be checked, and why (not an issue)

    @property
    def errors(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")

    @property
    def ok(self) -> bool:
        return not self.errors


def _read_in_order(paths: Sequence[str | Path], strict: bool) -> tuple[list[AuditRecord], list[Issue], int,
                                                                          list[tuple[int, str]]]:
    """The records of several files read as one log, each renumbered by a running line number (the files'
    lines one after the other), with the issues of each file, the first file's line count, and each file's
    (first running line, path) to name the file and its own line again."""
    records: list[AuditRecord] = []
    issues: list[Issue] = []
    files: list[tuple[int, str]] = []
    offset = first_lines = 0
    for i, path in enumerate(paths):
        audit = read_audit(path, strict=strict)
        files.append((offset, audit.path))
        records += [dataclasses.replace(r, line=r.line + offset) for r in audit.records]
        issues += [dataclasses.replace(x, line=x.line + offset if x.line else 0, path=audit.path)
                   for x in audit.issues]
        n_lines = max([r.line for r in audit.records] + [x.line for x in audit.issues] + [0])
        if i == 0:
            first_lines = n_lines
        offset += n_lines
    return records, issues, first_lines, files


def _located(issue: Issue, files: list[tuple[int, str]]) -> Issue:
    """An issue of the running numbering told by its file and that file's own line."""
    if issue.path or not issue.line:
        return issue
    start, path = max((f for f in files if f[0] < issue.line), key=lambda f: f[0])
    return dataclasses.replace(issue, line=issue.line - start, path=path)


def _file_line(line: int, files: list[tuple[int, str]]) -> tuple[str, int]:
    """A running line number as (the file, its own line)."""
    start, path = max((f for f in files if f[0] < line), key=lambda f: f[0])
    return path, line - start


def _check_times(records: Sequence[AuditRecord], files: list[tuple[int, str]]) -> list[Issue]:
    """Within one process the records' times never go back (the engine writes them as it goes, UTC): a record
    earlier than the one before it of its pid is out of order, as rotated files given newest first are."""
    issues: list[Issue] = []
    last: dict[int, AuditRecord] = {}
    for r in records:
        prev = last.get(r.pid)
        if prev is not None and r.time and prev.time and r.time[:23] < prev.time[:23]:
            (here, _), (there, line) = _file_line(r.line, files), _file_line(prev.line, files)
            where = f"line {line}" + (f" of {there}" if len(files) > 1 else "")
            hint = ": the files are not in order (give a rotated log oldest first: a.jsonl.1 a.jsonl)" if here != there else ""
            issues.append(Issue(r.line, "error", f"field 'time': {r.time} is earlier than {prev.time}, pid {r.pid}'s "
                                                 f"record before it ({where}): time runs backwards within one "
                                                 f"process{hint}"))
        if r.time:
            last[r.pid] = r
    return issues


def _experts_per_layer(path: str | Path) -> dict[int, int] | None:
    """Layer -> experts of the model at ``path`` (its GGUF header), or None when it cannot be read here."""
    from ..experts import expert_layout

    try:
        return {l.il: l.n_expert for l in expert_layout(path).layers}
    except (OSError, GgufError, ValueError):
        return None


def check_audit(paths: str | Path | Sequence[str | Path], model: str | Path | None = None) -> CheckResult:
    """Every record against the field list, and every run's invariants: ordering (load, ready, request...,
    exit), time that never runs backwards within a process, counters that never go down, zero counters at
    load, per-layer sums, resident expert ids in range and distinct, and with one slot the request counters
    adding up exactly to exit minus ready. Issues are sorted by file and line.

    The records do not say a layer's n_expert: resident ids are checked against the model's, read from
    ``model`` (a GGUF file), else from the path the load record names when it is readable here; without
    either only for ids >= 0 (``CheckResult.notes`` says so). A ``model`` that cannot be read raises
    AuditError.

    Several files are one log in the order given, oldest first (a rotated log: ``a.jsonl.1 a.jsonl``). A run
    whose first records are in the first file without its load record (rotated away) is checked from there
    on, with a warning."""
    given = None
    if model is not None:
        given = _experts_per_layer(model)
        if given is None:
            raise AuditError(0, [(None, f"{model}: not a readable GGUF model (its experts per layer bound the "
                                        f"resident expert ids)")])
    path_list = [paths] if isinstance(paths, (str, Path)) else list(paths)
    real = [Path(p).resolve() for p in path_list]
    twice = sorted({str(p) for p in path_list if real.count(Path(p).resolve()) > 1})
    if twice:  # read twice, every record would be its own duplicate
        raise AuditError(0, [(None, f"{', '.join(twice)} given more than once")])
    records, issues, first_lines, files = _read_in_order(path_list, strict=False)
    runs = split_runs(records, first_lines)
    if not records and not any(i.severity == "error" for i in issues):
        # a check of nothing would pass: no server wrote this file
        issues.append(Issue(0, "error", "no records: the file is empty (not a --moe-cache-audit log, or the server "
                                        "wrote nothing)"))
    issues += _check_times(records, files)
    notes: list[str] = []
    models: dict[str, dict[int, int] | None] = {}
    for run in runs:
        n_expert = given
        if n_expert is None and run.load is not None and run.load.model.path:
            path = run.load.model.path
            if path not in models:
                models[path] = _experts_per_layer(path)
                if models[path] is None and run.load.layers:
                    notes.append(f"the model {path} (pid {run.pid}'s load record) is not readable here: resident "
                                 f"expert ids are checked to be >= 0 and distinct, not against its experts per layer "
                                 f"(give --model FILE)")
            n_expert = models[path]
        issues += check_run(run, n_expert)
        if run.exit is None and (run.load is not None or run.partial):
            issues.append(Issue(run.records[0].line, "warning", f"pid {run.pid}'s run has no exit record "
                                                                f"(killed, or still running)"))
        if run.requests and not _exact_one_slot(run) and not _has_own(run):
            slots = sorted({r.slot for r in run.requests})
            issues.append(Issue(run.records[0].line, "warning", f"pid {run.pid} served requests on slots {slots}: "
                                                                f"overlapping requests count each other's lookups, "
                                                                f"so only sum >= exit - ready is checked (a log "
                                                                f"without own_* counters)"))
    issues.sort(key=lambda i: (i.line, i.severity != "error"))
    located = tuple(_located(i, files) for i in issues)
    return CheckResult(" ".join(p for _, p in files), len(records), runs, located, tuple(notes))


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
    admitted: int = 0       # experts brought into slots while running (the engine's n_admitted)
    cpu: int = 0            # misses the CPU computed
    peer_hits: int = 0      # misses the peer tier computed


def summarize_run(run: Run) -> RunSummary:
    last, load, reqs = run.records[-1], run.load, run.requests
    c = last.counters
    # the requests' own shares when the log has them (each lookup once), else their req_* (overlaps counted twice)
    if reqs and all(r.own is not None for r in reqs):
        rh = sum(r.own.hits for r in reqs)  # type: ignore[union-attr]
        looked = sum(r.own.hits + r.own.misses + r.own.refused for r in reqs)  # type: ignore[union-attr]
    else:
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
        gen_tps=run.exit.perf.gen_tps if run.exit else None, refused=c.refused, admitted=c.admitted, cpu=c.cpu,
        peer_hits=c.peer_hits)


def summarize(paths: str | Path | Sequence[str | Path]) -> tuple[RunSummary, ...]:
    """One summary per run of one file, or of several read as one rotated log (oldest first); malformed records
    raise AuditError (run check to list them all)."""
    path_list = [paths] if isinstance(paths, (str, Path)) else list(paths)
    records, _, first_lines, _ = _read_in_order(path_list, strict=True)
    return tuple(summarize_run(run) for run in split_runs(records, first_lines))


def format_summary(runs: Iterable[RunSummary]) -> str:
    header = ("pid", "start", "model", "mode", "requests", "prompt", "gen", "hit rate", "refused", "admitted",
              "on the CPU", "on the peer", "uploaded", "CPU read", "copies", "swaps", "exit")
    rows = [header]
    for s in runs:
        rows.append((str(s.pid), s.start, s.model, "hybrid" if s.hybrid else "upload", str(s.requests),
                     str(s.n_prompt), str(s.n_gen), f"{s.hit_rate:.3f}", str(s.refused), str(s.admitted), str(s.cpu),
                     str(s.peer_hits), f"{s.bytes_upload / 2**20:.2f} MiB",
                     f"{s.bytes_cpu / 2**20:.2f} MiB", str(s.copies), str(s.swaps), "yes" if s.exited else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    left = {1, 2, 3, 16}   # text columns; numbers align right
    return "\n".join("  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip() for r in rows)

