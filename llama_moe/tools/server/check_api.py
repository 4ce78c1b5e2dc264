"""A served model's OpenAI and Anthropic endpoints, with and without the API key, through the official clients
(``pip install openai anthropic``), and its MoE cache's series in /metrics: ``python -m llama_moe check-api
--server URL`` checks a running server, ``check-api MODEL PROFILE [--cache-mib N]`` starts one with the cache,
the profile and a key, checks it and stops it."""
from __future__ import annotations

import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import LlamaMoeError
from ..errors import MetricsError, ServerError
from .http import request_error

KEY_WANTED = "the server wants an API key (HTTP 401 without one): give --api-key or set LLAMA_API_KEY"


@dataclass(frozen=True)
class ApiCheck:
    name: str
    ok: bool
    detail: str


def _clients():
    try:
        import anthropic
        import openai
    except ImportError as exc:
        raise LlamaMoeError(f"check-api needs the official clients: pip install openai anthropic ({exc})") from None
    return openai, anthropic


def wants_key(server: str, timeout: float = 30.0) -> bool:
    """Whether the server refuses a request without a key (/v1/models is not one of its public endpoints)."""
    import requests

    return requests.get(server.rstrip("/") + "/v1/models", timeout=timeout).status_code == 401


def check_api(server: str, api_key: str | None = None, model: str = "default", timeout: float = 60.0,
              cache: bool = True) -> list[ApiCheck]:
    """The checks, each by name. Without a key, a server that wants one is one failed check that says so, not
    a bare 401 per endpoint. ``cache``: also the MoE cache's series in /metrics (the server needs --metrics)."""
    openai, anthropic = _clients()
    base = server.rstrip("/")
    checks: list[ApiCheck] = []
    needs_key = wants_key(base)
    if needs_key and not api_key:
        return [ApiCheck("api key", False, KEY_WANTED)]
    checks.append(ApiCheck("api key", True, "requests without a key are refused (401)" if needs_key else
                           "the server asks for no key"))
    before = _cache_metrics(base, api_key) if cache else None

    def attempt(name: str, fn) -> None:
        try:
            checks.append(ApiCheck(name, True, fn()))
        except Exception as exc:  # every failure is a finding, reported by name
            checks.append(ApiCheck(name, False, f"{type(exc).__name__}: {exc}"[:300]))

    key = api_key or "no-key"
    oai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, timeout=timeout, max_retries=0)
    ant = anthropic.Anthropic(base_url=base, api_key=key, timeout=timeout, max_retries=0)

    def chat() -> str:
        r = oai.chat.completions.create(model=model, max_tokens=16,
                                        messages=[{"role": "user", "content": "Say something about the sea."}])
        text = r.choices[0].message.content or ""
        if not text.strip():
            raise AssertionError("empty reply")
        return f"{r.usage.completion_tokens} tokens: {text[:60]!r}"

    def completion() -> str:
        r = oai.completions.create(model=model, prompt="The ship left the harbour", max_tokens=16)
        return f"{r.usage.completion_tokens} tokens: {r.choices[0].text[:60]!r}"

    def stream() -> str:
        parts = [c.choices[0].delta.content or "" for c in oai.chat.completions.create(
            model=model, max_tokens=16, stream=True, messages=[{"role": "user", "content": "Name a star."}]) if c.choices]
        if not "".join(parts).strip():
            raise AssertionError("the stream carried no text")
        return f"{len(parts)} chunks"

    def messages() -> str:
        r = ant.messages.create(model=model, max_tokens=16, messages=[{"role": "user", "content": "Say something about gardens."}])
        text = "".join(b.text for b in r.content if getattr(b, "type", "") == "text")
        if not text.strip():
            raise AssertionError("empty reply")
        return f"{r.usage.output_tokens} tokens: {text[:60]!r}"

    attempt("openai chat.completions", chat)
    attempt("openai completions", completion)
    attempt("openai chat.completions stream", stream)
    attempt("anthropic messages", messages)
    if api_key:
        def refused() -> str:
            bad = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key + "-wrong", timeout=timeout, max_retries=0)
            try:
                bad.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            except openai.AuthenticationError:
                return "a wrong key is refused (401)"
            raise AssertionError("a wrong API key was accepted")

        def refused_anthropic() -> str:
            bad = anthropic.Anthropic(base_url=base, api_key=api_key + "-wrong", timeout=timeout, max_retries=0)
            try:
                bad.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            except anthropic.AuthenticationError:
                return "a wrong key is refused (401)"
            raise AssertionError("a wrong API key was accepted")

        attempt("openai with a wrong key", refused)
        attempt("anthropic with a wrong key", refused_anthropic)
    if cache:
        checks.append(_check_cache(base, api_key, before))
    return checks


