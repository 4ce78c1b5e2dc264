#!/usr/bin/env python3
"""Builds the patched llama.cpp for llama_moe; the same as ``python -m llama_moe build``."""
import sys

from llama_moe.tools.cli.build import main

if __name__ == "__main__":
    sys.exit(main())
