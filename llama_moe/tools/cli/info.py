"""``python -m llama_moe info``: which native library is loaded and what it was built with."""
from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="show the native library in use and its build manifest")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ... import native_version

    print(json.dumps(native_version(), indent=2))
    return 0
