"""Every shipped gold graded against itself, its common rewritings and perturbed values; one JSON line.

For each gold of the MATH-500, AMC23 and AIME24 presets (as ``load_problems`` gives it), through the real path
(``extract_answer`` on a completion, then ``MathVerifier``'s worker):

* it must score 1 against itself (``self``) and against each rewriting that applies to it: ``boxed`` (the gold in
  a completion's ``\\boxed{}``; every rewriting below is delivered that way too), ``spacing_added`` (a space after
  each comma, not in a number's thousands separators: ``58, 500`` is a list; around ``+`` and ``=``),
  ``spacing_removed`` (no spaces, but one after a command before a letter; not for golds with ``\\text`` /
  ``\\mbox``, whose spaces are text), ``dfrac`` (``\\frac`` <-> ``\\dfrac``),
  ``decimal`` (``\\frac{a}{b}`` and mixed numbers <-> an exact decimal, integer ``n`` -> ``n.0``), ``reordered``
  (a bare list of solutions or a ``\\{set\\}`` in reverse order), ``thousands`` (an integer of 1000 or more with
  thousands commas; a gold written with ``,\\!`` without them), ``unpadded`` (AIME's ``025`` -> ``25``);
* it must score 0 against each perturbation that applies: ``number+1`` (a plain number plus one), ``element+1``
  (the first number in a list, tuple, set or interval plus one), ``first_number+1`` (the first number of any other
  expression plus one), ``text_changed`` (the last letter of the last ``\\text{}`` of a gold without digits moved
  one letter on), ``plus_one`` (``+1`` appended to another gold without digits), ``tuple_reversed`` (an ordered
  tuple ``(a, b, ...)`` of distinct items in reverse order), ``commas_dropped`` (a bare list written without its
  commas: MATH-500's roots ``-2,1`` are not ``-21``).

    python scripts/sweep_golds.py                       # all three datasets -> results/gold_sweep.json
    python scripts/sweep_golds.py --datasets aime24 --limit 5 --output outputs/sweep.json

Prints one JSON line (also written to ``--output``, with the command, date and commit): per dataset the number of
golds, self-matches, rewritings matched / tried and perturbations rejected / tried by kind, verifier timeouts and
errors, and each failure (line of the file, gold, kind, the answer given, expected and got); exits with 1 when
there is a failure.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

from gkv_rewards.extract import extract_answer
from gkv_rewards.verify import CHECK, MathVerifier
from gkv_train.jsonio import dumps
from gkv_train.problems.data import DATA_DIR, PRESETS, DataConfig, load_problems
from gkv_train.problems.files import read_records

from _common import ROOT, print_json

DATASETS = ("math500", "amc23", "aime24")
_FRAC = r"\\d?frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))"
_FRACTION = re.compile(rf"(-?)(\d+)?\s*{_FRAC}")  # \frac{a}{b}, \frac43, \frac 59, a mixed number 1\frac{4}{5}
_LATEX_THOUSANDS = re.compile(r"(\\\$)?\d{1,3}(?:,\\!\s*\d{3})+")  # 10,\!080  \$32,\!348
_INTEGER = re.compile(r"-?\d+")
_PLAIN = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_WRAPPED = re.compile(r"(\\left)?(\(|\[|\\\{)(.*)(\\right)?(\)|\]|\\\})", re.DOTALL)


def top_level_split(text: str) -> list[str]:
    """``text`` split at the commas outside any brackets or braces."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0 and text[i + 1 : i + 3] != "\\!":
            items.append(text[start:i])
            start = i + 1
    return [*items, text[start:]]


def wrapped(gold: str) -> tuple[str, str, str] | None:
    """(opening, inside, closing) when one bracket pair encloses all of ``gold`` ('(1,2)', '\\left[ 1, 2 \\right)',
    '\\{1,2\\}'); None otherwise ('(0,9) \\cup (9,36)')."""
    match = _WRAPPED.fullmatch(gold.strip())
    if match is None:
        return None
    inside, depth = match[3], 0
    if match[4] is None and inside.endswith("\\right"):
        inside = inside[: -len("\\right")]
    for ch in inside.replace("\\{", "(").replace("\\}", ")"):
        depth += (ch in "([{") - (ch in ")]}")
        if depth < 0:
            return None
    return (match[1] or "") + match[2], inside, ("\\right" if match[1] else "") + match[5]


