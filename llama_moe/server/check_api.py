"""A served model's OpenAI and Anthropic endpoints, with and without the API key, through the official clients
(``pip install openai anthropic``; ``python -m llama_moe check-api --server URL``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import LlamaMoeError
from .http import request_error


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


def check_api(server: str, api_key: str | None = None, model: str = "default", timeout: float = 60.0) -> list[ApiCheck]:
    openai, anthropic = _clients()
    base = server.rstrip("/")
    checks: list[ApiCheck] = []

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
    return checks


def reachable(server: str) -> None:
    """A server that does not answer at all is an error (exit 2), not four failed checks: any HTTP answer to
    /health, even a refusal, is a server to check."""
    import requests

    try:
        requests.get(server.rstrip("/") + "/health", timeout=30)
    except requests.RequestException as exc:
        raise LlamaMoeError(f"cannot reach {server}: {request_error(exc)}") from None
