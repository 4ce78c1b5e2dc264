"""Lifetimes on the real library: a context keeps its model's memory, so no order of close() calls or of garbage
collection frees a model under a context. A closed model refuses its own methods and new contexts with
ClosedError while its open contexts go on working (decoding, generating, tokenizing, the adaptive cache's
rebalance, traces, the mailbox); the model is freed with its last context. A closed context refuses every call,
a generation in progress included. (The same orders run under AddressSanitizer in test_lifecycle.py.)"""
from __future__ import annotations

import dataclasses
import gc
import warnings
from typing import Callable

import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.errors import ClosedError, LlamaMoeError
from support.cache_sizes import mib_for_slots

PROMPT = "The ship left the harbour at dawn"
N_GEN = 16


def _params(tiny_model_path) -> ContextParams:
    """The adaptive hybrid with 10 of 32 slots: rebalance() uploads experts read from the model's weights."""
    return ContextParams(moe_cache_device="CPU", n_ctx=512, moe_cache_mib=mib_for_slots(tiny_model_path, 10, hybrid=True),
                         moe_cache_hybrid=True, moe_cache_adaptive=True)


# no mmap: the weights are heap memory, which a read after its free corrupts silently (no SIGSEGV to notice)
RAM = ModelParams(cpu_moe=True, repack=False, use_mmap=False)


def _use(ctx: Context) -> tuple[list[int], list[int], int]:
    """Everything a context does with its model's memory: tokenize, decode, generate, swap experts in from the
    model's weights, trace, detokenize. Returns the generated tokens, the resident experts of layer 0 after the
    swaps, and the number of routing records."""
    ctx.reset()
    ctx.start_trace()
    tokens = list(ctx.generate(ctx.tokenize(PROMPT), N_GEN, stop_at_eog=False))
    swapped = ctx.rebalance(64)
    assert swapped >= 0, "the adaptive cache is off"
    more = list(ctx.generate([], 4, stop_at_eog=False))
    records = ctx.stop_trace()
    assert ctx.detokenize(tokens + more) and ctx.moe_cache_stats() is not None and ctx.layer_stats()
    return tokens + more, ctx.resident(0).tolist(), len(records)


@pytest.fixture(scope="module")
def reference(lib, tiny_model_path) -> tuple[list[int], list[int], int]:
    """What the context does when its model stays open throughout."""
    with Model(tiny_model_path, RAM) as model, Context(model, _params(tiny_model_path)) as ctx:
        return _use(ctx)


def _model_refuses(model: Model) -> None:
    for call in (lambda: model.n_layer, lambda: model.n_vocab, lambda: model.tokenize("x"), lambda: model.detokenize([1]),
                 lambda: model.is_eog(1), lambda: model.token_to_piece(1), lambda: model.meta("general.architecture"),
                 lambda: model.description, lambda: Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256))):
        with pytest.raises(ClosedError, match="this Model is closed"):
            call()


def _context_refuses(ctx: Context) -> None:
    for call in (lambda: ctx.decode([1]), lambda: ctx.logits(), lambda: list(ctx.generate([1], 2)), lambda: ctx.n_ctx,
                 lambda: ctx.tokenize("x"), lambda: ctx.detokenize([1]), lambda: ctx.rebalance(1), ctx.reset,
                 ctx.moe_cache_stats, ctx.layer_stats, lambda: ctx.resident(0), ctx.start_trace, ctx.stop_trace,
                 ctx.perf, ctx.reset_perf, lambda: ctx.complete("x", 2)):
        with pytest.raises(ClosedError, match="this Context is closed"):
            call()


def test_closed_objects_raise_a_llama_moe_error() -> None:
    assert issubclass(ClosedError, LlamaMoeError)


def test_model_closed_first_the_context_goes_on_and_frees_it(lib, tiny_model_path, reference) -> None:
    model = Model(tiny_model_path, RAM)
    ctx = Context(model, _params(tiny_model_path))
    model.close()
    assert model.closed and not model._memory.freed and model._memory.held_by == 1
    _model_refuses(model)
    assert _use(ctx) == reference  # the adaptive swaps read the closed model's weights: still there
    ctx.close()
    assert model._memory.freed and ctx._memory.freed
    _context_refuses(ctx)
    model.close()  # twice is fine
    ctx.close()


def test_context_closed_first_then_the_model(lib, tiny_model_path, reference) -> None:
    model = Model(tiny_model_path, RAM)
    ctx = Context(model, _params(tiny_model_path))
    assert _use(ctx) == reference
    ctx.close()
    assert ctx._memory.freed and not model._memory.freed and model._memory.held_by == 0
    _context_refuses(ctx)
    assert model.tokenize("hello") and model.n_layer > 0  # the model is untouched
    model.close()
    assert model._memory.freed
    _model_refuses(model)


