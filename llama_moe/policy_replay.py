"""The MoE cache's rules, run by the engine without a model or a device: the slots a cache size gives each layer
(``size_slots``), and the cache's policies replayed over a routing trace (``PolicyReplay``). Both are the engine's
own code (include/llama-moe.h): the slot arithmetic a context sizes its cache with, and the very policy objects its
cache runs (upload mode's LRU, the hybrid from a profile, the adaptive swaps, admission, re-partitioning, the
peer), fed the trace as the cache is fed it. The simulator and the planner ask these rather than re-deriving them."""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ._native.ffi import ffi
from ._native.loader import get_lib
from .errors import ClosedError, ParameterError
from .formats.trace import RoutingRecord

MODES = {"upload": 1, "hybrid": 2, "adaptive": 3}  # enum llama_moe_cache_mode
_ERR_BYTES = 512


@dataclass(frozen=True)
class LayerShape:
    """One layer the cache serves, as its rules see it. ``group``: layers of one expert tensor type and shape share
    one (a re-partition moves slots between the layers of a group); ``bias_bytes``: an expert's bias rows, which the
    hybrid copies beside it."""

    il: int
    n_expert: int
    n_used: int
    expert_bytes: int
    bias_bytes: int = 0
    group: int = 0


@dataclass(frozen=True)
class ReplayPolicy:
    """The cache's options a replay runs: ``mode`` "upload", "hybrid" or "adaptive"; ``admit`` missed experts
    admitted per layer between decodes (the hybrid's --moe-cache-admit; -1: the engine's choice, which is
    ``admit_auto`` here, since a replay measures no copy: None, the budget it starts with); ``admit_background``:
    the admissions upload in the background, as on a GPU (an admitted expert is a hit from the decode after the
    next); ``repartition``: decodes between two re-partitions of the slots between layers (0: never);
    ``ranked``: a profile's (layer, expert) pairs, hottest first, that fill the slots at the start."""

    mode: str = "upload"
    admit: int = 0
    admit_auto: int | None = None
    admit_background: bool = False
    repartition: int = 0
    ranked: Sequence[tuple[int, int]] = ()


@dataclass(frozen=True)
class ReplayLayer:
    """One layer's counts, as ``LayerStats`` counts a context's (hits and misses of the distinct experts of each
    lookup), and what the replay adds: the uploads, admissions, swaps and fills into the layer, its lookups (the
    split ones and the ubatches too large to look up), and its tokens with all their experts resident."""

    il: int
    n_slots: int          # at the end (a re-partition moves slots between layers)
    n_resident: int       # slots that hold an expert at the end
    n_slots_peer: int
    n_hit: int
    n_hit_profile: int
    n_miss: int           # n_upload + n_cpu + n_hit_peer
    n_upload: int
    n_cpu: int
    n_hit_peer: int
    n_admit: int
    n_swap: int
    n_fill: int
    n_lookup: int
    n_split: int
    n_large: int
    n_token: int
    n_token_resident: int
    n_ram_hit: int = 0    # three tiers (``ram_slots``): the RAM tier's lookups, as ``MoeCacheStats`` counts them
    n_ram_miss: int = 0


@dataclass(frozen=True)
class ReplayResult:
    """A replay's counts: per layer (in the order given), and the cache's totals."""

    layers: tuple[ReplayLayer, ...]
    n_decodes: int
    n_prefilled: int
    n_bytes_upload: int
    n_bytes_cpu: int
    n_admit: int
    n_swap: int           # adaptive: swaps and fills
    n_repartition: int    # re-partition rounds that moved slots
    n_repart_rounds: int
    n_moved: int          # slots they moved between layers
    n_demoted: int        # experts admission evicted into the peer
    n_ram_demoted: int = 0  # three tiers: experts the device let go that the RAM tier took
    n_ram_fill: int = 0     # three tiers: of the tier's misses, what the start put in the device's slots through it
    n_bytes_disk: int = 0   # three tiers: what the tier's misses read from the file (the context's n_bytes_disk
                            #   less its prompts' reads)
    n_bytes_ram_fill: int = 0  # of them, the start's fill's

    @property
    def n_hit(self) -> int:
        return sum(l.n_hit for l in self.layers)

    @property
    def n_miss(self) -> int:
        return sum(l.n_miss for l in self.layers)

    @property
    def n_ram_hit(self) -> int:
        return sum(l.n_ram_hit for l in self.layers)

    @property
    def n_ram_miss(self) -> int:
        return sum(l.n_ram_miss for l in self.layers)


