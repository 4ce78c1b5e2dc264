"""The MoE cache's settings as ``ContextParams`` fields: each field names its field of the engine's
``llama_moe_cache_params`` (include/llama-moe-params.h) and the type and range it takes. Python checks those
alone; the rules between the settings (admission needs the hybrid, ...) are the engine's, which refuses what
cannot apply and says why in the context's status (``Context.cache_status()``, and a ``MoeCacheWarning``).

A new setting is one field of ``ContextParams`` made with ``cache_setting``, whose name is ``moe_cache_`` and
the C field's name (docs/configuration.md has the steps)."""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Literal

from ._native.ffi import enum_names, ffi
from .errors import ParameterError

MiB = 2**20
PREFIX = "moe_cache_"

# what a setting takes; None, in any of them, leaves the engine's default
Kind = Literal["flag", "whole", "admit", "tristate", "share", "name", "path", "mode"]
# the mode's words, as llama.cpp's --moe-cache-mode spells them: enum llama_moe_cache_choice's names (0: the flags)
_CHOICES = {name: v for v, name in enum_names("enum llama_moe_cache_choice", "LLAMA_MOE_CACHE_CHOICE_").items() if v}
MOE_CACHE_MODES = tuple(sorted(_CHOICES, key=_CHOICES.get))  # "auto", "upload", "hybrid", "adaptive", "admit"
MoeCacheMode = Literal["auto", "upload", "hybrid", "adaptive", "admit"]
SIZE_AUTO = 2**64 - 1  # LLAMA_MOE_CACHE_SIZE_AUTO (SIZE_MAX): the size the engine measures on the device


@dataclass(frozen=True)
class CacheSetting:
    """A ContextParams field's C field (``llama_moe_cache_params.<c_name>``) and what it takes: a whole number
    or a share from ``low`` to ``high``, a device's name, a path, True/False, or (``tristate``) True/False/None
    for 1/0/-1 (auto); ``admit`` is a whole number or "auto" (-1); ``mode`` one of MOE_CACHE_MODES."""

    c_name: str
    kind: Kind
    low: float = 0
    high: float = 0
    what: str = ""


def cache_setting(kind: Kind, low: float = 0, high: float = 0, what: str = "", default: Any = None) -> Any:
    """A ContextParams field for ``llama_moe_cache_params.<name without moe_cache_>``; ``default`` None leaves
    the engine's default (llama_moe_cache_default_params)."""
    return dataclasses.field(default=default, metadata={"moe_cache": CacheSetting("", kind, low, high, what)})


def settings(params: Any) -> list[tuple[str, CacheSetting]]:
    """The cache's settings of a ContextParams: (field name, its setting with the C field named)."""
    out = []
    for f in dataclasses.fields(params):
        spec = f.metadata.get("moe_cache")
        if spec is not None:
            out.append((f.name, dataclasses.replace(spec, c_name=f.name.removeprefix(PREFIX))))
    return out


def _is_whole(value: Any, low: float, high: float) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and low <= value <= high


def check(name: str, spec: CacheSetting, value: Any) -> None:
    """A ParameterError naming the field when ``value`` is not of the setting's type or out of its range."""
    if value is None:  # the engine's default
        return
    kind = spec.kind
    if kind == "flag" and not isinstance(value, bool):
        raise ParameterError(f"{name} must be True or False (or None: the engine's default), got {value!r}")
    if kind == "tristate" and not isinstance(value, bool):
        raise ParameterError(f"{name} must be True, False or None (the engine chooses), got {value!r}")
    if kind == "whole" and not _is_whole(value, spec.low, spec.high):
        raise ParameterError(f"{name} must be {spec.what or 'a whole number'} from {spec.low:g} to {spec.high:g}, got {value!r}")
    if kind == "admit" and value != "auto" and not _is_whole(value, spec.low, spec.high):
        raise ParameterError(f"{name} must be \"auto\" or {spec.what} from {spec.low:g} to {spec.high:g}, got {value!r}")
    if kind == "share":
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or not spec.low <= value <= spec.high:
            raise ParameterError(f"{name} must be {spec.what or 'a number'} from {spec.low:g} to {spec.high:g}, got {value!r}")
    if kind == "name":
        if not isinstance(value, str) or not value or "\0" in value or len(value.encode()) > 127:
            raise ParameterError(f"{name} must be a device's name (1 to 127 bytes, no NUL) or None, got {value!r}")
    if kind == "mode" and value not in MOE_CACHE_MODES:
        raise ParameterError(f"{name} must be one of {', '.join(map(repr, MOE_CACHE_MODES))} or None (the flags decide), "
                             f"got {value!r}")
    if kind == "path":
        if not isinstance(value, (str, bytes, os.PathLike)):
            raise ParameterError(f"{name} must be a path or None, got {value!r}")
        raw = os.fsencode(value)
        if not raw or b"\0" in raw:
            raise ParameterError(f"{name} must be a non-empty path without NUL, got {value!r}")


def check_mib(mib: Any, name: str = "moe_cache_mib") -> float | str:
    """``moe_cache_mib`` (or ``moe_ram_mib``): a number of MiB from 0 (none) to 16 TiB, or "auto" (the engine
    measures it)."""
    if mib == "auto":
        return "auto"
    if isinstance(mib, bool) or not isinstance(mib, numbers.Real) or not 0 <= mib <= 1 << 24:
        auto = ("what the machine can spare" if name == "moe_ram_mib" else
                "what the device has free once the model, the KV cache and the compute buffers are in")
        raise ParameterError(f"{name} must be a number of MiB from 0 to {1 << 24}, or \"auto\" ({auto}), got {mib!r}")
    return float(mib)


def mib_to_bytes(mib: float) -> int:
    """The byte count a MiB figure becomes: ContextParams.moe_cache_mib as llama.cpp's --moe-cache-mib takes it."""
    return int(mib * MiB)


def to_native(params: Any, native: Any, keep: list[Any]) -> None:
    """Sets ``native`` (a ``struct llama_moe_cache_params``, from the engine's defaults) from the fields that are
    not None; the strings it points to go to ``keep``, which must outlive the context's creation."""
    native.size = SIZE_AUTO if params.moe_cache_mib == "auto" else mib_to_bytes(params.moe_cache_mib)
    native.ram_size = SIZE_AUTO if params.moe_ram_mib == "auto" else mib_to_bytes(params.moe_ram_mib)
    for name, spec in settings(params):
        value = getattr(params, name)
        if value is None:
            continue
        if spec.kind in ("name", "path"):
            raw = ffi.new("char[]", os.fsencode(value))
            keep.append(raw)
            setattr(native, spec.c_name, raw)
        elif spec.kind == "admit":
            setattr(native, spec.c_name, -1 if value == "auto" else int(value))  # -1: the engine chooses
        elif spec.kind == "mode":
            setattr(native, spec.c_name, _CHOICES[value])
        elif spec.kind == "tristate":
            setattr(native, spec.c_name, 1 if value else 0)
        elif spec.kind == "share":
            setattr(native, spec.c_name, float(value))
        else:
            setattr(native, spec.c_name, value if spec.kind == "flag" else int(value))