def test_two_contexts_the_model_goes_with_the_last(lib, tiny_model_path, reference) -> None:
    model = Model(tiny_model_path, RAM)
    first, second = Context(model, _params(tiny_model_path)), Context(model, _params(tiny_model_path))
    model.close()
    assert model._memory.held_by == 2
    first.close()
    assert not model._memory.freed and model._memory.held_by == 1
    assert _use(second) == reference
    second.close()
    assert model._memory.freed


def test_closing_the_model_mid_generation_and_the_context_mid_generation(lib, tiny_model_path, reference) -> None:
    model = Model(tiny_model_path, RAM)
    ctx = Context(model, _params(tiny_model_path))
    stream = ctx.generate(PROMPT, N_GEN + 4, stop_at_eog=False)
    got = [next(stream) for _ in range(3)]
    model.close()
    got += list(stream)  # the model's close() does not stop the generation
    with Model(tiny_model_path, RAM) as m2, Context(m2, _params(tiny_model_path)) as plain:
        assert got == list(plain.generate(PROMPT, N_GEN + 4, stop_at_eog=False))
    stream = ctx.generate(PROMPT, N_GEN, stop_at_eog=False)
    next(stream)
    ctx.close()
    with pytest.raises(ClosedError, match="this Context is closed"):
        next(stream)  # its sampler is freed with the generator
    assert model._memory.freed


def _forgotten(collect: Callable[[], None]) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        collect()
    assert all(issubclass(w.category, ResourceWarning) for w in seen), [str(w.message) for w in seen]


@pytest.mark.parametrize("first", ["model", "context"])
def test_garbage_collection_in_each_order(lib, tiny_model_path, reference, first) -> None:
    """del and gc.collect() of the model first or of the context first: the other keeps working until it goes
    too, and both are freed in the end."""
    model = Model(tiny_model_path, RAM)
    ctx = Context(model, _params(tiny_model_path))
    memories = (model._memory, ctx._memory)
    if first == "model":
        del model
        _forgotten(gc.collect)
        assert _use(ctx) == reference and not memories[0].freed
        del ctx
    else:
        del ctx
        _forgotten(gc.collect)
        assert memories[1].freed and not memories[0].freed
        assert model.tokenize(PROMPT)
        del model
    _forgotten(gc.collect)
    assert all(m.freed for m in memories)


@pytest.mark.parametrize("first", ["model", "context"])
def test_finalizers_in_each_order(lib, tiny_model_path, reference, first) -> None:
    """Objects collected together (a reference cycle) have their finalizers run in an order Python does not
    promise: each order is run here by calling the finalizers the collector would call, and once for real."""
    model = Model(tiny_model_path, RAM)
    ctx = Context(model, _params(tiny_model_path))
    if first == "model":
        _forgotten(model._finalizer)
        assert not model._memory.freed
        assert _use(ctx) == reference  # its model's weights are still there
        _forgotten(ctx._finalizer)
    else:
        _forgotten(ctx._finalizer)
        assert ctx._memory.freed and not model._memory.freed
        _forgotten(model._finalizer)
    assert model._memory.freed and ctx._memory.freed
    # the real thing: a cycle between the two, collected in one pass
    model = Model(tiny_model_path, RAM)
    ctx = Context(model, _params(tiny_model_path))
    model.cycle = ctx  # type: ignore[attr-defined]
    memories = (model._memory, ctx._memory)
    del model, ctx
    _forgotten(gc.collect)
    assert all(m.freed for m in memories)


def test_the_mailbox_threads_stop_before_the_closed_model_is_freed(lib, tiny_model_path) -> None:
    """The mailbox's CPU side computes with the model's experts on threads of its own; they are joined when the
    context is freed, and only then is the model freed."""
    model = Model(tiny_model_path, RAM)
    with Context(model, dataclasses.replace(_params(tiny_model_path), moe_cache_mailbox_on_cpu=True)) as ctx:
        before = list(ctx.generate(PROMPT, N_GEN, stop_at_eog=False))
        model.close()
        ctx.reset()
        assert list(ctx.generate(PROMPT, N_GEN, stop_at_eog=False)) == before
        assert ctx.rebalance(64) >= 0
        assert len(list(ctx.generate([], 4, stop_at_eog=False))) == 4
        assert not model._memory.freed
    assert model._memory.freed


def test_a_context_cannot_be_made_on_a_closed_model(lib, tiny_model_path) -> None:
    model = Model(tiny_model_path, RAM)
    model.close()
    with pytest.raises(ClosedError, match="this Model is closed"):
        Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256))
    # a refused context holds nothing: a bad parameter leaves the count as it was
    model = Model(tiny_model_path, RAM)
    with pytest.raises(LlamaMoeError):
        Context(model, ContextParams(moe_cache_device="CPU", n_ctx=-1))
    assert model._memory.held_by == 0
    model.close()
    assert model._memory.freed
