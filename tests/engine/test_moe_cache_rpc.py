"""The model's layers on two ggml rpc-servers on 127.0.0.1 (llama.cpp's --rpc), its experts in RAM, and the MoE
cache on the devices the engine picks: tokens and logits identical to no cache, counters equal to the independent
replay (tests/oracles/lru.py), and clear errors for a bad address, a dead server and a server killed mid-run."""
from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.errors import ParameterError, RpcServerError
from llama_moe.tools.experts import expert_layout
from llama_moe.tools.server.process import free_port
from oracles.lru import simulate_lru
from llama_moe.params import mib_to_bytes
from support.cache_sizes import mib_for_slots
from support.rpc_servers import RpcServer, find_rpc_server_binary, start_rpc_server

PROMPT = "The ship left the harbour at dawn, and the crew"
N_GEN = 24


@pytest.fixture(scope="module")
def rpc_pair(lib, tmp_path_factory: pytest.TempPathFactory):
    """Two rpc-servers on 127.0.0.1, stopped at the module's end (and killed with the test run)."""
    binary = find_rpc_server_binary()
    logs = tmp_path_factory.mktemp("rpc")
    servers: list[RpcServer] = []
    try:
        for i in range(2):
            servers.append(start_rpc_server(binary, logs / f"rpc{i}.log"))
        yield servers
    finally:
        for s in servers:
            s.stop()


def _params(servers: list[RpcServer]) -> ModelParams:
    return ModelParams(cpu_moe=True, repack=False, rpc=tuple(s.endpoint for s in servers))


def _run(model: Model, cp: ContextParams, trace: bool = False):
    with Context(model, cp) as ctx:
        if trace:
            ctx.start_trace()
        tokens = list(ctx.generate(PROMPT, max_tokens=N_GEN, stop_at_eog=False))
        logits = ctx.logits()
        records = ctx.stop_trace() if trace else []
        return tokens, logits, ctx.moe_cache_stats(), ctx.layer_stats(), records, ctx.cache_status()


def test_bad_rpc_addresses_are_refused_before_loading() -> None:
    for bad in ("127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":5000", "a:b", "x:1,y:2", " 127.0.0.1:5000"):
        with pytest.raises(ParameterError, match="rpc"):
            ModelParams(rpc=(bad,)).validate()
    with pytest.raises(ParameterError, match="tuple"):
        ModelParams(rpc="127.0.0.1:5000").validate()  # type: ignore[arg-type]
    with pytest.raises(ParameterError, match="twice"):
        ModelParams(rpc=("127.0.0.1:5000", "127.0.0.1:5000")).validate()


def test_bad_tensor_splits_are_refused(lib, tiny_model_path) -> None:
    for bad, why in (((-1.0, 1.0), ">= 0"), ((float("nan"),), ">= 0"), ((0.0, 0.0), "every share is 0"),
                     ("1,1", "tuple"), ((1.0,) * 17, "at most 16"), ((True,), ">= 0")):
        with pytest.raises(ParameterError, match=why):
            ModelParams(tensor_split=bad).validate()  # type: ignore[arg-type]
    # more shares than the model has devices: llama.cpp would read the first ones only
    with pytest.raises(ParameterError, match="3 shares, but the model has 0 device"):
        Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False, tensor_split=(1.0, 1.0, 1.0)))


def test_a_server_that_does_not_answer_is_a_clear_error(lib, tiny_model_path) -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(RpcServerError, match=f"no rpc-server answers at 127.0.0.1:{port}"):
        Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False, rpc=(f"127.0.0.1:{port}",)))
    assert time.monotonic() - started < 10


def test_a_server_of_another_protocol_is_a_clear_error(lib, tiny_model_path) -> None:
    import socket
    import threading

    with socket.socket() as listener:  # answers every connection with a line of text, as an HTTP server might
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(RpcServerError, match="not as a ggml rpc-server"):
            Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False, rpc=(f"127.0.0.1:{port}",)))


