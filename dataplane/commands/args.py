"""Command-line parsing that ``pdpair-agent`` and ``pdpair-operator`` share: a user's mistake is one
line naming the argument and its fix, never a usage dump or a traceback, and every number a user types
has a range.

The ``type=`` functions below raise ``argparse.ArgumentTypeError``, whose text argparse puts after the
argument's name (``argument --requests: -5 is out of range: ...``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_RST = (
    (re.compile(r":[a-z:]+:`~?([^`]+)`"), r"\1"),  # :class:`X`, :meth:`~a.b`
    (re.compile(r"``([^`]+)``"), r"\1"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"\1"),
)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, exit status 2. argparse's only hook
    for that is overriding ``error``; sub-command parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def plain(doc: str | None) -> str:
    """A docstring as ``--help`` text: reStructuredText roles, literals and bold reduced to their text."""
    text = doc or ""
    for pattern, repl in _RST:
        text = pattern.sub(repl, text)
    return text


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: the installed ``pdpair`` distribution's version."""
    try:
        version = metadata.version("pdpair")
    except metadata.PackageNotFoundError:
        version = "unknown (not installed: pip install -e .)"
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")


def integer(lo: int, hi: int) -> Callable[[str], int]:
    """``type=`` for a whole number in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number: give one from {lo:,} to {hi:,}"
            ) from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"{value} is out of range: give a whole number from {lo:,} to {hi:,}"
            )
        return value

    parse.__name__ = "integer"
    return parse


def number(lo: float, hi: float) -> Callable[[str], float]:
    """``type=`` for a finite number in ``[lo, hi]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number: give one from {lo:g} to {hi:g}"
            ) from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a number from {lo:g} to {hi:g}")
        return value

    parse.__name__ = "number"
    return parse


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``4K``, ``64KiB``, ``1M``, ``2GB`` (binary units); ValueError if malformed."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    if t and t[-1] in UNITS:
        return int(t[:-1]) * UNITS[t[-1]]
    return int(t)


def _size_text(n: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return str(n)


def size(lo: int, hi: int) -> Callable[[str], int]:
    """``type=`` for a byte count in ``[lo, hi]``, with optional K/M/G/T suffix."""

    def parse(text: str) -> int:
        try:
            value = parse_size(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a size: give bytes, or a number with K, M or G (e.g. 64K), "
                f"from {_size_text(lo)} to {_size_text(hi)}"
            ) from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: give a size from {_size_text(lo)} to {_size_text(hi)}"
            )
        return value

    parse.__name__ = "size"
    return parse


def listed(
    item: Callable[[str], Any], what: str, max_items: int = 64, min_items: int = 1
) -> Callable[[str], tuple[Any, ...]]:
    """``type=`` for a comma-separated list of ``min_items``..``max_items`` values, each parsed by
    ``item``."""

    def parse(text: str) -> tuple[Any, ...]:
        parts = [p for p in text.split(",") if p.strip()]
        if not min_items <= len(parts) <= max_items:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give {min_items} to {max_items} {what}, separated by commas"
            )
        out = []
        for i, p in enumerate(parts, 1):
            try:
                out.append(item(p))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"item {i} of the {what}: {exc}") from None
        return tuple(out)

    parse.__name__ = what
    return parse


def one_of(names: Sequence[str], what: str, *, empty: bool = False) -> Callable[[str], str]:
    """``type=`` for a name from ``names`` (or ``''`` when ``empty``): argparse's ``choices`` with the
    list in the error even when the help shows a metavar."""

    def parse(text: str) -> str:
        if text in names or (empty and text == ""):
            return text
        extra = " or '' for none" if empty else ""
        raise argparse.ArgumentTypeError(f"unknown {what} {text!r}: choose from {', '.join(names)}{extra}")

    parse.__name__ = what
    return parse


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """``type=`` for ``--log-level``: a logging level's name, any case."""
    if text.upper() in LOG_LEVELS:
        return text.upper()
    raise argparse.ArgumentTypeError(
        f"unknown level {text!r}: choose from {', '.join(LOG_LEVELS)} (any case)"
    )


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", type=log_level, default="INFO", metavar="LEVEL",
                        help=f"one of {', '.join(LOG_LEVELS)} (default: INFO)")


def output_file(text: str) -> str:
    """``type=`` for a file the command writes later: its folder must exist and be writable now, so a
    typo fails before the work instead of after it."""
    folder = Path(text).expanduser().parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r}: folder {folder} does not exist; create it or fix the path"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: folder {folder} is not writable; pick another path")
    return text
