"""Several sequences in one context: up to ``ContextParams.n_seq_max`` prompts generated together.

The prompts are evaluated first (packed into batches of ``n_batch`` tokens), then every step decodes one
token of each sequence still going in a single llama_batch, so the MoE layers (and the expert cache) see a
ubatch of as many tokens as there are live sequences. Each sequence has its own sampler, its own
``max_tokens``, its own grammar state (a ``grammar``: one for all or one per prompt) and its own end; the others
go on when one finishes. Sequence ``i`` is llama.cpp's sequence ``i``, with ``n_ctx // n_seq_max`` positions of
its own. A run starts from an empty context and leaves it empty (``n_past`` 0): the sequences' KV is dropped at
the end.

Greedy, every cache mode gives each sequence exactly the tokens of the same batch without a cache. A sequence's
tokens need not be those its prompt gets decoded alone: the batched products round differently, and a near-tie
can go the other way.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from ._native import check as _check
from .context import GREEDY, Completion, Context, Sampling, _Sampler
from .errors import ParameterError
from .result_stream import ResultStream
from .structured import check_grammar_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchResult:
    """One Completion per prompt, in the prompts' order, and the run's timings: ``prompt_seconds`` evaluating
    the prompts (and sampling each first token), ``decode_seconds`` the steps after, which decoded
    ``n_decoded`` tokens in ``n_steps`` batches."""

    completions: tuple[Completion, ...]
    prompt_seconds: float
    decode_seconds: float
    n_steps: int
    n_decoded: int

    @property
    def decode_tps(self) -> float:
        """Tokens decoded per second over all the sequences together."""
        return self.n_decoded / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.completions]


def _per_prompt(name: str, value: object, n: int) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ParameterError(f"{name}: {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n


class _Run:
    """The state of one batch run; ``steps()`` yields (index, token) and returns the BatchResult."""

    def __init__(self, ctx: Context, prompts: Sequence[str | Sequence[int]], max_tokens: int | Sequence[int],
                 sampling: Sampling | Sequence[Sampling], stop_at_eog: bool,
                 grammar: str | None | Sequence[str | None] = None) -> None:
        self.t0 = time.perf_counter()
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise ParameterError(f"prompts must be a list of strings or token lists, got {type(prompts).__name__}")
        if not prompts:
            raise ParameterError("prompts is empty: give at least one")
        lib = ctx._lib
        ptr = ctx._live()
        n_seq_max = int(lib.llama_n_seq_max(ptr))
        if len(prompts) > n_seq_max:
            raise ParameterError(f"{len(prompts)} prompts, but the context decodes at most n_seq_max={n_seq_max} "
                                 f"sequences together (ContextParams.n_seq_max)")
        if len(prompts) > ctx._n_batch:
            raise ParameterError(f"{len(prompts)} prompts, but a step's batch holds n_batch={ctx._n_batch} tokens")
        self.n_ctx_seq = int(lib.llama_n_ctx_seq(ptr))
        n_vocab = ctx.model.n_vocab
        self.prompts: list[list[int]] = []
        for i, p in enumerate(prompts):
            tokens = ctx.model.tokenize(p) if isinstance(p, str) else list(p)
            if not tokens:
                raise ParameterError(f"prompts[{i}] is empty")
            bad = [t for t in tokens if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab]
            if bad:
                raise ParameterError(f"prompts[{i}]: token {bad[0]!r} is outside the vocabulary (0..{n_vocab - 1})")
            if len(tokens) > self.n_ctx_seq:
                raise ParameterError(f"prompts[{i}] is {len(tokens)} tokens; each sequence has {self.n_ctx_seq} "
                                     f"positions (n_ctx // n_seq_max)")
            self.prompts.append(tokens)
        n = len(self.prompts)
        self.max_tokens = _per_prompt("max_tokens", max_tokens, n)
        for m in self.max_tokens:
            if isinstance(m, bool) or not isinstance(m, int) or m < 0:
                raise ParameterError(f"max_tokens must be a whole number >= 0 (or one per prompt), got {m!r}")
        self.samplings = _per_prompt("sampling", sampling, n)
        for s in self.samplings:
            if not isinstance(s, Sampling):
                raise ParameterError(f"sampling must be a Sampling (or one per prompt), got {s!r}")
        if not isinstance(stop_at_eog, bool):
            raise ParameterError(f"stop_at_eog must be True or False, got {stop_at_eog!r}")
        grammars = [check_grammar_text(g) for g in _per_prompt("grammar", grammar, n)]
        self.ctx, self.stop_at_eog = ctx, stop_at_eog
        # one sampler per sequence, each with a grammar state of its own; made here, before anything is
        # evaluated, so that a grammar llama.cpp refuses is refused at the call
        self.samplers = [ctx._sampler(s, g) for s, g in zip(self.samplings, grammars)]

    def _decode(self) -> None:
        ctx = self.ctx
        _check.check(ctx._lib.llama_decode(ctx._live(), ctx._batch), "llama_decode", _check.DECODE_CODES)

    def steps(self) -> Iterator[tuple[int, int]]:
        ctx, lib, n = self.ctx, self.ctx._lib, len(self.prompts)
        out: list[list[int]] = [[] for _ in range(n)]
        stopped = ["length"] * n
        done = [m == 0 for m in self.max_tokens]
        pos = [len(p) for p in self.prompts]
        t_first: list[float | None] = [None] * n
        t_done: list[float | None] = [None] * n
        samplers = self.samplers
        n_steps = n_decoded = 0
        t_prompt = t_steps = 0.0
        b, cap = ctx._batch, ctx._n_batch

        def take(i: int, tok: int) -> bool:
            """Sequence i's new token; True when it is to be yielded."""
            now = time.perf_counter()
            if t_first[i] is None:
                t_first[i] = now
            if self.stop_at_eog and ctx.model.is_eog(tok):
                done[i], stopped[i], t_done[i] = True, "eog", now
                return False
            out[i].append(tok)
            if len(out[i]) >= self.max_tokens[i] or pos[i] >= self.n_ctx_seq:
                done[i], t_done[i] = True, now
            return True

        try:
            with ctx._lock:
                ctx.reset()
                # the prompts, packed: each chunk's last-token outputs are sampled before the next chunk
                flat = [(i, j, t) for i, p in enumerate(self.prompts) for j, t in enumerate(p)]
                first: list[tuple[int, int]] = []
                for start in range(0, len(flat), cap):
                    chunk = flat[start:start + cap]
                    b.n_tokens = len(chunk)
                    ends = []
                    for k, (i, j, tok) in enumerate(chunk):
                        b.token[k], b.pos[k], b.n_seq_id[k], b.seq_id[k][0] = tok, j, 1, i
                        last = j == len(self.prompts[i]) - 1
                        b.logits[k] = 1 if last else 0
                        if last:
                            ends.append((i, k))
                    self._decode()
                    for i, k in ends:
                        if not done[i]:
                            tok = int(lib.llama_sampler_sample(samplers[i].chain, ctx._live(), k))
                            if take(i, tok):
                                first.append((i, tok))
                t_prompt = time.perf_counter() - self.t0
            for i, tok in first:
                yield i, tok
            t_step0 = time.perf_counter()
            while not all(done):
                with ctx._lock:
                    live = [i for i in range(n) if not done[i]]
                    b.n_tokens = len(live)
                    for k, i in enumerate(live):
                        b.token[k], b.pos[k], b.n_seq_id[k], b.seq_id[k][0], b.logits[k] = out[i][-1], pos[i], 1, i, 1
                    self._decode()
                    n_steps += 1
                    n_decoded += len(live)
                    made = []
                    for k, i in enumerate(live):
                        pos[i] += 1
                        tok = int(lib.llama_sampler_sample(samplers[i].chain, ctx._live(), k))
                        if take(i, tok):
                            made.append((i, tok))
                for i, tok in made:
                    yield i, tok
            t_steps = time.perf_counter() - t_step0
        finally:
            with ctx._lock:
                for s in samplers:
                    s.free()
                if not ctx.closed:
                    ctx.reset()
        t_end = time.perf_counter()
        completions = []
        for i in range(n):
            first_at = t_first[i] or t_end
            done_at = t_done[i] or t_end
            completions.append(Completion(tuple(self.prompts[i]), tuple(out[i]), ctx.model.detokenize(out[i]),
                                          first_at - self.t0, done_at - first_at, stopped[i]))
        log.debug("batch: %d sequences, %d steps, %d tokens decoded in %.3f s", n, n_steps, n_decoded, t_steps)
        return BatchResult(tuple(completions), t_prompt, t_steps, n_steps, n_decoded)


