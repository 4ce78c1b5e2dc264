"""Asking a served model for each task's code and running the answer against the task's asserts.

The answers are code a model wrote: each runs in its own Python process (isolated mode, a fresh temporary
folder as its working directory, no stdin), with a time limit and, on Linux, a 2 GiB address-space limit. That
keeps a runaway answer from hanging or exhausting the machine; it is not a security sandbox."""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import requests

from .tasks import Task

SYSTEM = "You are a careful Python programmer. Answer with the code only, in one ```python block, without examples or tests."
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class TaskResult:
    name: str
    passed: bool
    detail: str          # "ok", or why not: no code, the error's last line, the time limit
    seconds: float       # the model's answer, not the check
    answer: str          # the code that ran


@dataclass(frozen=True)
class CodeEvalResult:
    suite: str
    server: str
    results: tuple[TaskResult, ...]

    @property
    def n_passed(self) -> int:
        return sum(r.passed for r in self.results)


def extract_code(text: str) -> str:
    """The first fenced code block (python, py or none named); the whole text if it has no fence."""
    m = _BLOCK.search(text)
    if m:
        return m.group(1).strip() + "\n"
    # an answer cut by max_tokens inside its block
    if "```" in text:
        after = text.split("```", 1)[1]
        return after.split("\n", 1)[1] if after.startswith(("python", "py")) and "\n" in after else after
    return text.strip() + "\n"


def _limit_memory() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    except (ImportError, ValueError, OSError):
        pass


def run_answer(code: str, checks: str, timeout: float = 20.0) -> tuple[bool, str]:
    """Runs code, then checks, in a child Python; (passed, "ok" or why not)."""
    if not code.strip():
        return False, "no code in the answer"
    with tempfile.TemporaryDirectory(prefix="code-eval-") as work:
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", code + "\n\n" + checks + "\n"], cwd=work, capture_output=True,
                                  text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  preexec_fn=_limit_memory if sys.platform.startswith("linux") else None)
        except subprocess.TimeoutExpired:
            return False, f"over the {timeout:g} s limit"
    if proc.returncode == 0:
        return True, "ok"
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return False, (lines[-1] if lines else f"exit status {proc.returncode}")[:300]


def ask(server: str, prompt: str, max_tokens: int, api_key: str | None = None, timeout: float = 600.0) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = requests.post(server.rstrip("/") + "/v1/chat/completions", headers=headers, timeout=timeout, json={
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0, "seed": 0})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"] or ""


def evaluate(server: str, tasks: tuple[Task, ...], suite: str = "", max_tokens: int = 700, api_key: str | None = None,
             log: Callable[[str], None] = lambda s: None) -> CodeEvalResult:
    results = []
    for task in tasks:
        t0 = time.monotonic()
        text = ask(server, task.prompt, max_tokens, api_key)
        seconds = time.monotonic() - t0
        code = extract_code(text)
        passed, detail = run_answer(code, task.checks)
        results.append(TaskResult(task.name, passed, detail, seconds, code))
        log(f"{'PASS' if passed else 'FAIL'}  {task.name:16} {seconds:6.1f} s  {detail}")
    return CodeEvalResult(suite, server, tuple(results))


def serve_and_evaluate(model: Path, tasks: Sequence[Task], suite: str, port: int, max_tokens: int = 700,
                       api_key: str | None = None, profile: str | None = None, hybrid: bool = False, ctx: int = 4096,
                       extra: tuple[str, ...] = (), log: Callable[[str], None] = print) -> CodeEvalResult:
    """Serves ``model`` as ``serve`` would (the cache fitted to the GPU) on 127.0.0.1:``port``, and evaluates."""
    from ..plan import plan_for_gpu
    from ..process import launch

    url = f"http://127.0.0.1:{port}"
    plan = plan_for_gpu(model, n_ctx=ctx, profile=profile, hybrid=hybrid, api_key=api_key, port=port, extra=extra)
    log(plan.describe())
    work = Path(tempfile.mkdtemp(prefix="code-eval-"))
    from ..plan import API_KEY_ENV

    env = {API_KEY_ENV: api_key} if api_key else None
    with launch(plan.command, url, work / "server.log", env=env, timeout=600) as server:
        log(f"serving at {server.url} (log: {server.log})")
        return evaluate(url, tasks, suite, max_tokens, api_key, log)
