"""The cache's defaults on the real engine, with the cache in RAM: the mode in one word (moe_cache_mode, auto the
hybrid admitting with the engine's budget), the size the engine measures once the compute buffers are in
(moe_cache_mib="auto", the device's free memory given by a test switch), and the guard for slow links (the
copies that measure the link held to a rate by a test switch): auto leaves admission out or the cache off, an
explicit upload mode or admission is warned."""
from __future__ import annotations

import logging
import re
import warnings

import pytest

from llama_moe import Context, ContextParams, Model, ModelParams, MoeCacheStatus
from llama_moe.errors import MoeCacheWarning, ParameterError
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from support.cache_sizes import mib_for_slots

RAM = ModelParams(cpu_moe=True, repack=False)
PROMPT = "The ship left the harbour at dawn, and"
MiB = 2**20


@pytest.fixture(autouse=True)
def no_test_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLAMA_MOE_TEST_DEVICE_FREE_KIB", "LLAMA_MOE_TEST_COPY_GBPS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def profile(tiny_model_path, tmp_path_factory):
    layout = expert_layout(tiny_model_path)
    path = tmp_path_factory.mktemp("profile") / "tiny.strp"
    write_profile(path, Profile(layout.n_layer, layout.n_expert, 8,
                                tuple((l.il, e) for e in range(8) for l in layout.layers)))
    return path


