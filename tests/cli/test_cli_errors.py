"""Every command of ``python -m llama_moe`` given what a user gets wrong (paths that are missing, directories where
files go, folders that do not exist, corrupt models and profiles, numbers no option means, a server that is down):
one line on stderr, ``llama_moe COMMAND: error: ...``, exit status 2, no traceback, and no file written or left
behind (no ``.part``, no half-written output, an existing output untouched). A command without cases here fails
test_every_command_has_cases. Each case runs the real command in a subprocess, on the real library and models."""
from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llama_moe.tools.cli import make_parser
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.formats.trace import RoutingRecord, write_trace
from support.llama_server import free_port

TEXT = "The ship left the harbour at dawn. The sea was calm and the sailors sang of home.\n" * 3

# (argv, what the error line says): {name} is a file of the fixture below
CASES: list[tuple[str, str]] = [
    # stats
    ("stats {missing}", "{missing}: cannot open: No such file or directory"),
    ("stats {dir}", "{dir}: cannot open: Is a directory"),
    ("stats {corrupt_model}", "too short for a GGUF header"),
    ("stats {model} -t 0", "n_threads must be from 1 to 1024 or None, got 0"),
    ("stats {model} -p {empty}", "-p/--prompt is empty"),
    ("stats {model} -c -1", "-c/--ctx must be >= 0, got -1"),
    ("stats {model} -c 99999999999", "n_ctx must be a whole number"),
    ("stats {model} -ngl 99999999999", "n_gpu_layers must be a whole number of layers (-1: all) from -1 to 2147483647"),
    ("stats {model} --n-cpu-moe 99999999999", "n_cpu_moe must be a whole number of layers from 0 to 65535"),
    ("stats {model} --temp -1", "temperature must be a finite number >= 0, got -1.0"),
    ("stats {model} --temp nan", "--temp must be a finite number, got nan"),
    ("stats {model} --seed -1", "seed must be a whole number from 0 to 4294967295, got -1"),
    ("stats {model} -t lots", "argument -t/--threads: invalid int value: 'lots'"),
    ("stats {model} --moe-cache-mib 2 --moe-cache-profile {missing}", "--moe-cache-profile {missing}: no such file"),
    ("stats {model} --moe-cache-mib 2 --moe-cache-profile {corrupt_profile}",
     "--moe-cache-profile {corrupt_profile}: truncated: 10 bytes, shorter than the 24-byte header"),
    ("stats {model} --moe-cache-mib 2 --moe-cache-profile {other_profile}",
     "--moe-cache-profile {other_profile}: made for 4 layers x 32 experts, but the model has 6 x 32"),
    ("stats --server http://127.0.0.1:{port}", "cannot reach http://127.0.0.1:{port}/metrics"),
    # build (nothing here builds: each is refused before)
    ("build --bundle {dir}", "--bundle {dir}: a directory; give the file to write"),
    ("build --bundle {nofolder}", "--bundle {nofolder}: the folder {nofolder_parent} does not exist"),
    ("build --dev {model}", "{model} exists; remove it or export from it first"),
    ("build --export {missing}", "{missing}"),
    ("build --export {empty}", "--export is empty"),  # not a build: an empty path is no option
    ("build --dev {empty}", "--dev is empty"),
    # synth
    ("synth {dir}", "{dir}: a directory; give the file to write"),
    ("synth {nofolder}", "{nofolder}: the folder {nofolder_parent} does not exist"),
    ("synth {out} --shape nope", "shape: 'nope' is neither a preset"),
    ("synth {out} --shape n_expert=0", "shape: n_expert must be positive, got 0"),
    ("synth {out} --skew nan", "--skew must be a finite number, got nan"),
    ("synth {out} --seed x", "argument --seed: invalid int value: 'x'"),
    ("synth {out} --shape n_layer=99999999999", "shape: n_layer must be at most 512, got 99999999999"),
    ("synth {empty}", "OUT.gguf is empty"),
    # synth-report
    ("synth-report --shape nope", "shape: 'nope' is neither a preset"),
    ("synth-report --seeds 0,x", "--seeds must be whole numbers separated by commas, got '0,x'"),
    ("synth-report --seeds {empty}", "--seeds is empty"),
    ("synth-report --skew nan", "--skew must be a finite number, got nan"),
    # bench
    ("bench {missing} --modes cpu-moe", "{missing}: cannot open: No such file or directory"),
    ("bench {corrupt_model} --modes cpu-moe", "too short for a GGUF header"),
    ("bench {model} --modes cpu-moe --md {dir}", "--md {dir}: a directory; give the file to write"),
    ("bench {model} --modes cpu-moe --json {nofolder}", "--json {nofolder}: the folder {nofolder_parent} does not exist"),
    ("bench {model} --modes cpu-moe --json /dev/null", "--json /dev/null: not a regular file"),
    ("bench {model} --modes hybrid --profile {corrupt_profile}", "--profile {corrupt_profile}: truncated"),
    ("bench {model} --modes cpu-moe -t 99999", "-t/--threads must be at most 1024, got 99999"),
    ("bench {model} --modes cpu-moe --pp 99999999999", "--pp and -n/--n-gen must add up to at most 16777088"),
    ("bench {model} --cache-pct 50 inf", "--cache-pct must be a finite number, got inf"),
    ("bench {model} --modes ,", "--modes names no mode"),
    ("bench {model} --modes {empty}", "--modes is empty"),
    ("bench --merge {missing}", "--merge {missing}: not a JSON file that bench --json wrote"),
    ("bench --merge {bad_json}", "--merge {bad_json}: not a JSON file that bench --json wrote"),
    ("bench --merge {rows} --md {dir}", "--md {dir}: a directory; give the file to write"),
    # serve
    ("serve {missing} --dry-run", "{missing}: cannot open: No such file or directory"),
    ("serve {model} --dry-run --profile {corrupt_profile}", "--profile {corrupt_profile}: truncated"),
    ("serve {model} --dry-run --profile {other_profile}", "made for 4 layers x 32 experts, but the model has 6 x 32"),
    ("serve {model} --dry-run --port 70000", "--port must be from 1 to 65535, got 70000"),
    ("serve {model} --dry-run --host {empty}", "--host is empty"),
    ("serve {model} --dry-run --ctx 99999999999", "--ctx must be at most 16777216"),
    ("serve {model} --dry-run --min-cache-mib inf", "--min-cache-mib must be a finite number, got inf"),
    # check-api
    ("check-api --server http://127.0.0.1:{port}", "cannot reach http://127.0.0.1:{port}: Connection refused"),
    ("check-api --server notaurl", "cannot reach notaurl: Invalid URL"),
    ("check-api --server {empty}", "--server is empty"),
    # info
    ("info", "the patched libllama was not found", {"LLAMA_MOE_LIB": "{missing}"}),
    ("info", "{model}: cannot be loaded", {"LLAMA_MOE_LIB": "{model}"}),
    # audit
    ("audit check {missing}", "{missing}: cannot read the audit log"),
    ("audit check {dir}", "{dir}: cannot read the audit log"),
    ("audit check {empty}", "file is empty"),
    ("audit summary {missing}", "{missing}: cannot read the audit log"),
    ("audit", "the following arguments are required: ACTION"),
    # monitor
    ("monitor --port 70000", "--port must be from 0 (any free port) to 65535, got 70000"),
    ("monitor --port {busy}", "cannot listen on 127.0.0.1:{busy}"),
    ("monitor --server notaurl --port 0", "--server must be an http:// or https:// URL, got 'notaurl'"),
    # trace
    ("trace {model} {text} {dir}", "{dir}: a directory; give the file to write"),
    ("trace {model} {text} {nofolder}", "{nofolder}: the folder {nofolder_parent} does not exist"),
    ("trace {model} {missing} {out}", "{missing}: No such file or directory"),
    ("trace {corrupt_model} {text} {out}", "too short for a GGUF header"),
    ("trace {model} {text} {empty}", "out is empty"),
    ("trace {model} {text} {out} --ubatch 0", "ubatch and ctx must be at least 1, got ubatch 0"),
    ("trace {model} {text} {out} -t 0", "n_threads must be from 1 to 1024 or None, got 0"),
    ("trace {model} {latin1} {out}", "{latin1}: not UTF-8 text: byte 12 (0xe9, line 2) is not valid UTF-8"),
    # profile
    ("profile {model} {text} -o {dir}", "-o/--out {dir}: a directory; give the file to write"),
    ("profile {model} {text} -o {nofolder}", "-o/--out {nofolder}: the folder {nofolder_parent} does not exist"),
    ("profile {model} {text} -o {out} --trace-out {dir}", "--trace-out {dir}: a directory; give the file to write"),
    ("profile {model} {dir} -o {out}", "{dir}: Is a directory"),
    ("profile {dir} {text} -o {out}", "{dir}: a directory, not a model file"),
    ("profile {model} {text} -o {out} --slots 0", "--slots must be >= 1, got 0"),
    ("profile {model} {text} -o {out} --trace-out {out}", "-o/--out and --trace-out name the same file {out}"),
    ("profile {model} {text} -o {empty}", "-o/--out is empty"),
    ("profile {model} {text} -o {out} -t 0", "n_threads must be from 1 to 1024 or None, got 0"),
    ("profile {model} {latin1} -o {out}", "{latin1}: not UTF-8 text: byte 12 (0xe9, line 2)"),
    # plan
    ("plan {missing} --cache-mib 2", "{missing}: no such model file"),
    ("plan {corrupt_model} --cache-mib 2", "too short for a GGUF header"),
    ("plan {model} --cache-mib 2 --trace {trace} --out {dir}", "--out {dir}: a directory; give the file to write"),
    ("plan {model} --cache-mib 2 --trace {trace} --out {nofolder}", "--out {nofolder}: the folder {nofolder_parent} does not exist"),
    ("plan {model} --cache-mib 2 --trace {missing}", "{missing}: no such trace file"),
    ("plan {model} --cache-mib 2 --trace {dir}", "{dir}: a directory, not a trace file"),
    ("plan {model} --cache-mib 2 --trace {profile}", "a trace of another model?"),
    ("plan {model} --cache-mib -5", "--cache-mib must be > 0, got -5"),
    ("plan {model} --cache-mib 2 --trace {trace} --out {empty}", "--out is empty"),
    ("plan {model} --vram-gib 1e308", "--vram-gib must be at most 16384, got 1e+308"),
    ("plan {model} --cache-mib 2 --kfold 1", "--kfold must be >= 2, got 1"),
    # simulate
    ("simulate {model} --cache-mib 2 --train {trace} --kfold 1", "--kfold must be >= 2, got 1"),
    ("simulate {model} --cache-mib nan --train {trace} --kfold 2", "--cache-mib must be a finite number, got nan"),
    ("simulate {model} --cache-mib 0 --train {trace} --kfold 2", "--cache-mib must be > 0 and at most 16777216, got 0"),
    ("simulate {model} --cache-mib 2 --train {missing} --kfold 2", "{missing}: no such trace file"),
    ("simulate {model} --cache-mib 2 --train {trace} --kfold 2 --policies foo", "unknown policies ['foo']"),
    # predict
    ("predict {model} {missing}", "{missing}: no such trace file"),
    ("predict {dir} {trace}", "{dir}: a directory, not a model file"),
    ("predict {model} {trace} --top 0", "--top must be from 1 to 32, got 0"),
    # bench-adaptive
    ("bench-adaptive {missing}", "{missing}: cannot open: No such file or directory"),
    ("bench-adaptive {model} --json {dir}", "--json {dir}: a directory; give the file to write"),
    ("bench-adaptive {model} --profile-dir {model}", "--profile-dir {model}: not a folder"),
    ("bench-adaptive {model} --cache-pct 0", "--cache-pct must be above 0 and at most 100, got 0"),
    ("bench-adaptive {model} --topics nope", "unknown topic 'nope'"),
    # check-audit
    ("check-audit {missing} {profile}", "the model {missing}: no such file"),
    ("check-audit {model} {corrupt_profile}", "{corrupt_profile}: truncated"),
    ("check-audit {model} {other_profile}", "made for 4 layers x 32 experts, but the model has 6 x 32"),
    ("check-audit {model} {profile} --keep {model}", "--keep {model}: not a folder"),
    ("check-audit {model} {profile} -n 0", "-n must be >= 1, got 0"),
    ("check-audit {model} {profile} -t 0", "-t/--threads must be from 1 to 1024, got 0"),
    ("check-audit {model} {profile} --keep {empty}", "--keep is empty"),
    # code-eval
    ("code-eval {model} --no-server --port {port}", "http://127.0.0.1:{port}: Connection refused"),
    ("code-eval {model} --no-server --port 70000", "--port must be from 1 to 65535, got 70000"),
    ("code-eval {model} --profile {corrupt_profile}", "--profile {corrupt_profile}: truncated"),
    ("code-eval {model} --max-tokens 0", "--max-tokens must be >= 1, got 0"),
    ("code-eval {missing}", "{missing}: cannot open: No such file or directory"),
    # check-all
    ("check-all {missing}", "{missing}: cannot open: No such file or directory"),
    ("check-all {model} -n 0", "-n must be >= 1, got 0"),
    ("check-all {model} -n 99999999999", "-n must be from 1 to 768"),
]


