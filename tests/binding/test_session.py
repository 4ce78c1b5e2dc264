"""Sessions on the real library: sequence 0 saved and loaded back continues as the unsaved context would, the
cache's working set goes beside it, and a damaged, truncated or foreign file is refused with the context left
as it was."""
from __future__ import annotations

from pathlib import Path

import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, SessionError
from llama_moe.chat import chat
from llama_moe.session import MAGIC, load_session, read_session, save_session

PROMPT = "The ship left the harbour at dawn, and the crew"
RAM = ModelParams(cpu_moe=True, repack=False)


@pytest.fixture(scope="module")
def model(lib, tiny_model_path):
    with Model(tiny_model_path, RAM) as m:
        yield m


def _params(**kw) -> ContextParams:
    return ContextParams(moe_cache_device="CPU", n_ctx=512, n_threads=2, **kw)


def test_a_loaded_session_continues_as_the_saved_context_would(model, tmp_path: Path) -> None:
    path = tmp_path / "s.session"
    with Context(model, _params(moe_cache_mib=2)) as ctx:
        first = list(ctx.generate(PROMPT, 16, stop_at_eog=False))
        info = save_session(ctx, path)
        rest = list(ctx.generate([], 16, stop_at_eog=False))
    assert info.n_tokens == len(model.tokenize(PROMPT)) + len(first) and info.state_bytes > 0
    assert info.working_set and all(len(v) > 0 for v in info.working_set.values())
    with Context(model, _params()) as other:
        list(other.generate("Something else entirely", 8))
        loaded = load_session(other, path)
        assert loaded.tokens == info.tokens and loaded.working_set == info.working_set
        assert other.n_past == info.n_tokens
        assert list(other.generate([], 16, stop_at_eog=False)) == rest
        # a chat afterwards sees the loaded tokens as what the context holds
        assert chat(other, [{"role": "user", "content": "hi"}], max_tokens=2).n_reused == 0


def _with_header(tmp_path: Path, data: bytes, **model: int) -> Path:
    """The session ``data`` with fields of its model identity changed, and a valid checksum."""
    import json
    import struct
    import zlib

    (n,) = struct.unpack_from("<I", data, len(MAGIC))
    header = json.loads(data[len(MAGIC) + 4:len(MAGIC) + 4 + n])
    header["model"].update(model)
    raw = json.dumps(header).encode()
    body = MAGIC + struct.pack("<I", len(raw)) + raw + data[len(MAGIC) + 4 + n:-4]
    path = tmp_path / "foreign.session"
    path.write_bytes(body + struct.pack("<I", zlib.crc32(body)))
    return path


def test_bad_files_are_refused_and_the_context_is_unchanged(model, tmp_path: Path, tiny_q4_model_path) -> None:
    path = tmp_path / "s.session"
    with Context(model, _params()) as ctx:
        list(ctx.generate(PROMPT, 300, stop_at_eog=False))
        save_session(ctx, path)
    data = path.read_bytes()
    header, state = read_session(path)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    cases = {"truncated.session": (data[:-100], "damaged or truncated"), "flipped.session": (bytes(flipped), "damaged"),
             "magic.session": (b"XXXXXXXX" + data[8:], "not a llama_moe session"),
             "short.session": (MAGIC + b"\0", "truncated"), "empty.session": (b"", "not a llama_moe session")}
    with Context(model, _params()) as ctx:
        list(ctx.generate("To grow tomatoes in a small garden, start with", 4, stop_at_eog=False))
        n_past = ctx.n_past
        for name, (content, why) in cases.items():
            p = tmp_path / name
            p.write_bytes(content)
            with pytest.raises(SessionError, match=why):
                load_session(ctx, p)
            assert ctx.n_past == n_past
        with pytest.raises(SessionError, match="another model"):  # the identity is read before anything else
            load_session(ctx, _with_header(tmp_path, data, n_embd=1))
        assert ctx.n_past == n_past
        # a well-formed file whose state llama.cpp refuses (cut short): the sequence held before is put back
        import struct
        import zlib
        (n,) = struct.unpack_from("<I", data, len(MAGIC))
        at = len(MAGIC) + 4 + n
        body = data[:at] + struct.pack("<Q", len(state) // 2) + state[:len(state) // 2]
        (tmp_path / "cut.session").write_bytes(body + struct.pack("<I", zlib.crc32(body)))
        with pytest.raises(SessionError, match="llama.cpp refused the saved state"):
            load_session(ctx, tmp_path / "cut.session")
        assert ctx.n_past == n_past
        with pytest.raises(SessionError, match="cannot read"):
            load_session(ctx, tmp_path / "missing.session")
        with Model(tiny_q4_model_path, RAM) as q4, Context(q4, _params()) as foreign:
            with pytest.raises(SessionError, match="another model"):
                load_session(foreign, path)
        with Context(model, ContextParams(moe_cache_device="CPU", n_ctx=256, n_threads=2)) as small:
            with pytest.raises(SessionError, match="do not fit"):
                load_session(small, path)
        expected = list(ctx.generate([], 8, stop_at_eog=False))
    with Context(model, _params()) as fresh:
        list(fresh.generate("To grow tomatoes in a small garden, start with", 4, stop_at_eog=False))
        assert list(fresh.generate([], 8, stop_at_eog=False)) == expected  # the refusals changed nothing
    assert state and header["tokens"]


def test_a_returning_conversation_starts_with_its_experts(model, tmp_path: Path, tiny_model_path) -> None:
    """An admitting hybrid's working set saved with the session is brought into a fresh context's cache on load:
    the tokens after the resume are the same warm or cold, and the first 32 tokens hit more often warm."""
    from llama_moe import Sampling
    from support.cache_sizes import mib_for_slots
    sampling = Sampling(temperature=0.8, seed=5)
    cp = _params(moe_cache_mib=mib_for_slots(tiny_model_path, 12, hybrid=True), moe_cache_hybrid=True,
                 moe_cache_admit=2)
    path = tmp_path / "warm.session"
    with Context(model, cp) as ctx:
        list(ctx.generate(PROMPT, 96, sampling, stop_at_eog=False))
        saved = save_session(ctx, path)
    n_saved = sum(len(v) for v in saved.working_set.values())
    assert n_saved > 0
    runs = {}
    for warm in (False, True):
        with Context(model, cp) as ctx:
            info = load_session(ctx, path, warm=warm)
            assert info.n_warmed == (n_saved if warm else 0)
            if warm:
                for il, experts in saved.working_set.items():
                    assert sorted(ctx.resident(il).tolist()) == sorted(experts)
            start = ctx.moe_cache_stats()
            tokens = list(ctx.generate([], 32, sampling, stop_at_eog=False))
            end = ctx.moe_cache_stats()
            runs[warm] = (tokens, (end.n_hit - start.n_hit) / (end.n_lookup - start.n_lookup))
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > runs[False][1], runs


def test_admit_experts_refuses_what_it_cannot_do(model, tiny_model_path) -> None:
    from llama_moe.errors import ParameterError
    with Context(model, _params()) as ctx:
        with pytest.raises(ParameterError, match="no MoE cache"):
            ctx.admit_experts(0, [1, 2])
    with Context(model, _params(moe_cache_mib=2)) as ctx:
        with pytest.raises(ParameterError, match="out of range"):
            ctx.admit_experts(0, [1, 999])
        assert ctx.admit_experts(0, [3, 4, 3]) == 2
        assert {3, 4} <= set(ctx.resident(0).tolist())
        assert ctx.admit_experts(0, [3]) == 0  # held already
        assert ctx.moe_cache_stats().n_admit == 2
