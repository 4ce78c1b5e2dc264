"""Every refusal of the STRP profile reader, one fixed case each (tests/binding/test_fuzz.py only shows that random damage
is refused with *some* ProfileError): the message each damage gets, and that the engine's own loader refuses the same
file for the same reason (its warning, the cache then starts empty)."""
from __future__ import annotations

import logging
import re
import struct
import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.errors import ProfileError
from llama_moe.formats.profile import Profile, read_profile, write_profile

L, E = 6, 32  # the tiny model's layers and experts


def _strp(magic: bytes = b"STRP", version: int = 1, layers: int = L, experts: int = E, slots: int = 8,
          ranked: list[tuple[int, int]] | None = None, n_ranked: int | None = None, table: bool = True) -> bytes:
    """A profile's bytes, each field as given (valid by default: two pairs, the rank table after them)."""
    ranked = [(0, 1), (5, 31)] if ranked is None else ranked
    head = struct.pack("<4s5I", magic, version, layers, experts, slots, len(ranked) if n_ranked is None else n_ranked)
    pairs = np.asarray(ranked, dtype="<u2").reshape(-1, 2).tobytes()
    ranks = np.full(layers * experts if table and layers * experts < 1 << 20 else 0, -1, dtype="<i4")
    for rank, (il, e) in enumerate(ranked):
        if 0 <= il < layers and 0 <= e < experts and ranks.size and ranks[il * experts + e] < 0:
            ranks[il * experts + e] = rank
    return head + pairs + ranks.tobytes()


