"""Answers with known verdicts, checked inside train.py / scripts/evaluate.py / scripts/generate_traces.py processes
(not a bare import): the reward ``latex_probe`` (named in ``rewards=``), the answer list that a script is given by
``SCRIPT_WITH_ANSWERS``; ``answers_or_die``, a check that kills its own worker, and ``always_equal``, one that
takes every answer for right; ``completion_length``, a reward with a learning signal whatever a random model
writes."""

import json
import os
import signal
import time
from pathlib import Path

from gkv_rewards.functions import accuracy
from gkv_rewards.verify import answers_match


def _die_at_start():
    """With ``$DIE_AT_START`` = ``FILE:N``, the first N workers that import this module kill themselves while
    starting (SIGKILL, as the OOM killer does), counting in FILE."""
    if not os.environ.get("DIE_AT_START"):
        return
    path, _, times = os.environ["DIE_AT_START"].rpartition(":")
    died = len(Path(path).read_text()) if Path(path).exists() else 0
    if died < int(times):
        Path(path).write_text("x" * (died + 1))
        os.kill(os.getpid(), signal.SIGKILL)


_die_at_start()

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
    ("1,0", "10", False),  # a comma outside a thousands group makes a list
    ("-2,1", "1,-2", True),  # a bare list of solutions is a set
    ("-2,1", "-21", False),
    ("1234", "1,234", True),
]


def latex_probe(prompts=None, completions=(), **_):
    """A reward that scores ``PAIRS`` through the shared verifier, appends the verdicts and the wall time to the
    JSONL file ``$PROBE_OUT``, and gives the completions 0."""
    start = time.perf_counter()
    verdicts = accuracy(completions=[f"so \\boxed{{{a}}}" for _, a, _ in PAIRS], answer=[g for g, _, _ in PAIRS])
    with open(os.environ["PROBE_OUT"], "a") as f:
        f.write(json.dumps({"verdicts": verdicts, "seconds": time.perf_counter() - start}) + "\n")
    return [0.0] * len(completions)


def answers_or_die(gold, pred):
    """``answers_match``, except that the answer ``die`` kills the worker (SIGKILL, as the OOM killer does), the
    answer ``raise`` raises, with ``$DIE_ONCE`` set the first check kills its worker (creating that file), and with
    ``$HANG_ONCE`` set the first check hangs (creating that file)."""
    hang = os.environ.get("HANG_ONCE")
    if hang and not Path(hang).exists():
        Path(hang).touch()
        time.sleep(60)
    once = os.environ.get("DIE_ONCE")
    if once and not Path(once).exists():
        Path(once).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    if pred == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if pred == "raise":
        raise ValueError("a check that raises")
    return answers_match(gold, pred)


def always_equal(gold, pred):
    """A check that takes every answer for right (a control: a sweep must catch it)."""
    return True


def write_problems(path, golds=tuple(g for g, _, _ in PAIRS)):
    """A JSONL problem file with these gold answers (the ``PAIRS`` golds)."""
    path.write_text("".join(json.dumps({"question": f"Problem {i}?", "answer": g}) + "\n" for i, g in enumerate(golds)))
    return path


# scripts/evaluate.py or scripts/generate_traces.py run as __main__ (as `python scripts/<script>.py` does), each
# completion read as the next of `answers` (in order; e.g. the PAIRS answers), checked by `check`.
SCRIPT_WITH_ANSWERS = """
import itertools, runpy, sys
sys.path.insert(0, {tests!r})
import gkv_train.evaluation.evaluate as evaluation
import gkv_rewards.grading as grading
import gkv_train.evaluation.traces as traces
from gkv_rewards.verify import MathVerifier
answers = itertools.cycle({answers!r})
grading.extract_answer = lambda text: next(answers)
evaluation.MathVerifier = traces.MathVerifier = lambda: MathVerifier(check={check!r})
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


_paid_first_use = False


def slow_first_use(gold, pred):
    """``answers_match``, whose first call in a process first sleeps ``$SLOW_FIRST_USE`` seconds (default 3): the
    first-use cost math-verify pays in a fresh worker, stretched as a loaded machine stretches it. This module has no
    ``warm_up``, so a worker pays it inside the first check's time limit (the control);
    ``verifier_warm:slow_first_use`` is the same check with a ``warm_up`` that pays it before the worker is ready."""
    global _paid_first_use
    if not _paid_first_use:
        time.sleep(float(os.environ.get("SLOW_FIRST_USE", "3")))
        _paid_first_use = True
    return answers_match(gold, pred)


def completion_length(prompts=None, completions=(), **_):
    """A reward of the completion's length in characters / 100: the samples of a group differ in it (a GRPO
    advantage that is not 0) where accuracy would give a random model's group 0 each."""
    from gkv_rewards.functions import completion_text

    return [len(completion_text(c)) / 100 for c in completions]
