"""The one command from a model and a text to a profile (``python -m llama_moe profile``), and what it buys:
measured by the engine on text the profile was not made from."""
from __future__ import annotations

import subprocess
import sys

from support.cache_sizes import mib_for_slots
from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.tools.synth.corpus import split_paragraphs

RAM = ModelParams(cpu_moe=True, repack=False)


def _hit_rate(model: Model, text: str, params: ContextParams) -> float:
    with Context(model, params) as ctx:
        tokens = model.tokenize(text)[:120]  # where a cold cache pays most
        for i in range(0, len(tokens), 8):  # decode-sized ubatches, which take the cache
            ctx.decode(tokens[i:i + 8])
        return ctx.moe_cache_stats().hit_rate


def test_a_profile_from_train_text_beats_an_empty_cache_on_held_out_text(lib, tiny_model_path, tmp_path) -> None:
    split = split_paragraphs()
    train = tmp_path / "train.txt"
    train.write_text("\n\n".join(p for topic in sorted(split.train) for p in split.train[topic]))
    held_out = "\n\n".join(p for topic in sorted(split.test) for p in split.test[topic])
    profile = tmp_path / "train.strp"
    done = subprocess.run([sys.executable, "-m", "llama_moe", "profile", str(tiny_model_path), str(train), "-o",
                           str(profile), "--slots", "8", "-q"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert profile.is_file()
    with Model(tiny_model_path, RAM) as model:
        for hybrid in (False, True):
            mib = mib_for_slots(tiny_model_path, 8, hybrid=hybrid)
            empty = _hit_rate(model, held_out, ContextParams(n_ctx=512, n_batch=8, n_ubatch=8, moe_cache_mib=mib,
                                                             moe_cache_hybrid=hybrid, moe_cache_device="CPU"))
            filled = _hit_rate(model, held_out, ContextParams(n_ctx=512, n_batch=8, n_ubatch=8, moe_cache_mib=mib,
                                                              moe_cache_hybrid=hybrid, moe_cache_profile=profile,
                                                              moe_cache_device="CPU"))
            print(f"{'hybrid' if hybrid else 'upload'}: held-out hit rate {empty:.3f} empty, {filled:.3f} with the profile")
            assert filled > empty
