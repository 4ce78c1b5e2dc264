"""Reads the shared libraries an ELF file names (DT_NEEDED), without readelf."""
from __future__ import annotations

import struct
from pathlib import Path

_DT_NEEDED, _DT_STRTAB, _PT_DYNAMIC, _PT_LOAD = 1, 5, 2, 1


def needed_libraries(path: Path) -> list[str] | None:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared object, or None if it is not one."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []

    def file_offset(vaddr: int) -> int:
        for v, off, size in loads:
            if v <= vaddr < v + size:
                return vaddr - v + off
        return vaddr

    entries = []
    strtab = 0
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == _DT_STRTAB:
            strtab = file_offset(val)
        elif tag == _DT_NEEDED:
            entries.append(val)
    out = []
    for name_off in entries:
        start = strtab + name_off
        out.append(data[start:data.index(b"\0", start)].decode(errors="replace"))
    return out


def links_libstdcxx_statically(path: Path) -> bool:
    """True when a C++ library carries its own libstdc++ instead of linking the shared one. Loaded into a
    process that already has the shared libstdc++ (numpy 2 brings it), the two mix and crash."""
    needed = needed_libraries(path)
    if needed is None or any(n.startswith("libstdc++") or n.startswith("libc++") for n in needed):
        return False
    data = path.read_bytes()
    return b"__gxx_personality_v0" in data or b"_ZNSt" in data  # C++ code, so the runtime is inside
