"""The policies the engine's cache runs, replayed by the engine itself (``llama_moe.policy_replay``): the routing
is fed, a chunk of whole ubatches at a time, to the very policy objects a context's cache runs, so the simulator
follows every rule of the engine's (victims, ties, admission's cap, the adaptive constants, re-partitioning) and
never goes stale. Python only lays the routing out as the engine's trace and reads the counts back.

- ``lru``: upload mode (a miss uploaded into a free slot, else the least recently used one the ubatch does not
  use; a ubatch with more distinct experts than slots is split, the rest computed on the CPU, ``n_cpu``).
- ``static``: the hybrid from a profile (its experts stay; the misses run on the CPU).
- ``adaptive``: the hybrid that swaps hot experts in (``n_swap`` swaps, ``n_fill`` free slots filled).
- ``admitN``: the hybrid admitting up to N missed experts per layer between two decodes (``--moe-cache-admit N``;
  ``n_swap`` counts the admissions), each admission a hit from the next decode (admission on the CPU, or
  LLAMA_MOE_CACHE_ADMIT_ASYNC=0; a GPU's background admission lands a decode later).
- ``admitN-repartR``: the same, moving slots between layers every R decodes (``--moe-cache-repartition R``).

Each ubatch is one decode (a trace keeps no decodes; a prompt split into several ubatches of up to 32 tokens runs
no admission between them in the engine). Layers are given the trace's k and one pool of slots (a model's layers
of one expert shape)."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from ....policy_replay import LayerShape, PolicyReplay, ReplayPolicy
from ..routes import Routes
from .base import PolicyResult, Replay

ENGINE_CHUNK_TOKENS = 1024  # tokens fed at a time (the results do not depend on it)

# the engine's options of each policy the engine runs, by name
REPARTITION_PERIODS = (16, 32, 64, 128, 256)  # the admitN-repartR policies' periods, in decodes
ENGINE_POLICIES: dict[str, ReplayPolicy] = {
    "lru": ReplayPolicy("upload"),
    "static": ReplayPolicy("hybrid"),
    "adaptive": ReplayPolicy("adaptive"),
    **{f"admit{n}": ReplayPolicy("hybrid", admit=n) for n in (1, 2, 4, 8)},
    **{f"admit{n}-repart{r}": ReplayPolicy("hybrid", admit=n, repartition=r)
       for n in (1, 2, 4, 8) for r in REPARTITION_PERIODS},
}

_last: tuple[Routes, np.ndarray] | None = None  # the last chunk laid out: several replays are fed the same chunks


def engine_stream(chunk: Routes) -> np.ndarray:
    """The chunk as the engine's routing trace lays it out: per ubatch and layer, {il, n_tokens, k, ids} of the
    tokens the layer computed (int32). The layout of the last chunk is kept for the next replay fed it."""
    global _last
    if _last is not None and _last[0] is chunk:
        return _last[1]
    ex, k = chunk.experts, chunk.k
    layers = np.asarray(chunk.layers, dtype=np.int32)
    if chunk.one_token_ubatches:
        rec = np.empty(ex.shape[:2] + (3 + k,), dtype=np.int32)
        rec[:, :, 0], rec[:, :, 1], rec[:, :, 2], rec[:, :, 3:] = layers, 1, k, ex
        out = rec[chunk.computed].ravel()  # token by token, each token's layers in order
    else:
        parts = []
        for a, b in zip(chunk.starts[:-1].tolist(), chunk.starts[1:].tolist()):
            for j, il in enumerate(chunk.layers):
                ids = ex[a:b, j]
                ids = ids[ids[:, 0] >= 0]
                if len(ids):
                    parts += [np.array([il, len(ids), k], dtype=np.int32), ids.astype(np.int32).ravel()]
        out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    _last = (chunk, out)
    return out


class EngineReplay(Replay):
    """One of ENGINE_POLICIES replayed by the engine (or, named ``name``, any ``policy`` of the engine's options):
    its cached layers (``slots``; a layer with n_expert slots is held whole and looks nothing up), filled from
    ``profile`` as the engine fills them. ``sizes``: the model's layers as the engine sizes them (il ->
    ``budget.layer_shapes``' shape): the replay then counts the bytes it uploads and computes on the CPU as the
    engine does (``PolicyResult.n_bytes_upload``, ``n_bytes_cpu``); without, it counts no bytes."""

    def __init__(self, name: str, layers: Sequence[int], k: int, slots: dict[int, int], n_expert: int,
                 profile: Sequence[tuple[int, int]], policy: ReplayPolicy | None = None,
                 sizes: Mapping[int, LayerShape] | None = None, ram_slots: Mapping[int, int] | None = None) -> None:
        self.name = name
        self.policy = replace(policy or ENGINE_POLICIES[name], ranked=tuple(profile))
        self.sized = sizes is not None
        cached = [il for il in layers if il in slots]
        self.looked = {il for il in cached if slots[il] < n_expert}
        # one pool of slots (group 0) whatever the sizes: a re-partition moves slots between all the layers
        shapes = [LayerShape(il, n_expert, k, sizes[il].expert_bytes, sizes[il].bias_bytes) if sizes is not None
                  else LayerShape(il, n_expert, k, 1) for il in cached]
        self.ram = ram_slots is not None
        ram = {il: ram_slots[il] for il in cached} if ram_slots is not None else None
        self.replay = PolicyReplay(shapes, {il: slots[il] for il in cached}, self.policy, ram_slots=ram) if cached else None

    def feed(self, chunk: Routes) -> None:
        if self.replay is not None:
            self.replay.feed(engine_stream(chunk))

    def slots_now(self) -> dict[int, int]:
        """Slots per looked-up layer now (a re-partition moves them)."""
        if self.replay is None:
            return {}
        return {l.il: l.n_slots for l in self.replay.result().layers if l.il in self.looked}

    def result(self) -> PolicyResult:
        if self.replay is None:
            zero = 0 if self.sized else None
            return PolicyResult(self.name, 0, 0, 0, 0, 0, 0, 0, 0, {}, n_bytes_upload=zero, n_bytes_cpu=zero)
        r = self.replay.result()
        layers = [l for l in r.layers if l.il in self.looked]
        upload = self.policy.mode == "upload"
        admitting = self.policy.admit != 0
        return PolicyResult(
            self.name, sum(l.n_hit for l in layers), sum(l.n_hit_profile for l in layers), sum(l.n_miss for l in layers),
            sum(l.n_token for l in layers), sum(l.n_token_resident for l in layers),
            sum(l.n_cpu for l in layers) if upload else 0, sum(l.n_slots for l in layers),
            sum(l.n_resident for l in layers), {l.il: (l.n_hit, l.n_miss) for l in layers},
            n_swap=sum(l.n_admit if admitting else l.n_swap for l in layers), n_fill=sum(l.n_fill for l in layers),
            per_layer_cpu={l.il: l.n_cpu for l in layers} if upload else {},
            n_split_lookups=sum(l.n_split for l in layers), n_large=sum(l.n_large for l in layers),
            n_repartition=r.n_repartition, n_moved=r.n_moved,
            n_bytes_upload=r.n_bytes_upload if self.sized else None, n_bytes_cpu=r.n_bytes_cpu if self.sized else None,
            **self._ram(r))

    def _ram(self, r) -> dict:
        """The RAM tier's counts of the decodes: the start's fill (every one a miss) left out."""
        if not self.ram:
            return {}
        return {"n_ram_hit": sum(l.n_ram_hit for l in r.layers), "n_ram_miss": sum(l.n_ram_miss for l in r.layers) - r.n_ram_fill,
                "n_bytes_disk": r.n_bytes_disk - r.n_bytes_ram_fill if self.sized else None}


def engine_replay(name: str):
    """The factory of REPLAYS' signature for the engine's policy ``name``."""
    def make(layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
             profile: Sequence[tuple[int, int]], sizes: Mapping[int, LayerShape] | None = None,
             ram_slots: Mapping[int, int] | None = None) -> Replay:
        return EngineReplay(name, layers, k, slots, n_expert, profile, sizes=sizes, ram_slots=ram_slots)
    return make


__all__ = ["ENGINE_CHUNK_TOKENS", "ENGINE_POLICIES", "EngineReplay", "REPARTITION_PERIODS", "engine_replay",
           "engine_stream"]
