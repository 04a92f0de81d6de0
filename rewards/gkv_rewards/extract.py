"""Pull the final answer out of a model completion or a dataset's gold field. Pure string functions.

A comma is a thousands separator only inside a well-formed number (``1,000``, ``12,345,678``, ``-1,234.5``);
anywhere else (``1,2``, ``1,0``, ``12,34``, ``-2,1``) it separates the items of a list, which is kept as written
and compared as one (by math-verify: a bare list as a set, ``(a, b)`` as a tuple).
"""

from __future__ import annotations

import bisect
import math
import numbers
import re
from typing import NamedTuple

_THOUSANDS = re.compile(r"(?<![\d.,])(\d{1,3})((?:,\d{3})+)(?!\d|,\d)")
_ITEM = r"-?(?:\d+(?:\.\d+)?|\.\d+)(?:/\d+)?"
_NUMBERS = re.compile(rf"{_ITEM}(?:,{_ITEM})*")  # a number, or numbers joined by commas without spaces
_ANSWER_IS = re.compile(rf"answer\s*(?:is|:)\s*\$?\s*({_NUMBERS.pattern})", re.IGNORECASE)
_MISSING = {"nan", "none", "null"}  # how a missing value reads once written as text


def drop_thousands_separators(text: str) -> str:
    """``text`` with the commas of its well-formed numbers removed ('1,234.5' -> '1234.5', '$1,000' -> '$1000');
    every other comma kept ('1,2', '1,0', '12,34', '1,000,2' unchanged)."""
    return _THOUSANDS.sub(lambda m: m[1] + m[2].replace(",", ""), text)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included; None if there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        rest = text[start + len("\\boxed") :].strip().split()  # "\boxed 5"
        return rest[0].rstrip(".$") if rest else None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i].strip()
    return None


def after_hashes(text: str) -> str | None:
    """GSM8K style: what follows the last ``####`` on its line, without thousands separators."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    return drop_thousands_separators(tail.split("\n")[0].strip()) or None


def last_number(text: str) -> str | None:
    """The last number written in the text, without thousands separators ('1,234.5' -> '1234.5'); numbers joined
    by commas are kept together as a list ('x = 1,-2' -> '1,-2')."""
    found = _NUMBERS.findall(text)
    return drop_thousands_separators(found[-1]) if found else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: last ``\\boxed{}``, else after ``####``, else 'the answer is X', else the
    last number. None when nothing answer-like is found."""
    for extractor in (last_boxed, after_hashes):
        found = extractor(text)
        if found:
            return found
    stated = _ANSWER_IS.findall(text)
    if stated:
        return drop_thousands_separators(stated[-1])
    return last_number(text)


def gold_answer(value) -> str:
    """A dataset's gold field as a string: GSM8K ``#### 42`` solutions, floats such as AMC's ``27.0`` (written
    ``27``), zero-padded AIME strings (kept as written; compared numerically). ValueError for a gold that is no
    answer: null, NaN or infinite, empty, 'nan' / 'None' / 'null' (a missing value written as text), a boolean, or
    anything but a string or a number (a list, a dict: write the answer as the text the model should give)."""
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
        raise ValueError(f"gold answer {value!r} is a {type(value).__name__}, not a string or a number")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy's floats too
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"gold answer {value!r} is not a finite number")
        if value.is_integer():
            return str(int(value))
    text = str(value).strip()
    if "####" in text:
        text = after_hashes(text) or ""
    if not text or text.lower() in _MISSING:
        raise ValueError(f"gold answer {value!r} is empty or a missing value")
    return text


_AT_LEAST = re.compile(r"at least (\d+) of:")
EACH_LINE = "each line:"  # a first required line: every following line must be a whole line of the text, in order


