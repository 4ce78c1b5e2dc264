"""The MoE cache's counters as frozen dataclasses, copied out of the C structs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._native.ffi import enum_names


class HitRate:
    """hits / (hits + misses + refused) for anything that counts them (the context's, a layer's, a server's).

    A refused lookup is in the denominator, so that a cache too small for its ubatches never reads as a good one.
    The engine refuses none (upload mode splits such a ubatch: the misses without a slot are computed on the CPU
    and count as misses, and in n_cpu); n_refused is kept so that servers and logs of older builds read alike."""

    n_hit: int
    n_miss: int
    n_refused: int

    @property
    def n_lookup(self) -> int:
        return self.n_hit + self.n_miss + self.n_refused

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses + refused); 0.0 before the first lookup (``engine_hit_rate``)."""
        return engine_hit_rate(self.n_hit, self.n_miss, self.n_refused)


def engine_hit_rate(n_hit: int, n_miss: int, n_refused: int) -> float:
    """The engine's definition of the hit rate (``llama_moe_cache_hit_rate``), which its exit line, /metrics and
    the request lines use too."""
    from ._native.loader import get_lib

    return float(get_lib().llama_moe_cache_hit_rate(n_hit, n_miss, n_refused))


@dataclass(frozen=True)
class MoeCacheStats(HitRate):
    """Counters since the context was created. Hits, misses and refused count distinct experts per ubatch and
    layer, in ubatches of up to 32 tokens; layers held whole need no lookups and are not counted. n_refused is 0
    (the engine refuses no lookup), n_resident the slots holding an expert now, n_admit the missed
    experts the hybrid uploaded between decodes (moe_cache_admit). Every miss is uploaded, computed on the CPU or
    computed by the peer tier: n_miss = n_upload + n_cpu + n_hit_peer. n_upload: upload mode's misses uploaded when
    looked up; n_cpu: the misses the CPU computed (upload mode: those of a ubatch with more distinct experts than
    a layer's slots that found no slot it did not use; the hybrid: every miss the peer does not compute;
    n_bytes_cpu their bytes); n_hit_peer: those the peer tier computed (moe_cache_peer), n_slots_peer its slots and
    n_bytes_peer its memory (not in n_bytes_cache). n_admitted: the experts brought into slots while running
    (n_upload + n_swap + n_admit, the exit line's "admitted"). n_repartition: the rounds that moved slots between
    layers (moe_cache_repartition), n_moved the slots they moved. With the RAM tier (``ram_tier``,
    ContextParams.moe_ram_mib) the cache is in RAM and its uploads are reads of the model's file: n_disk_reads
    expert tensors (three an expert), n_bytes_disk bytes, disk_wait_us the time decodes waited for them, and of
    the bytes n_bytes_disk_prompt those of ubatches over 32 tokens (prompts, not looked up: each reads the experts
    it selects that no slot holds into a staging copy of one layer's experts). n_ram_hit and n_ram_miss are the RAM
    tier's lookups: alone, the cache's hits and misses; under a device cache (``ram_below``, three tiers: both
    moe_cache_mib and moe_ram_mib), the experts the device's slots lacked, distinct per ubatch, that the tier held
    or read from the file. Each is the engine's own figure."""

    n_hit: int
    n_hit_profile: int
    n_miss: int
    n_bytes_upload: int
    n_bytes_cpu: int
    hybrid: bool
    n_copy: int
    n_bytes_copy: int
    n_slots: int
    n_prefilled: int
    n_bytes_cache: int
    n_swap: int
    n_refused: int = 0
    n_resident: int = 0
    n_admit: int = 0
    n_cpu: int = 0
    n_repartition: int = 0
    n_moved: int = 0
    n_hit_peer: int = 0
    n_slots_peer: int = 0
    n_upload: int = 0
    n_admitted: int = 0
    n_bytes_peer: int = 0
    ram_tier: bool = False
    n_disk_reads: int = 0
    n_bytes_disk: int = 0
    disk_wait_us: int = 0
    n_bytes_disk_prompt: int = 0
    ram_below: bool = False
    n_ram_hit: int = 0
    n_ram_miss: int = 0

    @classmethod
    def _from_native(cls, s: Any) -> "MoeCacheStats":
        return cls(int(s.n_hit), int(s.n_hit_profile), int(s.n_miss), int(s.n_bytes_upload), int(s.n_bytes_cpu),
                   bool(s.hybrid), int(s.n_copy), int(s.n_bytes_copy), int(s.n_slots), int(s.n_prefilled),
                   int(s.n_bytes_cache), int(s.n_swap), int(s.n_refused), int(s.n_resident), int(s.n_admit),
                   int(s.n_cpu), int(s.n_repartition), int(s.n_moved), int(s.n_hit_peer), int(s.n_slots_peer),
                   int(s.n_upload), int(s.n_admitted), int(s.n_bytes_peer), bool(s.ram_tier), int(s.n_disk_reads),
                   int(s.n_bytes_disk), int(s.disk_wait_us), int(s.n_bytes_disk_prompt), bool(s.ram_below),
                   int(s.n_ram_hit), int(s.n_ram_miss))


_STATES = enum_names("enum llama_moe_cache_state", "LLAMA_MOE_CACHE_STATE_")
_MODES = enum_names("enum llama_moe_cache_mode", "LLAMA_MOE_CACHE_MODE_")
_REASONS = {v: name for v, name in enum_names("enum llama_moe_cache_reason", "LLAMA_MOE_CACHE_REASON_").items() if v}  # NONE: no bit
CACHE_STATES = tuple(_STATES[v] for v in sorted(_STATES))   # "off", "on", "partial"
CACHE_MODES = tuple(_MODES[v] for v in sorted(_MODES))      # "none", "upload", "hybrid", "adaptive"
CACHE_REASONS = tuple(_REASONS[v] for v in sorted(_REASONS))  # bit i of llama_moe_cache_status.reasons: "no_size", ...


@dataclass(frozen=True)
class MoeCacheStatus:
    """What became of the MoE cache asked for, as the engine decided it when the context was created
    (``llama_moe_cache_get_status``). ``state`` is "on" (as asked), "partial" (a cache, other than asked) or "off";
    ``reasons`` names every condition that made it so (``CACHE_REASONS``), ``reason`` the first, ``text`` says them
    in words; ``mode`` is the cache made ("upload", "hybrid", "adaptive", or "none" when off); ``profile_error``
    says why the profile was refused ("" when it was used, or none was given); ``peer`` names the peer tier's
    device ("" when none). ``admit`` is the admission the hybrid runs (0: none, "auto": the engine's budget, N a
    layer and decode); ``mode_auto`` and ``size_auto`` say whether the engine chose the mode (``moe_cache_mode="auto"``)
    and measured the size (``moe_cache_mib="auto"``), ``choice`` how, in words, with the link's and the CPU's rates
    measured when the context was made (``link_gbps``, ``cpu_gbps``; 0 when not measured). The reason
    "slow_link" on a cache that is "on" is a warning only: an explicit upload mode or admission on a slow link.
    ``ram_tier``: the cache is the RAM tier (slots in locked RAM, filled from the model's file), or has one under it
    (three tiers: ``MoeCacheStats.ram_below``); ``disk_direct``:
    its reads bypass the page cache (False where the file system refuses O_DIRECT)."""

    state: str
    reason: str | None
    reasons: tuple[str, ...]
    text: str
    mode: str
    mailbox: bool
    device: str
    n_slots: int  # slots per layer; with a profile's per-layer counts, the most of any layer (layer_stats: each)
    n_slots_asked: int  # what the size gave before the device's free memory (the most of any layer, likewise)
    n_layers: int
    n_layers_whole: int
    n_bytes: int
    profile_error: str = ""
    peer: str = ""
    admit: int | str = 0
    mode_auto: bool = False
    size_auto: bool = False
    link_gbps: float = 0.0
    cpu_gbps: float = 0.0
    choice: str = ""
    ram_tier: bool = False
    disk_direct: bool = False

    @property
    def as_asked(self) -> bool:
        return not self.reasons

    @classmethod
    def _from_native(cls, s: Any, ffi: Any) -> "MoeCacheStatus":
        bits = int(s.reasons)
        # a bit these declarations do not name (a newer engine's) is kept by its value
        reasons = tuple(_REASONS.get(1 << i, f"unknown ({1 << i})") for i in range(bits.bit_length()) if bits >> i & 1)
        first = int(s.reason)
        reason = _REASONS.get(first, f"unknown ({first})") if first > 0 else None
        state, mode = int(s.state), int(s.mode)
        return cls(_STATES.get(state, f"unknown ({state})"), reason, reasons,
                   ffi.string(s.text).decode("utf-8", "replace"),
                   _MODES.get(mode, f"unknown ({mode})"), bool(s.mailbox),
                   ffi.string(s.device).decode("utf-8", "replace"), int(s.n_slots), int(s.n_slots_asked),
                   int(s.n_layers), int(s.n_layers_whole), int(s.n_bytes),
                   ffi.string(s.profile_error).decode("utf-8", "replace"), ffi.string(s.peer).decode("utf-8", "replace"),
                   "auto" if int(s.admit) == -1 else int(s.admit), bool(s.mode_auto), bool(s.size_auto), float(s.link_gbps),
                   float(s.cpu_gbps), ffi.string(s.choice).decode("utf-8", "replace"), bool(s.ram_tier),
                   bool(s.disk_direct))


@dataclass(frozen=True)
class SeqStats(HitRate):
    """One sequence's share of the counters since the context was created (llama_moe_cache_get_seq_stats): each
    distinct expert a ubatch selects in a layer is charged whole to the sequence of the first token that selected
    it, so the sequences' shares add up to the context's hits, misses, refused selections and bytes (the hybrid's
    uploads between decodes aside), and its misses split as the context's: n_miss = n_upload + n_cpu + n_hit_peer."""

    n_hit: int
    n_miss: int
    n_refused: int
    n_bytes_upload: int
    n_bytes_cpu: int
    n_upload: int = 0
    n_cpu: int = 0
    n_hit_peer: int = 0


@dataclass(frozen=True)
class LayerStats(HitRate):
    il: int
    n_slots: int
    n_hit: int
    n_hit_profile: int
    n_miss: int
    n_refused: int = 0
    n_cpu: int = 0
    n_slots_peer: int = 0  # the peer tier's slots for the layer (moe_cache_peer), and of its misses those the peer
    n_hit_peer: int = 0    # computed
    n_bytes_disk: int = 0  # the RAM tier: bytes read from the model's file for the layer, and the time waited
    disk_wait_us: int = 0


@dataclass(frozen=True)
class CacheDevice(HitRate):
    """A device that holds MoE cache slots, as the engine placed them (``llama_moe_cache_get_devices``): with the
    model's layers split across devices, each layer's slots are on the device that computes it. ``layers`` are
    the model layers whose slots it holds, ``n_slots`` the slots per layer (with a profile's per-layer counts,
    the most of any of its layers: ``Context.layer_stats`` has each), ``n_bytes`` its memory for the cache."""
    name: str
    description: str
    layers: tuple[int, ...]
    n_slots: int
    n_slots_total: int
    n_bytes: int
    n_hit: int
    n_miss: int
    n_cpu: int
    n_refused: int = 0


def lookups_line(n_hit: int, n_miss: int, n_refused: int, n_admitted: int | None, n_resident: int | None,
                 n_slots: int) -> str:
    """The line llama.cpp prints at exit, "H hits of L lookups = R (A admitted, N refused, cache F% full)": A is the
    engine's n_admitted ("?" from a server that does not report it), R n/a before the first lookup, F "?" when the
    slots' fill is not known."""
    lookups = n_hit + n_miss + n_refused
    ratio = f"{engine_hit_rate(n_hit, n_miss, n_refused):.4f}" if lookups else "n/a"
    full = "?" if n_resident is None or not n_slots else f"{100.0 * n_resident / n_slots:.2f}"
    admitted = "?" if n_admitted is None else str(n_admitted)
    return f"{n_hit} hits of {lookups} lookups = {ratio} ({admitted} admitted, {n_refused} refused, cache {full}% full)"


def cache_lines(c: Any, off_reason: str | None = None, not_as_asked: str | None = None) -> list[str]:
    """The MoE cache's summary lines, the same for a context's MoeCacheStats and a server's MoeCacheMetrics
    (None: no cache; with ``off_reason``: asked for, and off; with ``not_as_asked``: a cache, other than asked)."""
    if c is None and off_reason:
        return [f"MoE cache    OFF: asked for, but llama.cpp went on without it: {off_reason}"]
    if c is None:
        return ["MoE cache    none (--moe-cache-mib N turns it on)",
                *([f"             NOT AS ASKED: {not_as_asked}"] if not_as_asked else [])]
    mode = "hybrid" if c.hybrid else "upload"
    admit = getattr(c, "n_admit", 0)
    cpu, peer = getattr(c, "n_cpu", 0), getattr(c, "n_hit_peer", 0)
    if c.hybrid:
        moved = f"the CPU computed {cpu} misses, reading {c.n_bytes_cpu / 2**20:.2f} MiB"
        if peer:
            moved += f", the peer {peer}"
    else:
        moved = f"{c.n_bytes_upload / 2**20:.2f} MiB uploaded"
        if cpu:
            moved += f"; {cpu} misses computed on the CPU, reading {c.n_bytes_cpu / 2**20:.2f} MiB"
    if getattr(c, "ram_below", False):
        mode += " over a RAM tier"
        moved += (f"; the RAM tier held {c.n_ram_hit} of {c.n_ram_hit + c.n_ram_miss} experts the slots lacked, "
                  f"{(c.n_bytes_disk or 0) / 2**20:.2f} MiB read from the model's file "
                  f"({(c.disk_wait_us or 0) / 1000:.1f} ms waited)")
    elif getattr(c, "ram_tier", False):
        mode = "RAM tier, upload"
        moved = (f"{(c.n_bytes_disk or 0) / 2**20:.2f} MiB read from the model's file "
                 f"({(c.disk_wait_us or 0) / 1000:.1f} ms waited)")
        if cpu:
            moved += f"; {cpu} misses beyond a ubatch's slots read for it alone ({c.n_bytes_cpu / 2**20:.2f} MiB)"
    if c.hybrid and admit:
        moved += f"; {admit} admitted between decodes ({c.n_bytes_upload / 2**20:.2f} MiB uploaded)"
    return [f"MoE cache    {mode} mode, {c.n_bytes_cache / 2**20:.2f} MiB, {c.n_slots} slots, {c.n_prefilled} prefilled by the profile",
            *([f"             NOT AS ASKED: {not_as_asked}"] if not_as_asked else []),
            f"             hit rate {c.hit_rate:.3f} ({c.n_hit} hits, {c.n_hit_profile} from the profile, {c.n_miss} misses), {moved}",
            "             " + lookups_line(c.n_hit, c.n_miss, c.n_refused, getattr(c, "n_admitted", None), c.n_resident,
                                              c.n_slots),
            *([f"             the peer tier computed {c.n_hit_peer} of the {c.n_miss} misses in its {c.n_slots_peer} slots"]
              if getattr(c, "n_slots_peer", 0) else []),
            *([f"             {c.n_repartition} re-partition{'s' if c.n_repartition != 1 else ''} moved {c.n_moved} slots "
               f"between layers"]
              if getattr(c, "n_repartition", 0) else [])]