def _command(argv: str) -> str:
    words = argv.split()
    return " ".join(words[:2]) if words[0] == "audit" and len(words) > 1 and not words[1].startswith("{") else words[0]


def test_every_command_has_cases() -> None:
    commands = make_parser().command_parsers
    every = {name for name in commands if name != "audit"}
    every |= {f"audit {action}" for action in ("check", "summary")}
    assert every <= {_command(c[0]) for c in CASES}, every - {_command(c[0]) for c in CASES}


@pytest.fixture(scope="module")
def files(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    work = tmp_path_factory.mktemp("cli-errors")
    layout = expert_layout(tiny_model_path)
    (work / "text.txt").write_text(TEXT)
    (work / "latin1.txt").write_bytes("The ship\nCaf\u00e9 au lait\n".encode("latin-1"))  # é is 0xe9, byte 12
    (work / "corrupt.gguf").write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    (work / "corrupt.strp").write_bytes(b"STRP\x01\x00\x00\x00\x06\x00")
    (work / "bad.json").write_text("[1, 2")
    (work / "a-dir").mkdir()
    (work / "empty.jsonl").write_bytes(b"")
    write_profile(work / "p.strp", Profile(layout.n_layer, layout.n_expert, 8, ((0, 1), (1, 2))))
    write_profile(work / "other.strp", Profile(4, layout.n_expert, 8, ((0, 1),)))
    rng = np.random.default_rng(0)
    write_trace(work / "t.bin", [RoutingRecord(l.il, rng.choice(layout.n_expert, (1, layout.n_expert_used), replace=False)
                                               .astype(np.int32)) for _ in range(60) for l in layout.layers])
    rows = [{"mode": "cpu-moe", "cache_mib": 0, "cache_pct": 0, "threads": 8, "decode_tps": 9.0, "decode_tps_spread": 0.5,
             "pp_tps": 100.0, "pp_tps_spread": 1.0, "hit_rate": None, "vram_mib": None, "runs": 2}] * 3
    (work / "rows.json").write_text(json.dumps(rows))
    return {"model": str(tiny_model_path), "text": str(work / "text.txt"), "latin1": str(work / "latin1.txt"), "corrupt_model": str(work / "corrupt.gguf"),
            "corrupt_profile": str(work / "corrupt.strp"), "profile": str(work / "p.strp"),
            "other_profile": str(work / "other.strp"), "trace": str(work / "t.bin"), "bad_json": str(work / "bad.json"),
            "rows": str(work / "rows.json"), "dir": str(work / "a-dir"), "missing": str(work / "missing.x"),
            "nofolder": str(work / "no" / "such" / "out.x"), "nofolder_parent": str(work / "no" / "such"),
            "out": str(work / "out.x"), "work": str(work), "empty": "", "empty_file": str(work / "empty.jsonl")}


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _run(argv: list[str], cwd: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llama_moe", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, **kw)


def _one_error_line(proc: subprocess.CompletedProcess[str], command: str, said: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"llama_moe {command}: error: ") and said in lines[0], (said, lines[0])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2(files, case) -> None:
    argv, said, env = case if len(case) == 3 else (*case, None)
    with socket.socket() as busy:  # a port something listens on, and one nothing does
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        names = {**files, "port": str(free_port()), "busy": str(busy.getsockname()[1])}
        work = Path(files["work"])
        before = _tree(work)
        proc = _run([a.format(**names) for a in argv.split()], files["work"],
                    {k: v.format(**names) for k, v in (env or {}).items()})
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    _one_error_line(proc, _command(argv), said.format(**names))
    assert _tree(work) == before, "a file was written, changed or left behind"


def _fsize_limit(limit: int):
    def apply() -> None:  # the kernel refuses writes past the limit (EFBIG) instead of killing the process (SIGXFSZ)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("argv", [
    "trace {model} {text} {target}",
    "profile {model} {text} -o {target}",
    "plan {model} --cache-mib 2 --trace {trace} --out {target}",
    "bench --merge {rows} --json {target}",
    "synth {target} --quiet --shape n_layer=1,n_expert=8,n_expert_used=2",
], ids=["trace", "profile", "plan", "bench", "synth"])
def test_a_write_that_fails_halfway_leaves_the_old_file_and_no_part(files, tmp_path, argv) -> None:
    """The file outgrows the process's file size limit while it is written (EFBIG, as a full disk's ENOSPC): the
    command says so in one line and exits 2; what was there before is untouched and nothing is left beside it."""
    target = tmp_path / "out.bin"
    target.write_bytes(b"the old file")
    before = _tree(tmp_path)
    proc = _run([a.format(**files, target=target) for a in argv.split()], str(tmp_path), preexec_fn=_fsize_limit(200))
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"llama_moe {argv.split()[0]}: error: .*{re.escape(str(target))}.*File too large", last), last
    # the lines before it, if any, are llama.cpp's log while the model loaded
    # one error, the last line (a warning before it, such as a custom shape's uncalibrated routing, is no error)
    assert all(not line.startswith("llama_moe") or ": warning: " in line
               for line in proc.stderr.strip().splitlines()[:-1]), proc.stderr
    assert _tree(tmp_path) == before and target.read_bytes() == b"the old file"


def test_the_writer_writes_a_device_in_place_and_through_a_symlink(tmp_path) -> None:
    """An API user may write to /dev/full or through a link: the device stays a device, the link a link."""
    from llama_moe.formats.atomic import write_bytes

    with pytest.raises(OSError, match="No space left on device") as excinfo:
        write_trace("/dev/full", [RoutingRecord(0, np.zeros((4096, 8), dtype=np.int32))])
    assert excinfo.value.filename == "/dev/full" and Path("/dev/full").is_char_device()
    real, link = tmp_path / "real.bin", tmp_path / "link.bin"
    link.symlink_to(real)
    write_bytes(link, b"new")
    assert link.is_symlink() and real.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["link.bin", "real.bin"]


def test_an_unknown_command_is_one_line_too(tmp_path) -> None:
    proc = _run(["frobnicate"], str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llama_moe: error: argument COMMAND: invalid choice: 'frobnicate'")


def test_an_empty_audit_log_is_a_failed_check(files) -> None:
    """A check of nothing would pass: an empty file is no server's audit log (exit 1, as every failed check)."""
    proc = _run(["audit", "check", files["empty_file"]], files["work"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
    assert "error: no records: the file is empty" in proc.stdout, proc.stdout
