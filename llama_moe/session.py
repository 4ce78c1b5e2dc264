"""Sessions: sequence 0 of a context (its KV state, through llama.cpp's state-seq API, and its tokens) saved to
a file with the MoE cache's working set beside it, and loaded back into a context of the same model.

The file: ``LMSESS01``, a little-endian u32 header length, the header (JSON: the model's identity and
geometry, the tokens, each cached layer's resident experts), a u64 state length, llama.cpp's state bytes, and
a CRC-32 of everything before it. A file that is damaged, truncated, of another model or too long for the
context is refused with SessionError before the context is touched; a state llama.cpp itself refuses puts
back the sequence the context held.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._native.ffi import ffi
from .context import Context
from .errors import SessionError
from .formats.atomic import write_bytes

log = logging.getLogger(__name__)

MAGIC = b"LMSESS01"


@dataclass(frozen=True)
class SessionInfo:
    """What a session holds: its tokens, the state's size, and the experts each cached layer held when it was
    saved (layer index -> expert ids, ascending; empty without a cache)."""

    path: Path
    tokens: tuple[int, ...]
    state_bytes: int
    working_set: dict[int, tuple[int, ...]]
    n_warmed: int = 0  # load_session: experts of the working set brought into the cache

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def identity(ctx: Context) -> dict[str, Any]:
    """The model a session belongs to: what llama.cpp reports of it and the MoE geometry of its GGUF."""
    m = ctx.model
    g = m.geometry
    return {"description": m.description, "n_params": m.n_params, "size_bytes": m.size_bytes, "n_vocab": m.n_vocab,
            "n_embd": m.n_embd, "n_layer": m.n_layer, "n_expert": g.n_expert, "n_expert_used": g.n_expert_used,
            "n_ff_exp": g.n_ff_exp}


def save_session(ctx: Context, path: str | os.PathLike[str]) -> SessionInfo:
    """Writes sequence 0 of ``ctx`` (whole, replacing any file at ``path``) and returns what it holds."""
    path = Path(path)
    with ctx._lock:
        lib, ptr = ctx._lib, ctx._live()
        if len(ctx._evaluated) != ctx.n_past:
            raise SessionError("the context's tokens are not known (a batch run or a failed decode since the last "
                               "reset): nothing to save")
        size = int(lib.llama_state_seq_get_size(ptr, 0))
        buf = ffi.new("uint8_t[]", max(size, 1))
        n = int(lib.llama_state_seq_get_data(ptr, buf, size, 0))
        if n == 0 and size:
            raise SessionError("llama_state_seq_get_data copied nothing")
        state = ffi.buffer(buf, n)[:]
        working = {s.il: tuple(int(e) for e in ctx.resident(s.il)) for s in ctx.layer_stats()}
        tokens = tuple(ctx._evaluated)
    header = json.dumps({"model": identity(ctx), "tokens": list(tokens),
                         "working_set": {str(k): list(v) for k, v in working.items()}}).encode()
    body = MAGIC + struct.pack("<I", len(header)) + header + struct.pack("<Q", len(state)) + state
    data = body + struct.pack("<I", zlib.crc32(body))
    write_bytes(path, data)
    log.info("session saved: %s, %d tokens, %d bytes of state", path, len(tokens), len(state))
    return SessionInfo(path, tokens, len(state), working)


def read_session(path: str | os.PathLike[str]) -> tuple[dict[str, Any], bytes]:
    """The header and the state bytes of a session file, or SessionError saying what is wrong with it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SessionError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    if data[:len(MAGIC)] != MAGIC:
        raise SessionError(f"{path}: not a llama_moe session (no {MAGIC.decode()} magic)")
    if len(data) < len(MAGIC) + 4 + 8 + 4:
        raise SessionError(f"{path}: truncated ({len(data)} bytes)")
    (crc,) = struct.unpack("<I", data[-4:])
    if zlib.crc32(data[:-4]) != crc:
        raise SessionError(f"{path}: damaged or truncated (the checksum does not match)")
    (n_header,) = struct.unpack_from("<I", data, len(MAGIC))
    at = len(MAGIC) + 4
    if at + n_header + 8 > len(data) - 4:
        raise SessionError(f"{path}: the header's length runs past the end")
    try:
        header = json.loads(data[at:at + n_header])
        tokens, model, working = header["tokens"], header["model"], header["working_set"]
        if not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) and isinstance(model, dict)
                and isinstance(working, dict)
                and all(k.isdigit() and isinstance(v, list) and all(isinstance(e, int) and not isinstance(e, bool)
                                                                     for e in v) for k, v in working.items())):
            raise ValueError("fields of the wrong type")
    except (ValueError, KeyError, TypeError) as exc:
        raise SessionError(f"{path}: the header is malformed: {exc}") from exc
    at += n_header
    (n_state,) = struct.unpack_from("<Q", data, at)
    at += 8
    if at + n_state != len(data) - 4:
        raise SessionError(f"{path}: the state's length does not match the file's")
    return header, data[at:at + n_state]