class Copy(NamedTuple):
    """What a completion copied of a task's required lines: ``found`` of the ``lines`` in order (the most that
    appear in order), ``needed`` of them to count as copied, and ``rest``: where the final answer is read (the text
    after the last line found; the whole text when nothing is required or a required line is missing)."""

    found: int
    needed: int
    lines: int
    rest: str

    @property
    def ok(self) -> bool:
        return self.found >= self.needed

    @property
    def share(self) -> float:
        """The share of the required lines found in order (1.0 when nothing is required)."""
        return self.found / self.lines if self.lines else 1.0


def copied(text: str, required: str | None) -> Copy:
    """What ``text`` copied of ``required``: a task's lines the completion must reproduce, one per line, in order,
    spaces normalised. A first line ``at least K of:`` asks for any K of the lines that follow, in order; a first
    line ``each line:`` asks for every line that follows as a whole line of the text, in order, other lines allowed
    between them (``found``: how many of the first lines were written so, ``written_in_order``). The final answer
    counts only after them (``rest``: the text after the last line found), so it comes at the end of the work. Used
    by tasks whose answer counts only after the work that leads to it (``copy_recall``, ``count_recall``)."""
    if not required:
        return Copy(0, 0, 0, text)
    if not isinstance(required, str):
        raise TypeError(f"required is {required!r} ({type(required).__name__}): the lines to copy, one text, or None")
    lines = required.split("\n")
    if lines[0].strip() == EACH_LINE:
        return written_in_order(text, [" ".join(line.split()) for line in lines[1:]])
    relaxed = _AT_LEAST.fullmatch(lines[0].strip())
    if relaxed:
        lines = lines[1:]
        if not 1 <= int(relaxed[1]) <= len(lines):
            raise ValueError(f"required asks for {relaxed[0]!r} of {len(lines)} lines: from 1 to {len(lines)}")
    flat = " ".join(text.split())
    wanted = [" ".join(line.split()) for line in lines]
    if not relaxed:  # every line, in order: the first occurrence of each after the one before
        at = 0
        for line in wanted:
            found = flat.find(line, at)
            if found < 0:
                return Copy(0, len(wanted), len(wanted), text)
            at = found + len(line)
        return Copy(len(wanted), len(wanted), len(wanted), flat[at:])
    count, end = most_in_order(flat, wanted)
    return Copy(count, min(int(relaxed[1]), len(wanted)), len(wanted), flat[end:])


def most_in_order(flat: str, wanted: list[str]) -> tuple[int, int]:
    """The most of the ``wanted`` lines that occur in ``flat`` in their order without overlapping, and the earliest
    end of such a chain (0 when none occurs). ``best[c]``: the earliest end of a chain of c lines among those seen;
    each line extends every chain from the longest down (so that it is used once), at its first occurrence after
    the chain's end (found by bisection in its occurrences). O(lines x chain length x log occurrences)."""
    best = [0]
    for line in wanted:
        starts, at = [], flat.find(line)
        while at >= 0:
            starts.append(at)
            at = flat.find(line, at + 1)
        if not starts:
            continue
        for c in range(len(best) - 1, -1, -1):
            i = bisect.bisect_left(starts, best[c])
            if i == len(starts):
                continue
            end = starts[i] + len(line)
            if c + 1 == len(best):
                best.append(end)
            elif end < best[c + 1]:
                best[c + 1] = end
    return len(best) - 1, best[-1]


def written_in_order(text: str, wanted: list[str]) -> Copy:
    """How many of the first ``wanted`` lines ``text`` holds as whole lines (spaces normalised) in their order,
    other lines allowed between them; ``rest``: the text after the last one found (the whole text when none is).
    One pass over the text's lines."""
    found, rest_at, at = 0, 0, 0
    for line in text.split("\n"):
        end = at + len(line)
        if found < len(wanted) and " ".join(line.split()) == wanted[found]:
            found, rest_at = found + 1, end
        at = end + 1
    return Copy(found, len(wanted), len(wanted), text[rest_at:] if found else text)


def copies_in_order(text: str, required: str | None) -> bool:
    """Whether ``text`` holds what ``required`` asks for (``copied``); True when nothing is required."""
    return copied(text, required).ok
