"""Reports as JSON: a dataclass's fields and its public properties (hit_rate, h_layer, ...), recursively."""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, TextIO


def jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.repr}
        for name, attr in vars(type(obj)).items():
            if isinstance(attr, property) and not name.startswith("_"):
                out[name] = jsonable(getattr(obj, name))
        return out
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    return obj


def dump(obj: Any, stream: TextIO) -> None:
    json.dump(jsonable(obj), stream, indent=2)
    stream.write("\n")
