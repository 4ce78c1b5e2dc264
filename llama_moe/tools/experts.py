"""Where a model's experts are and how big they are, read from its GGUF header."""
from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import GgufError

_EXPS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_(ch|)exps\.(weight|bias)$")


@dataclass(frozen=True)
class LayerExperts:
    il: int
    n_expert: int
    bytes_per_expert: int  # gate + up + down (or gate_up + down) of one expert
    type_name: str         # the expert tensors' ggml types, e.g. "q8_0" or "q4_0/q8_0"
    bias_bytes_per_expert: int = 0  # their biases (gpt-oss): the hybrid cache keeps a copy beside each slot


@dataclass(frozen=True)
class ExpertLayout:
    n_layer: int
    n_expert: int
    n_expert_used: int
    layers: tuple[LayerExperts, ...]

    @property
    def n_moe_layers(self) -> int:
        return len(self.layers)

    @property
    def total_expert_bytes(self) -> int:
        return sum(l.n_expert * l.bytes_per_expert for l in self.layers)


def expert_layout(path: str | os.PathLike[str]) -> ExpertLayout:
    from ..gguf_files.reader import read_gguf

    gguf = read_gguf(path)
    arch = gguf.architecture
    if arch is None:
        raise GgufError(f"{path}: no general.architecture; not a llama.cpp model")
    # block_count includes the MTP (nextn) blocks after the trunk: llama.cpp never runs them, and neither
    # the cache nor a profile counts them
    n_layer = int(gguf.get(f"{arch}.block_count", 0)) - int(gguf.get(f"{arch}.nextn_predict_layers", 0))
    n_expert = int(gguf.get(f"{arch}.expert_count", 0))
    used = gguf.get(f"{arch}.expert_used_count", 0)
    # a number, or one per layer (0 in layers without experts)
    used_per_layer = [int(u) for u in used] if isinstance(used, list) else None
    n_used = max(used_per_layer, default=0) if used_per_layer is not None else int(used)
    per_layer: dict[int, list] = {}
    for t in gguf.tensors:
        m = _EXPS.match(t.name)
        # chunk experts (GroveMoE's ffn_*_chexps, beside the routed ones) stay in RAM with --cpu-moe but on
        # llama.cpp's path: the cache holds a layer's routed experts only
        if m and m.group(3) != "ch" and int(m.group(1)) < n_layer:
            per_layer.setdefault(int(m.group(1)), []).append(t)
    layers = []
    for il in sorted(per_layer):
        tensors = [t for t in per_layer[il] if t.name.endswith(".weight")]
        biases = [t for t in per_layer[il] if t.name.endswith(".bias")]
        if not tensors:
            continue
        n = tensors[0].ne[-1]
        if any(t.ne[-1] != n for t in tensors + biases):
            raise GgufError(f"{path}: layer {il}'s expert tensors disagree on the number of experts")
        types = "/".join(sorted({t.type.name.lower() for t in tensors}))
        layers.append(LayerExperts(il, int(n), sum(t.nbytes for t in tensors) // int(n), types,
                                   sum(t.nbytes for t in biases) // int(n)))
    return ExpertLayout(n_layer, n_expert, n_used, tuple(layers))


@contextmanager
def zeroed_experts(path: str | os.PathLike[str], experts: Mapping[int, Sequence[int]]) -> Iterator[int]:
    """The file's bytes of the given experts (layer -> expert ids: weights and biases) are zeros inside the
    block and what they were after it; yields the bytes zeroed. A model mapped from the file (``use_mmap``, no
    repack) computes with the zeros at once, while copies made before (a cache's slots) keep the weights: where
    a computation's experts come from, told apart without comparing kernels."""
    from ..gguf_files.reader import read_gguf

    saved: list[tuple[int, bytes]] = []
    fd = os.open(path, os.O_RDWR)
    try:
        for t in read_gguf(path).tensors:
            m = _EXPS.match(t.name)
            if not m:
                continue
            per_expert = t.nbytes // t.ne[-1]
            for e in experts.get(int(m.group(1)), ()):
                at = t.offset + int(e) * per_expert
                saved.append((at, os.pread(fd, per_expert, at)))
                os.pwrite(fd, bytes(per_expert), at)
        yield sum(len(d) for _, d in saved)
    finally:
        for at, data in saved:
            os.pwrite(fd, data, at)
        os.close(fd)
