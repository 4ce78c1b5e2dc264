"""Model shapes for synthetic MoE models (qwen3moe or gpt-oss): presets and a ``k=v,...`` parser."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from llama_moe.errors import LlamaMoeError

ARCHS = ("qwen3moe", "gpt-oss")  # llama.cpp architecture names (LLM_ARCH_QWEN3MOE, LLM_ARCH_OPENAI_MOE)
_DEFAULTS = {"arch": "qwen3moe", "n_swa": 0}  # left out of describe() at these values
# llama.cpp's LLAMA_MAX_LAYERS and LLAMA_MAX_EXPERTS (llama-hparams.h); token ids and contexts as its int32 and
# ContextParams take them; 1 << 20 for every other dimension
_MAX = {"n_layer": 512, "n_expert": 1024, "n_vocab": 1 << 24, "n_ctx_train": 1 << 24}


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_vocab: int  # padded vocabulary size; the learned tokens are a prefix of it
    n_ctx_train: int
    arch: str = "qwen3moe"
    # gpt-oss: sliding-window size of the layers that use it (every other one, from layer 0)
    n_swa: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise LlamaMoeError(f"shape: arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if self.arch == "gpt-oss" and self.n_swa <= 0:
            raise LlamaMoeError(f"shape: gpt-oss needs a sliding window n_swa > 0, got {self.n_swa}")
        if self.arch == "qwen3moe" and self.n_swa != 0:
            raise LlamaMoeError(f"shape: qwen3moe has no sliding window; n_swa must be 0, got {self.n_swa}")
        for f in fields(self):
            if f.name in _DEFAULTS:
                continue
            if getattr(self, f.name) <= 0:
                raise LlamaMoeError(f"shape: {f.name} must be positive, got {getattr(self, f.name)}")
            high = _MAX.get(f.name, 1 << 20)
            if getattr(self, f.name) > high:  # before any array is made: 1e11 layers would be a MemoryError
                raise LlamaMoeError(f"shape: {f.name} must be at most {high}, got {getattr(self, f.name)}")
        if self.n_head % self.n_head_kv:
            raise LlamaMoeError(f"shape: n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if self.n_expert_used > self.n_expert:
            raise LlamaMoeError(f"shape: n_expert_used {self.n_expert_used} > n_expert {self.n_expert}")
        # Q8_0/Q4_0 rows hold whole 32-element blocks; the model's matrices have rows of
        # n_embd, n_ff_exp and n_head*head_dim elements
        for name in ("n_embd", "n_ff_exp"):
            if getattr(self, name) % 32:
                raise LlamaMoeError(f"shape: {name} must be a multiple of 32, got {getattr(self, name)}")
        if (self.n_head * self.head_dim) % 32:
            raise LlamaMoeError("shape: n_head * head_dim must be a multiple of 32")
        if self.head_dim % 2 or self.head_dim < 16:
            # RoPE rotates pairs; one head carries the eight-topic context (design.py)
            raise LlamaMoeError(f"shape: head_dim must be even and at least 16, got {self.head_dim}")
        if self.n_embd < 64:
            raise LlamaMoeError("shape: n_embd must be at least 64 (the synthetic LM needs the room)")
        if self.n_vocab < 512:
            raise LlamaMoeError("shape: n_vocab must be at least 512 (256 byte tokens plus merges)")

    @property
    def expert_params(self) -> int:
        """Parameters of one expert (gate + up + down) in one layer."""
        return 3 * self.n_embd * self.n_ff_exp

    def is_swa(self, layer: int) -> bool:
        """Whether ``layer`` attends to a sliding window (llama.cpp's set_swa_pattern(2) for gpt-oss:
        layers 0, 2, 4, ... slide, 1, 3, 5, ... see the whole context)."""
        return self.n_swa > 0 and layer % 2 == 0

    def describe(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if f.name not in _DEFAULTS or getattr(self, f.name) != _DEFAULTS[f.name])


SHAPES: dict[str, Shape] = {
    # a few MB; decodes fast on a 2-core CPU, for tests
    "tiny": Shape(n_layer=6, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_expert=32,
                  n_expert_used=4, n_ff_exp=64, n_vocab=2048, n_ctx_train=4096),
    "small": Shape(n_layer=12, n_embd=512, n_head=8, n_head_kv=4, head_dim=64, n_expert=64,
                   n_expert_used=8, n_ff_exp=256, n_vocab=4096, n_ctx_train=8192),
    # Qwen3-30B-A3B's sizes
    "qwen3-30b-a3b": Shape(n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128,
                           n_expert_used=8, n_ff_exp=768, n_vocab=151936, n_ctx_train=40960),
    # a flatter router: 512 experts, top-10, with Qwen3-Next-80B-A3B's sizes (its hybrid attention is not
    # modelled: every layer is full attention), calibrated against a 512-expert top-10 model's routing
    "flat-512": Shape(n_layer=48, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_expert=512,
                      n_expert_used=10, n_ff_exp=512, n_vocab=151936, n_ctx_train=262144),
    # gpt-oss (llama.cpp's "gpt-oss" architecture): a few MB, for tests
    "gpt-oss-tiny": Shape(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_expert=32,
                          n_expert_used=4, n_ff_exp=128, n_vocab=2048, n_ctx_train=4096, arch="gpt-oss", n_swa=32),
    # gpt-oss-20b's and gpt-oss-120b's sizes (HF config.json; vocabulary o200k_harmony's 201088)
    "gpt-oss-20b": Shape(n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_expert=32,
                         n_expert_used=4, n_ff_exp=2880, n_vocab=201088, n_ctx_train=131072, arch="gpt-oss", n_swa=128),
    "gpt-oss-120b": Shape(n_layer=36, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_expert=128,
                          n_expert_used=4, n_ff_exp=2880, n_vocab=201088, n_ctx_train=131072, arch="gpt-oss", n_swa=128),
}


def parse_shape(spec: str, base: Shape | None = None) -> Shape:
    """A preset name, or ``k=v`` pairs (``n_layer=4,n_expert=16``) overriding ``base``
    (default: the ``tiny`` preset; a leading preset name may be given: ``small,n_layer=2``).
    ``arch`` takes a name; a gpt-oss shape turned into qwen3moe drops its sliding window
    (``gpt-oss-120b,arch=qwen3moe`` is gpt-oss-120b's sizes in the qwen3moe architecture)."""
    spec = spec.strip()
    if spec in SHAPES:
        return SHAPES[spec]
    names = {f.name for f in fields(Shape)}
    shape = base if base is not None else SHAPES["tiny"]
    changes: dict[str, int | str] = {}
    for i, part in enumerate(p.strip() for p in spec.split(",") if p.strip()):
        if "=" not in part:
            if i == 0 and part in SHAPES:
                shape = SHAPES[part]
                continue
            raise LlamaMoeError(f"shape: {part!r} is neither a preset ({', '.join(SHAPES)}) nor key=value")
        k, v = (s.strip() for s in part.split("=", 1))
        if k not in names:
            raise LlamaMoeError(f"shape: unknown field {k!r} (fields: {', '.join(sorted(names))})")
        if k == "arch":
            changes[k] = v
            continue
        try:
            changes[k] = int(v)
        except ValueError:
            raise LlamaMoeError(f"shape: {k} must be an integer, got {v!r}") from None
    if changes.get("arch") == "qwen3moe" and "n_swa" not in changes:
        changes["n_swa"] = 0
    return replace(shape, **changes)


def get_shape(shape: str | Shape) -> Shape:
    return shape if isinstance(shape, Shape) else parse_shape(shape)