def load_session(ctx: Context, path: str | os.PathLike[str], warm: bool = True) -> SessionInfo:
    """Replaces sequence 0 of ``ctx`` by the session's (its last token evaluated again, so that generation
    continues from it); the context is unchanged when the file is refused. With ``warm`` and a cache, each
    layer's saved experts are uploaded into its slots first (``Context.admit_experts``; counted as admissions),
    so that a returning conversation starts with its experts."""
    path = Path(path)
    header, state = read_session(path)
    mine = identity(ctx)
    theirs = header["model"]
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if diff:
        said = ", ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} here" for k in diff)
        raise SessionError(f"{path}: saved with another model ({said})")
    tokens = header["tokens"]
    with ctx._lock:
        lib, ptr = ctx._lib, ctx._live()
        room = int(lib.llama_n_ctx_seq(ptr))
        if len(tokens) > room:
            raise SessionError(f"{path}: {len(tokens)} tokens do not fit this context's {room} positions")
        if any(not 0 <= t < mine["n_vocab"] for t in tokens):
            raise SessionError(f"{path}: a token outside the vocabulary")
        # what the context holds now, put back should llama.cpp refuse the state
        size = int(lib.llama_state_seq_get_size(ptr, 0))
        before = ffi.new("uint8_t[]", max(size, 1))
        n_before = int(lib.llama_state_seq_get_data(ptr, before, size, 0))
        mem = lib.llama_get_memory(ptr)
        lib.llama_memory_seq_rm(mem, 0, -1, -1)
        src = ffi.from_buffer("uint8_t[]", state) if state else ffi.new("uint8_t[]", 1)
        if not tokens:
            ok = True
        else:
            ok = int(lib.llama_state_seq_set_data(ptr, src, len(state), 0)) > 0
        if not ok or int(lib.llama_memory_seq_pos_max(mem, 0)) + 1 != len(tokens):
            lib.llama_memory_seq_rm(mem, 0, -1, -1)
            if n_before:
                lib.llama_state_seq_set_data(ptr, before, n_before, 0)
            raise SessionError(f"{path}: llama.cpp refused the saved state (a context of another KV layout?); "
                               f"the context is as it was")
        ctx.n_past = len(tokens)
        ctx._evaluated[:] = tokens
        # the conversation's experts back in the cache before its next token (a cache of any mode; at most
        # each layer's slots)
        working = {int(k): tuple(int(e) for e in v) for k, v in header["working_set"].items()}
        has_cache = bool(lib.llama_moe_cache_get_stats(ptr, ffi.new("struct llama_moe_cache_stats *")))
        warmed = 0
        if has_cache and warm:
            for il, experts in working.items():
                if experts and 0 <= il < mine["n_layer"] and all(0 <= e < mine["n_expert"] for e in experts):
                    warmed += max(0, int(lib.llama_moe_cache_admit_experts(ptr, il, ffi.new("int32_t[]", list(experts)),
                                                                           len(experts))))
        if tokens:  # the state holds no logits: the last token is evaluated again, for the next one's
            lib.llama_memory_seq_rm(mem, 0, len(tokens) - 1, -1)
            ctx.n_past -= 1
            del ctx._evaluated[-1]
            ctx.decode(tokens[-1:])
    log.info("session loaded: %s, %d tokens, %d experts brought into the cache", path, len(tokens), warmed)
    return SessionInfo(path, tuple(tokens), len(state), working, warmed)
