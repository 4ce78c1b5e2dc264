"""STRP expert profiles: the (layer, expert) pairs to hold in the cache, hottest first.

Layout, little-endian (Strata's write_expert_profile): ``STRP``, u32 version (1), u32 n_layers, u32 n_expert,
u32 slots (informational), u32 n_ranked, n_ranked x (u16 layer, u16 expert), then n_layers x n_expert x i32,
each pair's rank or -1, then optionally the per-layer slot counts the engine sizes its layers from: ``SLOT``,
u32 section version (1), u32 n_layers, n_layers x u32 slots (0: no count, a layer without experts). A file that
ends after the ranks has none. The native loader validates the same things read_profile does.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import write_bytes
from ..errors import ProfileError

MAGIC = b"STRP"
VERSION = 1
_HEADER = struct.Struct("<4s5I")
SLOTS_MAGIC = b"SLOT"
SLOTS_VERSION = 1
_SLOTS_HEADER = struct.Struct("<4s2I")


@dataclass(frozen=True)
class Profile:
    n_layers: int
    n_expert: int
    n_slots: int
    ranked: tuple[tuple[int, int], ...]  # (layer, expert), hottest first
    layer_slots: tuple[int, ...] | None = None  # layer -> slots (0: none), for every layer; None: equal slots

    def __post_init__(self) -> None:
        if not 0 < self.n_layers < 2**16 or not 0 < self.n_expert < 2**16:
            raise ProfileError(f"a profile needs 1..65535 layers and experts, got {self.n_layers} x {self.n_expert}")
        if len(self.ranked) > self.n_layers * self.n_expert:
            raise ProfileError(f"{len(self.ranked)} ranked pairs, more than {self.n_layers} x {self.n_expert}")
        for i, (il, e) in enumerate(self.ranked):
            if not (0 <= il < self.n_layers and 0 <= e < self.n_expert):
                raise ProfileError(f"pair {i} is (layer {il}, expert {e}), out of range for {self.n_layers} x {self.n_expert}")
        if self.layer_slots is not None:
            if len(self.layer_slots) != self.n_layers:
                raise ProfileError(f"{len(self.layer_slots)} per-layer slot counts for {self.n_layers} layers")
            bad = [(il, n) for il, n in enumerate(self.layer_slots) if not 0 <= n < 2**32]
            if bad:
                raise ProfileError(f"layer {bad[0][0]}'s slot count {bad[0][1]} is not a u32")

    def ranks(self) -> np.ndarray:
        """Each pair's rank, -1 where unranked: [n_layers, n_expert] int32."""
        out = np.full((self.n_layers, self.n_expert), -1, dtype=np.int32)
        for rank, (il, e) in enumerate(self.ranked):
            if out[il, e] < 0:
                out[il, e] = rank
        return out

    def to_bytes(self) -> bytes:
        pairs = np.asarray(self.ranked, dtype="<u2").reshape(-1, 2)
        out = (_HEADER.pack(MAGIC, VERSION, self.n_layers, self.n_expert, self.n_slots, len(self.ranked))
               + pairs.tobytes() + self.ranks().astype("<i4").tobytes())
        if self.layer_slots is not None:
            out += (_SLOTS_HEADER.pack(SLOTS_MAGIC, SLOTS_VERSION, self.n_layers)
                    + np.asarray(self.layer_slots, dtype="<u4").tobytes())
        return out


def write_profile(path: str | os.PathLike[str], profile: Profile) -> None:
    """Writes the profile whole or not at all (a failure leaves no file behind)."""
    write_bytes(path, profile.to_bytes())


def read_profile(path: str | os.PathLike[str], n_layers: int | None = None, n_expert: int | None = None) -> Profile:
    """Reads and validates a profile; with n_layers and n_expert, also that it was made for that model."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if data[:4] != MAGIC:
        raise ProfileError(f"{path}: not a profile (the magic is not STRP)")
    if len(data) < _HEADER.size:
        raise ProfileError(f"{path}: truncated: {len(data)} bytes, shorter than the 24-byte header")
    _, version, layers, experts, slots, n_ranked = _HEADER.unpack_from(data)
    if version != VERSION:
        raise ProfileError(f"{path}: version {version}, this llama_moe reads version {VERSION}")
    if (n_layers is not None and layers != n_layers) or (n_expert is not None and experts != n_expert):
        raise ProfileError(f"{path}: made for {layers} layers x {experts} experts, but the model has {n_layers} x {n_expert}")
    if n_ranked > layers * experts:
        raise ProfileError(f"{path}: n_ranked is {n_ranked}, more than n_layers x n_expert = {layers * experts}")
    end = _HEADER.size + 4 * n_ranked
    if len(data) < end:
        raise ProfileError(f"{path}: truncated: the header promises {n_ranked} ranked pairs, the file holds fewer")
    pairs = np.frombuffer(data, dtype="<u2", count=2 * n_ranked, offset=_HEADER.size).reshape(-1, 2)
    layer_slots = _read_slots(path, data, end + 4 * layers * experts, layers)
    try:
        return Profile(layers, experts, slots, tuple((int(a), int(b)) for a, b in pairs), layer_slots)
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None


def _read_slots(path: str | os.PathLike[str], data: bytes, at: int, n_layers: int) -> tuple[int, ...] | None:
    """The per-layer slot section after the ranks, None when the file ends there (or before: the ranks are not
    read). Anything else after the ranks is refused: a profile whose counts were lost would size the cache other
    than planned."""
    if len(data) <= at:
        return None
    left = len(data) - at
    if data[at:at + 4] != SLOTS_MAGIC:
        raise ProfileError(f"{path}: {left} bytes after the ranks that are not a per-layer slot section (magic SLOT)")
    if left < _SLOTS_HEADER.size:
        raise ProfileError(f"{path}: the per-layer slot section is truncated: {left} bytes, shorter than its 12-byte header")
    _, version, layers = _SLOTS_HEADER.unpack_from(data, at)
    if version != SLOTS_VERSION:
        raise ProfileError(f"{path}: per-layer slot section version {version}, this llama_moe reads version {SLOTS_VERSION}")
    if layers != n_layers:
        raise ProfileError(f"{path}: the per-layer slot section has {layers} layers, the profile {n_layers}")
    if left != _SLOTS_HEADER.size + 4 * layers:
        raise ProfileError(f"{path}: the per-layer slot section should be {_SLOTS_HEADER.size + 4 * layers} bytes for "
                           f"{layers} layers, it is {left}")
    return tuple(int(n) for n in np.frombuffer(data, dtype="<u4", count=layers, offset=at + _SLOTS_HEADER.size))
