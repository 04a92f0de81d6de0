"""Pull the final answer out of a model completion or a dataset's gold field. Pure string functions."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\$?\s*(-?[\d,]*\.?\d+(?:/\d+)?)", re.IGNORECASE)


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
    """GSM8K style: what follows the last ``####``, without thousands separators."""
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    return tail.split("\n")[0].replace(",", "").strip() or None


def last_number(text: str) -> str | None:
    """The last number written in the text (commas dropped), e.g. '1,234.5' -> '1234.5'."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: last ``\\boxed{}``, else after ``####``, else 'the answer is X', else the
    last number. None when nothing answer-like is found."""
    for extractor in (last_boxed, after_hashes):
        found = extractor(text)
        if found:
            return found
    stated = _ANSWER_IS.findall(text)
    if stated:
        return stated[-1].replace(",", "")
    return last_number(text)


def gold_answer(value) -> str:
    """Normalise a dataset's gold field to a string: GSM8K ``#### 42`` solutions, floats such as AMC's ``27.0``
    (written ``27``), zero-padded AIME strings (kept as written; compared numerically)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    hashed = after_hashes(text)
    return hashed if hashed is not None else text
