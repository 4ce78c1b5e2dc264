"""Audit logs written the way llama-server writes them, for the tests of the reader and the checker."""
from __future__ import annotations

EXPERT = 26112   # bytes of one tiny-model expert


class Run:
    """Writes one server run's records the way llama-server does: counters that only grow, requests whose
    own counters are what the context's moved during them."""

    def __init__(self, pid: int = 4242, hybrid: bool = False, layers: int = 2, slots: int = 8) -> None:
        self.pid, self.hybrid, self.n_layers, self.slots = pid, hybrid, layers, slots
        self.c = dict(hits=0, hits_profile=0, misses=0, bytes_upload=0, bytes_cpu=0, copies=0, bytes_copy=0, swaps=0,
                      refused=0)
        self.per_layer = [dict(hits=0, hits_profile=0, misses=0, refused=0) for _ in range(layers)]
        self.ms = 0
        self.task = 0

    def _base(self, event: str) -> dict:
        self.ms += 137
        time = f"2026-11-29T19:{self.ms // 60000 % 60:02d}:{self.ms // 1000 % 60:02d}.{self.ms % 1000:03d}Z"
        return dict(event=event, time=time, pid=self.pid, hybrid=self.hybrid, **self.c)

    def _layers(self) -> list[dict]:
        return [dict(il=il, slots=self.slots, resident=list(range(min(self.slots, 3))), **l)
                for il, l in enumerate(self.per_layer)]

    def _decode(self, hits: int, misses: int, profile: int = 0, refused: int = 0) -> dict:
        """Adds lookups spread over the layers; returns what moved. The hybrid refuses nothing."""
        refused = 0 if self.hybrid else refused
        for i in range(refused):
            self.per_layer[i % self.n_layers]["refused"] += 1
        for i in range(hits):
            self.per_layer[i % self.n_layers]["hits"] += 1
        for i in range(profile):
            self.per_layer[i % self.n_layers]["hits_profile"] += 1
        for i in range(misses):
            self.per_layer[i % self.n_layers]["misses"] += 1
        moved = dict(hits=hits, hits_profile=profile, misses=misses,
                     bytes_upload=0 if self.hybrid else misses * EXPERT, bytes_cpu=misses * EXPERT if self.hybrid else 0,
                     refused=refused)
        for k, v in moved.items():
            self.c[k] += v
        return moved

    def load(self) -> dict:
        return {**self._base("load"),
                "model": {"path": "/models/tiny-q8_0.gguf", "bytes": 6047968, "name": "tiny", "n_layer": 6},
                "params": {"build": "b1-0c1e57098", "moe_cache_mib": 2, "moe_cache_hybrid": self.hybrid,
                           "moe_cache_adaptive": False, "n_gpu_layers": -1, "n_threads": 2, "n_threads_batch": 2,
                           "n_ctx": 512, "n_batch": 2048, "n_ubatch": 512, "tensor_overrides": ["\\.ffn_(up|down|gate)_exps"]},
                "cache": {"slots": self.slots * self.n_layers, "prefilled": 0, "bytes": 2 << 20},
                "load_ms": 71.5, "devices": [], "profile": None, "layers": self._layers()}

    def ready(self) -> dict:
        self._decode(3, 9, refused=4)   # the warmup and the context probe fall between load and ready
        return self._base("ready")

    def request(self, hits: int, misses: int, profile: int = 0, slot: int = 0, refused: int = 0,
                own: bool = False) -> dict:
        """own: with the own_* counters of later builds, here the request's own lookups (no overlap)."""
        moved = self._decode(hits, misses, profile, refused)
        self.task += 1
        rec = {**self._base("request"), "slot": slot, "task": self.task, "n_prompt": 8, "n_gen": 16,
               "t_prompt_ms": 5.9, "t_gen_ms": 7.1, **{"req_" + k: v for k, v in moved.items()}}
        if own:
            rec.update(own_hits=moved["hits"], own_misses=moved["misses"], own_refused=moved["refused"],
                       own_bytes_upload=moved["bytes_upload"], own_bytes_cpu=moved["bytes_cpu"])
        return rec

    def exit(self) -> dict:
        return {**self._base("exit"), "layers": self._layers(),
                "perf": {"n_prompt": 24, "n_gen": 48, "t_prompt_ms": 17.7, "t_gen_ms": 21.3,
                         "prompt_tps": 1356.0, "gen_tps": 2253.5}}

    def all(self) -> list[dict]:
        return [self.load(), self.ready(), self.request(40, 24, 5, refused=6), self.request(52, 12),
                self.request(61, 3, 2), self.exit()]
