"""``python -m llama_moe <command>``: the command-line layer. Each command is a module of its own here that
parses its options, calls the library and prints; it registers itself in ``make_parser``.

Every command fails the same way on what a user can get wrong (a path, a number, a file that is not what it
should be, a server that is down): one line on stderr, ``llama_moe COMMAND: error: ...``, and exit status 2;
the check commands exit 1 when the check itself fails. The files a command writes are checked before it runs
(``OUTPUTS``), and are written whole or not at all. An unexpected internal error still shows its traceback.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import warnings
from typing import Callable, NoReturn

from ...errors import LlamaMoeError, MoeCacheWarning, ParameterError

EXIT_ERROR = 2  # an input the command cannot use (argparse's own status for a bad command line)
# The loggers of the HTTP library under the openai and anthropic clients (its name differs between versions):
# "HTTP Request: POST ..." at INFO for every request
HTTP_LOGGERS = ("httpx", "httpx2")

# The options (argparse dests) that name files a command writes, and folders it writes into: refused before the
# command starts, so that a run of minutes does not end on a path it cannot write (tests/cli/test_cli_errors.py).
OUTPUTS: dict[str, tuple[str, ...]] = {
    "profile": ("out", "trace_out"), "plan": ("out",), "trace": ("out",), "bench": ("json", "md", "png"),
    "bench-adaptive": ("json", "md"), "synth": ("out",), "build": ("bundle",),
}
OUTPUT_DIRS: dict[str, tuple[str, ...]] = {"bench-adaptive": ("profile_dir",), "check-audit": ("keep",)}
# The options that name an STRP profile a command hands to llama.cpp (which would only warn and start the cache
# empty), each with the argument naming the model it must fit: read and checked before the command starts.
PROFILES: dict[str, tuple[tuple[str, str], ...]] = {
    "stats": (("moe_cache_profile", "model"),), "serve": (("profile", "model"),), "bench": (("profile", "model"),),
    "code-eval": (("profile", "model"),), "check-audit": (("profile", "model"),),
}


def _commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    from . import synth as synth_cli
    from . import (audit, bench, bench_adaptive, build, check_all, check_api, check_audit, code_eval, info, monitor, plan,
                   predict, profile, serve, simulate, stats, trace)

    return [stats.register, build.register, synth_cli.register, synth_cli.register_report, bench.register, serve.register, check_api.register,
            info.register, audit.register, monitor.register, trace.register, profile.register, plan.register,
            simulate.register, predict.register, bench_adaptive.register, check_audit.register, code_eval.register, check_all.register]


class _Parser(argparse.ArgumentParser):
    """A bad command line is one line too: ``llama_moe COMMAND: error: ...`` (not argparse's usage block)."""

    def error(self, message: str) -> NoReturn:
        name = self.prog.removeprefix("python -m ")
        self.exit(EXIT_ERROR, f"{name}: error: {message} (--help: usage)\n")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m llama_moe", description="MoE inference with a VRAM expert cache")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: llama.cpp's debug log)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for register in _commands():
        register(sub)
    parser.command_parsers = sub.choices  # type: ignore[attr-defined]
    return parser


def check_finite(command: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """No option of ours means NaN or infinity, which float() reads from "nan" and "inf": refused by name."""
    for action in command._actions:
        if action.type is not float:
            continue
        value = getattr(args, action.dest, None)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and not math.isfinite(v):
                raise ParameterError(f"{option_name(command, action.dest) or action.dest} must be a finite number, got {v:g}")


def _leaf(command: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the action a command was given (``audit check``'s, not ``audit``'s): the one whose options
    the checks below read."""
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _leaf(action.choices[getattr(args, action.dest)], args)
    return command


def check_not_empty(command: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """No option or argument of ours means an empty text: an empty path would be the current folder (or, for
    ``build --export ''``, no option at all and a build), an empty URL no server. Refused by name."""
    for action in command._actions:
        value = getattr(args, action.dest, None)
        if any(v == "" for v in (value if isinstance(value, list) else [value])):
            name = option_name(command, action.dest) or action.metavar or action.dest
            raise ParameterError(f"{name} is empty")


def check_distinct_outputs(command: argparse.ArgumentParser, args: argparse.Namespace, dests: tuple[str, ...]) -> None:
    """Two outputs of one command naming the same file: the second would overwrite the first."""
    seen: dict[str, str] = {}
    for dest in dests:
        value = getattr(args, dest, None)
        if value is None:
            continue
        real = os.path.realpath(value)
        if real in seen:
            raise ParameterError(f"{seen[real]} and {option_name(command, dest)} name the same file {value}")
        seen[real] = option_name(command, dest)


def option_name(command: argparse.ArgumentParser, dest: str) -> str:
    """How the command line names an option (``-o/--out``); "" for a positional argument (its path says it)."""
    for action in command._actions:
        if action.dest == dest:
            return "/".join(action.option_strings)
    raise KeyError(dest)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after "--" is passed on as it is (serve hands it to llama-server)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    args.passthrough = passthrough
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    level = logging.WARNING - 10 * min(args.verbose, 2) if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    for http in HTTP_LOGGERS:  # the API clients' HTTP library logs every request at INFO: shown with -v only
        logging.getLogger(http).setLevel(logging.INFO if args.verbose else logging.WARNING)
    # llama.cpp's own log is loud at INFO; show its warnings unless asked for more.
    logging.getLogger("llama_moe.native").setLevel(logging.DEBUG if args.verbose >= 2 else
                                                   logging.INFO if args.verbose else logging.WARNING)
    name = " ".join(x for x in ("llama_moe", args.command, getattr(args, "audit_command", None)) if x)
    with warnings.catch_warnings():  # the display is this command's, and ends with it
        show_cache_warnings(name)
        return _run(parser, args, name)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str) -> int:
    try:
        from .common import check_output_dir, check_output_file, check_profile_file

        command = _leaf(parser.command_parsers[args.command], args)  # type: ignore[attr-defined]
        check_finite(command, args)
        check_not_empty(command, args)
        check_distinct_outputs(command, args, OUTPUTS.get(args.command, ()))
        for dest in OUTPUTS.get(args.command, ()):
            check_output_file(getattr(args, dest), option_name(command, dest))
        for dest in OUTPUT_DIRS.get(args.command, ()):
            check_output_dir(getattr(args, dest), option_name(command, dest))
        for dest, model in PROFILES.get(args.command, ()):
            check_profile_file(getattr(args, dest), option_name(command, dest), getattr(args, model))
        return int(args.func(args) or 0)
    except (LlamaMoeError, OSError) as exc:  # OSError: a path, a permission, a full disk, a refused connection
        print(f"{name}: error: {one_line(exc, args.verbose)}", file=sys.stderr)
        return EXIT_ERROR
    except MemoryError as exc:  # a size this machine cannot hold is the input's fault, not an internal error
        print(f"{name}: error: out of memory: {one_line(exc, args.verbose) if str(exc) else 'MemoryError'}",
              file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def show_cache_warnings(name: str) -> None:
    """A MoeCacheWarning (the cache asked for is off, or other than asked) is one line on stderr at any verbosity,
    ``llama_moe COMMAND: warning: ...``, each time it is raised; other warnings keep Python's display."""
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: object = None,
             line: str | None = None) -> None:
        if issubclass(category, MoeCacheWarning):
            print(f"{name}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)  # type: ignore[arg-type]

    warnings.showwarning = show  # type: ignore[assignment]
    warnings.simplefilter("always", MoeCacheWarning)


def one_line(exc: BaseException, verbose: int = 0) -> str:
    """The error's message on one line. An OSError names its file; a long message of several lines (a server's or
    a compiler's log after it) keeps its first and last lines, all of them with -v."""
    if isinstance(exc, OSError) and not isinstance(exc, LlamaMoeError) and exc.strerror:
        where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        text = exc.strerror if where is None else f"{where}: {exc.strerror}"
    else:
        text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(exc).__name__]
    if verbose and len(lines) > 1:
        return text
    if len(lines) <= 2 or len(" ".join(lines)) <= 400:
        return " ".join(lines)
    hidden = len(lines) - 2
    return f"{lines[0]} ... {lines[-1]} ({hidden} more line{'s' * (hidden != 1)} with -v)"
