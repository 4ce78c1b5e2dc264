"""Fixtures of the server tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile


@pytest.fixture()
def profile(tiny_model_path, tmp_path) -> Path:
    """A profile of the tiny model that ranks its experts in an order spread over the layers (not the model's
    own routing): the server tests need a valid profile, not a good one."""
    layout = expert_layout(tiny_model_path)
    ranked = [(l.il, (5 * l.il + 3 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers]
    write_profile(tmp_path / "p.strp", Profile(layout.n_layer, layout.n_expert, 12, tuple(ranked)))
    return tmp_path / "p.strp"
