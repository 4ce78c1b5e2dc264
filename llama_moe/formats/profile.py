"""STRP expert profiles: the (layer, expert) pairs to hold in the cache, hottest first.

Layout, little-endian (Strata's write_expert_profile): ``STRP``, u32 version (1), u32 n_layers, u32 n_expert,
u32 slots (informational), u32 n_ranked, n_ranked x (u16 layer, u16 expert), then n_layers x n_expert x i32,
each pair's rank or -1. The native loader validates the same things read_profile does.
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


@dataclass(frozen=True)
class Profile:
    n_layers: int
    n_expert: int
    n_slots: int
    ranked: tuple[tuple[int, int], ...]  # (layer, expert), hottest first

    def __post_init__(self) -> None:
        if not 0 < self.n_layers < 2**16 or not 0 < self.n_expert < 2**16:
            raise ProfileError(f"a profile needs 1..65535 layers and experts, got {self.n_layers} x {self.n_expert}")
        if len(self.ranked) > self.n_layers * self.n_expert:
            raise ProfileError(f"{len(self.ranked)} ranked pairs, more than {self.n_layers} x {self.n_expert}")
        for i, (il, e) in enumerate(self.ranked):
            if not (0 <= il < self.n_layers and 0 <= e < self.n_expert):
                raise ProfileError(f"pair {i} is (layer {il}, expert {e}), out of range for {self.n_layers} x {self.n_expert}")

    def ranks(self) -> np.ndarray:
        """Each pair's rank, -1 where unranked: [n_layers, n_expert] int32."""
        out = np.full((self.n_layers, self.n_expert), -1, dtype=np.int32)
        for rank, (il, e) in enumerate(self.ranked):
            if out[il, e] < 0:
                out[il, e] = rank
        return out

    def to_bytes(self) -> bytes:
        pairs = np.asarray(self.ranked, dtype="<u2").reshape(-1, 2)
        return (_HEADER.pack(MAGIC, VERSION, self.n_layers, self.n_expert, self.n_slots, len(self.ranked))
                + pairs.tobytes() + self.ranks().astype("<i4").tobytes())


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
    try:
        return Profile(layers, experts, slots, tuple((int(a), int(b)) for a, b in pairs))
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None