def is_number(gold: str) -> bool:
    """A plain number ('42', '025', '-1.5', '58,500') or a LaTeX one with ``,\\!`` thousands separators (told
    apart here, not by the verifier under test)."""
    return _PLAIN.fullmatch(gold) is not None or _LATEX_THOUSANDS.fullmatch(gold) is not None


def latex_fraction(value: Fraction) -> str:
    """``value`` as ``\\frac{p}{q}`` in lowest terms, sign in front ('-\\frac{1}{2}')."""
    return f"{'-' if value < 0 else ''}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def exact(value: Fraction) -> str:
    """``value`` as an exact decimal ('0.75', '3') when it has one, else ``latex_fraction``."""
    q = value.denominator
    while q % 2 == 0:
        q //= 2
    while q % 5 == 0:
        q //= 5
    if q != 1:
        return latex_fraction(value)
    whole, digits, rest = abs(value.numerator) // value.denominator, "", abs(value) % 1
    while rest:
        rest *= 10
        digits += str(int(rest))
        rest %= 1
    return ("-" if value < 0 else "") + str(whole) + (f".{digits}" if digits else "")


def fraction_value(gold: str) -> Fraction | None:
    """The value of a gold that is one ``\\frac`` (or ``\\dfrac``, ``\\frac43``) of integers, or a mixed number."""
    match = _FRACTION.fullmatch(gold.strip())
    if match is None:
        return None
    sign, whole, a1, a2, b1, b2 = match.groups()
    value = int(whole or 0) + Fraction(int(a1 or a2), int(b1 or b2))
    return -value if sign else value


def plus_one_first_number(gold: str) -> str:
    """``gold`` with its first run of digits increased by one ('(3,4]' -> '(4,4]', '\\frac{14}{3}' ->
    '\\frac{15}{3}')."""
    return re.sub(r"\d+", lambda m: str(int(m[0]) + 1), gold, count=1)


def rewritings(gold: str) -> list[tuple[str, str]]:
    """(kind, answer) pairs that must score 1 against ``gold``."""
    found = [("boxed", gold)]
    spaced = re.sub(r"\s*([+=])\s*", r" \1 ", gold if is_number(gold) else re.sub(r",(?!\\!)\s*", ", ", gold)).strip()
    if spaced != gold:
        found.append(("spacing_added", spaced))
    if not re.search(r"\\(text|mbox)", gold):
        unspaced = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])|\s+", lambda m: m[1] + " " if m[1] else "", gold)
        if unspaced != gold:
            found.append(("spacing_removed", unspaced))
    if "\\frac" in gold or "\\dfrac" in gold:
        other = gold.replace("\\frac", "\\dfrac") if "\\frac" in gold else gold.replace("\\dfrac", "\\frac")
        found.append(("dfrac", other))
    value = fraction_value(gold)
    if value is not None and "." in exact(value):
        found.append(("decimal", exact(value)))
    elif re.fullmatch(r"-?\d*\.\d+", gold):
        found.append(("decimal", latex_fraction(Fraction(gold))))
    elif _INTEGER.fullmatch(gold):
        found.append(("decimal", f"{int(gold)}.0"))
    if _INTEGER.fullmatch(gold) and abs(int(gold)) >= 1000:
        found.append(("thousands", f"{int(gold):,}"))
    elif _LATEX_THOUSANDS.fullmatch(gold):
        found.append(("thousands", re.sub(r",\\!\s*", "", gold)))
    if re.fullmatch(r"-?0\d+", gold):
        found.append(("unpadded", str(int(gold))))
    outer = wrapped(gold)
    if outer is not None and outer[0].endswith("\\{"):
        items = top_level_split(outer[1])
        if len(set(i.strip() for i in items)) > 1:
            found.append(("reordered", outer[0] + ",".join(reversed(items)) + outer[2]))
    elif outer is None and not is_number(gold):
        items = top_level_split(gold)
        if len(set(i.strip() for i in items)) > 1:
            found.append(("reordered", ",".join(i.strip() for i in reversed(items))))
    return found


