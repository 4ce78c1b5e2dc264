"""Where the MoE cache's slots go when the model's layers are split across devices (-sm layer, -ts, RPC
servers): each layer's slots on the device that computes it, ``moe_cache_size`` bytes per device. Read from the
engine where the devices are at hand (``engine_devices``: the model loaded on them, its experts in RAM), or,
without them, from ``budget``'s mirror of the engine's rule for a tensor split (``mirrored_devices``)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import CacheBudgetError, ToolInputError
from ...errors import MoeCacheWarning
from ..experts import ExpertLayout
from ...params import mib_to_bytes
from .budget import MiB, cache_device_layers, engine_device_layer_slots, engine_device_slots


@dataclass(frozen=True)
class DeviceSplit:
    """One device of the cache: its name (the engine's, such as RPC0; "device N" for the mirror: the model's
    N-th device), what it is (an RPC server's address), its MoE layers and the slots in each (with a profile's
    per-layer counts, ``slots`` is the most of any of its layers and ``layer_slots`` has each)."""
    name: str
    description: str
    layers: tuple[int, ...]
    slots: int
    n_bytes: int | None = None  # the engine's buffer on the device (None: mirrored, not allocated)
    layer_slots: tuple[int, ...] = ()  # each layer's slots, as ``layers``; empty: ``slots`` in each

    def slots_of(self) -> dict[int, int]:
        """Layer -> its slots on this device (before capping at the layer's experts, for equal slots)."""
        return dict(zip(self.layers, self.layer_slots)) if self.layer_slots else {il: self.slots for il in self.layers}


def mirrored_devices(layout: ExpertLayout, tensor_split: Sequence[float], cache_mib: float,
                     hybrid: bool, layer_slots: Mapping[int, int] | None = None) -> list[DeviceSplit]:
    """The cache's devices for ``tensor_split`` (llama.cpp's -ts, every layer offloaded) and ``cache_mib`` per
    device, by the engine's rule mirrored in ``budget``; CacheBudgetError for a device whose budget cannot hold one
    slot in each of its layers (the engine would leave them on llama.cpp's path). ``layer_slots``: a profile's
    per-layer counts (il -> slots), which each device sizes its own layers from within its own budget
    (``engine_device_layer_slots``). The devices' free memory, which can only lower a device's slots, is not
    known here."""
    out = []
    for dev, layers in cache_device_layers(layout, tensor_split):
        if layer_slots is not None:
            each = engine_device_layer_slots(layout, layers, mib_to_bytes(cache_mib), dict(layer_slots), hybrid)
            counts = tuple(each[il] for il in layers) if each else ()
            slots = max(counts, default=0)
        else:
            slots = engine_device_slots(layout, layers, mib_to_bytes(cache_mib), hybrid)
            counts = ()
        if slots < 1:
            raise CacheBudgetError(f"{cache_mib:g} MiB per device cannot hold one expert in each of device {dev}'s "
                                   f"{len(layers)} layers (the engine would leave them on llama.cpp's path)")
        out.append(DeviceSplit(f"device {dev}", f"share {float(tensor_split[dev]):g} of the tensor split", layers, slots,
                               layer_slots=counts))
    return out


def engine_devices(model_path: str, layout: ExpertLayout, cache_mib: float, hybrid: bool, rpc: Sequence[str] = (),
                   tensor_split: Sequence[float] = (), profile: str | None = None) -> list[DeviceSplit]:
    """The cache's devices as the engine places them: the model loaded with its experts in RAM (cpu_moe), its
    other weights on the devices (the ``rpc`` servers', then the machine's GPUs; split by ``tensor_split``, or by
    free memory without), and a context with a cache of ``cache_mib`` per device, whose devices and each layer's
    slots are read back (``Context.cache_devices``, ``Context.layer_stats``). ``profile``: a profile whose
    per-layer counts each device sizes its layers from. ToolInputError when the engine turns the cache off,
    refuses the profile or leaves layers out."""
    from ...context import Context
    from ...model import Model
    from ...params import ContextParams, ModelParams

    mp = ModelParams(cpu_moe=True, repack=False, rpc=tuple(rpc), tensor_split=tuple(tensor_split))
    cp = ContextParams(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=1, moe_cache_mib=cache_mib,
                       moe_cache_hybrid=hybrid, moe_cache_profile=profile)
    with warnings.catch_warnings():
        # what the engine made of the size is read back below; a hybrid without a profile, said at every
        # context, is no news here
        warnings.simplefilter("ignore", MoeCacheWarning)
        with Model(model_path, mp) as model, Context(model, cp) as ctx:
            status = ctx.cache_status()
            devices = ctx.cache_devices()
            each = {l.il: l.n_slots for l in ctx.layer_stats()}
    if not devices:
        raise ToolInputError(f"the engine turned the cache off: {status.text}")
    if profile is not None and "profile_refused" in status.reasons:
        raise ToolInputError(f"the engine refused the profile {profile}: {status.text}")
    placed = sorted(il for d in devices for il in d.layers)
    left = sorted(set(l.il for l in layout.layers) - set(placed))
    if left:
        raise ToolInputError(f"the engine left layers {left} off the cache ({status.text}): "
                             f"give each device more than {cache_mib:g} MiB")
    return [DeviceSplit(d.name, d.description, d.layers, d.n_slots, d.n_bytes, tuple(each[il] for il in d.layers))
            for d in devices]


def describe_budget(cache_mib: float, devices: Sequence[DeviceSplit]) -> str:
    return f"--moe-cache-mib {cache_mib:g} on each of {len(devices)} devices ({len(devices) * cache_mib:g} MiB in all)"


__all__ = ["DeviceSplit", "MiB", "describe_budget", "engine_devices", "mirrored_devices"]
