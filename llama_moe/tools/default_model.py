"""The embedded default model: a tiny synthetic MoE made on first use and kept in the cache."""
from __future__ import annotations

import logging
from pathlib import Path

from .. import paths

log = logging.getLogger(__name__)

DEFAULT_SHAPE = "tiny"
DEFAULT_EXPERT_TYPE = "q8_0"
DEFAULT_SEED = 0


def default_model_path() -> Path:
    from .synth import SYNTH_VERSION, synthesize

    path = paths.models_dir() / f"{DEFAULT_SHAPE}-{DEFAULT_EXPERT_TYPE}-s{DEFAULT_SEED}-v{SYNTH_VERSION}.gguf"
    if not path.is_file():
        log.info("making the default model %s (once)", path)
        path.parent.mkdir(parents=True, exist_ok=True)
        synthesize(path, shape=DEFAULT_SHAPE, expert_type=DEFAULT_EXPERT_TYPE, seed=DEFAULT_SEED)
    return path


def default_prompt() -> str:
    """The first paragraph of the embedded corpus's first topic: real text, so routing has locality."""
    from .synth.corpus import load_corpus

    corpus = load_corpus()
    first = corpus[sorted(corpus)[0]]
    return first.strip().split("\n\n")[0]
