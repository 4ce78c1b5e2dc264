"""A context over a model: decoding batches, logits, and generation (greedy or sampled, streamed). Chat, several
sequences and sessions build on it (chat.py, batch.py, session.py: functions that take a Context)."""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ._native import check as _check
from ._native.cache_status import read_status, warn_status
from ._native.ffi import ffi
from ._native.handle import NativeHandle
from .errors import NativeCallError, ParameterError
from .model import Model
from .params import LLAMA_MAX_SEQ, ContextParams, check_sampling
from .stats import CacheDevice, LayerStats, MoeCacheStats, MoeCacheStatus, SeqStats
from .formats.trace import RoutingRecord, parse_stream
from .structured import check_grammar_text, grammar_sampler


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked. ``temperature == 0`` is greedy (argmax) and ignores the rest."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        check_sampling(self)  # ParameterError (a ValueError) naming the field


GREEDY = Sampling()


@dataclass(frozen=True)
class Perf:
    """llama.cpp's own timings since the context was created (or reset): prompt and generation."""

    n_prompt: int
    n_gen: int
    t_prompt_ms: float
    t_gen_ms: float

    @property
    def prompt_tps(self) -> float:
        return 1000.0 * self.n_prompt / self.t_prompt_ms if self.t_prompt_ms > 0 else 0.0

    @property
    def gen_tps(self) -> float:
        return 1000.0 * self.n_gen / self.t_gen_ms if self.t_gen_ms > 0 else 0.0


@dataclass(frozen=True)
class Completion:
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    text: str
    prompt_seconds: float
    gen_seconds: float
    stopped_by: str  # "eog" or "length"


