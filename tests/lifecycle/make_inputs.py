"""The lifecycle loop's inputs for the GPU-machine scripts: the tiny model and a profile for it, in DIR
(tests/test_lifecycle.py makes the same from its fixtures)."""
from __future__ import annotations

import sys
from pathlib import Path

from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from llama_moe.tools.synth import synthesize


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    synthesize(out / "tiny.gguf", shape="tiny", expert_type="q8_0", seed=0)
    layout = expert_layout(out / "tiny.gguf")
    write_profile(out / "tiny.strp", Profile(layout.n_layer, layout.n_expert, 8, tuple(
        (l.il, (3 * l.il + e) % layout.n_expert) for e in range(8) for l in layout.layers)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