def _expected_slots(layout, n_layers: int, size: int) -> int:
    """The contract: moe_cache_size bytes per device, the same slots in each of its layers, after each layer's
    expert map (its n_expert int32 ids, padded to 256 bytes)."""
    maps = n_layers * -(-layout.n_expert * 4 // 256) * 256
    return min(layout.n_expert, (size - maps) // (n_layers * layout.layers[0].bytes_per_expert))


@pytest.mark.parametrize("slots_all", [4, 12])  # the size of 4 (12) slots per layer on one device
def test_each_layer_s_slots_are_on_its_own_rpc_device(rpc_pair, tiny_model_path, caplog, slots_all) -> None:
    layout = expert_layout(tiny_model_path)
    mib = mib_for_slots(tiny_model_path, slots_all)
    size = int(mib * 2**20)
    caplog.set_level(logging.DEBUG, logger="llama_moe.native")
    base = dict(n_ctx=512, n_threads=2)
    with Model(tiny_model_path, _params(rpc_pair)) as model:
        # llama.cpp's load log: the layers' weights went to both servers' devices, and which layer to which
        on = set(re.findall(r"RPC\d+\[([^\]]+)\] model buffer size", caplog.text))
        assert on == {s.endpoint for s in rpc_pair}, caplog.text[-3000:]
        layer_dev = {int(il): dev for il, dev in re.findall(r"load_tensors: layer +(\d+) assigned to device (\S+),", caplog.text)}
        plain_tokens, plain_logits, no_stats, _, _, _ = _run(model, ContextParams(**base))
        assert no_stats is None
        caplog.clear()
        with Context(model, ContextParams(**base, moe_cache_mib=mib)) as ctx:
            ctx.start_trace()
            tokens = list(ctx.generate(PROMPT, max_tokens=N_GEN, stop_at_eog=False))
            logits = ctx.logits()
            records = ctx.stop_trace()
            stats, layers, status, devices = ctx.moe_cache_stats(), ctx.layer_stats(), ctx.cache_status(), ctx.cache_devices()
    assert len(tokens) == N_GEN
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)

    # each MoE layer's slots on the device llama.cpp put the layer on, the budget per device
    moe_layers = [l.il for l in layout.layers]
    assert len(devices) == 2 and {d.description for d in devices} == {s.endpoint for s in rpc_pair}, devices
    assert sorted(il for d in devices for il in d.layers) == moe_layers
    expected: dict[int, int] = {}
    for d in devices:
        assert {layer_dev[il] for il in d.layers} == {d.name}, (d, layer_dev)
        assert d.n_slots == _expected_slots(layout, len(d.layers), size)
        expected.update({il: d.n_slots for il in d.layers})
        assert d.n_slots_total == d.n_slots * len(d.layers)
        assert f"{d.name} (layers " in status.device
    assert {l.il: l.n_slots for l in layers} == expected
    assert stats is not None and stats.n_slots == sum(d.n_slots_total for d in devices)
    assert stats.n_bytes_cache == sum(d.n_bytes for d in devices) == status.n_bytes
    assert status.state == "on" and status.n_slots == max(d.n_slots for d in devices)  # the most of any layer

    # the counters: per layer and per device, as the independent replay of the trace
    sim = simulate_lru(records, expected, layout.n_expert)
    assert (stats.n_hit, stats.n_miss, stats.n_cpu) == (sim.n_hit, sim.n_miss, sim.n_cpu)
    replayed = {il: (*sim.per_layer.get(il, (0, 0)), sim.per_layer_cpu.get(il, 0)) for il in moe_layers}  # whole: none
    assert {l.il: (l.n_hit, l.n_miss, l.n_cpu) for l in layers} == replayed
    for d in devices:
        assert (d.n_hit, d.n_miss, d.n_cpu) == tuple(sum(replayed[il][j] for il in d.layers) for j in range(3))
    assert stats.n_hit > 0 and stats.n_miss > 0
    # the load log says where each device's slots are
    for d in devices:
        assert re.search(rf"llama_moe_cache: [\d.]+ MiB on {re.escape(d.name)} \(layers [\d,-]+\): {d.n_slots} slots per layer",
                         caplog.text), caplog.text[-3000:]


# per-layer counts that fit 1 MiB on each device with the split 1,1: fewer than a token's experts (upload mode
# computes some of every token's experts on the CPU), a few, many, more than the layer's experts (held whole)
_FITTING = {0: 3, 1: 12, 2: 2, 3: 20, 4: 5, 5: 35}


def test_each_device_sizes_its_layers_from_the_profiles_counts(rpc_pair, tiny_model_path, tmp_path, caplog) -> None:
    """A profile's per-layer slot counts with the layers split across the two servers' devices (-ts 1,1, 1 MiB
    each): every layer gets its count on its device (read from the engine), nothing is said ignored, the tokens
    and logits are those of no cache, and the counters those of the independent replay with the same counts."""
    layout = expert_layout(tiny_model_path)
    profile = _layer_slots_profile(layout, tmp_path, _FITTING)
    want = {il: min(n, layout.n_expert) for il, n in _FITTING.items()}
    base = dict(n_ctx=512, n_threads=2)
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    mp = ModelParams(cpu_moe=True, repack=False, rpc=tuple(s.endpoint for s in rpc_pair), tensor_split=(1.0, 1.0))
    with Model(tiny_model_path, mp) as model:
        plain_tokens, plain_logits, *_ = _run(model, ContextParams(**base))
        caplog.clear()
        tokens, logits, stats, layers, records, status = _run(
            model, ContextParams(**base, moe_cache_mib=1.0, moe_cache_profile=profile), trace=True)
        with Context(model, ContextParams(**base, moe_cache_mib=1.0, moe_cache_profile=profile)) as ctx:
            devices = ctx.cache_devices()
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert status.state == "on" and status.reasons == (), status.text
    assert "not applied" not in caplog.text
    assert {l.il: l.n_slots for l in layers} == want
    assert len(devices) == 2 and [d.layers for d in devices] == [(0, 1, 2, 3), (4, 5)]
    for d in devices:
        assert d.n_slots == max(want[il] for il in d.layers)  # the most of its layers, as one device's status
        assert d.n_slots_total == sum(want[il] for il in d.layers)
        assert re.search(rf"llama_moe_cache: [\d.]+ MiB on {re.escape(d.name)} \(layers [\d,-]+\): per-layer slots from the "
                         rf"profile, {min(want[il] for il in d.layers)} to {d.n_slots} of {layout.n_expert} experts, "
                         rf"{d.n_slots_total} in all: " + " ".join(f"{il}:{want[il]}" for il in d.layers), caplog.text), \
            caplog.text[-3000:]
    assert status.n_slots == max(d.n_slots for d in devices) and status.n_layers_whole == 1
    assert stats is not None and stats.n_slots == sum(want.values())
    sim = simulate_lru(records, want, layout.n_expert, prefill=_ranked(layout))
    assert (stats.n_hit, stats.n_hit_profile, stats.n_miss, stats.n_cpu) == (sim.n_hit, sim.n_hit_profile, sim.n_miss,
                                                                             sim.n_cpu)
    assert stats.n_cpu > 0 and stats.n_hit_profile > 0


def test_a_profile_the_engine_refuses_is_refused_across_devices_too(rpc_pair, tiny_model_path, tmp_path) -> None:
    """A profile for another geometry, or one giving a cached layer no slots, is refused with the layers split
    across devices as on one device: said (profile_refused), and each device gives its layers equal slots; the
    planner's read of the engine says the engine refused it."""
    from llama_moe.errors import MoeCacheWarning
    from llama_moe.tools.errors import ToolInputError
    from llama_moe.formats.profile import Profile, write_profile
    from llama_moe.tools.routing.placement import engine_devices, mirrored_devices

    layout = expert_layout(tiny_model_path)
    other = tmp_path / "other.strp"
    write_profile(other, Profile(layout.n_layer + 1, layout.n_expert, 8, _ranked(layout),
                                 tuple(_FITTING.get(il, 0) for il in range(layout.n_layer + 1))))
    zero = _layer_slots_profile(layout, tmp_path, {**_FITTING, 4: 0})
    equal = [(d.layers, d.slots) for d in mirrored_devices(layout, (1.0, 1.0), 1.0, False)]
    mp = ModelParams(cpu_moe=True, repack=False, rpc=tuple(s.endpoint for s in rpc_pair), tensor_split=(1.0, 1.0))
    with Model(tiny_model_path, mp) as model:
        for bad, why in ((other, "layer"), (zero, "gives layer 4 no slots")):
            with pytest.warns(MoeCacheWarning, match=why):
                with Context(model, ContextParams(n_ctx=256, n_threads=2, moe_cache_mib=1.0, moe_cache_profile=bad)) as ctx:
                    status, devices = ctx.cache_status(), ctx.cache_devices()
            assert "profile_refused" in status.reasons and why in status.text, status.text
            assert [(d.layers, d.n_slots) for d in devices] == equal
    with pytest.raises(ToolInputError, match="refused the profile"):
        engine_devices(str(tiny_model_path), layout, 1.0, False, tuple(s.endpoint for s in rpc_pair), (1.0, 1.0), str(zero))


LONG_PROMPT = ("In the morning the baker lights the ovens long before the town wakes, shapes the loaves on the floured "
               "table, and listens to the first carts rattle over the cobbles outside the window")


@pytest.mark.parametrize("mode", ["upload", "hybrid", "adaptive", "admit", "admit-repart"])
def test_every_mode_works_per_device(rpc_pair, tiny_model_path, mode) -> None:
    """Each mode on the two servers' devices: the same text and logits as no cache after a prompt of over 32
    tokens, and the mode's own work. Slots move between layers within one device only: across two the option is
    ignored, and the status says why."""
    layout = expert_layout(tiny_model_path)
    hybrid = mode != "upload"
    kw = dict(moe_cache_hybrid=hybrid, moe_cache_adaptive=mode == "adaptive",
              moe_cache_admit=2 if mode.startswith("admit") else 0, moe_cache_repartition=16 if mode == "admit-repart" else 0)
    base = dict(n_ctx=512, n_threads=2)
    with Model(tiny_model_path, _params(rpc_pair)) as model:
        assert len(model.tokenize(LONG_PROMPT)) > 32

        def run(cp: ContextParams):
            with Context(model, cp) as ctx:
                tokens = list(ctx.generate(LONG_PROMPT, max_tokens=48, stop_at_eog=False))
                return tokens, ctx.logits(), ctx.moe_cache_stats(), ctx.cache_devices(), ctx.cache_status()

        plain_tokens, plain_logits, *_ = run(ContextParams(**base))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the hybrid without a profile starts empty: said, and meant here
            tokens, logits, stats, devices, status = run(ContextParams(
                **base, moe_cache_mib=mib_for_slots(tiny_model_path, 4, hybrid=hybrid), **kw))
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert len(devices) == 2 and status.mode == ("upload" if mode == "upload" else "adaptive" if mode == "adaptive" else "hybrid")
    assert stats is not None and stats.hybrid == hybrid
    if mode == "upload":
        # ggml's RPC devices take no offloaded ops: a prompt's expert matmuls stay on the CPU, beside the experts,
        # so the prompt copies out of the slots never apply there
        assert stats.n_copy == 0 and stats.n_hit > 0 and all(d.n_hit > 0 for d in devices)
    elif mode == "adaptive":
        assert stats.n_swap > 0 and stats.n_hit > 0
    elif mode.startswith("admit"):
        assert stats.n_admit > 0 and stats.n_hit > 0
        assert all(d.n_hit > 0 for d in devices)
        assert stats.n_moved == 0 and ("option_ignored" in status.reasons) == (mode == "admit-repart")
        if mode == "admit-repart":
            assert "--moe-cache-repartition 16 moves slots within one device" in status.text
    else:
        assert stats.n_hit == 0 and stats.n_miss > 0  # no profile, nothing admitted: the CPU computes every expert


def test_llama_server_with_rpc_puts_each_layer_s_slots_on_its_device(rpc_pair, tiny_model_path, tmp_path) -> None:
    """llama.cpp's own --rpc, in our llama-server: the same placement, said in its load line, and it serves."""
    import requests

    from llama_moe.tools.server import process as server_process
    from support.llama_server import find_server_binary

    endpoints = ",".join(s.endpoint for s in rpc_pair)
    args = ["-m", str(tiny_model_path), "--rpc", endpoints, "-ngl", "99", "--cpu-moe", "--no-repack",
            "--moe-cache-mib", "2", "-c", "512", "-t", "2", "-np", "1"]
    with server_process.start_server(find_server_binary(), args, tmp_path / "server.log") as server:
        r = requests.post(f"{server.url}/completion", json={"prompt": PROMPT, "n_predict": 8, "ignore_eos": True, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
    log = (tmp_path / "server.log").read_text(errors="replace")
    line = re.search(r"llama_moe: MoE cache on: .*", log)
    assert line and re.search(r"on RPC\d+ \(layers [\d,-]+\), RPC\d+ \(layers [\d,-]+\)", line.group(0)), log[-3000:]


def test_two_models_on_the_same_servers_at_once(rpc_pair, tiny_model_path) -> None:
    """ggml keeps one connection to each server and a server serves one client: the second model shares it."""
    with Model(tiny_model_path, _params(rpc_pair)) as first, Model(tiny_model_path, _params(rpc_pair)) as second:
        with Context(first, ContextParams(n_ctx=256, n_threads=2)) as a, \
                Context(second, ContextParams(n_ctx=256, n_threads=2)) as b:
            assert list(a.generate(PROMPT, max_tokens=8, stop_at_eog=False)) == \
                list(b.generate(PROMPT, max_tokens=8, stop_at_eog=False))


_CHILD = textwrap.dedent("""
    import sys
    from llama_moe import Context, ContextParams, Model, ModelParams
    model = Model(sys.argv[1], ModelParams(cpu_moe=True, repack=False, rpc=tuple(sys.argv[2:])))
    with Context(model, ContextParams(n_ctx=512, n_threads=1, moe_cache_mib=float(8))) as ctx:
        for n, tok in enumerate(ctx.generate("The ship left the harbour", max_tokens=400, stop_at_eog=False)):
            if n == 2:
                print("GENERATING", flush=True)
    print("FINISHED", flush=True)
""")


def test_a_server_killed_mid_run_ends_the_run_with_a_clear_error(lib, tiny_model_path, tmp_path) -> None:
    """ggml's RPC client cannot recover a lost server: the process ends, at once, saying so; it never hangs."""
    binary = find_rpc_server_binary()
    servers = [start_rpc_server(binary, tmp_path / f"rpc{i}.log") for i in range(2)]
    try:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tiny_model_path), *(s.endpoint for s in servers)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "GENERATING", child.stderr.read() if child.stderr else ""
            servers[1].stop()
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
        assert child.returncode != 0 and "FINISHED" not in out
        assert "RPC server" in err or "Remote RPC server crashed" in err, err[-2000:]
    finally:
        for s in servers:
            s.stop()


@pytest.mark.parametrize("split, hybrid", [((1.0, 1.0), False), ((3.0, 1.0), False), ((1.0, 4.0), True), ((0.0, 1.0), True)])
def test_the_planners_mirror_of_the_split_is_the_engines(rpc_pair, tiny_model_path, split, hybrid) -> None:
    """routing.placement's mirror of llama.cpp's layer split and the engine's slots per device, against the
    engine's own placement (Context.cache_devices) on the two servers' devices, for the same tensor split."""
    from llama_moe.tools.routing.placement import engine_devices, mirrored_devices

    layout = expert_layout(tiny_model_path)
    mib = 1.0
    mirrored = mirrored_devices(layout, split, mib, hybrid)
    placed = engine_devices(str(tiny_model_path), layout, mib, hybrid, tuple(s.endpoint for s in rpc_pair), split)
    assert [(d.layers, d.slots) for d in placed] == [(d.layers, d.slots) for d in mirrored]
    # (3, 1) leaves the second device the output layer alone, (0, 1) the first nothing: no MoE layer, no slots there
    assert len(placed) == {(1.0, 1.0): 2, (3.0, 1.0): 1, (1.0, 4.0): 2, (0.0, 1.0): 1}[split] and {d.description for d in placed} <= {s.endpoint for s in rpc_pair}
    # the buffer the engine allocates on each device, as the plan reports it
    from llama_moe.tools.routing.budget import engine_buffer_bytes
    from llama_moe.tools.routing.planning import device_slots, _on

    slots = device_slots(layout, placed)
    for d in placed:
        assert d.n_bytes == engine_buffer_bytes(_on(layout, d.layers), slots, hybrid), d


def _ranked(layout) -> tuple[tuple[int, int], ...]:
    return tuple((l.il, (5 * l.il + 3 * i) % layout.n_expert) for i in range(layout.n_expert) for l in layout.layers)


def _layer_slots_profile(layout, tmp_path: Path, counts: dict[int, int]) -> Path:
    """A profile whose per-layer slot section carries ``counts``."""
    from llama_moe.formats.profile import Profile, write_profile

    out = tmp_path / "layer-slots.strp"
    write_profile(out, Profile(layout.n_layer, layout.n_expert, 8, _ranked(layout),
                               tuple(counts.get(il, 0) for il in range(layout.n_layer))))
    return out


# per-layer counts against 1 MiB per device (about 40 slots of the tiny model's experts): fewer than a token's
# experts, a few, many, more than the layer's experts. Split 1,1 puts layers 0-3 on the first device, whose
# counts (49 slots) do not fit and are scaled down there, and 4-5 on the second, whose counts fit as they are;
# split 1,4 puts 2-5 on the second device, which scales them, hybrid's null slots taken first.
_SCALED = {0: 3, 1: 12, 2: 2, 3: 37, 4: 5, 5: 16}


@pytest.mark.parametrize("split, hybrid", [((1.0, 1.0), False), ((1.0, 4.0), True)])
def test_the_planners_mirror_of_per_layer_counts_across_devices_is_the_engines(rpc_pair, tiny_model_path, tmp_path,
                                                                              split, hybrid) -> None:
    """A profile's per-layer counts with the layers split across devices: routing.placement's mirror of each
    device sizing its own layers from them within its own budget, against the engine's slots for each layer
    (Context.cache_devices, Context.layer_stats) on the two servers' devices; the buffer as the plan reports it."""
    from llama_moe.tools.routing.budget import cache_bytes_for_layer_slots, engine_buffer_bytes, engine_device_layer_slots
    from llama_moe.tools.routing.placement import engine_devices, mirrored_devices
    from llama_moe.tools.routing.planning import _on, device_slots

    layout = expert_layout(tiny_model_path)
    profile = _layer_slots_profile(layout, tmp_path, _SCALED)
    mirrored = mirrored_devices(layout, split, 1.0, hybrid, _SCALED)
    placed = engine_devices(str(tiny_model_path), layout, 1.0, hybrid, tuple(s.endpoint for s in rpc_pair), split,
                            str(profile))
    assert [(d.layers, d.slots, d.layer_slots) for d in placed] == [(d.layers, d.slots, d.layer_slots) for d in mirrored]
    assert len(placed) == 2 and {d.description for d in placed} == {s.endpoint for s in rpc_pair}
    slots = device_slots(layout, placed)
    scaled = 0
    for d in placed:
        assert d.n_bytes == engine_buffer_bytes(_on(layout, d.layers), slots, hybrid), d
        asked = {il: min(_SCALED[il], layout.n_expert) for il in d.layers}
        # each device within its own budget, its counts kept where they fit it
        assert cache_bytes_for_layer_slots(_on(layout, d.layers), d.slots_of(), hybrid) <= mib_to_bytes(1.0)
        if cache_bytes_for_layer_slots(_on(layout, d.layers), asked, hybrid) <= mib_to_bytes(1.0):
            assert d.slots_of() == asked
        else:
            scaled += 1
            assert d.slots_of() == engine_device_layer_slots(layout, d.layers, mib_to_bytes(1.0), _SCALED, hybrid) != asked
    assert scaled == 1


def test_plan_reads_each_devices_layers_and_slots_from_the_engine(rpc_pair, tiny_model_path, tmp_path, capsys) -> None:
    """``plan --rpc``: the placement read from the engine on the servers; the same plan as the mirror's for the
    same split, each device's held-out counts the sum of its layers' (the simulator's split counted)."""
    import json

    from llama_moe.tools.cli import main

    text = tmp_path / "t.txt"
    text.write_text(" ".join([LONG_PROMPT] * 6), encoding="utf-8")
    trace = tmp_path / "t.bin"
    assert main(["trace", str(tiny_model_path), str(text), str(trace), "--ctx", "512", "-q"]) == 0

    def plan(*extra: str) -> dict:
        capsys.readouterr()
        assert main(["plan", str(tiny_model_path), "--cache-mib", "1", "--trace", str(trace), "--kfold", "3",
                     "--json", "-q", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    engine = plan("--rpc", ",".join(s.endpoint for s in rpc_pair), "--tensor-split", "1,1")
    mirror = plan("--tensor-split", "1,1")
    assert [(d["layers"], d["slots"], d["buffer_bytes"]) for d in engine["devices"]] == \
        [(d["layers"], d["slots"], d["buffer_bytes"]) for d in mirror["devices"]]
    assert [d["name"] for d in engine["devices"]] != [d["name"] for d in mirror["devices"]]  # RPCn against "device n"
    assert engine["hit_rate"] == mirror["hit_rate"] and len(engine["devices"]) == 2
    by_layer = {l["il"]: l for l in engine["layers"]}
    for d in engine["devices"]:
        assert all(by_layer[il]["slots"] == d["slots"] for il in d["layers"])
        misses = sum(by_layer[il]["misses_per_token"] for il in d["layers"])
        assert d["misses_per_token"] == pytest.approx(misses)
        assert d["cpu_per_token"] == pytest.approx(sum(by_layer[il]["cpu_per_token"] for il in d["layers"]))
        assert d["hit_rate"]["low"] <= d["hit_rate"]["mean"] <= d["hit_rate"]["high"]
        # pooled: hits / (hits + misses) over its layers, from the layers' own rates and misses
        looked = sum(by_layer[il]["misses_per_token"] / (1 - by_layer[il]["hit_rate"]) for il in d["layers"])
        assert d["pooled_hit_rate"] == pytest.approx(1 - misses / looked)
    assert engine["devices"][0]["slots"] < engine["devices"][1]["slots"]  # four layers share one budget, two the other


def test_llama_server_reports_each_device_in_metrics_and_audit(rpc_pair, tiny_model_path, tmp_path) -> None:
    """llama-server with its layers split across the two servers (-ts 1,1): /metrics has each device's layers,
    slots, bytes and counters beside the unchanged totals, which they add up to; the audit log's load and exit
    records list the devices and each layer's; the placement is the planner's for the same split."""
    import requests

    from llama_moe.formats.audit import ExitRecord, LoadRecord, read_audit
    from llama_moe.tools.routing.placement import mirrored_devices
    from llama_moe.tools.server import process as server_process
    from llama_moe.tools.server.audit import check_audit
    from llama_moe.tools.server.metrics import fetch_metrics_text, parse_moe_cache
    from support.llama_server import find_server_binary

    layout = expert_layout(tiny_model_path)
    audit = tmp_path / "audit.jsonl"
    args = ["-m", str(tiny_model_path), "--rpc", ",".join(s.endpoint for s in rpc_pair), "-ts", "1,1", "-ngl", "99",
            "--cpu-moe", "--no-repack", "--moe-cache-mib", "1", "-c", "512", "-t", "2", "-np", "1", "--metrics",
            "--moe-cache-audit", str(audit)]
    with server_process.start_server(find_server_binary(), args, tmp_path / "server.log") as server:
        r = requests.post(f"{server.url}/completion", json={"prompt": LONG_PROMPT, "n_predict": 16, "ignore_eos": True, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 16
        text = fetch_metrics_text(server.url)
        m = parse_moe_cache(text)
    assert m is not None and len(m.devices) == 2, text[-3000:]
    planned = mirrored_devices(layout, (1.0, 1.0), 1.0, False)
    assert [(d.layers, d.n_slots) for d in m.devices] == [(d.layers, d.slots) for d in planned]
    assert {d.description for d in m.devices} == {s.endpoint for s in rpc_pair}
    assert all(re.fullmatch(r"RPC\d+", d.name) for d in m.devices)
    # the totals, unchanged, are the devices' sums; each device's counters its layers'
    assert m.n_slots == sum(d.n_slots_total for d in m.devices)
    assert m.n_bytes_cache == sum(d.n_bytes for d in m.devices)
    assert (m.n_hit, m.n_miss, m.n_cpu) == tuple(sum(getattr(d, f) for d in m.devices) for f in ("n_hit", "n_miss", "n_cpu"))
    for d in m.devices:
        assert d.n_slots_total == d.n_slots * len(d.layers)
        assert (d.n_hit, d.n_miss) == (sum(m.layers[il][0] for il in d.layers), sum(m.layers[il][2] for il in d.layers))
        assert d.n_hit > 0 and d.n_miss > 0
        for il in d.layers:
            assert f'llamacpp:moe_cache_layer_device{{layer="{il}",device="{d.name}"}} 1' in text
    # the audit log: the devices at load, their counters at exit, each layer's device
    result = check_audit(audit)
    assert not result.issues, result.issues  # no error, and no field the reference does not list
    records = read_audit(audit).records
    load = next(r for r in records if isinstance(r, LoadRecord))
    exit_ = next(r for r in records if isinstance(r, ExitRecord))
    assert [(d.name, d.layers, d.slots, d.bytes) for d in load.cache_devices] == \
        [(d.name, d.layers, d.n_slots, d.n_bytes) for d in m.devices]
    assert {l.il: l.device for l in load.layers} == {il: d.name for d in m.devices for il in d.layers}
    for d, dm in zip(exit_.cache_devices, m.devices):
        assert (d.hits, d.misses) >= (dm.n_hit, dm.n_miss) and d.hits == sum(l.hits for l in exit_.layers if l.device == d.name)


def _peer_run(rpc_pair, tiny_model_path: Path, tmp_path: Path, peer: str, split: tuple[float, float], slots: int = 4):
    from llama_moe.formats.profile import Profile, write_profile

    layout = expert_layout(tiny_model_path)
    profile = tmp_path / "ranked.strp"
    write_profile(profile, Profile(layout.n_layer, layout.n_expert, 8, _ranked(layout)))
    mp = ModelParams(cpu_moe=True, repack=False, rpc=tuple(s.endpoint for s in rpc_pair), tensor_split=split)
    with Model(tiny_model_path, mp) as model:
        plain = _run(model, ContextParams(n_ctx=512, n_threads=2))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a refused peer is said in the status, read below
            got = _run(model, ContextParams(n_ctx=512, n_threads=2, moe_cache_mib=mib_for_slots(tiny_model_path, slots, hybrid=True),
                                            moe_cache_hybrid=True, moe_cache_profile=profile, moe_cache_peer=peer), trace=True)
    return layout, plain, got


def test_a_peer_device_computes_the_experts_the_profile_ranks_next(rpc_pair, tiny_model_path, tmp_path, caplog) -> None:
    """--moe-cache-peer: all layers on the first server, the cache there, and the second server's device holding
    each layer's experts the profile ranks after the cache's: it computes their rows, the CPU the rest; the tokens
    and logits are no cache's, and every lookup is where the rule puts it."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    layout, (plain_tokens, plain_logits, *_), got = _peer_run(rpc_pair, tiny_model_path, tmp_path, "RPC1", (1.0, 0.0))
    tokens, logits, stats, layers, records, status = got
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert status.device == "RPC0" and status.peer == "RPC1" and status.as_asked and not status.mailbox
    assert "llama_moe_cache: peer tier on RPC1: " in caplog.text
    # the rule: a layer's ranked experts, the first in the cache's slots, the next in the peer's
    expected = {}
    for l in layers:
        ranked = list(dict.fromkeys(e for il, e in _ranked(layout) if il == l.il))
        cache, peer = set(ranked[:l.n_slots]), set(ranked[l.n_slots:l.n_slots + l.n_slots_peer])
        hits = on_peer = on_cpu = 0
        for r in records:
            if r.il != l.il or r.n_tokens > 32:
                continue
            distinct = set(e for e in r.experts.reshape(-1).tolist() if e >= 0)
            hits += len(distinct & cache)
            on_peer += len(distinct & peer)
            on_cpu += len(distinct - cache - peer)
        expected[l.il] = (hits, on_peer + on_cpu, on_peer)
        assert l.n_slots_peer > 0
    assert {l.il: (l.n_hit, l.n_miss, l.n_hit_peer) for l in layers} == expected
    assert stats.n_hit_peer == sum(p for _, _, p in expected.values()) > 0
    assert stats.n_slots_peer == sum(l.n_slots_peer for l in layers)


def _replay_admit_with_peer(records, slots: int, peer_slots: dict[int, int], admit: int) -> dict[int, tuple[int, int, int]]:
    """The admitting hybrid with a peer, written from its description: per ubatch and layer, an expert in the
    cache's slots is a hit; one the peer holds is the peer's (a miss of the cache, its peer slot marked used);
    every miss (once per ubatch) waits for admission. When the next decode starts, each layer admits its first
    ``admit`` waiting experts into its first free slot, else its least recently used one (the lowest of equals),
    as just used; the expert that slot held goes to the peer (kept and marked used if the peer has it, else into
    the peer's first free slot, else its least recently used one), as just used. A round never evicts, from the
    cache or the peer, what it put there or what the decode before used: a layer whose slots all hold such
    experts admits no more, and a peer whose slots do keeps none. (hits, misses, peer's) a layer."""
    cache: dict[int, list] = {}
    peer: dict[int, list] = {}
    queue: dict[int, list[int]] = {}
    count: dict[int, list[int]] = {}
    last_lookup: dict[int, int] = {}
    clock, prev = 0, None

    def lru(table: list, free_first: bool = True) -> int:
        expert_in, last = table
        free = [s for s, e in enumerate(expert_in) if e < 0]
        return free[0] if free else min(range(len(expert_in)), key=lambda s: (last[s], s))

    def admit_all() -> None:
        nonlocal clock
        clock += 1
        for il, q in queue.items():
            n = 0
            for e in q:
                if n >= admit:
                    break
                if e in cache[il][0]:
                    continue
                s = lru(cache[il])
                if cache[il][0][s] >= 0 and cache[il][1][s] >= last_lookup[il]:
                    break  # every slot holds what this round admitted or the decode before used
                evicted = cache[il][0][s]
                cache[il][0][s], cache[il][1][s] = e, clock
                n += 1
                if evicted >= 0:
                    pin, plast = peer[il]
                    if evicted in pin:
                        plast[pin.index(evicted)] = clock
                    else:
                        ps = lru(peer[il])
                        if pin[ps] < 0 or plast[ps] < last_lookup[il]:
                            pin[ps], plast[ps] = evicted, clock
            q.clear()

    for r in records:
        if prev is not None and r.il <= prev:
            admit_all()
        prev = r.il
        clock += 1
        if r.n_tokens > 32:
            continue
        last_lookup[r.il] = clock
        cache.setdefault(r.il, [[-1] * slots, [0] * slots])
        peer.setdefault(r.il, [[-1] * peer_slots[r.il], [0] * peer_slots[r.il]])
        q, c = queue.setdefault(r.il, []), count.setdefault(r.il, [0, 0, 0])
        seen: set[int] = set()
        for e in r.experts.reshape(-1).tolist():
            if e < 0 or e in seen:
                continue
            seen.add(e)
            if e in cache[r.il][0]:
                c[0] += 1
                cache[r.il][1][cache[r.il][0].index(e)] = clock
                continue
            c[1] += 1
            if e in peer[r.il][0]:
                c[2] += 1
                peer[r.il][1][peer[r.il][0].index(e)] = clock
            q.append(e)
    return {il: tuple(c) for il, c in count.items()}


def test_with_admission_the_peer_takes_what_the_cache_evicts(rpc_pair, tiny_model_path, caplog) -> None:
    """No profile: the admitting hybrid's evictions fill the peer, which then holds the ranks of recency after
    the cache's. Tokens and logits are no cache's, and every lookup is where an independent replay puts it."""
    caplog.set_level(logging.INFO, logger="llama_moe.native")
    mp = ModelParams(cpu_moe=True, repack=False, rpc=tuple(s.endpoint for s in rpc_pair), tensor_split=(1.0, 0.0))
    with Model(tiny_model_path, mp) as model:
        plain_tokens, plain_logits, *_ = _run(model, ContextParams(n_ctx=512, n_threads=2))
        tokens, logits, stats, layers, records, status = _run(model, ContextParams(
            n_ctx=512, n_threads=2, moe_cache_mib=mib_for_slots(tiny_model_path, 4, hybrid=True), moe_cache_hybrid=True,
            moe_cache_admit=2, moe_cache_peer="RPC1"), trace=True)
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert status.peer == "RPC1" and status.as_asked
    expected = _replay_admit_with_peer(records, 4, {l.il: l.n_slots_peer for l in layers}, 2)
    assert {l.il: (l.n_hit, l.n_miss, l.n_hit_peer) for l in layers} == expected
    assert stats.n_hit_peer > 0 and all(l.n_slots_peer > 0 for l in layers)
    assert re.search(r"llama_moe_cache: peer RPC1 computed \d+ of the \d+ misses, the CPU the others; [1-9]\d* experts the "
                     r"cache evicted went to it", caplog.text)


@pytest.mark.parametrize("peer, split, why", [
    ("RPC0", (1.0, 0.0), "--moe-cache-peer RPC0 is the device that holds the cache"),
    ("CUDA7", (1.0, 0.0), "--moe-cache-peer CUDA7 is not one of the model's devices (RPC0, RPC1)"),
    ("RPC1", (1.0, 1.0), "--moe-cache-peer RPC1 takes the experts of a cache on one device, and the layers are split"),
])
def test_a_peer_that_cannot_apply_is_refused_with_its_reason(rpc_pair, tiny_model_path, tmp_path, peer, split, why) -> None:
    _, (plain_tokens, plain_logits, *_), got = _peer_run(rpc_pair, tiny_model_path, tmp_path, peer, split)
    tokens, logits, stats, layers, _, status = got
    assert tokens == plain_tokens
    np.testing.assert_array_equal(logits, plain_logits)
    assert "option_ignored" in status.reasons and why in status.text and status.peer == ""
    assert stats.n_slots_peer == 0 and all(l.n_slots_peer == 0 for l in layers)


@pytest.mark.parametrize("kw, why", [
    (dict(moe_cache_hybrid=True), "--moe-cache-peer RPC1 has nothing to fill it"),
    (dict(moe_cache_admit=2), "--moe-cache-peer RPC1 works with --moe-cache-hybrid"),
])
def test_a_peer_needs_the_hybrid_and_something_to_fill_it(lib, tiny_model_path, kw, why) -> None:
    """The rules between the settings are the engine's: Python takes the peer's name, the engine drops the peer
    with its reason in the status (checked before any device is looked at: the cache here is in RAM)."""
    from llama_moe.errors import MoeCacheWarning

    cp = ContextParams(n_ctx=256, moe_cache_mib=4, moe_cache_peer="RPC1", moe_cache_device="CPU", **kw)
    cp.validate()
    with Model(tiny_model_path, ModelParams(cpu_moe=True, repack=False)) as model:
        with pytest.warns(MoeCacheWarning, match=why):
            ctx = Context(model, cp)
        with ctx:
            status = ctx.cache_status()
    assert "option_ignored" in status.reasons and why in status.text and status.peer == ""
