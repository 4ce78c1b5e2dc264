"""Tracing: runs the engine over a text and records which experts every MoE layer selected."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..experts import ExpertLayout
from ...formats.trace import RoutingRecord, write_trace
from ..errors import ToolInputError

DEFAULT_UBATCH = 32  # tokens per decode: routing does not depend on batching, and 32 is far faster than 1


def iter_trace(model_path: str | os.PathLike[str], text: str, n_ctx: int = 4096, n_threads: int | None = None,
               ubatch: int = DEFAULT_UBATCH, progress: Callable[[int, int], None] | None = None) -> Iterator[RoutingRecord]:
    """Yields the routing of ``text``, one record per ubatch and MoE layer, in engine order. The text is cut
    into windows of ``n_ctx`` tokens, each evaluated from an empty context, in decodes of ``ubatch`` tokens.
    ``progress(tokens done, tokens in all)`` is called after each decode."""
    from ...context import Context
    from ...model import Model
    from ...params import ContextParams, ModelParams

    if ubatch < 1 or n_ctx < 1:
        raise ToolInputError(f"ubatch and ctx must be at least 1, got ubatch {ubatch} and ctx {n_ctx}")
    if not text.strip():
        raise ToolInputError("the text is empty: nothing to trace")
    ubatch = min(ubatch, n_ctx)
    cp = ContextParams(n_ctx=n_ctx, n_batch=ubatch, n_ubatch=ubatch, n_threads=n_threads)
    cp.validate()  # before the model loads
    # experts in RAM in their file layout, as the cache runs them; the routing is the same anywhere
    with Model(model_path, ModelParams(cpu_moe=True, repack=False)) as model:
        tokens = model.tokenize(text)
        with Context(model, cp) as ctx:
            done = 0
            for start in range(0, len(tokens), n_ctx):
                window = tokens[start:start + n_ctx]
                ctx.reset()
                ctx.start_trace()
                for a in range(0, len(window), ubatch):
                    # every token's logits: else llama.cpp's last layer computes (and routes) only the last token
                    ctx.decode(window[a:a + ubatch], all_logits=True)
                    done += len(window[a:a + ubatch])
                    if progress:
                        progress(done, len(tokens))
                yield from ctx.stop_trace()  # per window: the native buffer stays small


def trace_text(model_path: str | os.PathLike[str], text: str, n_ctx: int = 4096, n_threads: int | None = None,
               ubatch: int = DEFAULT_UBATCH, progress: Callable[[int, int], None] | None = None) -> list[RoutingRecord]:
    """The routing of ``text`` as a list (see iter_trace)."""
    return list(iter_trace(model_path, text, n_ctx, n_threads, ubatch, progress))


@dataclass(frozen=True)
class TraceReport:
    model: str
    text: str
    out: str
    n_tokens: int
    n_layers: int        # MoE layers traced
    k: int               # experts per token
    n_records: int       # (token, layer) records written
    bytes: int
    seconds: float
    ctx: int
    ubatch: int

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0


def trace_to_file(model_path: str | os.PathLike[str], text: str, text_name: str, out: str | os.PathLike[str],
                  layout: ExpertLayout, n_ctx: int = 4096, n_threads: int | None = None, ubatch: int = DEFAULT_UBATCH,
                  progress: Callable[[int, int], None] | None = None) -> TraceReport:
    """Traces ``text`` (``iter_trace``) into the routing trace file ``out``, written whole or not at all."""
    tokens = 0

    def counted(records: Iterator[RoutingRecord]) -> Iterator[RoutingRecord]:
        nonlocal tokens
        for rec in records:
            if rec.il == layout.layers[0].il:
                tokens += rec.n_tokens
            yield rec

    t0 = time.monotonic()
    n = write_trace(out, counted(iter_trace(model_path, text, n_ctx, n_threads, ubatch, progress)))
    return TraceReport(str(model_path), text_name, str(out), tokens, layout.n_moe_layers, layout.n_expert_used, n,
                       Path(out).stat().st_size, time.monotonic() - t0, n_ctx, ubatch)
