"""Chat over a context: messages formatted with the model's own chat template (llama.cpp's
``llama_chat_apply_template``), answered up to the template's end of turn.

A conversation is formatted whole on every call and evaluated in sequence 0; the tokens it shares with what
that sequence already holds (the previous turn, as a rule) are kept, not evaluated again. The text the model
writes is returned as it came: a tool or function call in it is neither parsed nor altered. A ``grammar`` or a
``response_format`` holds the answer to a language or a JSON schema (llama_moe.structured).
"""
from __future__ import annotations

import codecs
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence, Union

from ._native.ffi import ffi
from .context import GREEDY, Context, Sampling, _Sampler
from .errors import ChatTemplateError, ParameterError
from .model import Model
from .result_stream import ResultStream
from .structured import resolve_grammar

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation; a mapping with the keys ``role`` and ``content`` is taken as well."""

    role: str
    content: str


Message = Union[ChatMessage, Mapping[str, str]]


@dataclass(frozen=True)
class ChatResult:
    """The assistant's answer: its text and tokens (the end-of-turn token not among them), why it ended
    (``"stop"``: the end of the turn or a stop string; ``"length"``: ``max_tokens`` or the context's end), the
    formatted prompt and its tokens, how many of those were kept from before, and the timings."""

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    prompt: str
    prompt_tokens: tuple[int, ...]
    n_reused: int
    prompt_seconds: float
    gen_seconds: float

    @property
    def message(self) -> dict[str, str]:
        """The answer as the next turn's input takes it."""
        return {"role": "assistant", "content": self.text}

    @property
    def gen_tps(self) -> float:
        return len(self.tokens) / self.gen_seconds if self.gen_seconds > 0 else 0.0


def _message(i: int, m: Any) -> tuple[str, str]:
    if isinstance(m, ChatMessage):
        role, content = m.role, m.content
    elif isinstance(m, Mapping):
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise ParameterError(f"messages[{i}]: only 'role' and 'content' are formatted, got {extra} too "
                                 f"(a tool call goes into the content as the model writes it)")
        if "role" not in m or "content" not in m:
            raise ParameterError(f"messages[{i}] needs a 'role' and a 'content', got {sorted(m)}")
        role, content = m["role"], m["content"]
    else:
        raise ParameterError(f"messages[{i}] must be a ChatMessage or a mapping with 'role' and 'content', "
                             f"got {type(m).__name__}")
    if role not in ROLES:
        raise ParameterError(f"messages[{i}]: role must be one of {', '.join(ROLES)}, got {role!r}")
    if not isinstance(content, str) or "\0" in content:
        raise ParameterError(f"messages[{i}]: content must be a string without NUL, got {content!r:.60}")
    return role, content


def check_messages(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """The (role, content) pairs of a conversation, or ParameterError naming the message that is wrong."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ParameterError(f"messages must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ParameterError("messages is empty: a conversation needs at least one message")
    return [_message(i, m) for i, m in enumerate(messages)]


def builtin_templates() -> tuple[str, ...]:
    """The names of the templates llama.cpp knows without a model ("chatml", "llama3", ...)."""
    from ._native.loader import get_lib

    lib = get_lib()
    n = int(lib.llama_chat_builtin_templates(ffi.NULL, 0))
    names = ffi.new("const char *[]", max(n, 1))
    n = min(n, int(lib.llama_chat_builtin_templates(names, n)))
    return tuple(ffi.string(names[i]).decode() for i in range(n))


def model_template(model: Model, name: str | None = None) -> str | None:
    """The model's own template (GGUF ``tokenizer.chat_template``, or ``tokenizer.chat_template.NAME``), or None."""
    ptr = model._lib.llama_model_chat_template(model._native, ffi.NULL if name is None else name.encode())
    return None if ptr == ffi.NULL else ffi.string(ptr).decode("utf-8", "replace")


def resolve_template(model: Model, template: str | None) -> str:
    """What llama_chat_apply_template is given: the model's template (None), a template the model names, a
    built-in name, or a template's text (anything with ``{%`` or ``{{``)."""
    if template is None:
        own = model_template(model)
        if own is None:
            raise ChatTemplateError(f"{model.path.name} has no chat template (tokenizer.chat_template); name one of "
                                    f"llama.cpp's: {', '.join(builtin_templates())}")
        return own
    if not isinstance(template, str) or not template or "\0" in template:
        raise ParameterError(f"template must be a non-empty string without NUL or None, got {template!r:.60}")
    if "{%" in template or "{{" in template:
        return template
    own = model_template(model, template)
    if own is not None:
        return own
    if template in builtin_templates():
        return template
    raise ChatTemplateError(f"no chat template named {template!r}: {model.path.name} has no "
                            f"tokenizer.chat_template.{template}, and llama.cpp's own are "
                            f"{', '.join(builtin_templates())}")


def format_chat(model: Model, messages: Sequence[Message], template: str | None = None,
                add_generation_prompt: bool = True) -> str:
    """The conversation as the model reads it, ending with the assistant's turn opened (``add_generation_prompt``)."""
    pairs = check_messages(messages)
    tmpl = resolve_template(model, template)
    keep = [ffi.new("char[]", tmpl.encode())]
    arr = ffi.new("llama_chat_message[]", len(pairs))
    for i, (role, content) in enumerate(pairs):
        r, c = ffi.new("char[]", role.encode()), ffi.new("char[]", content.encode())
        keep += [r, c]
        arr[i].role, arr[i].content = r, c
    size = max(256, 2 * sum(len(c) + len(r) for r, c in pairs) + 256)
    while True:
        buf = ffi.new("char[]", size)
        n = int(model._lib.llama_chat_apply_template(keep[0], arr, len(pairs), add_generation_prompt, buf, size))
        if n < 0:
            raise ChatTemplateError(f"llama.cpp cannot apply the chat template {tmpl[:80]!r}: it applies only the "
                                    f"templates it recognises ({', '.join(builtin_templates())})")
        if n <= size:
            return ffi.buffer(buf, n)[:].decode("utf-8", "replace")
        size = n + 1


def _check_stop(stop: Sequence[str]) -> tuple[str, ...]:
    if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
        raise ParameterError(f"stop must be a list of non-empty strings, got {stop!r:.80}")
    return tuple(stop)


def _held_back(text: str, stop: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could begin a stop string (kept back from the stream)."""
    for n in range(min(len(text), max(map(len, stop)) - 1), 0, -1):
        if any(s.startswith(text[-n:]) for s in stop):
            return n
    return 0


def _reuse_prefix(ctx: Context, tokens: list[int]) -> int:
    """Keeps the longest prefix of ``tokens`` that sequence 0 already holds (one token short of all of them:
    the last is evaluated for its logits), drops the rest; returns the number kept. Called under the lock."""
    old = ctx._evaluated
    n = 0
    if len(old) == ctx.n_past:
        limit = min(len(old), len(tokens) - 1)
        while n < limit and old[n] == tokens[n]:
            n += 1
    if n == 0:
        ctx.reset()
        return 0
    if n < len(old):
        lib = ctx._lib
        if not lib.llama_memory_seq_rm(lib.llama_get_memory(ctx._live()), 0, n, -1):
            ctx.reset()  # a memory that cannot drop a tail (recurrent layers): start again
            return 0
        del old[n:]
        ctx.n_past = n
    return n


@dataclass(frozen=True)
class _Prepared:
    prompt: str
    tokens: list[int]
    budget: int
    stops: tuple[str, ...]
    t0: float
    sampler: _Sampler


def _prepare(ctx: Context, messages: Sequence[Message], max_tokens: int, sampling: Sampling, template: str | None,
             stop: Sequence[str], grammar: str | None, response_format: Mapping[str, Any] | None) -> _Prepared:
    """Everything checked before a token is evaluated: the messages, the template, the sizes, the grammar (the
    sampler is made here, so a grammar llama.cpp refuses is refused at the call)."""
    t0 = time.perf_counter()
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ParameterError(f"max_tokens must be a whole number >= 0, got {max_tokens!r}")
    stops = _check_stop(stop)
    constraint = resolve_grammar(grammar, response_format)
    model = ctx.model
    prompt = format_chat(model, messages, template)
    tokens = model.tokenize(prompt, add_special=True, parse_special=True)
    room = int(ctx._lib.llama_n_ctx_seq(ctx._live()))
    if len(tokens) >= room:
        raise ParameterError(f"the conversation is {len(tokens)} tokens: it does not fit the context's "
                             f"{room} positions with room for an answer")
    sampler = ctx._sampler(sampling, constraint)
    return _Prepared(prompt, tokens, min(max_tokens, room - len(tokens)), stops, t0, sampler)


def _run(ctx: Context, prep: _Prepared) -> Iterator[str]:
    """Yields the answer's text piece by piece; returns its ChatResult."""
    model, stops, budget = ctx.model, prep.stops, prep.budget
    with ctx._lock:
        n_reused = _reuse_prefix(ctx, prep.tokens)
    log.debug("chat: %d prompt tokens, %d kept from before", len(prep.tokens), n_reused)
    tokens: list[int] = []
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text, sent = "", 0
    finish = "length"
    t_first: float | None = None
    stream = ctx._generate(prep.tokens[n_reused:], budget, prep.sampler, stop_at_eog=True)
    try:
        for tok in stream:
            if t_first is None:
                t_first = time.perf_counter()
            tokens.append(tok)
            text += decoder.decode(model.token_to_piece(tok))
            if stops:
                cut = min((i for i in (text.find(s, sent) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                    if cut > sent:
                        yield text[sent:]
                    sent = len(text)
                    break
            end = len(text) - (_held_back(text, stops) if stops else 0)
            if end > sent:
                yield text[sent:end]
                sent = end
        else:
            if len(tokens) < budget:
                finish = "stop"  # the end-of-generation token
            text += decoder.decode(b"", final=True)
            if len(text) > sent:
                yield text[sent:]
    finally:
        stream.close()
    t_end = time.perf_counter()
    t_first = t_first or t_end
    return ChatResult(text, tuple(tokens), finish, prep.prompt, tuple(prep.tokens), n_reused, t_first - prep.t0,
                      t_end - t_first)


class ChatStream(ResultStream[str, ChatResult]):
    """An answer as it is made: iterating gives pieces of its text (never a split character); ``result`` is the
    ChatResult once the iteration ends. ``close()`` (or leaving a ``with`` block) stops it early."""

    def __init__(self, ctx: Context, messages: Sequence[Message], max_tokens: int = 256, sampling: Sampling = GREEDY, *,
                 template: str | None = None, stop: Sequence[str] = (), grammar: str | None = None,
                 response_format: Mapping[str, Any] | None = None) -> None:
        # refused at the call, not at the first next()
        prep = _prepare(ctx, messages, max_tokens, sampling, template, stop, grammar, response_format)
        super().__init__(_run(ctx, prep))


def chat(ctx: Context, messages: Sequence[Message], max_tokens: int = 256, sampling: Sampling | None = None, *,
         template: str | None = None, stop: Sequence[str] = (), grammar: str | None = None,
         response_format: Mapping[str, Any] | None = None) -> ChatResult:
    """The whole answer; the context's lock is held throughout, so a concurrent call waits its turn."""
    with ctx._lock:
        stream = ChatStream(ctx, messages, max_tokens, sampling or GREEDY, template=template, stop=stop,
                            grammar=grammar, response_format=response_format)
        for _ in stream:
            pass
    assert stream.result is not None
    return stream.result