def _open(model: Model, cp: ContextParams, tokens: int = 0) -> tuple[MoeCacheStatus, list[str], list[int], object]:
    """The status, the MoeCacheWarnings said, the tokens generated and the counters after them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx = Context(model, cp)
    with ctx:
        out = list(ctx.generate(PROMPT, tokens)) if tokens else []
        return (ctx.cache_status(), [str(w.message) for w in caught if issubclass(w.category, MoeCacheWarning)], out,
                ctx.moe_cache_stats())


# ------------------------------------------------------------------------------------------------- the mode

def test_auto_is_the_hybrid_admitting_with_the_engines_budget(lib, tiny_model_path) -> None:
    mib = mib_for_slots(tiny_model_path, 8, hybrid=True)
    with Model(tiny_model_path, RAM) as model:
        _, _, plain, _ = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256), tokens=24)
        status, said, out, stats = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_mode="auto"), tokens=24)
    assert (status.state, status.mode, status.admit, status.mode_auto, status.size_auto) == ("on", "hybrid", "auto", True, False)
    assert status.choice == "mode auto: the hybrid, admitting its misses (the engine's budget)"  # a cache in RAM: no link measured
    assert status.link_gbps == 0 and said == [] and status.n_slots == 8
    assert out == plain, "the admitting hybrid gives no cache's tokens"
    assert stats.hybrid and stats.n_admit > 0 and stats.n_upload == 0


@pytest.mark.parametrize("word, mode, admit", [("upload", "upload", 0), ("hybrid", "hybrid", 0), ("adaptive", "adaptive", 0),
                                               ("admit", "hybrid", "auto")])
def test_each_word_is_its_mode(lib, tiny_model_path, profile, word, mode, admit) -> None:
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), moe_cache_mode=word,
                       moe_cache_profile=profile)
    with Model(tiny_model_path, RAM) as model:
        status, said, _, _ = _open(model, cp)
    assert (status.state, status.mode, status.admit, status.mode_auto, status.choice) == ("on", mode, admit, False, ""), status
    assert said == []


def test_a_size_in_mib_alone_keeps_upload_mode_and_auto_alone_is_auto(lib, tiny_model_path, monkeypatch) -> None:
    """The contract's default: --moe-cache-mib N without a mode is upload mode. An automatic size without a mode or a
    mode flag is auto mode; with --moe-cache-hybrid the flags decide, as they do with a size in MiB."""
    monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(500 * 1024))
    with Model(tiny_model_path, RAM) as model:
        upload = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=2))[0]
        auto = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib="auto", moe_cache_margin_mib=0))[0]
        flags = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib="auto", moe_cache_margin_mib=0, moe_cache_hybrid=True,
                                           moe_cache_admit=2))[0]
    assert (upload.mode, upload.admit, upload.mode_auto, upload.size_auto) == ("upload", 0, False, False)
    assert (auto.mode, auto.admit, auto.mode_auto, auto.size_auto) == ("hybrid", "auto", True, True)
    assert (flags.mode, flags.admit, flags.mode_auto, flags.size_auto) == ("hybrid", 2, False, True)


# ------------------------------------------------------------------------------------------- the automatic size

def _compute_mib(caplog) -> float:
    """The CPU compute buffer of the first reserve, as llama.cpp itself logs it: the one the cache was sized after."""
    sizes = re.findall(r"CPU compute buffer size =\s+([\d.]+) MiB", caplog.text)
    assert sizes, caplog.text[-3000:]
    return float(sizes[0])


def test_the_automatic_size_is_what_the_compute_buffers_and_the_margin_leave(lib, tiny_model_path, monkeypatch, caplog) -> None:
    """The device's free memory is the test switch's (as if measured when the context is made); the engine reserves
    its compute buffers first, then gives the cache that memory less the buffers and the margin."""
    layout = expert_layout(tiny_model_path)
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    margin = 3
    with Model(tiny_model_path, RAM) as model:
        monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(500 * 1024))
        status = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib="auto", moe_cache_margin_mib=margin))[0]
        compute = _compute_mib(caplog)
        assert compute > 0 and status.state == "on" and status.n_slots == layout.n_expert  # room for every expert
        m = re.search(r"size auto: the cache takes ([\d.]+) MiB: CPU's free memory after the model, the KV cache and the "
                      r"compute buffers \(([\d.]+) MiB of them there\), ([\d.]+) MiB, less a margin of ([\d.]+) MiB, at most "
                      r"what holds every layer whole", status.choice)
        assert m, status.choice
        assert float(m[2]) == pytest.approx(compute, abs=0.01) and float(m[3]) == pytest.approx(500 - compute, abs=0.01)
        assert float(m[4]) == margin and status.size_auto and status.mode_auto
        assert all(part in caplog.text for part in status.choice.split("; "))  # the log says each part too

        # free memory for exactly 10 slots a layer once the buffers and the margin are out
        caplog.clear()
        free_mib = compute + margin + mib_for_slots(tiny_model_path, 10, hybrid=True)
        monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(int(free_mib * 1024)))
        status, said, out, stats = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib="auto", moe_cache_margin_mib=margin),
                                         tokens=8)
        assert (status.state, status.n_slots, said) == ("on", 10, []), status
        assert f"size auto: the cache takes {mib_for_slots(tiny_model_path, 10, hybrid=True):.2f} MiB" in status.choice
        assert len(out) == 8 and stats.n_slots == 10 * len(layout.layers)

        # the margin leaves nothing: no cache, said
        monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(int((compute + margin - 0.5) * 1024)))
        status, said, _, _ = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib="auto", moe_cache_margin_mib=margin))
        assert (status.state, status.reason) == ("off", "no_room"), status
        assert "nothing is left: the cache is off" in status.text and len(said) == 1 and "moe_cache_mib=auto" in said[0]


# ------------------------------------------------------------------------------------------- the slow link

SLOW = "0.0005"  # GB/s: far below the CPU's products over the tiny model's experts, even on a loaded machine


def test_on_a_slow_link_auto_leaves_admission_out_or_the_cache_off(lib, tiny_model_path, profile, monkeypatch) -> None:
    mib = mib_for_slots(tiny_model_path, 8, hybrid=True)
    monkeypatch.setenv("LLAMA_MOE_TEST_COPY_GBPS", SLOW)
    with Model(tiny_model_path, RAM) as model:
        status, said, out, stats = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_mode="auto",
                                                              moe_cache_profile=profile), tokens=16)
        assert (status.state, status.reasons, status.mode, status.admit) == ("partial", ("slow_link",), "hybrid", 0), status
        assert status.link_gbps == pytest.approx(float(SLOW), rel=0.25) and status.cpu_gbps > status.link_gbps
        assert "mode auto: the hybrid without admission, the profile's experts staying: the link to CPU carries " \
            f"{status.link_gbps:.3g} GB/s" in status.text and status.text in status.choice
        assert "more than 2 times the CPU's product, so uploads cannot pay for themselves" in status.text
        assert len(said) == 1 and status.text in said[0]
        assert stats.n_admit == 0 and stats.n_prefilled > 0 and len(out) == 16

        status, said, _, _ = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_mode="auto"))
        assert (status.state, status.reason) == ("off", "slow_link"), status
        assert "mode auto: no cache: the link to CPU carries" in status.text and "without a profile the hybrid would stay empty" \
            in status.text


@pytest.mark.parametrize("kw, what", [({}, "upload mode"), ({"moe_cache_mode": "admit"}, "admission"),
                                      ({"moe_cache_hybrid": True, "moe_cache_admit": 2}, "admission")],
                         ids=["upload", "admit", "admit by the flags"])
def test_on_a_slow_link_an_explicit_upload_mode_runs_warned(lib, tiny_model_path, monkeypatch, kw, what) -> None:
    monkeypatch.setenv("LLAMA_MOE_TEST_COPY_GBPS", SLOW)
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), **kw)
    with Model(tiny_model_path, RAM) as model:
        status, said, out, _ = _open(model, cp, tokens=4)
    assert (status.state, status.reasons) == ("on", ("slow_link",)), status  # as asked, with the warning
    assert status.text.startswith(f"{what} on a slow link: the link to CPU carries {status.link_gbps:.3g} GB/s: an expert's upload")
    assert "--moe-cache-mode auto leaves uploads out" in status.text and status.admit == (0 if what == "upload mode" else
                                                                                          kw.get("moe_cache_admit", "auto"))
    assert len(said) == 1 and "as asked, with a warning: " + status.text in said[0] and len(out) == 4


def test_a_link_fast_enough_or_not_measured_keeps_auto(lib, tiny_model_path, monkeypatch) -> None:
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), moe_cache_mode="auto")
    with Model(tiny_model_path, RAM) as model:
        status = _open(model, cp)[0]   # a cache in RAM without the switch: no link to measure
        assert (status.reasons, status.admit, status.link_gbps, status.cpu_gbps) == ((), "auto", 0.0, 0.0)
        monkeypatch.setenv("LLAMA_MOE_TEST_COPY_GBPS", "100000")   # no throttle to speak of
        status = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=2))[0]
        assert status.link_gbps > 0 and status.cpu_gbps > 0   # upload mode measured it
        if status.reasons:  # this machine's own copies slower than twice its products: the rule's other side
            assert status.reasons == ("slow_link",) and status.state == "on"


# ------------------------------------------------------------------------------------------- bad values

@pytest.mark.parametrize("kw, said", [
    ({"moe_cache_mode": "fast"}, "moe_cache_mode must be one of 'auto', 'upload', 'hybrid', 'adaptive', 'admit' or None"),
    ({"moe_cache_mode": "Auto"}, "moe_cache_mode must be one of"),
    ({"moe_cache_mib": "Auto"}, "moe_cache_mib must be a number of MiB from 0 to 16777216, or \"auto\""),
    ({"moe_cache_mib": "512"}, "moe_cache_mib must be a number of MiB"),
    ({"moe_cache_mib": "auto", "moe_cache_margin_mib": -1}, "moe_cache_margin_mib must be a whole number of MiB from 0"),
    ({"moe_cache_mib": "auto", "moe_cache_margin_mib": 1.5}, "moe_cache_margin_mib must be a whole number of MiB"),
])
def test_bad_values_are_refused_before_anything_loads(kw, said) -> None:
    with pytest.raises(ParameterError, match=re.escape(said)):
        ContextParams(**kw).validate()


@pytest.mark.parametrize("kw, said", [
    ({"moe_cache_mode": "upload", "moe_cache_hybrid": True}, "--moe-cache-mode upload contradicts --moe-cache-hybrid, which is ignored"),
    ({"moe_cache_mode": "hybrid", "moe_cache_admit": 2}, "--moe-cache-mode hybrid contradicts --moe-cache-admit, which is ignored"),
    ({"moe_cache_mode": "auto", "moe_cache_adaptive": True}, "--moe-cache-mode auto contradicts --moe-cache-adaptive, which is ignored"),
    ({"moe_cache_margin_mib": 100}, "--moe-cache-margin-mib 100 applies to --moe-cache-mib auto"),
    ({"moe_cache_hybrid": True, "moe_cache_repartition": 8}, "--moe-cache-repartition 8 needs the admitting hybrid"),
])
def test_what_cannot_apply_with_the_rest_is_the_engines_to_refuse(lib, tiny_model_path, kw, said) -> None:
    """Python takes each value (its type and range are right); the engine ignores what contradicts the rest, says
    why, and keeps the reason in the status."""
    cp = ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib_for_slots(tiny_model_path, 8, hybrid=True), **kw)
    cp.validate()
    with Model(tiny_model_path, RAM) as model:
        status, warned, _, _ = _open(model, cp)
    assert "option_ignored" in status.reasons and said in status.text, status.text
    assert any(said in w for w in warned)


def test_the_words_that_admit_take_what_admission_needs(lib, tiny_model_path) -> None:
    """moe_cache_admit sets the budget of auto and admit, and re-partition follows an admitting word as it follows
    the flags; the mode and the margin without a size are named as given for nothing."""
    mib = mib_for_slots(tiny_model_path, 8, hybrid=True)
    with Model(tiny_model_path, RAM) as model:
        for mode in ("auto", "admit"):
            status = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mib=mib, moe_cache_mode=mode,
                                               moe_cache_admit=2, moe_cache_repartition=8))[0]
            assert status.as_asked and status.admit == 2, status.text
        status, warned, _, _ = _open(model, ContextParams(moe_cache_device="CPU", n_ctx=256, moe_cache_mode="auto",
                                                          moe_cache_margin_mib=10))
    assert status.state == "off" and status.reasons == ("no_size",)
    assert "--moe-cache-mode, --moe-cache-margin-mib: no effect without --moe-cache-mib" in status.text