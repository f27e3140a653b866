"""What the command-line tools share: an argument parser whose errors are one line and exit 2, the
parsing of comma-separated axis values and device lists, the check that an output directory takes
files, and a report printed and saved."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Callable, NoReturn

USAGE_ERROR = 2



class UsageError(ValueError):
    """Input that is refused before anything runs; the message is the one line a user reads."""


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


def positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be a number > 0")
    return value


def dtype(text: str) -> str:
    """An argparse ``type`` for a dtype name: ``bf16`` or ``bfloat16`` -> ``bfloat16``."""
    from .dtypes import full

    try:
        return full(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def devices(text: str) -> list[str]:
    """``all`` (every visible GPU, else the CPU), ``cpu``, ``cuda`` (the current GPU) or a list
    such as ``cuda:0,cuda:1``; each one checked to exist; one kind of device."""
    import torch  # here: the tools that take no device need not import it

    if text == "all":
        count = torch.cuda.device_count()
        return [f"cuda:{i}" for i in range(count)] if count else ["cpu"]
    found = []
    for name in dict.fromkeys(part.strip() for part in text.split(",")):
        try:
            device = torch.device(name)
        except RuntimeError:
            raise argparse.ArgumentTypeError(f"{name!r} is not a device (cpu, cuda, cuda:N)") from None
        if device.type == "cuda":
            count = torch.cuda.device_count()
            if not count:
                raise argparse.ArgumentTypeError(f"{name}: no CUDA GPU is visible here")
            index = torch.cuda.current_device() if device.index is None else device.index
            if index >= count:
                raise argparse.ArgumentTypeError(f"{name}: only {count} GPU(s) visible (cuda:0..cuda:{count - 1})")
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise argparse.ArgumentTypeError(f"{name!r}: only cpu and cuda devices are measured")
        found.append(str(device))
    if len({torch.device(d).type for d in found}) > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: one measurement runs on one kind of device (all cuda or cpu)")
    return found


def writable_dir(path: Path, option: str = "--out") -> None:
    """Raise :class:`UsageError` unless ``path`` is, or can be made, a directory that takes new files;
    a directory made only to find out is removed again."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file; name a directory (new, or one of an earlier run to resume it)")
    made = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        for directory in made:  # innermost first
            with suppress(OSError):
                directory.rmdir()
        raise UsageError(f"{option} {path}: cannot write there ({exc.strerror or exc}); "
                         f"name a directory you can write to") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"{option} {path}: not writable; name a directory you can write to")

