"""A real llama-server with the hybrid cache and an audit log, run twice, through the mailbox and through the
scheduler's copies (``python -m llama_moe check-audit``): the same prompts must give the same text, and both
audit logs must pass ``audit check`` (every record, every invariant between them).

Without a GPU there is no mailbox: both runs then put the cache in RAM (--moe-cache-device CPU) and the first
runs the mailbox with the CPU as the device (--moe-cache-mailbox-on-cpu), as the tests do.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import requests

from ..equivalence import PROMPTS
from ..errors import CheckAuditError
from .audit import check_audit
from .process import server_binary, start_server


@dataclass(frozen=True)
class AuditRun:
    mailbox: bool           # through the mailbox, or the scheduler's copies
    mailbox_line: str       # llama.cpp's last word on the mailbox: its exit line, else its load line ("" if none)
    texts: tuple[str, ...]  # one per prompt, greedy
    n_records: int
    errors: tuple[str, ...]  # audit check's errors ("line N: ...")
    warnings: int


@dataclass(frozen=True)
class CheckAuditResult:
    gpu: bool
    runs: tuple[AuditRun, ...]

    @property
    def same_text(self) -> bool:
        return len({r.texts for r in self.runs}) == 1

    @property
    def mailbox_used(self) -> bool:
        """The mailbox run's exit line counts hand-overs; the other run says the mailbox was off."""
        def handovers(line: str) -> int:
            return int(line.split("for each of ")[1].split()[0]) if "for each of " in line else 0

        return any(r.mailbox and handovers(r.mailbox_line) > 0 for r in self.runs) and \
            all("mailbox off" in r.mailbox_line for r in self.runs if not r.mailbox)

    @property
    def ok(self) -> bool:
        return (self.same_text and self.mailbox_used and all(all(r.texts) for r in self.runs)
                and all(not r.errors and r.n_records >= 2 + len(PROMPTS) for r in self.runs))


def _complete(url: str, prompt: str, n_predict: int) -> str:
    r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1,
                                                 "seed": 0, "cache_prompt": False}, timeout=600)
    r.raise_for_status()
    return r.json()["content"]


def check_audit_run(model: str | Path, profile: str | Path, cache_mib: float = 256, n_predict: int = 48,
                    threads: int | None = None, workdir: str | Path | None = None, log=print,
                    on_cpu: bool | None = None) -> CheckAuditResult:
    """on_cpu: the cache in RAM and the mailbox with the CPU as its device (default: when there is no GPU)."""
    from ...devices import gpus

    model, profile = Path(model), Path(profile)
    for what, path in (("model", model), ("profile", profile)):
        if not path.is_file():
            raise CheckAuditError(f"the {what} {path}: no such file")
    if not cache_mib > 0:
        raise CheckAuditError(f"--cache-mib must be > 0, got {cache_mib:g}")
    if n_predict < 1:
        raise CheckAuditError(f"-n must be >= 1, got {n_predict}")
    if threads is not None and not 1 <= threads <= 1024:  # 0 would be dropped below, not refused
        raise CheckAuditError(f"-t/--threads must be from 1 to 1024, got {threads}")
    binary = server_binary()
    gpu = bool(gpus()) if on_cpu is None else not on_cpu
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="check-audit-"))
    work.mkdir(parents=True, exist_ok=True)
    args = ["-m", str(model), "-ngl", "999", "--cpu-moe", "--moe-cache-mib", f"{cache_mib:g}", "--moe-cache-profile",
            str(profile), "--moe-cache-hybrid", "-c", "2048", "--parallel", "1", "-v"]
    if threads:
        args += ["-t", str(threads)]
    if not gpu:
        args.append("--no-repack")  # the cache cannot slice experts out of repacked tensors
        args += ["--moe-cache-device", "CPU", "--moe-cache-mailbox-on-cpu"]
        log("the cache runs in RAM and the mailbox with the CPU as the device (--moe-cache-device CPU "
            "--moe-cache-mailbox-on-cpu)")
    runs = []
    for mailbox in (True, False):
        name = "mailbox" if mailbox else "scheduler"
        audit = work / f"audit-{name}.jsonl"
        audit.unlink(missing_ok=True)
        switch = "--moe-cache-mailbox" if mailbox else "--no-moe-cache-mailbox"
        with start_server(binary, [*args, switch, "--moe-cache-audit", str(audit)], work / f"server-{name}.log") as server:
            texts = tuple(_complete(server.url, p, n_predict) for p in PROMPTS)
        said = [line[line.index("llama_moe_cache: mailbox"):] for line in
                (work / f"server-{name}.log").read_text(errors="replace").splitlines() if "llama_moe_cache: mailbox" in line]
        # the exit line (hand-overs counted) if there is one, else the load line
        said = [line for line in said if "hand-overs from the GPU" in line] or said
        result = check_audit(audit)
        runs.append(AuditRun(mailbox, said[-1].strip() if said else "", texts, result.n_records,
                             tuple(f"line {i.line}: {i.message}" for i in result.errors),
                             sum(1 for i in result.issues if i.severity == "warning")))
        log(f"{name}: {len(texts)} completions, {result.n_records} audit records, {len(result.errors)} errors")
    return CheckAuditResult(gpu, tuple(runs))
