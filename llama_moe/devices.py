"""The compute devices the native library sees, with their free and total memory."""
from __future__ import annotations

from dataclasses import dataclass

from ._native.ffi import ffi
from ._native.loader import get_lib


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    kind: str  # "cpu", "gpu", "igpu", "accel" or "meta"
    free_bytes: int
    total_bytes: int

    @property
    def mib_free(self) -> float:
        return self.free_bytes / 2**20

    @property
    def mib_total(self) -> float:
        return self.total_bytes / 2**20


_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


def devices() -> list[Device]:
    lib = get_lib()
    out = []
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        lib.ggml_backend_dev_memory(dev, free, total)
        out.append(Device(ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
                          ffi.string(lib.ggml_backend_dev_description(dev)).decode(),
                          _KINDS.get(int(lib.ggml_backend_dev_type(dev)), "?"), int(free[0]), int(total[0])))
    return out


def gpus() -> list[Device]:
    return [d for d in devices() if d.kind in ("gpu", "igpu")]
