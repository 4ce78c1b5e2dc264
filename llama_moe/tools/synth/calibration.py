"""What each synthetic shape's routing is calibrated against, and what real traces say of it (no numpy).

Every preset carries either its calibration (the figures it is held to, their source and the command that
reports them) or the label "not calibrated"; a custom shape (``k=v,...``) is never calibrated. ``held_out`` is
what the routing gave beside real traces that played no part in its calibration (docs/synthetic-models.md,
"Beside real traces").
"""
from __future__ import annotations

from dataclasses import dataclass

from llama_moe.tools.synth.shapes import SHAPES, Shape, parse_shape

NOT_CALIBRATED = "not calibrated"
DOC = "docs/synthetic-models.md"


@dataclass(frozen=True)
class Calibration:
    """A shape's calibration: ``calibrated`` against ``against`` (figures and sources), or not (``against`` then
    says what its routing is instead); ``held_out``: the routing beside real traces ("" where none was compared);
    ``report``: the command that measures it beside its targets."""

    shape: str              # the preset's name, or the custom shape's k=v description
    preset: bool
    calibrated: bool
    against: str
    held_out: str
    report: str

    @property
    def label(self) -> str:
        """One line: "calibrated against ..." or "not calibrated: ..."."""
        head = f"calibrated against {self.against}" if self.calibrated else f"{NOT_CALIBRATED}: {self.against}"
        return head + (f"; beside real traces: {self.held_out}" if self.held_out else "")


_QWEN3_FIGURES = ("the published routing of Qwen3-30B-A3B (gajsanders/moe-trace, docs/findings 004-007: per-layer "
                  "LRU 0.424 / 0.647 / 0.810 / 0.918 and Belady 0.608 / 0.784 / 0.888 / 0.929 at 8 / 16 / 32 / 64 of "
                  "128 experts, adjacent-token overlap 0.079 at layer 0, 0.54-0.60 in the middle, 0.206 at the last)")
_FLAT_FIGURES = ("the published figures of a 512-expert top-10 model (r9700-lru-expert-cache, "
                 "llamacpp-moe-expert-cache: warm LRU 0.736 and Belady ~0.86 at 49 slots per layer; at half the "
                 "experts a static hot set misses 23.3% and a warm LRU 4.7%; overlap 0.46); 5 of its 7 targets met")
_DERIVED = ("held to targets derived from Qwen3-30B-A3B's published figures by a stated rule; no gpt-oss routing "
            "was measured for it")
_TEST_SHAPE = "a test shape: the Qwen3-30B-A3B setting on sizes it was not calibrated for"

_PRESETS: dict[str, tuple[bool, str, str]] = {
    "tiny": (False, _TEST_SHAPE, ""),
    "small": (False, _TEST_SHAPE, ""),
    "gpt-oss-tiny": (False, _TEST_SHAPE, ""),
    "qwen3-30b-a3b": (True, _QWEN3_FIGURES,
                      "on a real Qwen3-30B-A3B trace its LRU is 6-9 points too high at 1/16 and 1/8 of the experts, "
                      "within 3 points at 1/4 and 1/2"),
    "flat-512": (True, _FLAT_FIGURES,
                 "its hottest 10% of experts take 0.43 of the picks, against 0.31-0.32 in the real 512-expert "
                 "model's histogram"),
    "gpt-oss-20b": (False, _DERIVED, ""),
    "gpt-oss-120b": (False, _DERIVED, "on a real gpt-oss-120b trace its LRU is 5-13 points too high at every size"),
}
CUSTOM = ("a custom shape: the Qwen3-30B-A3B routing setting on sizes it was not calibrated for; "
          "real routing of other shapes is less local (a Mixtral-like 32 x 8 top-2 shape: 12-20 LRU points below "
          "this routing at 1-6 slots per layer), so its hit rates are no forecast of a real model's")


def preset_name(shape: str | Shape) -> str | None:
    """The preset a shape is (by name, or by its sizes: ``tiny,n_layer=6`` is ``tiny``), None for a custom one."""
    if isinstance(shape, str):
        if shape.strip() in SHAPES:
            return shape.strip()
        shape = parse_shape(shape)
    return next((name for name, preset in SHAPES.items() if preset == shape), None)


def calibration_of(shape: str | Shape) -> Calibration:
    """The calibration of a preset (by name or sizes), or the "not calibrated" label of a custom shape."""
    name = preset_name(shape)
    if name is None:
        described = shape if isinstance(shape, str) else shape.describe()
        return Calibration(described, False, False, CUSTOM, "", "python -m llama_moe synth-report --shape SHAPE")
    calibrated, against, held_out = _PRESETS.get(name, (False, "no calibration is recorded for this preset", ""))
    return Calibration(name, True, calibrated, against, held_out, f"python -m llama_moe synth-report --shape {name} ({DOC})")


def custom_shape_warning(spec: str) -> str | None:
    """The warning for a ``--shape`` that is no preset (None for a preset)."""
    if preset_name(spec) is not None:
        return None
    return f"--shape {spec}: its routing is {NOT_CALIBRATED}, {CUSTOM}"
