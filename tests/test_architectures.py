"""The cache on every MoE architecture the synthesizer makes: each architecture's tiny model through
tests/arch_check.py in a process of its own (a crash in the engine fails that architecture alone), on the CPU
with the cache in RAM. Upload, hybrid with a profile, adaptive hybrid, the mailbox on the CPU device and
n_cpu_moe must each give the tokens and final logits of no cache over 128 greedy tokens after a prompt of over
32; every MoE layer (never a dense one, never an MTP block) is cached and hits, with the slots the planner
predicts; the upload mode's counters equal a replay of the engine's routing trace.

With LLAMA_MOE_ARCH_REPORT=DIR each architecture's results are also written to DIR/CONFIG.json, from which
tests/arch_table.py writes the table of docs/architectures.md.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llama_moe.tools.synth import synthesize
from llama_moe.tools.synth.archs import CONFIGS, arch_model
from llama_moe.tools.synth.synthesize import synthesize_arch

HERE = Path(__file__).resolve().parent
REPORT = os.environ.get("LLAMA_MOE_ARCH_REPORT")

# what the engine does not do yet, each a failure of the checks named: strict, so they fail once fixed
NEEDS_ENGINE: dict[str, str] = {}


# tensors the base's loader takes that gguf-py 0.19.0's per-architecture tables do not list
NOT_IN_GGUF_PY = {("deepseek2", "blk.{bid}.ffn_gate_up_exps")}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_each_configuration_names_its_tensors_as_gguf_py_does(config: str) -> None:
    from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

    m = arch_model(config)
    arch = {name: a for a, name in MODEL_ARCH_NAMES.items()}[m.arch]
    known = {TENSOR_NAMES[t] for t in MODEL_TENSORS[arch]}
    names = {re.sub(r"^blk\.\d+\.", "blk.{bid}.", t.name.rsplit(".", 1)[0] if t.name.endswith(
        (".weight", ".bias", ".scale")) else t.name) for t in m.tensors}
    assert names - known <= {n for a, n in NOT_IN_GGUF_PY if a == m.arch}, sorted(names - known)
    assert len({t.name for t in m.tensors}) == len(m.tensors)


def test_the_tools_count_the_trunk_and_read_per_layer_experts_per_token(tmp_path: Path) -> None:
    """An MTP block is in block_count but never run: neither a cached layer nor a profile's; experts per token
    stored per layer (0 where there are none) are read as such, not taken for a number; chunk experts are not a
    layer's routed experts."""
    from llama_moe.tools.experts import expert_layout
    from llama_moe.tools.routing.budget import engine_slots

    synthesize_arch(tmp_path / "mtp.gguf", "glm4moe-mtp")
    layout = expert_layout(tmp_path / "mtp.gguf")
    assert layout.n_layer == 4 and [l.il for l in layout.layers] == [1, 2, 3]
    assert set(engine_slots(layout, 2**22, False)) == {1, 2, 3}
    synthesize_arch(tmp_path / "k.gguf", "nemotron_h_moe-per-layer-k")
    layout = expert_layout(tmp_path / "k.gguf")
    assert layout.n_expert_used == 4 and [l.il for l in layout.layers] == [1, 3]
    # chunk experts beside the routed ones (8 of half the width) are not the cache's: the routed experts alone
    synthesize_arch(tmp_path / "g.gguf", "grovemoe")
    layout = expert_layout(tmp_path / "g.gguf")
    assert [(l.n_expert, l.bytes_per_expert) for l in layout.layers] == [(16, 3 * 64 * 136)] * 4


