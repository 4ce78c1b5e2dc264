"""A llama-cpp-python-shaped front for code that moves here: ``Llama(model_path=..., n_ctx=...)`` with
``create_completion`` and ``create_chat_completion``, which take ``grammar`` (GBNF text) and ``response_format``
and return OpenAI-shaped dicts. A thin layer over Model and Context: streaming, several sequences, the MoE cache
and its statistics are the binding's own API (``llm.model``, ``llm.context``)."""
from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any, Mapping, Sequence

from .chat import Message, chat
from .context import Context, Sampling
from .errors import ParameterError
from .model import Model
from .params import ContextParams, ModelParams


class Llama:
    """One model and one context over it. ``model_params`` and ``context_params`` take everything else the binding
    offers (``ContextParams(moe_cache_mib=...)``, ``ModelParams(cpu_moe=True)``); given, they win over the
    llama-cpp-python-style arguments."""

    def __init__(self, model_path: str | os.PathLike[str], *, n_ctx: int = 512, n_batch: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int = 0, seed: int = 0,
                 model_params: ModelParams | None = None, context_params: ContextParams | None = None) -> None:
        self.model_path = str(model_path)
        self.model = Model(model_path, model_params or ModelParams(n_gpu_layers=n_gpu_layers))
        try:
            self.context = Context(self.model, context_params or ContextParams(n_ctx=n_ctx, n_batch=n_batch,
                                                                               n_threads=n_threads))
        except BaseException:
            self.model.close()
            raise
        self._seeds = random.Random(seed)  # a call without a seed draws one: calls differ, runs repeat

    def close(self) -> None:
        self.context.close()
        self.model.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sampling(self, temperature: float, top_p: float, top_k: int, seed: int | None) -> Sampling:
        return Sampling(temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=self._seeds.randrange(2**32) if seed is None else seed)

    def _answer(self, kind: str, choice: dict[str, Any], n_prompt: int, n_completion: int) -> dict[str, Any]:
        return {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
                "created": int(time.time()), "model": self.model_path, "choices": [{"index": 0, **choice}],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                          "total_tokens": n_prompt + n_completion}}

    def create_completion(self, prompt: str, max_tokens: int | None = 16, temperature: float = 0.8,
                          top_p: float = 0.95, top_k: int = 40, seed: int | None = None,
                          stop: str | Sequence[str] | None = None, grammar: str | None = None) -> dict[str, Any]:
        """The prompt continued, as OpenAI's completions answer (``object``: ``text_completion``). ``max_tokens``
        None or below 1 runs to the end of the context."""
        if not isinstance(prompt, str):
            raise ParameterError(f"prompt must be a str, got {type(prompt).__name__}")
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        if not all(isinstance(s, str) and s for s in stops):
            raise ParameterError(f"stop must be a non-empty string or a list of them, got {stop!r:.80}")
        ctx = self.context
        tokens = ctx.tokenize(prompt)
        room = ctx.n_ctx - len(tokens)
        if room < 1:
            raise ParameterError(f"the prompt is {len(tokens)} tokens: it does not fit n_ctx={ctx.n_ctx} with room "
                                 f"for an answer")
        budget = room if max_tokens is None or max_tokens < 1 else min(max_tokens, room)
        out: list[int] = []
        text, finish = "", "length"
        # checked (the grammar included) before the context is cleared; evaluated from the first next()
        stream = ctx.generate(tokens, budget, self._sampling(temperature, top_p, top_k, seed), grammar=grammar)
        ctx.reset()
        try:
            for tok in stream:
                out.append(tok)
                text = ctx.detokenize(out)
                cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                    break
            else:
                finish = "length" if len(out) >= budget else "stop"
        finally:
            stream.close()
            ctx.reset()
        return self._answer("text_completion", {"text": text, "logprobs": None, "finish_reason": finish},
                            len(tokens), len(out))

    def create_chat_completion(self, messages: Sequence[Message], max_tokens: int | None = None,
                               temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                               seed: int | None = None, stop: str | Sequence[str] | None = None,
                               response_format: Mapping[str, Any] | None = None,
                               grammar: str | None = None) -> dict[str, Any]:
        """The assistant's answer, as OpenAI's chat completions answer (``object``: ``chat.completion``), with the
        model's chat template; ``response_format`` as OpenAI takes it (``json_object``, ``json_schema``). The
        conversation's start that the last call evaluated is kept, not evaluated again."""
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        budget = self.context.n_ctx if max_tokens is None or max_tokens < 1 else max_tokens
        res = chat(self.context, messages, budget, self._sampling(temperature, top_p, top_k, seed), stop=stops,
                   grammar=grammar, response_format=response_format)
        return self._answer("chat.completion", {"message": res.message, "logprobs": None,
                                                "finish_reason": res.finish_reason},
                            len(res.prompt_tokens), len(res.tokens))