class _Sampler:
    """A sampler chain: llama.cpp's grammar sampler first when there is a grammar (the tokens it does not allow
    are out before the others choose), then greedy, or top-k, top-p, temperature and a seeded draw. Made before
    anything is evaluated, so that a grammar llama.cpp refuses is a ParameterError at the call; freed by free(),
    or by the garbage collector for a stream that never started."""

    def __init__(self, lib: Any, sampling: Sampling, vocab: Any = None, grammar: str | None = None) -> None:
        constrain = grammar_sampler(lib, vocab, grammar) if grammar is not None else None  # ParameterError
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if constrain is not None:
            lib.llama_sampler_chain_add(chain, constrain)  # the chain owns it now
        if sampling.temperature == 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            if sampling.top_k > 0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(sampling.top_k))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(sampling.top_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(sampling.temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(sampling.seed & 0xFFFFFFFF))
        self.chain = chain
        # frees nothing but the sampler's own memory: it may outlive the model (a grammar keeps a vocabulary
        # pointer it reads only while sampling)
        self._free = weakref.finalize(self, lib.llama_sampler_free, chain)

    def free(self) -> None:
        self._free()
        self.chain = None


class Context(NativeHandle):
    """A llama.cpp context: KV cache, compute buffers and (with the patch series) the MoE expert cache.

    One thread at a time: every native call holds the context's lock, so concurrent calls queue.

    A context keeps its model's memory: after ``model.close()`` the context still decodes, generates,
    tokenizes (``tokenize``/``detokenize`` here) and rebalances, and the model is freed with the last of its
    contexts. A closed context raises ``ClosedError``, a generation in progress included.
    """

    _kind = "Context"

    def __init__(self, model: Model, params: ContextParams | None = None) -> None:
        super().__init__()
        self.model = model
        self.params = params or ContextParams()
        lib = model._lib
        native, keep = self.params._to_native(lib)
        # The context computes with the model's weights and vocabulary: it holds the model's memory until it is
        # freed itself, whatever happens to the Model first (close(), the garbage collector).
        held = model._hold()  # ClosedError on a closed model
        try:
            ptr = self._create(model, held, native)
        except BaseException:
            held.release()
            raise
        del keep  # the context copied the strings it needs
        self._lib = lib
        self._vocab = model._vocab
        n_batch = int(lib.llama_n_batch(ptr))
        batch = lib.llama_batch_init(n_batch, 0, 1)

        def free(p: Any = ptr, b: Any = batch, l: Any = lib) -> None:
            l.llama_batch_free(b)
            l.llama_free(p)  # joins the cache's threads (the mailbox's CPU side) before the model may go

        self._adopt(ptr, free, holds=(held,))
        self._batch = batch
        self._n_batch = n_batch
        self.n_past = 0
        self._evaluated: list[int] = []  # the tokens of sequence 0 in the KV cache, in order (chat reuses a prefix)

    def _create(self, model: Model, held: Any, native: Any) -> Any:
        lib = model._lib
        model.check_file()  # a memory-mapped file truncated since the load would crash the warm-up decode
        _check.begin()
        ptr = _check.check_ptr(lib.llama_init_from_model(held.ptr, native), "llama_init_from_model",
                               "could not create the context")
        # what the engine made of the cache asked for: read once, it does not change while the context lives
        self._cache_status = read_status(lib, ptr)
        # every setting the engine refused, with its reason (without a size: those given for nothing)
        tier_alone = self.params.moe_cache_mib == 0 and self.params.moe_ram_mib != 0
        warn_status(self._cache_status, self.params.moe_ram_mib if tier_alone else self.params.moe_cache_mib, stacklevel=3,
                    name="moe_ram_mib" if tier_alone else "moe_cache_mib")
        return ptr

    def cache_status(self) -> MoeCacheStatus:
        """What became of the MoE cache asked for: on, partial or off, why, on which device, with how many slots
        per layer, in which mode (see MoeCacheStatus)."""
        with self._lock:
            self._live()
            return self._cache_status

    @property
    def moe_cache_off_reason(self) -> str | None:
        """Why the MoE cache asked for is off (the engine's words), or None when there is one or none was asked."""
        s = self._cache_status
        return s.text if s.state == "off" and self.params.moe_cache_on else None

    @property
    def n_ctx(self) -> int:
        with self._lock:
            return int(self._lib.llama_n_ctx(self._live()))

    def reset(self) -> None:
        """Forgets the evaluated tokens (clears the KV cache)."""
        with self._lock:
            self._lib.llama_memory_clear(self._lib.llama_get_memory(self._live()), True)
            self.n_past = 0
            self._evaluated.clear()

    def decode(self, tokens: Sequence[int], all_logits: bool = False) -> None:
        """Evaluates tokens after the ones already evaluated, in chunks of n_batch; the last token's
        logits (or every token's, with ``all_logits``, for the last chunk) become readable."""
        if not tokens:
            raise ParameterError("decode needs at least one token")
        with self._lock:
            ptr = self._live()
            n_vocab = self._vocab.n_tokens
            for t in tokens:
                if not 0 <= t < n_vocab:
                    raise ParameterError(f"token id {t} is outside the vocabulary (0..{n_vocab - 1})")
            if self.n_past + len(tokens) > self.n_ctx:
                raise ParameterError(f"{self.n_past} + {len(tokens)} tokens do not fit the context of {self.n_ctx}")
            b = self._batch
            for start in range(0, len(tokens), self._n_batch):
                chunk = tokens[start:start + self._n_batch]
                last_chunk = start + self._n_batch >= len(tokens)
                b.n_tokens = len(chunk)
                for i, tok in enumerate(chunk):
                    b.token[i] = tok
                    b.pos[i] = self.n_past + i
                    b.n_seq_id[i] = 1
                    b.seq_id[i][0] = 0
                    b.logits[i] = 1 if last_chunk and (all_logits or i == len(chunk) - 1) else 0
                _check.check(self._lib.llama_decode(ptr, b), "llama_decode", _check.DECODE_CODES)
                self.n_past += len(chunk)
                self._evaluated.extend(chunk)

    def logits(self, i: int = -1) -> np.ndarray:
        """A copy of the logits of output ``i`` of the last decode (-1: the last)."""
        with self._lock:
            ptr = self._lib.llama_get_logits_ith(self._live(), i)
            if ptr == ffi.NULL:
                raise NativeCallError("llama_get_logits_ith", None, f"no logits for output {i}")
            n = self._vocab.n_tokens
            return np.frombuffer(ffi.buffer(ptr, 4 * n), dtype=np.float32).copy()

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, sampling: Sampling = GREEDY,
                 stop_at_eog: bool = True, *, grammar: str | None = None) -> Iterator[int]:
        """Evaluates the prompt, then yields up to ``max_tokens`` new tokens one by one as they are made.
        An empty prompt continues from where the last decode or generation stopped (decoding in chunks).
        ``grammar`` (GBNF text, start symbol ``root``) holds the new tokens to its language (llama_moe.structured).
        The arguments, the grammar included, are checked at the call, before anything is evaluated."""
        if max_tokens < 0:
            raise ParameterError(f"max_tokens must be >= 0, got {max_tokens}")
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens and self.n_past == 0:
            raise ParameterError("an empty prompt continues a sequence, but nothing has been decoded yet")
        return self._generate(tokens, max_tokens, self._sampler(sampling, grammar), stop_at_eog)

    def _sampler(self, sampling: Sampling, grammar: str | None) -> _Sampler:
        grammar = check_grammar_text(grammar)
        with self._lock:
            self._live()
            return _Sampler(self._lib, sampling, self._vocab, grammar)

    def _generate(self, tokens: list[int], max_tokens: int, sampler: _Sampler, stop_at_eog: bool) -> Iterator[int]:
        """generate()'s tokens, with its sampler made and its arguments checked; frees the sampler at the end."""
        try:
            if tokens:
                self.decode(tokens)
            for _ in range(max_tokens):
                with self._lock:
                    tok = int(self._lib.llama_sampler_sample(sampler.chain, self._live(), -1))
                    eog = self._vocab.is_eog(tok)
                if stop_at_eog and eog:
                    return
                yield tok
                self.decode([tok])
        finally:
            sampler.free()

    def complete(self, prompt: str | Sequence[int], max_tokens: int = 128, sampling: Sampling = GREEDY,
                 stop_at_eog: bool = True, *, grammar: str | None = None) -> Completion:
        """Generates to the end (or ``max_tokens``) and returns the text with its timings."""
        prompt_tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        out: list[int] = []
        t0 = time.perf_counter()
        t_first = None
        stream = self.generate(prompt_tokens, max_tokens, sampling, stop_at_eog, grammar=grammar)
        for tok in stream:
            if t_first is None:
                t_first = time.perf_counter()
            out.append(tok)
        t_end = time.perf_counter()
        t_first = t_first or t_end
        return Completion(tuple(prompt_tokens), tuple(out), self.detokenize(out), t_first - t0, t_end - t_first,
                          "length" if len(out) == max_tokens else "eog")

    # -- the model's vocabulary, through the context: it works after model.close() while the context is open
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        with self._lock:
            self._live()
            return self._vocab.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        with self._lock:
            self._live()
            return self._vocab.detokenize(tokens, remove_special, unparse_special)

    # -- the MoE cache -------------------------------------------------------------------------------
    def moe_cache_stats(self) -> MoeCacheStats | None:
        """The cache's counters, or None when this context has no MoE cache."""
        with self._lock:
            out = ffi.new("struct llama_moe_cache_stats *")
            if not self._lib.llama_moe_cache_get_stats(self._live(), out):
                return None
            return MoeCacheStats._from_native(out)

    def moe_cache_seq_stats(self, seq: int) -> SeqStats | None:
        """Sequence ``seq``'s share of the cache's counters (see SeqStats), or None without a MoE cache."""
        if not 0 <= seq < LLAMA_MAX_SEQ:
            raise ParameterError(f"seq must be from 0 to {LLAMA_MAX_SEQ - 1}, got {seq}")
        with self._lock:
            out = ffi.new("struct llama_moe_cache_seq_stats *")
            if not self._lib.llama_moe_cache_get_seq_stats(self._live(), seq, out):
                return None
            return SeqStats(int(out.n_hit), int(out.n_miss), int(out.n_refused), int(out.n_bytes_upload),
                            int(out.n_bytes_cpu), int(out.n_upload), int(out.n_cpu), int(out.n_hit_peer))

    def layer_stats(self) -> list[LayerStats]:
        """One entry per layer the cache serves (empty without a cache)."""
        with self._lock:
            ptr = self._live()
            n = self._lib.llama_moe_cache_get_layer_stats(ptr, ffi.NULL, 0)
            arr = ffi.new("struct llama_moe_cache_layer_stats[]", max(n, 1))
            n = min(n, self._lib.llama_moe_cache_get_layer_stats(ptr, arr, n))
            return [LayerStats(int(a.il), int(a.n_slots), int(a.n_hit), int(a.n_hit_profile), int(a.n_miss),
                               int(a.n_refused), int(a.n_cpu), int(a.n_slots_peer), int(a.n_hit_peer),
                               int(a.n_bytes_disk), int(a.disk_wait_us)) for a in arr[0:n]]

    def cache_devices(self) -> list[CacheDevice]:
        """The devices that hold the cache's slots, with the layers each holds (empty without a cache): one, or,
        with the model's layers split across devices, one per device."""
        with self._lock:
            ptr = self._live()
            n = self._lib.llama_moe_cache_get_devices(ptr, ffi.NULL, 0)
            arr = ffi.new("struct llama_moe_cache_device_status[]", max(n, 1))
            n = min(n, self._lib.llama_moe_cache_get_devices(ptr, arr, n))
            layers: list[list[int]] = [[] for _ in range(n)]
            for il in range(self.model.n_layer):
                k = self._lib.llama_moe_cache_get_layer_device(ptr, il)
                if 0 <= k < n:
                    layers[k].append(il)
            return [CacheDevice(name=ffi.string(a.name).decode("utf-8", "replace"),
                                description=ffi.string(a.description).decode("utf-8", "replace"), layers=tuple(layers[k]),
                                n_slots=int(a.n_slots), n_slots_total=int(a.n_slots_total), n_bytes=int(a.n_bytes),
                                n_hit=int(a.n_hit), n_miss=int(a.n_miss), n_cpu=int(a.n_cpu))
                    for k, a in enumerate(arr[0:n])]

    def resident(self, il: int) -> np.ndarray:
        """The expert ids the cache holds in layer ``il`` now, ascending (empty for a layer it does not serve)."""
        with self._lock:
            ptr = self._live()
            n = self._lib.llama_moe_cache_get_resident(ptr, il, ffi.NULL, 0)
            arr = ffi.new("int32_t[]", max(n, 1))
            n = min(n, self._lib.llama_moe_cache_get_resident(ptr, il, arr, n))
            return np.frombuffer(ffi.buffer(arr, 4 * n), dtype=np.int32).copy()

    def rebalance(self, max_swaps: int = 64) -> int:
        """Adaptive cache: swaps up to ``max_swaps`` of the hottest experts the cache lacks for the coldest it
        holds (free slots first), now, between two decodes. Returns the number swapped in, or -1 when this
        context has no adaptive cache (``moe_cache_hybrid`` and ``moe_cache_adaptive``)."""
        if max_swaps < 0:
            raise ParameterError(f"max_swaps must be >= 0, got {max_swaps}")
        with self._lock:
            return int(self._lib.llama_moe_cache_rebalance(self._live(), max_swaps))

    def admit_experts(self, il: int, experts: Sequence[int]) -> int:
        """Uploads the given experts of layer ``il`` that the cache lacks, first given first, into its free or
        least recently used slots, now, between two decodes (at most the layer's slots; counted in
        ``MoeCacheStats.n_admit``). Returns how many were uploaded: 0 for a layer the cache does not look up
        (held whole, or not cached). Any cache mode; ParameterError without a cache or for an id outside the
        layer's experts."""
        ids = [int(e) for e in experts]
        with self._lock:
            ptr = self._live()
            if not self._lib.llama_moe_cache_get_stats(ptr, ffi.new("struct llama_moe_cache_stats *")):
                raise ParameterError("admit_experts: this context has no MoE cache")
            n = int(self._lib.llama_moe_cache_admit_experts(ptr, int(il), ffi.new("int32_t[]", ids or [0]), len(ids)))
        if n < 0:
            raise ParameterError(f"admit_experts: an expert id of layer {il} is out of range: {ids}")
        return n

    # -- routing traces --------------------------------------------------------------------------------
    def start_trace(self) -> None:
        """Records the experts every MoE layer selects from now on (one device sync per layer while on)."""
        with self._lock:
            self._lib.llama_moe_trace_start(self._live())

    def stop_trace(self) -> list[RoutingRecord]:
        """Stops recording and returns what was recorded since start_trace, one record per ubatch and layer."""
        with self._lock:
            ptr = self._live()
            self._lib.llama_moe_trace_stop(ptr)
            n = self._lib.llama_moe_trace_get(ptr, ffi.NULL, 0)
            buf = np.empty(max(n, 1), dtype=np.int32)
            n = min(n, self._lib.llama_moe_trace_get(ptr, ffi.cast("int32_t *", buf.ctypes.data), n))
            return parse_stream(buf[:n])

    def perf(self) -> Perf:
        with self._lock:
            d = self._lib.llama_perf_context(self._live())
            return Perf(int(d.n_p_eval), int(d.n_eval), float(d.t_p_eval_ms), float(d.t_eval_ms))

    def reset_perf(self) -> None:
        with self._lock:
            self._lib.llama_perf_context_reset(self._live())

    def __repr__(self) -> str:
        return f"<Context {'closed' if self.closed else f'n_ctx={self.n_ctx} n_past={self.n_past}'}>"
