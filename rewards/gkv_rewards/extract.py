"""Pull the final answer out of a model completion or a dataset's gold field. Pure string functions.

A comma is a thousands separator only inside a well-formed number (``1,000``, ``12,345,678``, ``-1,234.5``);
anywhere else (``1,2``, ``1,0``, ``12,34``, ``-2,1``) it separates the items of a list, which is kept as written
and compared as one (by math-verify: a bare list as a set, ``(a, b)`` as a tuple).
"""

from __future__ import annotations

import math
import numbers
import re

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


def copies_in_order(text: str, required: str | None) -> bool:
    """Whether ``text`` holds each line of ``required`` (a task's sentences the completion must reproduce, one per
    line), in order, spaces normalised; True when nothing is required (None or empty). Used by tasks whose answer
    counts only after the work that leads to it (``copy_recall``: the story copied, then the number)."""
    if not required:
        return True
    flat, at = " ".join(text.split()), 0
    for line in required.split("\n"):
        found = flat.find(" ".join(line.split()), at)
        if found < 0:
            return False
        at = found + len(line)
    return True