# (bytes, the model's geometry given to the reader or None, the message after "PATH: ", the engine says it too)
CASES = {
    "empty file": (b"", None, r"not a profile \(the magic is not STRP\)", True),
    "shorter than the magic": (b"STR", None, r"not a profile \(the magic is not STRP\)", True),
    "another magic": (_strp(magic=b"GGUF"), None, r"not a profile \(the magic is not STRP\)", True),
    "header cut": (_strp()[:23], None, r"truncated: 23 bytes, shorter than the 24-byte header", True),
    "magic only": (b"STRP", None, r"truncated: 4 bytes, shorter than the 24-byte header", True),
    "version 0": (_strp(version=0), None, r"version 0, this llama_moe reads version 1", False),
    "version 2": (_strp(version=2), None, r"version 2, this llama_moe reads version 1", False),
    "layers of another model": (_strp(layers=5), (L, E), r"made for 5 layers x 32 experts, but the model has 6 x 32", True),
    "experts of another model": (_strp(experts=16, ranked=[(0, 1)]), (L, E),
                                 r"made for 6 layers x 16 experts, but the model has 6 x 32", True),
    "layers checked alone": (_strp(layers=7), (L, None), r"made for 7 layers x 32 experts", False),
    "experts checked alone": (_strp(experts=33), (None, E), r"made for 6 layers x 33 experts", False),
    "more ranked pairs than pairs": (_strp(n_ranked=L * E + 1), None,
                                     rf"n_ranked is {L * E + 1}, more than n_layers x n_expert = {L * E}", True),
    "pairs cut": (_strp(table=False)[:24 + 4 + 2], None,
                  r"truncated: the header promises 2 ranked pairs, the file holds fewer", True),
    "a count over the file": (_strp(n_ranked=100, table=False), None,
                              r"truncated: the header promises 100 ranked pairs, the file holds fewer", True),
    "a pair's layer out of range": (_strp(ranked=[(0, 1), (6, 0)]), None,
                                    r"pair 1 is \(layer 6, expert 0\), out of range for 6 x 32", True),
    "a pair's expert out of range": (_strp(ranked=[(3, 32)]), None,
                                     r"pair 0 is \(layer 3, expert 32\), out of range for 6 x 32", True),
    "no layers": (_strp(layers=0, ranked=[]), None, r"a profile needs 1..65535 layers and experts, got 0 x 32", False),
    "no experts": (_strp(experts=0, ranked=[]), None, r"a profile needs 1..65535 layers and experts, got 6 x 0", False),
    "more layers than a u16 counts": (_strp(layers=65536, ranked=[], table=False), None,
                                      r"a profile needs 1..65535 layers and experts, got 65536 x 32", False),
    "more experts than a u16 counts": (_strp(experts=65536, ranked=[], table=False), None,
                                       r"a profile needs 1..65535 layers and experts, got 6 x 65536", False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_damage_is_refused_with_its_reason(tmp_path, name) -> None:
    data, geometry, said, _ = CASES[name]
    path = tmp_path / "p.strp"
    path.write_bytes(data)
    with pytest.raises(ProfileError, match=rf"^{path}: {said}"):
        read_profile(path, *(geometry or ()))


def test_the_valid_profile_the_cases_start_from_is_read(tmp_path) -> None:
    """The cases damage one field each of this file: undamaged, it is read, with or without the model's geometry."""
    path = tmp_path / "p.strp"
    path.write_bytes(_strp())
    assert read_profile(path, L, E) == read_profile(path) == Profile(L, E, 8, ((0, 1), (5, 31)))
    write_profile(tmp_path / "q.strp", Profile(L, E, 8, ((0, 1), (5, 31))))
    assert (tmp_path / "q.strp").read_bytes() == _strp()


@pytest.mark.parametrize("make, said", [
    (lambda p: None, "cannot read it: No such file or directory"),
    (lambda p: p.mkdir(), "cannot read it: Is a directory"),
], ids=["missing", "a directory"])
def test_a_file_that_cannot_be_read_is_a_profile_error(tmp_path, make, said) -> None:
    path = tmp_path / "p.strp"
    make(path)
    with pytest.raises(ProfileError, match=rf"^{path}: {said}$"):
        read_profile(path)


@pytest.mark.parametrize("kw, said", [
    (dict(n_layers=0), "a profile needs 1..65535 layers and experts, got 0 x 32"),
    (dict(n_expert=65536), "a profile needs 1..65535 layers and experts, got 6 x 65536"),
    (dict(ranked=((0, 0),) * (L * E + 1)), f"{L * E + 1} ranked pairs, more than 6 x 32"),
    (dict(ranked=((0, 0), (-1, 3))), r"pair 1 is \(layer -1, expert 3\), out of range for 6 x 32"),
    (dict(ranked=((5, 32),)), r"pair 0 is \(layer 5, expert 32\), out of range for 6 x 32"),
], ids=["no layers", "too many experts", "more pairs than pairs", "a negative layer", "an expert out of range"])
def test_a_profile_built_in_python_is_checked_as_one_read(kw, said) -> None:
    with pytest.raises(ProfileError, match=f"^{said}$"):
        Profile(**{"n_layers": L, "n_expert": E, "n_slots": 8, "ranked": (), **kw})


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[3]])
def test_the_engine_refuses_the_same_damage_for_the_same_reason(lib, tiny_model_path, tmp_path, monkeypatch, caplog,
                                                                name) -> None:
    """The native loader (src/llama-moe-profile.cpp of the patch series) makes the same checks against the loaded model:
    llama.cpp warns with the same reason and the cache starts empty. (Version and geometry-only cases word the
    version differently, or need the model's geometry the engine always has, and are left to the reader.)"""
    data, _, said, _ = CASES[name]
    path = tmp_path / "p.strp"
    path.write_bytes(data)
    caplog.set_level(logging.WARNING, logger="llama_moe.native")
    with Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False)) as model:
        with Context(model, ContextParams(n_ctx=256, moe_cache_mib=2, moe_cache_profile=path, moe_cache_device="CPU")) as ctx:
            stats = ctx.moe_cache_stats()
    assert stats is not None and stats.n_prefilled == 0
    warned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert f"MoE cache profile {path} refused: " in warned[0] and "the cache starts empty" in warned[0]
    assert re.search(said, warned[0]), (said, warned[0])
