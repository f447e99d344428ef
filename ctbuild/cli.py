"""The ``ctbuild`` command line. Each subcommand lives in `ctbuild.commands.<name>` and is
imported only when used, so ``ctbuild cache stats`` on a GPU node never imports Ray or the
kernel-declaration machinery.

Whatever a command raises ends here as one line on stderr, never a traceback (``-v`` shows it):
bad input — a config, a declaration, a kernel module that fails to import, a cache that cannot be
used — exits 2; an environment failure (a full disk) or an internal error exits 1; output into a
closed pipe (``ctbuild plan | head -1``) stops quietly with exit 0, as ``git log | head`` does.
SIGINT and SIGTERM end a command the same way: every ``finally`` runs (the farm stops Ray and
its workers), then one line and exit 128 + the signal's number (130, 143); a second signal
while that cleanup runs exits at once (the farm's reaper stops what Ray started).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import Any, NoReturn

from . import __version__
from .user_code import user_frame

#: Subcommands in help order: module name under ctbuild.commands, one-line summary.
COMMANDS = {
    "plan": "list kernels x workloads x archs, their configs and the compile jobs",
    "precompile": "compile every planned config to CUBINs in the cache (CPU, Ray)",
    "tune": "measure the precompiled candidates on this GPU and record the winners",
    "cache": "inspect, verify, trim, export and import the kernel cache",
    "doctor": "check the toolchain, CUDA_HOME, the GPU and the cache directory",
}

EPILOG = """\
typical flow:
  ctbuild plan --config examples/ctbuild.toml --arch sm_90,sm_100
  ctbuild precompile --config examples/ctbuild.toml --cache /cache     # docker build, CPU
  ctbuild tune --config examples/ctbuild.toml --cache /cache           # one GPU node
  CTBUILD_CACHE_DIR=/cache python serve.py                             # warm start

Run 'ctbuild COMMAND --help' for each command's options.
"""

#: Errors that mean "the input is wrong" (exit 2), by module and class name: looked up in
#: sys.modules, so classifying an error never imports anything.
BAD_INPUT = (("ctbuild.project", "ConfigError"), ("ctbuild.declare", "DeclarationError"),
             ("ctbuild.toolchain", "ToolchainError"), ("ctbuild.serve.miss_policy", "RuntimeConfigError"),
             ("ctbuild.cache.errors", "CacheError"),
             ("ctbuild.settings", "SettingsError"))


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread where it was received, so that SIGTERM
    (``docker stop``, a CI timeout) unwinds like Ctrl-C: what holds a cache or Ray open closes."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: The signal `_on_signal` took, for the closing line: code between the handler and the CLI
#: (Ray's, for one) may turn `Interrupted` into a plain KeyboardInterrupt.
_received: list[int] = []


def _on_signal(signum: int, frame: FrameType | None) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_now)
    _received.append(signum)
    raise Interrupted(signum)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    """A second signal during the cleanup the first one started: leave now."""
    print(f"ctbuild: {signal.Signals(signum).name} again: stopping without cleaning up",
          file=sys.stderr, flush=True)
    os._exit(128 + signum)


def handle_signals() -> dict[int, Any]:
    """Route SIGINT and SIGTERM to `Interrupted`; returns the handlers they had (none when
    not on the main thread: then the embedding program owns its signals)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line, as every other error of the CLI is: what is
    wrong and where the command's options are explained (the full usage block buried the
    error under it). Subcommand parsers are of this class too (argparse makes them so)."""

    #: whose ``--help`` the error points to (the chosen subcommand's: the top-level parser
    #: reports options it does not know)
    help_prog: str | None = None

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} "
                     f"(see '{self.help_prog or self.prog} --help')\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand's module is imported (the others are
    listed with their summaries), else every subcommand is built (for docs/gen_cli.py)."""
    parser = OneLineParser(
        prog="ctbuild", description="Precompile and autotune cuTile kernels at build time.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ctbuild {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log debug messages (and show tracebacks)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"ctbuild.commands.{name}").add_parser(sub, name, summary)
        else:
            sub.add_parser(name, help=summary, description=summary)
    if only is not None:
        parser.help_prog = f"ctbuild {only}"
    return parser


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is one), else None."""
    return next((word for word in argv if word in COMMANDS), None)


#: Commands whose process skips the interpreter's teardown once done: their atexit handlers run,
#: but not the finalization of every module, in which torch's CUDA state alone took 0.5-0.7 s of
#: each `ctbuild tune` on an H200 host (the measuring processes already leave this way). What
#: they write is committed before they return: records through diskcache's transactions, files
#: by rename.
QUICK_EXIT = frozenset({"tune"})


def run() -> NoReturn:
    """The ``ctbuild`` process (the console script, ``python -m ctbuild``): `main`, then exit."""
    argv = sys.argv[1:]
    code = main(argv)
    if chosen_command(argv) in QUICK_EXIT:
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to keep
                stream.flush()
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "-v" in argv or "--verbose" in argv
    previous = handle_signals()
    try:
        return _main(argv, verbose)
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(sig, handler)


def _main(argv: list[str], verbose: bool) -> int:
    try:
        os.getcwd()
    except FileNotFoundError:  # every relative path, and the defaults, would fail without a name
        print("ctbuild: error: the current directory no longer exists (deleted, or its mount "
              "is gone): cd to an existing directory and run again", file=sys.stderr)
        return 2
    try:
        parser = build_parser(only=chosen_command(argv))
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="ctbuild: %(levelname)s: %(message)s")
        if not args.command:
            parser.print_help()
            code = 2
        else:
            code = int(args.run(args) or 0)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else (_received or [signal.SIGINT])[0]
        print(f"ctbuild: interrupted by {signal.Signals(signum).name}; what finished is kept "
              "(nothing failed was cached): re-run the same command to continue", file=sys.stderr)
        return 128 + signum
    except Exception as exc:  # noqa: BLE001 - the one place that turns any error into one line
        message, code = describe_error(exc)
        if verbose:
            traceback.print_exc()
        print(f"ctbuild: error: {message}", file=sys.stderr)
        return code


def describe_error(exc: BaseException) -> tuple[str, int]:
    """One line saying what went wrong and where, and the exit code (2 bad input, 1 otherwise)."""
    bad_input = tuple(getattr(sys.modules[module], name) for module, name in BAD_INPUT
                      if module in sys.modules)
    text = str(exc).strip() or type(exc).__name__
    if bad_input and isinstance(exc, bad_input):
        return text, 2
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        hint = "; free space and re-run (finished work is kept)" if exc.errno == 28 else ""
        return f"{exc.strerror or text}{where}{hint}", 1
    frame = user_frame(exc)
    if frame is not None:
        return (f"{type(exc).__name__}: {text} (in {frame.filename}:{frame.lineno}, "
                f"{frame.name}); fix that code, or run with -v for the traceback"), 2
    tb = traceback.extract_tb(exc.__traceback__)
    at = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
    return (f"internal error: {type(exc).__name__}: {text}{at}; please report it with the "
            "output of the same command run with -v"), 1


if __name__ == "__main__":
    sys.exit(main())
