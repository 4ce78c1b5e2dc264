"""What crosses the network per generated token when a model's layers run on ggml rpc-servers: two servers on
127.0.0.1, each behind a counting TCP relay, the tiny synthetic model's layers split across them, its experts in
the client's RAM (cpu_moe), without and with the MoE cache. Prints bytes sent to and received from the servers
for loading, for the prompt, and per generated token, and of the bytes up, those the cache's uploads of missed
experts into the servers' slots account for (the engine's n_bytes_upload).

    python benchmarks/rpc_traffic.py [--tokens 64] [--slots-per-k 2] [--shape tiny] [--direct]

``--direct`` connects to the servers without the relays (no byte counts; the speed without the relays' hop).
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.tools.experts import expert_layout
from llama_moe.rpc import greet, parse_endpoint
from llama_moe.tools.server.process import free_port
from llama_moe.tools.synth import synthesize

PROMPT = "The ship left the harbour at dawn, and the crew watched the grey cliffs fall behind them"


class CountingRelay:
    """Accepts on 127.0.0.1:port, forwards to target, counts bytes each way (up: to the server)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = self.down = 0
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
                with self.lock:
                    if up:
                        self.up += len(data)
                    else:
                        self.down += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.up, self.down


def start_server(binary: Path, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            greet(parse_endpoint(f"127.0.0.1:{port}"), timeout_s=2)
            return proc, port
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"rpc-server did not start: {log.read_text()[-1000:]}")
            time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--slots-per-k", type=float, default=2.0, help="cache slots per layer, in multiples of top-k")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--direct", action="store_true", help="no relays: tokens per second only")
    args = ap.parse_args()

    from llama_moe._native.loader import llama_binary

    binary = llama_binary("ggml-rpc-server")  # $LLAMA_BIN, else next to the loaded libllama
    work = Path(tempfile.mkdtemp(prefix="rpc_traffic-"))
    model_path = work / f"{args.shape}.gguf"
    synthesize(model_path, shape=args.shape, expert_type="q8_0", seed=0)
    layout = expert_layout(model_path)
    slots = max(1, int(args.slots_per_k * layout.n_expert_used))
    mib = sum(l.bytes_per_expert for l in layout.layers) * slots / 2**20 + 1  # + the maps
    servers = [start_server(binary, work / f"rpc{i}.log") for i in range(2)]
    relays = [CountingRelay(("127.0.0.1", port)) for _, port in servers]
    total = lambda: tuple(sum(c) for c in zip(*(r.counts() for r in relays)))  # noqa: E731
    try:
        print(f"model: {args.shape} ({layout.n_moe_layers} MoE layers, {layout.n_expert} experts, top-{layout.n_expert_used}, "
              f"{layout.layers[0].bytes_per_expert} B per expert); cache: {slots} slots per layer")
        print(f"{'cache':>8} {'load up':>12} {'prompt up':>12} {'prompt down':>12} {'tok up B':>10} {'tok down B':>10} "
              f"{'uploads B':>10} {'tok/s':>7}")
        for cache_mib in (0.0, mib):
            before = total()
            ports = [port for _, port in servers] if args.direct else [r.port for r in relays]
            mp = ModelParams(cpu_moe=True, repack=False, rpc=tuple(f"127.0.0.1:{p}" for p in ports))
            with Model(model_path, mp) as model, Context(model, ContextParams(n_ctx=512, n_threads=2,
                                                                              moe_cache_mib=cache_mib)) as ctx:
                loaded = total()
                prompt = model.tokenize(PROMPT)
                ctx.decode(prompt)
                prompted = total()
                up0 = ctx.moe_cache_stats().n_bytes_upload if cache_mib else 0
                tok = int(ctx.logits().argmax())
                t0 = time.monotonic()
                for _ in range(args.tokens):
                    ctx.decode([tok])
                    tok = int(ctx.logits().argmax())
                dt = time.monotonic() - t0
                done = total()
                uploads = (ctx.moe_cache_stats().n_bytes_upload - up0) / args.tokens if cache_mib else 0.0
                label = f"{cache_mib:.1f}M" if cache_mib else "none"
                where = ", ".join(f"{d.name} layers {list(d.layers)} {d.n_slots} slots" for d in ctx.cache_devices())
            print(f"{label:>8} {loaded[0] - before[0]:>12} {prompted[0] - loaded[0]:>12} {prompted[1] - loaded[1]:>12} "
                  f"{(done[0] - prompted[0]) / args.tokens:>10.0f} {(done[1] - prompted[1]) / args.tokens:>10.0f} "
                  f"{uploads:>10.0f} {args.tokens / dt:>7.1f}" + (f"  ({where})" if cache_mib else ""))
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
