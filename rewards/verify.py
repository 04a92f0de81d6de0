"""Answer checking: exact numbers directly, everything else with math-verify under a hard time limit.

math-verify's own time limit uses ``signal.alarm``, which only works in the main thread and does not stop every
pathological case. ``MathVerifier`` runs it in a worker process instead and kills the worker when a check
overruns: the check then counts as wrong (reward 0) and as a failure in ``stats``; the run goes on.
"""

from __future__ import annotations

import multiprocessing as mp
from fractions import Fraction

from rewards.extract import gold_answer


def as_number(text: str) -> Fraction | None:
    """Exact value of a plain number ('42', '-3.50', '1,000', '3/4', '$5', '20%'), else None."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip("%").rstrip(".").strip()
    if cleaned.startswith("\\$"):
        cleaned = cleaned[2:]
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _math_verify(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = parse(f"${pred}$", parsing_timeout=None)
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _worker(conn, check) -> None:
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(check(*job))
        except Exception:  # a malformed expression is a wrong answer, not a crash
            conn.send(False)


class MathVerifier:
    """``verifier(pred, gold) -> bool``: is the predicted answer equal to the gold one (gold first, as
    math-verify expects)? Numbers are compared exactly without math-verify; other answers go to a worker
    process that is killed after ``timeout`` seconds. ``stats`` counts checks, timeouts and errors.
    ``check(gold, pred) -> bool`` is the comparison run in the worker (a module-level function)."""

    def __init__(self, timeout: float = 5.0, check=_math_verify):
        self.timeout = timeout
        self.check = check
        self.stats = {"checks": 0, "timeouts": 0, "errors": 0}
        self._process = None
        self._conn = None

    def __call__(self, pred: str | None, gold) -> bool:
        self.stats["checks"] += 1
        if pred is None or not pred.strip():
            return False
        gold = gold_answer(gold)
        gold_number, pred_number = as_number(gold), as_number(pred)
        if gold_number is not None and pred_number is not None:
            return gold_number == pred_number
        return self._ask_worker(gold, pred)

    def _ask_worker(self, gold: str, pred: str) -> bool:
        try:
            if self._process is None or not self._process.is_alive():
                self._start()
            self._conn.send((gold, pred))
            if self._conn.poll(self.timeout):
                return bool(self._conn.recv())
            self.stats["timeouts"] += 1
        except (OSError, EOFError):
            self.stats["errors"] += 1
        self.close()  # a stuck or broken worker is killed; the next check starts a fresh one
        return False

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process holding torch threads
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_worker, args=(child, self.check), daemon=True)
        self._process.start()

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
        self._process = self._conn = None

    def __del__(self):
        self.close()

    def __getstate__(self):  # picklable (accelerate / dataloaders may copy reward functions)
        return {**self.__dict__, "_process": None, "_conn": None}