def perturbations(gold: str) -> list[tuple[str, str]]:
    """(kind, answer) pairs that must score 0 against ``gold``."""
    found = []
    outer = wrapped(gold)
    if is_number(gold):
        padded = re.fullmatch(r"0\d+", gold) is not None  # AIME's 025 -> 026
        plus_one = exact(Fraction(re.sub(r"[^\d.-]", "", gold)) + 1)
        found.append(("number+1", plus_one.zfill(len(gold)) if padded else plus_one))
    elif re.search(r"\d", gold):
        listed = outer is not None or len(top_level_split(gold)) > 1
        found.append(("element+1" if listed else "first_number+1", plus_one_first_number(gold)))
    elif "\\text{" in gold:
        head, body = gold.rsplit("\\text{", 1)
        letters = [i for i, ch in enumerate(body) if ch.isalpha()]
        last, base = letters[-1], ord("a") if body[letters[-1]].islower() else ord("A")
        moved = chr((ord(body[last]) - base + 1) % 26 + base)
        found.append(("text_changed", head + "\\text{" + body[:last] + moved + body[last + 1 :]))
    else:
        found.append(("plus_one", f"{gold}+1"))
    if outer is None and not is_number(gold) and len(top_level_split(gold)) > 1:
        found.append(("commas_dropped", "".join(i.strip() for i in top_level_split(gold))))
    if outer is not None and outer[0].endswith("(") and outer[2].endswith(")"):
        items = top_level_split(outer[1])
        if len(items) > 1 and len(set(i.strip() for i in items)) == len(items):
            found.append(("tuple_reversed", outer[0] + ",".join(reversed(items)) + outer[2]))
    return found


def sweep_dataset(name: str, verify: MathVerifier, limit: int | None = None) -> dict:
    """The sweep of one preset's golds (the first ``limit``): counts by kind and the failures."""
    problems = load_problems(DataConfig(name=name, split="test", limit=limit))
    lines = [int(where.rsplit(":", 1)[1]) for where, _ in read_records(DATA_DIR / PRESETS[name].file)]
    stats_before = dict(verify.stats)
    report = {"golds": len(problems), "self_match": 0, "rewritings": {}, "perturbed": {}, "failures": []}
    for line, gold in zip(lines, problems["answer"]):
        checks = [("self", gold, True, gold)]
        checks += [(kind, answer, True, None) for kind, answer in rewritings(gold)]
        checks += [(kind, answer, False, None) for kind, answer in perturbations(gold)]
        for kind, answer, expected, extracted in checks:
            if extracted is None:
                extracted = extract_answer(f"So the answer is $\\boxed{{{answer}}}$.")
            verdict = verify.judge(extracted, gold)
            passed = verdict.correct == expected and not verdict.timed_out and not verdict.error
            if kind == "self":
                report["self_match"] += passed
            else:
                tally = report["rewritings" if expected else "perturbed"].setdefault(kind, {"tried": 0, "passed": 0})
                tally["tried"] += 1
                tally["passed"] += passed
            if not passed:
                report["failures"].append(
                    {
                        "line": line,
                        "gold": gold,
                        "kind": kind,
                        "answer": answer,
                        "extracted": extracted,
                        "expected": expected,
                        "got": verdict.correct,
                        "timed_out": verdict.timed_out,
                        "error": verdict.error,
                    }
                )
    for tally in report["rewritings"].values():
        tally["matched"] = tally.pop("passed")
    for tally in report["perturbed"].values():
        tally["rejected"] = tally.pop("passed")
    report.update({f"verifier_{k}": verify.stats[k] - stats_before[k] for k in ("timeouts", "errors", "malformed")})
    return report


def commit() -> str | None:
    """The checkout's commit (with ``+dirty`` when it has uncommitted changes), None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=sorted(PRESETS))
    parser.add_argument("--limit", type=int, default=None, help="the first N golds of each dataset")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per check (training's limit: 5)")
    parser.add_argument("--check", default=CHECK, help="the comparison the worker runs (module:function)")
    parser.add_argument("--output", default=str(ROOT / "results" / "gold_sweep.json"))
    args = parser.parse_args(argv)
    verify = MathVerifier(timeout=args.timeout, check=args.check)
    try:
        datasets = {name: sweep_dataset(name, verify, args.limit) for name in args.datasets}
    finally:
        verify.close()
    result = {
        "sweep": "golds",
        "command": " ".join(["python", "scripts/sweep_golds.py", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "failures": sum(len(d["failures"]) for d in datasets.values()),
        "datasets": datasets,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(dumps(result, indent=2) + "\n")
    print_json(result)
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["failures"] else 0)
