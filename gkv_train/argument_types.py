"""The types of the commands' argparse arguments (the benchmarks' and ``gkv-train compare``'s), each checked by
argparse before any work: a bad value is one ``error:`` line naming the argument, exit 2."""

from __future__ import annotations

import argparse
import math
from pathlib import Path


def integer_from(low: int):
    """The argparse type of an integer >= ``low``: ``count`` (problems, rows, tokens, repeats: >= 1) and ``natural``
    (a seed, or a count where 0 means none: >= 0)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: expected an integer >= {low}")
        return value

    return parse


count, natural = integer_from(1), integer_from(0)


def real_in(low: float, high: float, low_open: bool = False):
    """The argparse type of a number in [``low``, ``high``] (``(low, high]`` with ``low_open``; never NaN, and
    infinite only where ``high`` is): a share, a temperature, a learning rate."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low < value if low_open else low <= value) or not value <= high or value == math.inf:
            interval = f"{'(' if low_open else '['}{low}, {high}{')' if high == math.inf else ']'}"
            raise argparse.ArgumentTypeError(f"{value}: expected a number in {interval}")
        return value

    return parse


fraction, positive_fraction = real_in(0, 1), real_in(0, 1, low_open=True)  # a share or threshold; top-p, eta


nonnegative_number, positive_number = real_in(0, math.inf), real_in(0, math.inf, low_open=True)  # temperature; lr


def true_false(text: str) -> bool:
    """The argparse type of a yes/no setting written as the configuration writes it: ``true`` or ``false``."""
    found = {"true": True, "false": False}.get(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")
    return found


def worker(text: str) -> tuple[int, int]:
    """``--worker i/n``: the i-th of n workers side by side (0 <= i < n), as (i, n)."""
    i, slash, n = text.partition("/")
    if not (slash and i.isdecimal() and n.isdecimal()) or not int(i) < int(n):
        raise argparse.ArgumentTypeError(f"{text!r}: expected i/n, the i-th of n workers counted from 0 (0/2, 1/2)")
    return int(i), int(n)


def input_file(text: str) -> Path:
    """A file the script reads: it exists and is a file."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} {'is a folder' if path.is_dir() else 'does not exist'}")
    return path


def input_folder(text: str) -> Path:
    """A folder the script reads: it exists and is a folder."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} {'is a file' if path.exists() else 'does not exist'}")
    return path


def output_file(text: str) -> Path:
    """A file the script writes at the end (a results file): not a folder, in a folder that exists, so that the
    work is not lost to a path that cannot be written."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: name a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the folder {path.parent} does not exist")
    return path


def output_folder(text: str) -> Path:
    """A folder the script writes into (created with its parents when the work starts): not a file, nor inside
    one."""
    path = Path(text).expanduser()
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: {folder} is a file, not a folder")
    return path