def _shapes(layers: Sequence[LayerShape]) -> Any:
    arr = ffi.new("struct llama_moe_layer_shape[]", max(len(layers), 1))
    for a, l in zip(arr, layers):
        a.il, a.n_expert, a.n_used, a.group = l.il, l.n_expert, l.n_used, l.group
        a.expert_bytes, a.bias_bytes = l.expert_bytes, l.bias_bytes
    return arr


def _said(err: Any) -> str:
    return ffi.string(err).decode("utf-8", "replace")


def size_slots(layers: Sequence[LayerShape], size_bytes: int, hybrid: bool,
               layer_slots: Mapping[int, int] | None = None) -> dict[int, int]:
    """Layer -> the slots a cache of ``size_bytes`` gives it on one device, as a context sizes them before the
    device's free memory (which can only lower them): the same count in every layer, or, with a profile's per-layer
    counts (``layer_slots``), those counts scaled down where they do not fit; at most the layer's experts (then it
    is held whole). ParameterError, with the engine's words, when the size cannot hold one expert per layer."""
    lib = get_lib()
    if not layers:
        raise ParameterError("no layers: the cache serves at least one")
    if size_bytes < 0:
        raise ParameterError(f"a cache size is >= 0 bytes, got {size_bytes}")
    counts, n_counts = ffi.NULL, 0
    if layer_slots is not None:
        n_counts = max([il + 1 for il in layer_slots] + [l.il + 1 for l in layers])
        counts = ffi.new("uint32_t[]", n_counts)
        for il, n in layer_slots.items():
            counts[il] = max(0, min(int(n), 2**32 - 1))
    out = ffi.new("int32_t[]", len(layers))
    err = ffi.new("char[]", _ERR_BYTES)
    if lib.llama_moe_cache_size_slots(_shapes(layers), len(layers), int(size_bytes), hybrid, counts, n_counts, out, err,
                                      _ERR_BYTES) != 0:
        raise ParameterError(_said(err))
    return {l.il: int(out[i]) for i, l in enumerate(layers)}


_max_ubatch: int | None = None


def max_ubatch() -> int:
    """Ubatches of more tokens keep llama.cpp's path: the cache does not look their experts up."""
    global _max_ubatch
    if _max_ubatch is None:
        _max_ubatch = int(get_lib().llama_moe_cache_max_ubatch())
    return _max_ubatch


def adaptive_half_life() -> float:
    """Generated tokens over which the adaptive cache's heats halve: it follows a conversation over about this many."""
    return float(get_lib().llama_moe_cache_adaptive_half_life())


