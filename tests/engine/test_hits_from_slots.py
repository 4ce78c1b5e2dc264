"""Where the hybrid's counted hits are computed: from the slots' copies, never from the model's experts in RAM.
Once the slots are filled, the model file's bytes of every expert the cache holds are overwritten with zeros. The
CPU computes from the file's mapping, which sees the zeros at once; the slots keep their copies. A context whose
hits all come from its slots gives the logits it gave before the file changed, while a context without a cache
(the CPU reading the zeros) does not. Slots filled at load (a profile) and filled after the prompt
(``admit_experts``); the CPU is the cache's device here, and ``benchmarks/cuda/adaptive_probe.py --poison`` runs
the same check on a GPU, where the slots are the device's."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.tools.equivalence import forced_steps
from llama_moe.tools.experts import expert_layout, zeroed_experts
from support.cache_sizes import mib_for_slots

PROMPT = "The ship left the harbour at dawn, and the crew"
STEPS = "sang as they hauled the ropes, and the wind rose over the grey water until the gulls went quiet"
# the experts' bytes stay the mapping's: no copy into repacked buffers, no read of the file into memory
MAPPED = ModelParams(cpu_moe=True, repack=False, use_mmap=True)
SLOTS = 12


@pytest.fixture()
def model_copy(tiny_model_path: Path, tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    shutil.copyfile(tiny_model_path, path)
    return path


@pytest.mark.filterwarnings("ignore:.*starts empty and stays empty")
@pytest.mark.parametrize("fill", ["profile", "admit_experts"])
def test_the_hits_are_computed_from_the_slots_copies(lib, model_copy: Path, tmp_path: Path, fill: str) -> None:
    layout = expert_layout(model_copy)
    cp = dict(n_ctx=512, n_threads=2, moe_cache_device="CPU", moe_cache_hybrid=True,
              moe_cache_mib=mib_for_slots(model_copy, SLOTS, hybrid=True))
    if fill == "profile":
        ranked = [(l.il, (5 * l.il + 3 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers]
        profile = tmp_path / "tiny.strp"
        write_profile(profile, Profile(layout.n_layer, layout.n_expert, SLOTS, tuple(ranked)))
        cp["moe_cache_profile"] = profile
    with Model(model_copy, MAPPED) as model:
        steps = model.tokenize(STEPS, add_special=False)

        def run(poisoned: bool) -> tuple[np.ndarray, dict[int, list[int]], int]:
            with Context(model, ContextParams(**cp)) as ctx:
                ctx.decode(model.tokenize(PROMPT))
                if fill == "admit_experts":
                    for l in layout.layers:
                        assert ctx.admit_experts(l.il, [(3 * l.il + 5 * i) % layout.n_expert for i in range(SLOTS)]) == SLOTS
                resident = {l.il: ctx.resident(l.il).tolist() for l in layout.layers}
                assert all(len(r) == SLOTS for r in resident.values())
                hits0 = ctx.moe_cache_stats().n_hit
                if not poisoned:
                    return forced_steps(ctx, steps), resident, ctx.moe_cache_stats().n_hit - hits0
                with zeroed_experts(model_copy, resident):
                    return forced_steps(ctx, steps), resident, ctx.moe_cache_stats().n_hit - hits0

        clean, resident, hits = run(poisoned=False)
        poisoned, resident_after, hits_after = run(poisoned=True)
        assert resident_after == resident and hits_after == hits
        assert hits > len(steps) * layout.n_moe_layers  # most steps hit in most layers
        # every counted hit came from a slot: the zeros in the file changed nothing
        np.testing.assert_array_equal(poisoned, clean)

        # the check can fail: the CPU, computing from the file, reads the zeros
        with Context(model, ContextParams(n_ctx=512, n_threads=2)) as plain:
            plain.decode(model.tokenize(PROMPT))
            before = forced_steps(plain, steps[:4])
        with Context(model, ContextParams(n_ctx=512, n_threads=2)) as plain:
            plain.decode(model.tokenize(PROMPT))
            with zeroed_experts(model_copy, resident):
                after = forced_steps(plain, steps[:4])
        assert not np.array_equal(before, after)
