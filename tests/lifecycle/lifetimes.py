"""The Python binding's lifetimes under AddressSanitizer: run by tests/binding/test_lifecycle.py in a Python with
libasan preloaded (LD_PRELOAD), so that the library's frees, and its copies out of freed memory (memcpy and the
like, which ASan intercepts even in the uninstrumented libllama), are checked.

    python lifetimes.py MODEL [plant]

Each order of closing, and of garbage collection, of a model and its adaptive hybrid context (no mmap: the
weights are heap memory), the context using its model's memory after the model is closed or collected: a
decode, a generation, and rebalance(), whose swaps copy experts out of the model's weights. Prints one line per
order, then "lifetimes: N orders". With ``plant``, the model is freed behind the binding's back before the
context's rebalance(): the proof that this run would see a read of freed memory."""
from __future__ import annotations

import ctypes
import gc
import sys
import warnings

from llama_moe import Context, ContextParams, Model, ModelParams

RAM = ModelParams(cpu_moe=True, repack=False, use_mmap=False)
PROMPT = "The ship left the harbour at dawn"


def params() -> ContextParams:
    # 1.5 MiB: 10 of the tiny model's 32 slots per layer, so that rebalance() has experts to swap in
    # the cache in RAM: the sanitizer's machines have no GPU
    return ContextParams(n_ctx=256, moe_cache_mib=1.5, moe_cache_hybrid=True, moe_cache_adaptive=True, n_threads=2,
                         moe_cache_device="CPU")


def use(ctx: Context) -> int:
    ctx.reset()
    list(ctx.generate(ctx.tokenize(PROMPT), 8, stop_at_eog=False))
    swapped = ctx.rebalance(64)
    assert swapped > 0, "rebalance() swapped nothing in: the run would not read the model's weights"
    list(ctx.generate([], 2, stop_at_eog=False))
    return swapped


def orders(path: str) -> dict[str, object]:
    def model_closed_first() -> int:
        model = Model(path, RAM)
        ctx = Context(model, params())
        model.close()
        n = use(ctx)
        ctx.close()
        return n

    def context_closed_first() -> int:
        model = Model(path, RAM)
        ctx = Context(model, params())
        n = use(ctx)
        ctx.close()
        model.tokenize(PROMPT)
        model.close()
        return n

    def two_contexts_model_closed_between() -> int:
        model = Model(path, RAM)
        a, b = Context(model, params()), Context(model, params())
        model.close()
        use(a)
        a.close()
        n = use(b)
        b.close()
        return n

    def model_collected_first() -> int:
        model = Model(path, RAM)
        ctx = Context(model, params())
        model._finalizer()  # what the collector calls when the model goes first (a cycle with its context)
        n = use(ctx)
        del model, ctx
        gc.collect()
        return n

    def context_collected_first() -> int:
        model = Model(path, RAM)
        ctx = Context(model, params())
        n = use(ctx)
        ctx._finalizer()
        del ctx
        gc.collect()
        model.tokenize(PROMPT)
        del model
        gc.collect()
        return n

    def a_cycle_collected_in_one_pass() -> int:
        model = Model(path, RAM)
        ctx = Context(model, params())
        n = use(ctx)
        model.cycle = ctx  # type: ignore[attr-defined]
        del model, ctx
        gc.collect()
        return n

    return {f.__name__: f for f in (model_closed_first, context_closed_first, two_contexts_model_closed_between,
                                    model_collected_first, context_collected_first, a_cycle_collected_in_one_pass)}


def plant(path: str) -> None:
    model = Model(path, RAM)
    ctx = Context(model, params())
    list(ctx.generate(ctx.tokenize(PROMPT), 8, stop_at_eog=False))
    memory = model._memory
    model._lib.llama_model_free(memory.ptr)  # the bug this binding prevents, done by hand
    memory._ptr = None  # so that the binding does not free it twice
    print("planted: the model freed under its context", flush=True)
    ctx.rebalance(64)
    print("planted: rebalance() returned", flush=True)


def asan_loaded() -> bool:
    try:
        ctypes.CDLL(None).__asan_init  # noqa: B018 (the lookup is the test)
    except AttributeError:
        return False
    return True


def main(argv: list[str]) -> int:
    print(f"asan: {'on' if asan_loaded() else 'off'}", flush=True)
    warnings.simplefilter("ignore", ResourceWarning)  # the collected orders forget objects on purpose
    if argv[1:2] == ["plant"]:
        plant(argv[0])
        return 0
    done = orders(argv[0])
    for name, run in done.items():
        print(f"{name}: {run()} experts swapped in", flush=True)
    print(f"lifetimes: {len(done)} orders", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
