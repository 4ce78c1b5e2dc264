"""``python -m llama_moe build``: the same as build_native.py."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from ..build import make_parser, run

    p = sub.add_parser("build", help="fetch, patch and build llama.cpp (the native library and tools)")
    make_parser(p)
    p.set_defaults(func=run)
