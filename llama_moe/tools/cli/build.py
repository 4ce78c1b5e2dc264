"""``python -m llama_moe build`` and ``python build_native.py``: fetch, patch and build llama.cpp
(``llama_moe.native_build``)."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ...native_build import bundle, build, dev_tree, export
from ...errors import BuildError

DESCRIPTION = "Builds the patched llama.cpp: ``python build_native.py`` / ``python -m llama_moe build``."


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="fetch, patch and build llama.cpp (the native library and tools)")
    make_parser(p)
    p.set_defaults(func=run)


def make_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="build_native.py", description=DESCRIPTION)
    p.add_argument("--source", help="a llama.cpp tree, the llama-cpp-python sdist or a bundle (default: $LLAMA_MOE_SOURCE, "
                                    "then the download cache, then pip)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--cuda", dest="variant", action="store_const", const="cuda", help="build for CUDA or fail")
    kind.add_argument("--cpu", dest="variant", action="store_const", const="cpu", help="build for the CPU only")
    p.set_defaults(variant="auto")
    p.add_argument("--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES, e.g. 90-real (default: the visible GPUs')")
    p.add_argument("--lib-only", action="store_true", help="only libllama and ggml, no llama-server/-cli/-bench")
    p.add_argument("--tests", action="store_true", help="also build test-backend-ops")
    p.add_argument("-j", "--jobs", type=int, help="parallel compile jobs (default: all cores)")
    p.add_argument("--verbose", action="store_true", help="stream the compiler output instead of a progress bar")
    p.add_argument("--force", action="store_true", help="rebuild and reinstall even when up to date")
    p.add_argument("--bundle", metavar="OUT.tar.xz", help="write a trimmed source bundle (no build)")
    p.add_argument("--dev", metavar="DIR", help="write a git tree, one commit per patch, for editing (no build)")
    p.add_argument("--export", metavar="DIR", help="write patches/ back from a --dev tree's commits (no build)")
    p.add_argument("--cmake-arg", action="append", default=[], help="an extra CMake argument (repeatable)")
    return p


def run(args: argparse.Namespace) -> int:
    if args.bundle:
        size = bundle(Path(args.bundle), args.source)
        print(f"wrote {args.bundle}: {size / 2**20:.1f} MiB")
        return 0
    if args.dev:
        dev_tree(Path(args.dev), args.source)
        print(f"dev tree at {args.dev}: edit, commit (amend or fixup into the patch's commit), then --export {args.dev}")
        return 0
    if args.export:
        names, n_files, root = export(Path(args.export))
        print(f"exported {len(names)} patches and {n_files} new files to {root}")
        return 0
    result = build(args.source, args.variant, args.cuda_arch, tools=not args.lib_only, tests=args.tests,
                   jobs=args.jobs, verbose=args.verbose, force=args.force, cmake_extra=args.cmake_arg)
    state = "built" if result.rebuilt else "up to date"
    print(f"{state}: {result.install_dir} ({result.variant}, patches {result.patch_hash}, {result.seconds:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = make_parser().parse_args(argv)
    try:
        return run(args)
    except BuildError as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 1
