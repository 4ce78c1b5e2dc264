"""Speculative decoding through the MoE cache, on a real llama-server with the cache in RAM (the tests' switch):
a draft model with the target's vocabulary, the MTP head of the synthetic glm4moe model, n-grams. Each kind runs
once without the cache and once per cache mode; against the run without it: the same greedy tokens, the same
draft and acceptance counts; the cache looked up every verification ubatch and charged it to the target's
context and its requests (the per-slot series, the requests' own shares, the audit log); the draft model or the
MTP head has no cache of its own and its load says so."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from llama_moe.formats.audit import ExitRecord, ReadyRecord, RequestRecord, read_audit
from llama_moe.tools.server.audit import check_audit
from llama_moe.tools.server.metrics import parse_moe_cache, parse_prometheus, parse_request_log_line
from support.llama_server import find_server_binary, start_server, stop_server

pytestmark = pytest.mark.slow

N_PREDICT = 32
# prompts of more than 32 tokens take llama.cpp's path: every lookup is then a generation step's, each of which is
# a verification ubatch when there is a draft
PROMPTS = ("The ship left the harbour at dawn, and the crew watched the grey water turn to silver while the gulls "
           "followed the stern and the old captain told them about the storms of the northern sea",
           "To grow tomatoes in a cold spring, gardeners start the seeds indoors by a bright window, keep the soil "
           "warm and moist, and plant them out only when the nights no longer bring frost")
REPEAT = ("one two three four five six seven eight nine ten, " * 8).strip()  # n-gram drafts find it again

MODES = {
    "upload": (),
    "hybrid": ("--moe-cache-hybrid",),
    "adaptive": ("--moe-cache-hybrid", "--moe-cache-adaptive"),
    "admitting": ("--moe-cache-hybrid", "--moe-cache-admit", "2"),
}


@dataclass(frozen=True)
class Kind:
    model: str                 # the fixture of the target model
    args: tuple[str, ...]      # the speculative options ({draft}: the draft model's path)
    prompts: tuple[str, ...]
    mib: str                   # a cache that holds part of each layer's experts
    n_layers: int              # MoE layers the target's cache serves
    n_used: int                # experts a token selects
    said: str                  # what the load says of the draft's cache ("" where there is no draft context)
    modes: tuple[str, ...]


KINDS = {
    # the draft's experts in RAM too: without the fix, it made a second cache of its own from the target's options
    "draft": Kind("tiny_model_path", ("-md", "{draft}", "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
                                      "--spec-draft-cpu-moe"), PROMPTS, "2", 6, 4,
                  "llama_moe: the draft model runs without the MoE cache", tuple(MODES)),
    "mtp": Kind("mtp_model_path", ("--spec-type", "draft-mtp", "--spec-draft-n-max", "3"), PROMPTS, "0.5", 3, 4,
                "llama_moe: the MTP head runs without the MoE cache", ("upload", "admitting")),
    "ngram": Kind("tiny_model_path", ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                                      "--spec-ngram-simple-size-m", "8"), (REPEAT,), "2", 6, 4, "",
                  ("upload", "adaptive")),
}


@dataclass(frozen=True)
class Run:
    completions: tuple[dict, ...]
    metrics: str
    log: str
    audit: Path | None
    rc: int


@pytest.fixture(scope="module")
def server_binary(lib) -> Path:
    return find_server_binary()


@pytest.fixture(scope="module")
def draft_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer (same n_vocab and n_embd: the same BPE) with 2 layers of 8 experts."""
    from llama_moe.tools.synth import synthesize

    path = tmp_path_factory.mktemp("draft") / "draft.gguf"
    synthesize(path, "tiny,n_layer=2,n_expert=8,n_expert_used=2", "q8_0", seed=0)
    return path


@pytest.fixture(scope="module")
def mtp_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_moe.tools.synth.synthesize import synthesize_arch

    path = tmp_path_factory.mktemp("mtp") / "glm4moe-mtp.gguf"
    synthesize_arch(path, "glm4moe-mtp", "q8_0", seed=0)
    return path