def _cache_metrics(base: str, api_key: str | None):
    from .metrics import fetch_server_metrics

    try:
        return fetch_server_metrics(base, api_key=api_key).moe_cache
    except (ServerError, MetricsError) as exc:
        return exc


def _check_cache(base: str, api_key: str | None, before) -> ApiCheck:
    """The cache's series are there and the requests above looked their experts up (hits + misses + refused
    moved)."""
    after = _cache_metrics(base, api_key)
    for m in (before, after):
        if isinstance(m, Exception):
            return ApiCheck("moe cache", False, str(m))
    if after is None:
        return ApiCheck("moe cache", False, "/metrics has no llamacpp:moe_cache_* series: the server has no MoE cache "
                                            "(--moe-cache-mib N)")
    looked = (after.n_hit + after.n_miss + after.n_refused) - (before.n_hit + before.n_miss + before.n_refused)
    if looked <= 0:
        return ApiCheck("moe cache", False, f"the requests looked up no expert: the lookups stayed at "
                                            f"{after.n_hit + after.n_miss + after.n_refused}")
    mode = "hybrid" if after.hybrid else "upload mode"
    return ApiCheck("moe cache", True, f"{mode}, {after.n_slots} slots, {after.n_bytes_cache / 2**20:.2f} MiB: the checks "
                                       f"looked up {looked} experts, hit rate {after.hit_rate:.3f} since the start")


def serve_and_check(model: str | Path, profile: str | Path, cache_mib: float = 256, timeout: float = 60.0,
                    workdir: str | Path | None = None, log=print) -> list[ApiCheck]:
    """The contract's form: llama-server with the cache (MODEL, PROFILE, --cache-mib), /metrics and a fresh key
    given in its environment, checked, then stopped with one SIGTERM. Without a GPU the cache runs in RAM
    (--moe-cache-device CPU), which checks the endpoints and the series, not the speed."""
    from ...devices import gpus
    from .plan import API_KEY_ENV
    from .process import server_binary, start_server

    model, profile = Path(model), Path(profile)
    for what, path in (("model", model), ("profile", profile)):
        if not path.is_file():
            raise LlamaMoeError(f"the {what} {path}: no such file")
    if not cache_mib > 0:
        raise LlamaMoeError(f"--cache-mib must be > 0, got {cache_mib:g}")
    _clients()
    gpu = bool(gpus())
    key = secrets.token_urlsafe(16)
    env = {API_KEY_ENV: key}
    args = ["-m", str(model), "-ngl", "999", "--cpu-moe", "--moe-cache-mib", f"{cache_mib:g}", "--moe-cache-profile",
            str(profile), "-c", "2048", "--parallel", "1", "--metrics", "--alias", "default"]
    if not gpu:
        args += ["--moe-cache-device", "CPU", "--no-repack"]  # the cache cannot slice experts out of repacked tensors
        log("no GPU: the cache runs in RAM (--moe-cache-device CPU), which checks the API and the series")
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="check-api-"))
    work.mkdir(parents=True, exist_ok=True)
    with start_server(server_binary(), args, work / "server.log", env=env) as server:
        log(f"serving {model.name} at {server.url} (log: {server.log})")
        return check_api(server.url, key, "default", timeout)


def reachable(server: str) -> None:
    """A server that does not answer at all is an error (exit 2), not four failed checks: any HTTP answer to
    /health, even a refusal, is a server to check."""
    import requests

    try:
        requests.get(server.rstrip("/") + "/health", timeout=30)
    except requests.RequestException as exc:
        raise LlamaMoeError(f"cannot reach {server}: {request_error(exc)}") from None
