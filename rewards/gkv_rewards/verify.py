"""Answer checking under a hard time limit: exact numbers, and math-verify for everything else.

Every comparison of model output, plain numbers included, runs in a worker process (``gkv_rewards.worker``) that is
killed when a check overruns ``timeout``. The worker is warm before its first check (it has imported math-verify and run
one comparison: ``warm_up``), so the limit measures the check alone, never start-up costs that a loaded machine
stretches; a check that overruns is retried once on a fresh warm worker, and only when it overruns again does it count
as wrong (reward 0) and as a timeout in ``stats`` (a warning is logged, the run goes on with a fresh worker). A worker
that dies during a check (killed, out of memory) or while it starts is restarted and the check retried once; a check
whose worker dies again has no verdict: it is counted as an error (``stats["errors"]``, ``Verdict.error``), never as a
wrong answer. A check that raises on its input (a malformed expression) is a wrong answer, counted in
``stats["malformed"]``. The worker is a plain ``python -m gkv_rewards.worker`` child: it imports only this module and
math-verify (about a second), never the launching script (``train.py``, with torch and transformers), and it dies with
its parent.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
from fractions import Fraction
from typing import NamedTuple

from gkv_rewards.extract import drop_thousands_separators, gold_answer

log = logging.getLogger(__name__)

CHECK = "gkv_rewards.verify:answers_match"
STARTUP_TIMEOUT = 120.0  # importing math-verify takes ~1 s; generous for a loaded machine
_NUMBER = re.compile(r"(?P<sign>[+-]?)(?P<int>\d*)(?:\.(?P<frac>\d*))?(?:[eE](?P<exp>[+-]?\d+))?(?:/(?P<den>\d+))?")


def as_number(text: str) -> tuple[int, int, int] | None:
    """A plain number ('42', '-3.50', '1,000', '3/4', '$5', '20%', '2.5e-3', '1e100000000') as
    (numerator, power of ten, denominator) with the value numerator * 10^power / denominator, else None.
    The power is kept apart, so a huge exponent costs nothing; overlong digit strings are not numbers; a comma
    outside a well-formed thousands group makes a list, not a number ('1,2', '1,0': None)."""
    cleaned = drop_thousands_separators(text.strip()).replace("\\$", "").replace("$", "")
    cleaned = cleaned.rstrip("%").rstrip(".").strip()
    match = _NUMBER.fullmatch(cleaned)
    if match is None or not (match["int"] or match["frac"]):
        return None
    digits, frac = match["int"] + (match["frac"] or ""), match["frac"] or ""
    try:
        numerator = int(digits) * (-1 if match["sign"] == "-" else 1)
        power = int(match["exp"] or 0) - len(frac)
        denominator = int(match["den"] or 1)
    except ValueError:  # more digits than int() converts (4300): not a plain number
        return None
    if denominator == 0:
        return None
    return numerator, power, denominator


def numbers_equal(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """Exact equality of two ``as_number`` values, without ever building 10^power for a power larger than the
    digits involved."""
    left, right = a[0] * b[2], b[0] * a[2]  # a/b -> cross-multiplied: left * 10^a[1] == right * 10^b[1]
    if left == 0 or right == 0:
        return left == right
    if (left < 0) != (right < 0):
        return False
    shift = a[1] - b[1]
    if shift < 0:
        left, right, shift = right, left, -shift
    if shift > len(str(abs(right))):  # left * 10^shift has more digits than right
        return False
    return left * 10**shift == right


def latex_number(value: tuple[int, int, int]) -> str | None:
    """An ``as_number`` value written for math-verify (which does not read '2.5e-3'): an integer or an exact
    ``\\frac``; None for a power of ten beyond +-1000 (such a number only equals another plain number)."""
    numerator, power, denominator = value
    if abs(power) > 1000:
        return None
    exact = Fraction(numerator * 10 ** max(power, 0), denominator * 10 ** max(-power, 0))
    if exact.denominator == 1:
        return str(exact.numerator)
    sign = "-" if exact < 0 else ""
    return f"{sign}\\frac{{{abs(exact.numerator)}}}{{{exact.denominator}}}"


def _math_verify(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice: the worker is the limit

    gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = parse(f"${pred}$", parsing_timeout=None)
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def answers_match(gold: str, pred: str) -> bool:
    """Is ``pred`` equal to ``gold``? Two plain numbers are compared exactly, anything else with math-verify
    (gold first). Unbounded on adversarial input: run it in the worker (``MathVerifier``)."""
    gold_number, pred_number = as_number(gold), as_number(pred)
    if gold_number is not None and pred_number is not None:
        return numbers_equal(gold_number, pred_number)
    if gold_number is not None:
        gold = latex_number(gold_number) or gold
    if pred_number is not None:
        pred = latex_number(pred_number) or pred
    return _math_verify(gold, pred)


def warm_up() -> None:
    """Pay math-verify's first-use costs (its import, the parser's first build: seconds on a loaded machine) before
    any check is timed: the worker calls a check module's ``warm_up`` before it says it is ready."""
    _math_verify(r"\frac{1}{2}", "0.5")


def warn_unverified(what: str, timeouts: int, errors: int, marked: str = "") -> None:
    """One line on stderr for each kind of answer check of ``what`` (e.g. "held-out evaluation") that gave no
    verdict: ``timeouts`` (scored 0) and ``errors`` (the worker died twice; scored 0, never a plain wrong answer:
    ``marked`` says where they are marked as such)."""
    if timeouts:
        print(f"{what}: {timeouts} answer checks timed out (scored 0)", file=sys.stderr)
    if errors:
        print(
            f"{what}: {errors} answer checks have no verdict (their worker died twice; scored 0{marked})",
            file=sys.stderr,
        )


