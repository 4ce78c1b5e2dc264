"""Shared fixtures: the real patched libllama and small synthetic MoE models made once per test run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Every subprocess a test starts (python -m llama_moe ..., from any folder) imports this checkout's package, not
# whichever one the environment has installed.
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture(scope="session")
def lib():
    """The loaded native library; a missing build fails loudly: CI builds it before the tests."""
    from llama_moe._native.loader import get_lib

    return get_lib()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_moe.tools.synth import synthesize

    path = tmp_path_factory.mktemp("models") / "tiny-q8_0.gguf"
    synthesize(path, shape="tiny", expert_type="q8_0", seed=0)
    return path


@pytest.fixture(scope="session")
def tiny_q4_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_moe.tools.synth import synthesize

    path = tmp_path_factory.mktemp("models") / "tiny-q4_0.gguf"
    synthesize(path, shape="tiny", expert_type="q4_0", seed=1)
    return path


@pytest.fixture(scope="session")
def gpt_oss_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llama_moe.tools.synth import synthesize

    path = tmp_path_factory.mktemp("models") / "gpt-oss-tiny-mxfp4.gguf"
    synthesize(path, "gpt-oss-tiny", "mxfp4", seed=0)
    return path