class BatchStream(ResultStream[tuple[int, int], BatchResult]):
    """A batch run as it is made: iterating gives (prompt index, token) pairs; ``result`` is the BatchResult
    once the iteration ends. ``close()`` (or leaving a ``with`` block) stops every sequence."""

    def __init__(self, run: _Run) -> None:
        super().__init__(run.steps())


def stream_batch(ctx: Context, prompts: Sequence[str | Sequence[int]], max_tokens: int | Sequence[int] = 128,
                 sampling: Sampling | Sequence[Sampling] | None = None, stop_at_eog: bool = True, *,
                 grammar: str | None | Sequence[str | None] = None) -> BatchStream:
    """The (index, token) pairs of every sequence as they are made; the input is checked at the call."""
    return BatchStream(_Run(ctx, prompts, max_tokens, GREEDY if sampling is None else sampling, stop_at_eog, grammar))


def generate_batch(ctx: Context, prompts: Sequence[str | Sequence[int]], max_tokens: int | Sequence[int] = 128,
                   sampling: Sampling | Sequence[Sampling] | None = None, stop_at_eog: bool = True, *,
                   grammar: str | None | Sequence[str | None] = None) -> BatchResult:
    """Every sequence to its end; the context's lock is held throughout, so a concurrent call waits its turn.
    Greedy, any cache mode gives the tokens of the same batch without a cache, not necessarily each prompt's tokens
    decoded alone (see the module's docstring)."""
    with ctx._lock:
        stream = stream_batch(ctx, prompts, max_tokens, sampling, stop_at_eog, grammar=grammar)
        for _ in stream:
            pass
    assert stream.result is not None
    return stream.result
