"""Answers with known verdicts, checked inside train.py / scripts/evaluate.py processes (not a bare import): the
reward ``latex_probe`` (named in ``rewards=``) and the answer list that ``scripts/evaluate.py`` is given by
``run_evaluate_with_answers``."""

import json
import os
import time

from gkv_train.rewards.functions import accuracy

# (gold, answer, equal): LaTeX, fractions, intervals, sets, scientific notation and huge exponents.
PAIRS = [
    (r"\frac{1}{2}", r"\frac{1}{2}", True),
    (r"\frac{1}{2}", "0.5", True),
    (r"\frac{1}{2}", r"\frac{1}{3}", False),
    ("[1,2)", r"\left[1, 2\right)", True),
    ("[1,2)", "(1,2)", False),
    (r"\{1,2\}", r"\{2,1\}", True),
    (r"\{1,2,3\}", r"\{1,2\}", False),
    (r"3\sqrt{2}", r"\sqrt{18}", True),
    ("100000", "1e5", True),
    (r"\frac{1}{400}", "2.5e-3", True),
    ("5", "1e10000000", False),
    ("5", "1e100000000", False),
    ("1e100000000", "10e99999999", True),
]


def latex_probe(prompts=None, completions=(), **_):
    """A reward that scores ``PAIRS`` through the shared verifier, appends the verdicts and the wall time to the
    JSONL file ``$PROBE_OUT``, and gives the completions 0."""
    start = time.perf_counter()
    verdicts = accuracy(completions=[f"so \\boxed{{{a}}}" for _, a, _ in PAIRS], answer=[g for g, _, _ in PAIRS])
    with open(os.environ["PROBE_OUT"], "a") as f:
        f.write(json.dumps({"verdicts": verdicts, "seconds": time.perf_counter() - start}) + "\n")
    return [0.0] * len(completions)


def write_problems(path):
    """A JSONL problem file whose gold answers are the ``PAIRS`` golds."""
    path.write_text("".join(json.dumps({"question": f"Problem {i}?", "answer": g}) + "\n" for i, (g, _, _) in enumerate(PAIRS)))
    return path


# scripts/evaluate.py run as __main__ (as `python scripts/evaluate.py` does), each problem's completion read as
# its PAIRS answer (one sample per problem, in order).
EVALUATE_WITH_ANSWERS = """
import itertools, runpy, sys
sys.path.insert(0, {tests!r})
import gkv_train.rewards.grading as grading
from verifier_probe import PAIRS
answers = itertools.cycle([a for _, a, _ in PAIRS])
grading.extract_answer = lambda text: next(answers)
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""