class Verdict(NamedTuple):
    """One check's outcome: ``correct``; ``timed_out`` (then not correct); ``error``: no verdict, the worker died
    twice (then not correct either, and not to be read as a wrong answer)."""

    correct: bool
    timed_out: bool = False
    error: bool = False


class MathVerifier:
    """``verifier(pred, gold) -> bool``: is the predicted answer equal to the gold one? (``judge`` tells a wrong
    answer from a timeout or an error.) Each check runs in a warm worker process, which is killed when the check
    overruns ``timeout`` seconds; the check is then retried once on a fresh worker. ``stats`` counts checks,
    timeouts (a check that overran twice: scored 0), errors (no verdict: the worker died, and died again on the
    retry), retries (checks retried after an overrun or a dead worker, and workers started again after dying
    while starting) and malformed (checks that raised: wrong answers).
    ``check`` is the import path (``module:function``) of the comparison ``f(gold, pred) -> bool`` the worker
    runs."""

    def __init__(self, timeout: float = 5.0, check: str = CHECK):
        self.timeout = timeout
        self.check = check
        self.stats = {"checks": 0, "timeouts": 0, "errors": 0, "retries": 0, "malformed": 0}
        self._process = None
        self._buffer = b""

    def __call__(self, pred: str | None, gold) -> bool:
        return self.judge(pred, gold).correct

    def judge(self, pred: str | None, gold) -> Verdict:
        """The verdict on ``pred`` (None: no answer found, wrong) against ``gold`` (normalised by ``gold_answer``:
        ValueError for a gold that is no answer)."""
        self.stats["checks"] += 1
        gold = gold_answer(gold)
        if pred is None or not pred.strip():
            return Verdict(False)
        timed_out = died = 0
        while True:
            reply = self._ask_worker(gold, pred)
            if reply is None:  # overran: the stuck worker is killed; a fresh, warm one gets one more try
                self.close()
                timed_out += 1
                if timed_out == 1:
                    self.stats["retries"] += 1
                    log.warning(
                        "answer check overran %.1f s; retried once on a fresh worker (gold %.80r, answer %.80r)",
                        self.timeout,
                        gold,
                        pred,
                    )
                    continue
                self.stats["timeouts"] += 1
                log.warning(
                    "answer check timed out twice after %.1f s, scored 0 (gold %.80r, answer %.80r)",
                    self.timeout,
                    gold,
                    pred,
                )
                return Verdict(False, timed_out=True)
            if reply:
                result = json.loads(reply)
                if result is None:  # the check raised: a malformed expression is a wrong answer, not a crash
                    self.stats["malformed"] += 1
                return Verdict(bool(result))
            self.close()  # the worker died: the next attempt (or check) starts a fresh one
            died += 1
            if died == 1:
                self.stats["retries"] += 1
                log.warning(
                    "the answer-check worker died; restarted, check retried (gold %.80r, answer %.80r)", gold, pred
                )
                continue
            self.stats["errors"] += 1
            log.warning(
                "the answer-check worker died again: no verdict, counted as an error (gold %.80r, answer %.80r)",
                gold,
                pred,
            )
            return Verdict(False, error=True)

    def _ask_worker(self, gold: str, pred: str) -> bytes | None:
        """The worker's reply line to ``[gold, pred]``; None when it does not come within ``timeout`` seconds of
        the question (a worker is started, warm, first: not counted), b"" when the worker died (exited, or its
        pipe broke) before replying."""
        if self._process is None or self._process.poll() is not None:
            self._start()
        try:
            self._process.stdin.write((json.dumps([gold, pred]) + "\n").encode())
            self._process.stdin.flush()
            return self._read_line(self.timeout)
        except OSError:
            return b""

    def _read_line(self, timeout: float) -> bytes | None:
        """The worker's next line (without the newline); None when it does not come within ``timeout`` seconds,
        b"" when the worker has exited."""
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _start(self) -> None:
        """Start the worker and wait until it is warm (its check imported, the module's ``warm_up`` run: not
        counted against the time limit). A worker that dies while it starts (killed, out of memory) is started
        once more; RuntimeError when it dies again (naming how it ended; an error of its own is printed above) or
        does not get ready within ``STARTUP_TIMEOUT`` seconds."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p or os.getcwd() for p in sys.path)}
        command = [sys.executable, "-m", "gkv_rewards.worker", str(os.getpid()), self.check]
        for attempt in range(2):
            self._buffer = b""
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)
            line = self._read_line(STARTUP_TIMEOUT)
            if line == b"ready":
                return
            if line is None:
                self.close()
                raise RuntimeError(
                    f"the answer-check worker ({' '.join(command[1:3])}, check {self.check}) did not "
                    f"get ready within {STARTUP_TIMEOUT:.0f} s"
                )
            try:
                status = self._process.wait(timeout=10)  # its output ended: it has exited (or is about to)
            except subprocess.TimeoutExpired:
                status = None
            self.close()
            how = f"was killed by signal {-status}" if status is not None and status < 0 else f"exited ({status})"
            if attempt == 0:
                self.stats["retries"] += 1
                log.warning("the answer-check worker %s while starting; started again", how)
                continue
            raise RuntimeError(
                f"the answer-check worker ({' '.join(command[1:3])}, check {self.check}) {how} while "
                "starting, twice (an error of its own is printed above)"
            )

    def close(self) -> None:
        """Stop the worker (a later check starts a new one)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for pipe in (self._process.stdin, self._process.stdout):
                pipe.close()
        self._process = None
        self._buffer = b""

    def __del__(self):
        self.close()

    def __getstate__(self):  # picklable (accelerate / dataloaders may copy reward functions)
        return {**self.__dict__, "_process": None, "_buffer": b""}
