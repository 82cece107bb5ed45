"""What every depthpack command line promises about errors, in one place.

train/train.py, export/export.py, python -m depthpack.eval and python -m depthpack.bench all refuse
bad input the same way: one line on stderr, `NAME: error: WHAT`, and exit code 1; never a traceback,
never argparse's usage block and exit code 2. A library error that a user can cause (a ValueError:
bad config, corrupt checkpoint, malformed manifest; an OSError: a file system that refuses) is such a
refusal. Warnings (say, a corrupt checkpoint skipped for the previous one) are one line each too, and
so is a Ctrl-C (`NAME: interrupted`, exit code 130; with run(sigterm=True) a SIGTERM too: `NAME: terminated`,
exit code 143), also while torch is still importing: the entry
points hand run() their module by name (lazy), and the packages import lazily (core.lazy).
Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import gc
import sys
import warnings
from typing import Any, Callable, NoReturn


def one_line(message: Any) -> str:
    """message on one line: its lines, stripped, joined by ' | ' (a few messages quote a multi-line text)."""
    return " | ".join(part.strip() for part in str(message).splitlines() if part.strip())


def fail(name: str, message: Any) -> NoReturn:
    print(f"{name}: error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(1)


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line `NAME: error: ...` and exit code 1 like every other refusal."""

    def __init__(self, *args, name: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = name

    def error(self, message: str) -> NoReturn:
        fail(self.name, message)


class Terminated(BaseException):
    """A SIGTERM, raised in the main thread where run(sigterm=True) asked for it: it unwinds like a Ctrl-C."""


def _terminated(signum, frame) -> None:
    raise Terminated()


def run(name: str, main: Callable[[list[str] | None], Any], argv: list[str] | None = None,
        sigterm: bool = False) -> int:
    """Run main(argv) as the command NAME: its int result is the exit code (anything else: 0); a
    ValueError or OSError becomes one line on stderr and exit code 1; a Ctrl-C one line and exit code 130.
    sigterm: a SIGTERM unwinds too (finally blocks, children ended, temporary files removed; the default
    action dies at once and leaves multiprocessing's resource tracker to report leaks), one line, exit 143."""
    import signal
    import threading

    sigterm = sigterm and threading.current_thread() is threading.main_thread()  # handlers live in the main thread

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"{name}: warning: {one_line(message)}", file=sys.stderr, flush=True)

    before = signal.signal(signal.SIGTERM, _terminated) if sigterm else None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            try:
                result = main(argv)
            except (ValueError, OSError) as e:
                print(f"{name}: error: {one_line(e)}", file=sys.stderr, flush=True)
                return 1
    except (KeyboardInterrupt, Terminated) as e:
        print(f"{name}: {'terminated' if isinstance(e, Terminated) else 'interrupted'}", file=sys.stderr, flush=True)
        gc.freeze()  # exit at once: the interpreter's final collections over torch's objects are most of an exit
        return 143 if isinstance(e, Terminated) else 130
    finally:
        if sigterm:
            signal.signal(signal.SIGTERM, before)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def lazy(target: str) -> Callable[[list[str] | None], Any]:
    """The function "module:name", imported when called: the command modules import torch at their top, so
    an entry point that hands this to run() keeps a Ctrl-C during that import to one line as well."""
    def call(argv: list[str] | None = None) -> Any:
        import importlib

        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)(argv)
    return call
