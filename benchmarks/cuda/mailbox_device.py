"""The mailbox's CUDA side on a GPU (CI runs only the CPU device's kernels): each check in a process of its own,
since CUDA reads some of its variables once per process.

    python3 benchmarks/cuda/mailbox_device.py [--checks stall,ring,graphs,pdl,no-pinned,two-contexts,share] [-n 128]

- stall: LLAMA_MOE_MAILBOX_TEST_STALL=3 and a 500 ms timeout, a decode of eight one-token ubatches: it fails
  once, within about one timeout (the sticky abort), leaves the KV cache as before (the prompt decodes again from
  position 0), and the tokens and logits after it are those of the scheduler's path, bit for bit.
- ring: the CPU side slowed before each record (LLAMA_MOE_MAILBOX_TEST_DELAY_US=300), one-token ubatches back to
  back: no error, no record lost, tokens, logits and per-layer counts those of the scheduler's path.
- default, graphs, pdl, graphs-pdl: the hybrid through the mailbox against the scheduler's path (the same
  kernels: bit for bit), as built, with CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS=1), programmatic dependent
  launch off (GGML_CUDA_PDL=0), and both off.
- no-pinned: GGML_CUDA_NO_PINNED=1: the mailbox says it cannot run and the hybrid goes the scheduler's way,
  with the scheduler's tokens.
- two-contexts: two contexts of one model decoding at once on the GPU, each with the tokens it has alone.
- share: more than 32 experts a token (tiny, 64 experts, 40 a token) with moe_cache_mailbox_gpu_share=0.5, against
  no cache by the equivalence rule (tokens identical, or parting only at a near tie); where the device cannot
  read the host copy, the reason the engine gives.
- litmus: about 10^6 send/receive rounds (a 48-layer tiny model, one-token steps, CUDA graphs replayed) with
  every core busy with other work: no decode fails, no record is lost, and every round of the same prompt
  gives the same tokens and logits as the first, which are the scheduler's.
Prints a line per check ending in "-> ok" or "-> WRONG", then "MAILBOX DEVICE: PASS" or "... FAIL".
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

CHECKS = ("default", "stall", "ring", "graphs", "pdl", "graphs-pdl", "no-pinned", "two-contexts", "share", "litmus")


def _log_lines() -> list[str]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("llama_moe.native")
    logger.setLevel(logging.INFO)
    logger.addHandler(Keep())
    return lines


def _model(shape: str, tmp: Path) -> Path:
    from llama_moe.tools.synth.synthesize import synthesize
    path = tmp / "model.gguf"
    synthesize(path, shape=shape, expert_type="q8_0", seed=0)
    return path


def _profile(path: Path, tmp: Path) -> Path:
    from llama_moe.tools.bench.corpus_profile import train_profile
    return train_profile(path, tmp / "p.strp", log=lambda s: None, n_ctx=512)


def _generate(model, cp, tokens: list[int], n: int) -> tuple[list[int], np.ndarray, list[tuple[int, int]]]:
    from llama_moe import Context
    with Context(model, cp) as ctx:
        out = list(ctx.generate(tokens, max_tokens=n, stop_at_eog=False))
        return out, ctx.logits(), [(l.n_hit, l.n_miss) for l in ctx.layer_stats()]


def one(check: str, n: int, model_path: Path | None, profile_path: Path | None) -> str:
    from llama_moe import Context, ContextParams, Model, ModelParams
    from llama_moe._native.env import environment
    from llama_moe.tools.equivalence import DEVICE_TOLERANCE, PROMPTS, Mode, compare_mode, reference
    from llama_moe.errors import NativeCallError
    from llama_moe.tools.experts import expert_layout

    tmp = Path(tempfile.mkdtemp())
    lines = _log_lines()
    if check in ("share", "litmus") or model_path is None:
        shape = {"share": "tiny,n_expert=64,n_expert_used=40", "litmus": "tiny,n_layer=48"}.get(check, "tiny")
        path = _model(shape, tmp)
        profile = _profile(path, tmp)
    else:
        path, profile = model_path, profile_path or _profile(model_path, tmp)
    total = expert_layout(path).total_expert_bytes / 2**20
    hybrid = dict(moe_cache_hybrid=True, moe_cache_profile=str(profile))
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model:
        prompt = model.tokenize(PROMPTS[0])
        if check == "stall":
            cp = ContextParams(n_ctx=1024, n_batch=8, n_ubatch=1, moe_cache_mib=total * 0.25 + 1, **hybrid)
            with environment(LLAMA_MOE_CACHE_NO_MAILBOX="1"):
                ref = _generate(model, cp, prompt, n)
            with environment(LLAMA_MOE_MAILBOX_TEST_STALL="3"):  # a test switch (the tests' build)
                with Context(model, dataclasses.replace(cp, moe_cache_mailbox_timeout_ms=500)) as ctx:
                    t0 = time.monotonic()
                    try:
                        ctx.decode(prompt[:8])
                        failed, why = False, "the decode did not fail"
                    except NativeCallError as e:
                        failed, why = True, str(e)
                    dt = time.monotonic() - t0
                    empty = ctx.n_past == 0
                    ctx.decode(prompt)  # a position error here if the failed decode left its tokens behind
                    out = list(ctx.generate([], max_tokens=n, stop_at_eog=False))
                    logits = ctx.logits()
            good = failed and "did not come within" in why and empty and dt < 2.0 and out == ref[0] and \
                np.array_equal(logits, ref[1])
            aborted = next((l for l in lines if "later layers did not wait" in l), "no later layer gave up")
            return (f"stall: the decode failed in {dt:.2f} s ({aborted.split('mailbox: ')[-1]}), KV cache as before: "
                    f"{empty}; after it {n} tokens {'identical' if out == ref[0] else 'DIFFERENT'} to the scheduler's, logits "
                    f"{'bit-identical' if np.array_equal(logits, ref[1]) else 'DIFFERENT'} -> {'ok' if good else 'WRONG'}")
        if check == "ring":
            cp = ContextParams(n_ctx=1024, n_batch=64, n_ubatch=1, moe_cache_mib=total * 0.75 + 1, **hybrid)
            with environment(LLAMA_MOE_CACHE_NO_MAILBOX="1"):
                ref = _generate(model, cp, prompt, n)
            with environment(LLAMA_MOE_MAILBOX_TEST_DELAY_US="300"):
                got = _generate(model, cp, prompt, n)
            line = next((l for l in lines if "hand-overs had nothing for the CPU" in l), "")
            good = got[0] == ref[0] and np.array_equal(got[1], ref[1]) and got[2] == ref[2] and \
                " 0 records lost" in line and not line.startswith("0 ")
            return (f"ring: {line.split('mailbox: ')[-1]}; tokens, logits and per-layer counts "
                    f"{'those of the scheduler' if good else 'DIFFERENT'} -> {'ok' if good else 'WRONG'}")
        if check in ("default", "graphs", "pdl", "graphs-pdl", "no-pinned"):
            cp = ContextParams(n_ctx=1024, moe_cache_mib=total * 0.5 + 1, **hybrid)
            got = _generate(model, cp, prompt, n)
            with environment(LLAMA_MOE_CACHE_NO_MAILBOX="1"):
                ref = _generate(model, cp, prompt, n)
            same = got[0] == ref[0] and np.array_equal(got[1], ref[1])
            if check == "no-pinned":
                said = any("no page-locked memory for the mailbox" in l for l in lines)
                return (f"no-pinned (GGML_CUDA_NO_PINNED=1): the mailbox {'said it cannot run' if said else 'SAID NOTHING'}; "
                        f"tokens and logits {'those of the scheduler' if same else 'DIFFERENT'} -> {'ok' if same and said else 'WRONG'}")
            var = {"default": "defaults", "graphs": "GGML_CUDA_DISABLE_GRAPHS=1", "pdl": "GGML_CUDA_PDL=0",
                   "graphs-pdl": "GGML_CUDA_DISABLE_GRAPHS=1 GGML_CUDA_PDL=0"}[check]
            used = any("layers hand over to" in l for l in lines)
            good = same and used
            return (f"{check} ({var}): the mailbox {'on' if used else 'OFF'}; {n} tokens and their logits against the "
                    f"scheduler's {'bit-identical' if same else 'DIFFERENT'} -> {'ok' if good else 'WRONG'}")
        if check == "two-contexts":
            cp = ContextParams(n_ctx=1024, moe_cache_mib=total * 0.5 + 1, **hybrid)
            alone = [_generate(model, cp, model.tokenize(p), n)[:2] for p in PROMPTS[:2]]
            both: list = [None, None]

            def run(i: int) -> None:
                both[i] = _generate(model, cp, model.tokenize(PROMPTS[i]), n)[:2]

            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            good = all(b is not None and b[0] == a[0] and np.array_equal(b[1], a[1]) for a, b in zip(alone, both))
            return f"two-contexts: two hybrid contexts decoding at once, each {'bit-identical' if good else 'DIFFERENT'} " \
                   f"to alone -> {'ok' if good else 'WRONG'}"
        if check == "share":
            ok = True
            parts = []
            for p in PROMPTS[:2]:
                ref = reference(model, p, n)
                c = compare_mode(model, ref, Mode({**hybrid, "moe_cache_mailbox_gpu_share": 0.5}), total * 0.5 + 1, p,
                                 DEVICE_TOLERANCE)
                ok &= c.ok
                parts.append(c.describe())
            reads = next((l for l in lines if "the device read" in l), "")
            why = next((l.split("has no effect): ")[-1].strip() for l in lines if "has no effect" in l), "")
            return (f"share (64 experts, 40 a token, GPU share 0.5): {'; '.join(parts)}; "
                    f"{reads.split('; ')[1] if reads.count('; ') >= 1 else 'no exit line'}"
                    f"{'; the share did not apply: ' + why if why else ''} -> {'ok' if ok else 'WRONG'}")
        if check == "litmus":
            return _litmus(model, prompt, total, hybrid, lines)
    raise SystemExit(f"unknown check {check!r}")


def _litmus(model, prompt: list[int], total: float, hybrid: dict, lines: list[str], rounds: int = 1_000_000,
            chunk: int = 1000, seconds: float = float(os.environ.get("LITMUS_SECONDS", "240"))) -> str:
    from llama_moe import ContextParams
    from llama_moe._native.env import environment
    from llama_moe.errors import LlamaMoeError
    cp = ContextParams(n_ctx=2048, moe_cache_mib=total * 0.5 + 1, **hybrid)
    with environment(LLAMA_MOE_CACHE_NO_MAILBOX="1"):
        ref = _generate(model, cp, prompt, chunk)
    n_moe = len(ref[2])
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 4)]
    t0, done, same, failed = time.monotonic(), 0, 0, ""
    try:
        while done < rounds and time.monotonic() - t0 < seconds:
            try:
                got = _generate(model, cp, prompt, chunk)
            except LlamaMoeError as e:
                failed = str(e)
                break
            done += chunk * n_moe  # one-token steps: a round per MoE layer each
            same += got[0] == ref[0] and np.array_equal(got[1], ref[1])
    finally:
        for b in busy:
            b.kill()
    n = -(-done // (chunk * n_moe))
    lost = [l for l in lines if "records lost" in l and " 0 records lost" not in l]
    good = not failed and same == n and not lost  # fewer rounds than asked when time ran out: said in the line
    return (f"litmus: {done} rounds ({n} runs of {chunk} tokens over {n_moe} MoE layers) in {time.monotonic() - t0:.0f} s "
            f"with {len(busy)} busy processes, CUDA graphs {'off' if os.environ.get('GGML_CUDA_DISABLE_GRAPHS') else 'on'}; "
            f"{same} of {n} runs bit-identical to the scheduler's; {failed or 'no decode failed'}; "
            f"{lost[0].split('mailbox: ')[-1] if lost else 'no record lost'} -> {'ok' if good else 'WRONG'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per check")
    a = ap.parse_args()
    if a.one:
        print(one(a.one, a.n, a.model, a.profile), flush=True)
        return 0
    # the tiny model and its profile, made once for the checks that use it
    tmp = Path(tempfile.mkdtemp())
    model_path = _model("tiny", tmp)
    profile_path = _profile(model_path, tmp)
    env_of = {"graphs": {"GGML_CUDA_DISABLE_GRAPHS": "1"}, "pdl": {"GGML_CUDA_PDL": "0"},
              "graphs-pdl": {"GGML_CUDA_DISABLE_GRAPHS": "1", "GGML_CUDA_PDL": "0"},
              "no-pinned": {"GGML_CUDA_NO_PINNED": "1"}}
    ok = True
    for check in a.checks.split(","):
        if check not in CHECKS:
            print(f"unknown check {check!r} (checks: {', '.join(CHECKS)})", file=sys.stderr)
            return 2
        try:
            r = subprocess.run([sys.executable, __file__, "--one", check, "-n", str(a.n), "--model", str(model_path),
                                "--profile", str(profile_path)], capture_output=True, text=True,
                               timeout=a.timeout + (int(os.environ.get("LITMUS_SECONDS", "240")) if check == "litmus" else 0),
                               env={**os.environ, **env_of.get(check, {})})
            line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else \
                f"{check}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:] } -> WRONG"
        except subprocess.TimeoutExpired:
            line = f"{check}: no result within {a.timeout} s -> WRONG"
        ok &= line.endswith("-> ok")
        print(line, flush=True)
    print("MAILBOX DEVICE: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