def test_synth_cli_writes_an_architecture_and_refuses_what_it_cannot(tmp_path: Path, capsys) -> None:
    from llama_moe.gguf_files import read_gguf
    from llama_moe.tools.cli import main as cli_main

    assert cli_main(["synth", str(tmp_path / "d.gguf"), "--arch", "deepseek2", "--shape", "tiny", "--quiet"]) == 0
    g = read_gguf(tmp_path / "d.gguf")
    assert g.architecture == "deepseek2" and g.get("deepseek2.expert_group_count") == 4
    assert cli_main(["synth", str(tmp_path / "g.gguf"), "--arch", "gpt-oss", "--quiet"]) == 0
    assert read_gguf(tmp_path / "g.gguf").architecture == "gpt-oss"
    for argv, said in ((["--arch", "olmoe", "--shape", "small"], "has the tiny shape only"),
                       (["--arch", "olmoe", "--skew", "2"], "router knobs"),
                       (["--arch", "mamba"], "unknown architecture 'mamba'"),
                       (["--arch", "gpt-oss", "--shape", "small"], "is a qwen3moe shape, not gpt-oss")):
        capsys.readouterr()
        assert cli_main(["synth", str(tmp_path / "x.gguf"), *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.gguf").exists()


def _make(config: str, path: Path) -> list[int]:
    """Writes the model; returns the layers whose routed experts the cache should hold."""
    if config == "qwen3moe":
        info = synthesize(path, "tiny", "q8_0", seed=0)
        return list(range(info.shape.n_layer))
    if config == "gpt-oss":
        info = synthesize(path, "gpt-oss-tiny", "mxfp4", seed=0)
        return list(range(info.shape.n_layer))
    synthesize_arch(path, config, "q8_0", seed=0)
    return list(arch_model(config).moe_layers)


def _param(config: str):
    if config in NEEDS_ENGINE:
        return pytest.param(config, marks=pytest.mark.xfail(strict=True, reason=NEEDS_ENGINE[config]))
    return config


@pytest.mark.slow
@pytest.mark.parametrize("config", [_param(c) for c in ["qwen3moe", "gpt-oss", *CONFIGS]])
def test_the_cache_on_each_architecture(lib, tmp_path: Path, config: str) -> None:
    path = tmp_path / f"{config}.gguf"
    moe_layers = _make(config, path)
    out = tmp_path / "result.json"
    # the package of this tree, whatever an installed one points at
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(HERE / "arch_check.py"), str(path), config, str(out),
                           ",".join(map(str, moe_layers))], capture_output=True, text=True, timeout=900, env=env)
    result = json.loads(out.read_text()) if out.is_file() else {
        "info": {"config": config, "crashed": proc.returncode, "stderr": proc.stderr[-2000:]}, "checks": {}}
    if REPORT:
        Path(REPORT).mkdir(parents=True, exist_ok=True)
        (Path(REPORT) / f"{config}.json").write_text(json.dumps(result, indent=1))
    assert out.is_file(), f"{config}: the checks died (exit status {proc.returncode}):\n{proc.stderr[-3000:]}"
    failed = {name: c["detail"] for name, c in result["checks"].items() if not c["ok"]}
    assert not failed, f"{config}: {len(failed)} of {len(result['checks'])} checks failed:\n" + \
        "\n".join(f"  {name}: {detail}" for name, detail in failed.items())
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_gemma4s_per_expert_scales_are_served(lib, tmp_path: Path) -> None:
    """Gemma 4's per-expert scales (ffn_down_exps.scale) no longer keep its MoE layers on llama.cpp's path: the
    cache serves every one, with no warning, and the tokens are no cache's (test_the_cache_on_each_architecture
    checks every mode)."""
    import warnings

    from llama_moe import Context, ContextParams, Model, ModelParams
    from llama_moe.errors import MoeCacheWarning
    from support.cache_sizes import mib_for_slots

    path = tmp_path / "g4.gguf"
    synthesize_arch(path, "gemma4", "q8_0", seed=0)
    with Model(path, ModelParams(cpu_moe=True, repack=False)) as model:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Context(model, ContextParams(n_ctx=256, n_threads=2, moe_cache_mib=mib_for_slots(path, 4),
                                              moe_cache_device="CPU")) as ctx:
                list(ctx.generate("The ship left the harbour", max_tokens=8, stop_at_eog=False))
                stats, layers = ctx.moe_cache_stats(), ctx.layer_stats()
                status = ctx.cache_status()
    assert not [w for w in caught if issubclass(w.category, MoeCacheWarning)], [str(w.message) for w in caught]
    assert stats is not None and stats.n_hit + stats.n_miss > 0
    assert [l.il for l in layers] == list(arch_model("gemma4").moe_layers)
    assert status.state == "on" and "layers_skipped" not in status.reasons
