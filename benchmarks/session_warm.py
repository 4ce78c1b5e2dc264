"""Hit rate of the first tokens after a conversation is resumed from a saved session, with its working set
brought back into the cache (warm) or not (cold), on the real engine (the cache in RAM,
moe_cache_device="CPU"): a hybrid admitting 2 experts per layer and decode at a quarter and half of the
experts, the embedded tiny model, one conversation per topic of the corpus (its first 400 tokens and 32 generated,
then the session saved; then the next 64 tokens in a fresh context).

    python benchmarks/session_warm.py [-n 64]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling  # noqa: E402
from llama_moe.tools.experts import expert_layout  # noqa: E402
from llama_moe.tools.routing.budget import cache_bytes_for_slots  # noqa: E402
from llama_moe.tools.routing.heldout import t_interval  # noqa: E402
from llama_moe.tools.synth import synthesize  # noqa: E402
from llama_moe.tools.synth.corpus import TOPICS, load_corpus  # noqa: E402
from llama_moe.session import load_session, save_session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=64, help="tokens after the resume")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    path = tmp / "tiny.gguf"
    synthesize(path, shape="tiny", expert_type="q8_0", seed=0)
    layout = expert_layout(path)
    corpus = load_corpus()
    print(f"| slots per layer | cold | warm |\n|---|---|---|")
    with Model(path, ModelParams(cpu_moe=True, repack=False)) as model:
        for pct in (25, 50):
            slots = layout.n_expert * pct // 100
            mib = (cache_bytes_for_slots(layout, slots, True) + layout.layers[0].bytes_per_expert // 2) / 2**20
            cp = ContextParams(n_ctx=2048, n_threads=2, moe_cache_mib=mib, moe_cache_hybrid=True, moe_cache_admit=2,
                               moe_cache_device="CPU")
            rates: dict[bool, list[float]] = {False: [], True: []}
            for i, topic in enumerate(TOPICS):
                text = corpus[topic]
                session = tmp / f"{topic}.session"
                with Context(model, cp) as ctx:
                    ctx.decode(model.tokenize(text)[:400])
                    list(ctx.generate([], 32, Sampling(temperature=0.8, seed=i), stop_at_eog=False))
                    save_session(ctx, session)
                for warm in (False, True):
                    with Context(model, cp) as ctx:
                        load_session(ctx, session, warm=warm)
                        s0 = ctx.moe_cache_stats()
                        list(ctx.generate([], a.n, Sampling(temperature=0.8, seed=100 + i), stop_at_eog=False))
                        s1 = ctx.moe_cache_stats()
                        rates[warm].append((s1.n_hit - s0.n_hit) / (s1.n_lookup - s0.n_lookup))
            cells = [f"{e.mean:.3f} [{e.low:.3f}, {e.high:.3f}]" for e in (t_interval(rates[False]), t_interval(rates[True]))]
            print(f"| {slots} of {layout.n_expert} ({pct}%) | {cells[0]} | {cells[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