def records_stream(records: Iterable[RoutingRecord]) -> np.ndarray:
    """Records as the engine's routing trace lays them out (``Context.stop_trace``'s source): per ubatch and layer
    {il, n_tokens, k, the ids}, int32."""
    parts = []
    for rec in records:
        n, k = rec.experts.shape
        parts.append(np.array([rec.il, n, k], dtype=np.int32))
        parts.append(np.ascontiguousarray(rec.experts, dtype=np.int32).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


class PolicyReplay:
    """The cache's policies over ``layers`` with ``slots[il]`` slots each (and ``peer_slots[il]`` on a peer device),
    started as a context starts them, then fed a routing trace (``feed``) as the cache is fed it: each ubatch is one
    decode, and the rounds due between two decodes run before the next. ``ram_slots[il]``: three tiers, a RAM tier
    of that many slots a layer under the cache, driven as a context drives it. ``result()`` at any point.
    ParameterError for options or shapes a cache would not take, with the engine's words. Close it (or use
    ``with``) to free it."""

    def __init__(self, layers: Sequence[LayerShape], slots: Mapping[int, int], policy: ReplayPolicy = ReplayPolicy(),
                 peer_slots: Mapping[int, int] | None = None, ram_slots: Mapping[int, int] | None = None) -> None:
        if policy.mode not in MODES:
            raise ParameterError(f"mode {policy.mode!r}: one of {', '.join(MODES)}")
        missing = [l.il for l in layers if l.il not in slots]
        if missing:
            raise ParameterError(f"no slot count for layers {missing}")
        self._lib = get_lib()
        self._lock = threading.Lock()
        self._n = len(layers)
        p = ffi.new("struct llama_moe_replay_params *")
        p.mode, p.admit, p.repartition = MODES[policy.mode], policy.admit, policy.repartition
        p.admit_auto = -1 if policy.admit_auto is None else policy.admit_auto
        p.admit_background = policy.admit_background
        ranked = ffi.new("uint16_t[]", max(2 * len(policy.ranked), 1))
        for i, (il, e) in enumerate(policy.ranked):
            if not (0 <= il < 65536 and 0 <= e < 65536):
                raise ParameterError(f"ranked pair {i} ({il}, {e}) is out of a profile's range (0 to 65535)")
            ranked[2 * i], ranked[2 * i + 1] = il, e
        p.ranked, p.n_ranked = ranked, len(policy.ranked)
        n_slots = ffi.new("int32_t[]", [int(slots[l.il]) for l in layers] or [0])
        peer = ffi.new("int32_t[]", [int(peer_slots.get(l.il, 0)) for l in layers] or [0]) if peer_slots else ffi.NULL
        err = ffi.new("char[]", _ERR_BYTES)
        ptr = self._lib.llama_moe_replay_init(p, _shapes(layers), n_slots, peer, len(layers), err, _ERR_BYTES)
        if ptr == ffi.NULL:
            raise ParameterError(_said(err))
        self._ptr = ptr
        self._free = weakref.finalize(self, self._lib.llama_moe_replay_free, ptr)
        self._free.atexit = False
        if ram_slots is not None:
            missing = [l.il for l in layers if l.il not in ram_slots]
            if missing:
                self.close()
                raise ParameterError(f"no RAM tier slot count for layers {missing}")
            ram = ffi.new("int32_t[]", [int(ram_slots[l.il]) for l in layers] or [0])
            if self._lib.llama_moe_replay_set_ram_tier(ptr, ram, err, _ERR_BYTES) != 0:
                self.close()
                raise ParameterError(_said(err))

    def _live(self) -> Any:
        if not self._free.alive:
            raise ClosedError("the replay is closed")
        return self._ptr

    def feed(self, data: np.ndarray) -> None:
        """Feeds records in the engine's routing trace layout (int32: per ubatch and layer {il, n_tokens, k, ids}),
        whole records; a record of a layer not after the one before starts the next ubatch. Records of layers the
        replay does not have are passed over. ParameterError for a record cut short, a k other than the layer's or
        an expert out of range (the records before it were fed)."""
        buf = np.ascontiguousarray(data, dtype=np.int32)
        err = ffi.new("char[]", _ERR_BYTES)
        with self._lock:
            rc = self._lib.llama_moe_replay_feed(self._live(), ffi.from_buffer("int32_t[]", buf), buf.size, err, _ERR_BYTES)
        if rc != 0:
            raise ParameterError(_said(err))

    def feed_records(self, records: Iterable[RoutingRecord]) -> None:
        """``feed`` of ``RoutingRecord``s (``Context.stop_trace()``'s)."""
        self.feed(records_stream(records))

    def result(self) -> ReplayResult:
        with self._lock:
            ptr = self._live()
            arr = ffi.new("struct llama_moe_replay_layer_stats[]", max(self._n, 1))
            n = min(self._n, self._lib.llama_moe_replay_get_layer_stats(ptr, arr, self._n))
            tot = ffi.new("struct llama_moe_replay_stats *")
            self._lib.llama_moe_replay_get_stats(ptr, tot)
        names = [f for f in ReplayLayer.__dataclass_fields__]
        layers = tuple(ReplayLayer(**{f: int(getattr(a, f)) for f in names}) for a in arr[0:n])
        return ReplayResult(layers, **{f: int(getattr(tot, f)) for f in ReplayResult.__dataclass_fields__ if f != "layers"})

    def slots(self, il: int) -> list[int]:
        """What layer ``il``'s slots hold now, slot by slot (-1: free, or an admission still in flight); [] for a
        layer the replay does not have."""
        with self._lock:
            ptr = self._live()
            n = self._lib.llama_moe_replay_get_slots(ptr, il, ffi.NULL, 0)
            arr = ffi.new("int32_t[]", max(n, 1))
            n = min(n, self._lib.llama_moe_replay_get_slots(ptr, il, arr, n))
        return [int(x) for x in arr[0:n]]

    def close(self) -> None:
        self._free()

    def __enter__(self) -> "PolicyReplay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["LayerShape", "MODES", "PolicyReplay", "ReplayLayer", "ReplayPolicy", "ReplayResult", "adaptive_half_life",
           "max_ubatch", "records_stream", "size_slots"]