def _ask(url: str, prompt: str) -> dict:
    r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0,
                                                  "cache_prompt": False, "return_tokens": True}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _serve(binary: Path, model: Path, d: Path, args: list[str], prompts: tuple[str, ...], n_slots: int = 1) -> Run:
    audit = d / "audit.jsonl" if "--moe-cache-mib" in args else None
    log = d / "server.log"
    proc, url = start_server(binary, ["-m", str(model), "--cpu-moe", "--no-repack", "--metrics", "-c",
                                      str(1024 * n_slots), "-np", str(n_slots), *args,
                                      *(["--moe-cache-audit", str(audit)] if audit else [])], log)
    try:
        with ThreadPoolExecutor(n_slots) as pool:
            completions = tuple(pool.map(lambda p: _ask(url, p), prompts))
        metrics = requests.get(url + "/metrics", timeout=30).text
    finally:
        rc = stop_server(proc)
    return Run(completions, metrics, log.read_text(errors="replace"), audit, rc)


@pytest.fixture(scope="module")
def runs(request, server_binary: Path, draft_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """Each (kind, mode) served once, "none" without the cache."""
    done: dict[tuple[str, str], Run] = {}

    def get(kind: str, mode: str) -> Run:
        if (kind, mode) not in done:
            k = KINDS[kind]
            args = [a.replace("{draft}", str(draft_model_path)) for a in k.args]
            if mode != "none":
                args += ["--moe-cache-mib", k.mib, *MODES[mode]]
            done[kind, mode] = _serve(server_binary, request.getfixturevalue(k.model),
                                      tmp_path_factory.mktemp(f"{kind}-{mode}"), args, k.prompts)
        return done[kind, mode]

    return get


def _metric(metrics: str, name: str) -> float:
    values = [s.value for s in parse_prometheus(metrics) if s.name == name]
    assert values, f"{name} not in /metrics"
    return values[0]


CASES = [(kind, mode) for kind, k in KINDS.items() for mode in k.modes]


@pytest.mark.parametrize("kind,mode", CASES)
def test_the_cache_changes_no_token_and_no_acceptance(runs, kind: str, mode: str) -> None:
    plain, cached = runs(kind, "none"), runs(kind, mode)
    assert plain.rc == 0 and cached.rc == 0
    for a, b in zip(plain.completions, cached.completions, strict=True):
        assert b["tokens"] == a["tokens"] and len(a["tokens"]) == N_PREDICT
        assert (b["timings"]["draft_n"], b["timings"]["draft_n_accepted"]) == \
               (a["timings"]["draft_n"], a["timings"]["draft_n_accepted"])
        assert a["timings"]["prompt_n"] > 32   # the prompt keeps llama.cpp's path: no lookup of its own
    drafted = sum(c["timings"]["draft_n"] for c in cached.completions)
    accepted = sum(c["timings"]["draft_n_accepted"] for c in cached.completions)
    assert drafted > 0
    if kind != "mtp":   # the random-weight MTP head rarely guesses the target; the others draft what it says
        assert accepted > 0
    for name in ("llamacpp:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total",
                 "llamacpp:spec_decode_num_drafts_total"):
        assert _metric(cached.metrics, name) == _metric(plain.metrics, name), name


@pytest.mark.parametrize("kind,mode", CASES)
def test_every_verification_is_looked_up_and_charged_to_the_target(runs, kind: str, mode: str) -> None:
    k, run = KINDS[kind], runs(kind, mode)
    c = parse_moe_cache(run.metrics)
    assert c is not None and c.hybrid == (mode != "upload")
    # each verification (a draft and its token, 2 tokens or more) looks up at least n_used experts in every layer
    n_verify = _metric(run.metrics, "llamacpp:spec_decode_num_drafts_total")
    assert n_verify > 0 and c.n_hit + c.n_miss >= n_verify * k.n_layers * k.n_used
    assert len(c.layers) == k.n_layers
    # the target's one slot: its series is the totals, and its requests' own shares are what the context moved
    per_seq = {s.name: s.value for s in parse_prometheus(run.metrics) if s.name.startswith("llamacpp:moe_cache_seq_")}
    assert per_seq["llamacpp:moe_cache_seq_hits_total"] == c.n_hit
    assert per_seq["llamacpp:moe_cache_seq_misses_total"] == c.n_miss
    assert run.audit is not None
    records = read_audit(run.audit).records
    ready = next(r for r in records if isinstance(r, ReadyRecord))
    reqs = [r for r in records if isinstance(r, RequestRecord)]
    assert isinstance(records[-1], ExitRecord) and len(reqs) == len(k.prompts)
    moved = records[-1].counters - ready.counters
    for name in ("hits", "misses", "bytes_cpu"):
        assert sum(getattr(r.own, name) for r in reqs) == getattr(moved, name), name
    assert moved.hits + moved.misses > 0
    checked = check_audit(run.audit)
    assert checked.ok, [str(i) for i in checked.errors]
    lines = [parse_request_log_line(l) for l in run.log.splitlines() if "MoE cache hits = " in l]
    assert len(lines) == len(k.prompts) and all(l is not None and l.own is not None for l in lines)
    assert sum(l.own.hits for l in lines) == moved.hits   # type: ignore[union-attr]


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_draft_has_no_cache_and_the_load_says_so(runs, kind: str) -> None:
    k = KINDS[kind]
    run = runs(kind, k.modes[0])
    on = [l for l in run.log.splitlines() if "llama_moe: MoE cache on:" in l]
    assert len(on) == 1 and f"in {k.n_layers} layers" in on[0], on   # the target's, without an MTP block
    if k.said:
        assert sum(k.said in l for l in run.log.splitlines()) == 1, k.said
        assert k.said not in runs(kind, "none").log   # no cache to speak of
    else:
        assert "runs without the MoE cache" not in run.log
    assert "drafts for another" not in run.log   # the draft was given no cache option to refuse
    said = [l for l in run.log.splitlines() if "llama_moe: speculative decoding (" in l]
    assert len(said) == 1 and "verification ubatch (up to" in said[0] and "takes the MoE cache" in said[0], said


def test_long_drafts_are_said_to_keep_llama_cpp_s_path(server_binary: Path, tiny_model_path: Path,
                                                       tmp_path: Path) -> None:
    """ngram-mod drafts up to 64 tokens by default: their verification ubatches are larger than the cache's."""
    run = _serve(server_binary, tiny_model_path, tmp_path, ["--spec-type", "ngram-mod", "--moe-cache-mib", "2"], ())
    said = [l for l in run.log.splitlines() if "llama_moe: speculative decoding (ngram-mod) drafts up to 64" in l]
    assert len(said) == 1 and "cap the drafts at 31" in said[0], said


def test_the_requests_own_shares_add_up_when_slots_verify_together(server_binary: Path, tiny_model_path: Path,
                                                                  draft_model_path: Path, tmp_path: Path) -> None:
    """Two slots drafting at once: a verification ubatch holds both slots' drafts, and each expert it selects is
    charged to one of them; the requests' own shares add up to what the context counted, the per-slot series
    to the totals."""
    prompts = PROMPTS + tuple(p.replace("the", "a") for p in PROMPTS)
    run = _serve(server_binary, tiny_model_path, tmp_path, ["-md", str(draft_model_path), "--spec-type", "draft-simple",
                 "--spec-draft-n-max", "4", "--moe-cache-mib", "2"], prompts, n_slots=2)
    assert run.rc == 0 and all(c["timings"]["draft_n"] > 0 for c in run.completions)
    records = read_audit(run.audit).records   # type: ignore[arg-type]
    ready = next(r for r in records if isinstance(r, ReadyRecord))
    reqs = [r for r in records if isinstance(r, RequestRecord)]
    assert isinstance(records[-1], ExitRecord) and len(reqs) == len(prompts) and {r.slot for r in reqs} == {0, 1}
    moved = records[-1].counters - ready.counters
    for name in ("hits", "misses", "refused", "bytes_upload", "bytes_cpu"):
        assert sum(getattr(r.own, name) for r in reqs) == getattr(moved, name), name
    assert sum(r.req.hits for r in reqs) > moved.hits   # the slots really verified together
    c = parse_moe_cache(run.metrics)
    assert c is not None
    per_seq: dict[str, float] = {}
    for s in parse_prometheus(run.metrics):
        if s.name.startswith("llamacpp:moe_cache_seq_"):
            per_seq[s.name] = per_seq.get(s.name, 0) + s.value
    for series, total in (("hits", c.n_hit), ("misses", c.n_miss), ("upload_bytes", c.n_bytes_upload),
                          ("cpu_bytes", c.n_bytes_cpu)):
        assert per_seq[f"llamacpp:moe_cache_seq_{series}_total"] == total, series
    assert re.search(r"llama_moe: speculative decoding \(draft-simple\): a slot's verification ubatch \(up to 5 tokens\)",
                     run.log)
