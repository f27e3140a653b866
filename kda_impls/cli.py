"""What the command-line tools share: an argument parser whose errors are one line and exit 2, the
parsing of comma-separated axis values, and a report printed and saved."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, NoReturn

USAGE_ERROR = 2


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``PROG: error: WHAT (see PROG --help)``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see {self.prog} --help)")


def fail(prog: str, message: str) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` on one line to stderr and exit 2."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(USAGE_ERROR)


def print_and_save(text: str, out: Path | None) -> int:
    """Print a report and, where ``out`` names a file, write it there too; the exit status (0)."""
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


def comma_list(convert: Callable[[str], object]) -> Callable[[str], tuple]:
    """An argparse ``type`` for ``1,16,64``: the values converted, in order, without repeats."""

    def parse(text: str) -> tuple:
        items = [item.strip() for item in text.split(",")]
        if not all(items):
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of values")
        try:
            return tuple(dict.fromkeys(convert(item) for item in items))
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names the type in its messages
    return parse


def _number(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole number' if kind is int else 'number'}") from None


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be a whole number >= 1")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be a whole number >= 0")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a number >= 0")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be a number > 0")
    return value
