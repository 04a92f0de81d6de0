"""Reward cases: answers, golds and the answer-check worker, called directly in a child."""

from __future__ import annotations

import json
import re

from faults.harness import (
    REWARD_CHILD,
    Case,
    Context,
    Verdict,
    failure_message,
)


def reward_case(name, kind, about, spec: dict, expect, timeout=60.0) -> Case:
    """A reward function or the verifier called directly in a child. ``expect``: the list of scores, or
    ``zero_or_raise`` / ``one_or_raise`` (the score, or a clear ValueError / TypeError naming the gold answer)."""

    def run(ctx: Context) -> Verdict:
        spec_file = ctx.work / "spec.py"
        spec_file.write_text(repr(spec))
        proc = ctx.run([ctx.python, "-c", REWARD_CHILD, str(spec_file)], timeout)
        if proc.timed_out:
            return Verdict("hang", f"no score within {proc.seconds:.0f} s")
        found = [line for line in proc.out.splitlines() if line.startswith("BENCH_RESULT ")]
        if proc.rc != 0 or not found:
            return Verdict("crash", f"exit {proc.rc}: {failure_message(proc.err)[:300]}")
        got = json.loads(found[-1].split(" ", 1)[1])
        extra = {"got": got}
        if "raised" in got:
            raised = f"{got['raised']}: {got['message'][:200]}"
            if isinstance(expect, str):
                if got["raised"] in ("ValueError", "TypeError") and re.search(r"gold|answer", got["message"], re.I):
                    return Verdict("clear_error", raised, extra)
                unclear = got["raised"] in ("ValueError", "TypeError")  # refused, but not naming the gold
                return Verdict("unclear_error" if unclear else "crash", raised, extra)
            return Verdict("crash", f"raised on a valid input: {raised}", extra)
        scores = got["scores"]
        want = {"zero_or_raise": [0.0], "one_or_raise": [1.0]}[expect] if isinstance(expect, str) else expect
        if scores != want:
            return Verdict("silent_wrong", f"scored {scores}, right is {want}", extra)
        return Verdict("ok", f"scored {scores} in {got['seconds']:.1f} s", extra)

    return Case(name, "rewards", kind, about, run, timeout)


def acc(name, kind, about, completion, gold, expect, timeout=60.0) -> Case:
    return reward_case(
        name,
        kind,
        about,
        {"call": "accuracy", "completions": [completion], "answers": [gold]},
        [float(expect)] if not isinstance(expect, str) else expect,
        timeout,
    )


def verifier_case(
    name, kind, about, check_name, expect_score, expect_stats=None, timeout=60.0, verifier_timeout=5.0, check_path=None
) -> Case:
    """The verifier with a misbehaving check (``CHECKS_MODULE``'s ``check_name``, or ``check_path``) on one right
    answer ('42' vs '42')."""
    spec = {
        "call": "verifier",
        "check": check_path or f"bench_faults_checks:{check_name}",
        "timeout": verifier_timeout,
        "pairs": [("42", "42")],
    }
    inner = reward_case(name, kind, about, spec, [expect_score], timeout)

    def run(ctx: Context) -> Verdict:
        verdict = inner.run(ctx)
        if verdict.outcome == "ok" and expect_stats:
            stats = verdict.extra["got"].get("stats", {})
            missing = {k: v for k, v in expect_stats.items() if stats.get(k, 0) < v}
            if missing:
                return Verdict(
                    "silent_wrong", f"scored {expect_score} but stats {stats} count none of {missing}", verdict.extra
                )
        return verdict

    return Case(name, "rewards", kind, about, run, timeout)


LISTED, CONTROL, NEW = "listed", "control", "new"  # the kinds of case (bench_faults.KINDS)
DEEP = "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}"  # 3000 nested braces in a box

# (name, kind, about, completion, gold, expected reward): ``accuracy`` of one completion against its gold (``acc``)
ACCURACY = [
    # commas: lists vs thousands separators
    ("rewards/boxed-1_2-vs-12", LISTED, "\\boxed{1,2} against gold 12", "\\boxed{1,2}", "12", 0),
    ("rewards/boxed-3_5-vs-35", LISTED, "\\boxed{3,5} against gold 35", "\\boxed{3,5}", "35", 0),
    ("rewards/math500-457-boxed-21", LISTED, "MATH-500 line 457 (gold -2,1): \\boxed{-21}", "\\boxed{-21}", "-2,1", 0),
    (
        "rewards/math500-457-boxed-1_-2",
        LISTED,
        "MATH-500 line 457 (gold -2,1): \\boxed{1,-2}",
        "\\boxed{1,-2}",
        "-2,1",
        1,
    ),
    ("rewards/gold-1_0-vs-10", LISTED, "gold 1,0 against \\boxed{10}", "\\boxed{10}", "1,0", 0),
    (
        "rewards/boxed-12_34-vs-1234",
        NEW,
        "a malformed thousands group \\boxed{12,34} against 1234",
        "\\boxed{12,34}",
        "1234",
        0,
    ),
    ("rewards/boxed-1_0-vs-10", NEW, "\\boxed{1,0} against gold 10", "\\boxed{1,0}", "10", 0),
    ("rewards/boxed-35-vs-3_5", NEW, "\\boxed{35} against the list gold 3,5", "\\boxed{35}", "3,5", 0),
    (
        "rewards/answer-is-list",
        NEW,
        "'the answer is 1,-2' (no box) against gold -2,1",
        "So the answer is 1,-2.",
        "-2,1",
        1,
    ),
    ("rewards/boxed--2_1-same-order", CONTROL, "\\boxed{-2,1} against gold -2,1", "\\boxed{-2,1}", "-2,1", 1),
    ("rewards/boxed-3_space-5-vs-3_5", NEW, "\\boxed{3, 5} against gold 3,5", "\\boxed{3, 5}", "3,5", 1),
    (
        "rewards/boxed-1_000-vs-1000",
        CONTROL,
        "a thousands separator \\boxed{1,000} against 1000",
        "\\boxed{1,000}",
        "1000",
        1,
    ),
    ("rewards/hashes-1_234", CONTROL, "GSM8K '#### 1,234' against 1234", "so #### 1,234", "1234", 1),
    (
        "rewards/last-number-1_000",
        CONTROL,
        "the last number '1,000 apples' against gold 1000 (int)",
        "She has 1,000 apples.",
        1000,
        1,
    ),
    ("rewards/tuple-order", CONTROL, "an ordered pair (2,1) against (1,2)", "\\boxed{(2,1)}", "(1,2)", 0),
    ("rewards/decimal-vs-list", CONTROL, "\\boxed{1.2} against the list gold 1,2", "\\boxed{1.2}", "1,2", 0),
    # golds that are no answer
    ("rewards/gold-nan-text", LISTED, "gold 'nan' against \\boxed{nan}", "\\boxed{nan}", "nan", "zero_or_raise"),
    ("rewards/gold-None-text", LISTED, "gold 'None' against \\boxed{None}", "\\boxed{None}", "None", "zero_or_raise"),
    (
        "rewards/gold-nan-float",
        LISTED,
        "gold NaN (a JSON NaN) against \\boxed{nan}",
        "\\boxed{nan}",
        float("nan"),
        "zero_or_raise",
    ),
    ("rewards/gold-None", LISTED, "gold None against \\boxed{None}", "\\boxed{None}", None, "zero_or_raise"),
    (
        "rewards/gold-list-2",
        LISTED,
        "gold [2] (a list) against \\boxed{2}: read as the text '[2]'",
        "\\boxed{2}",
        [2],
        "one_or_raise",
    ),
    ("rewards/gold-null-text", NEW, "gold 'null' against \\boxed{null}", "\\boxed{null}", "null", "zero_or_raise"),
    (
        "rewards/gold-inf-float",
        NEW,
        "gold inf (a float) against \\boxed{inf}",
        "\\boxed{inf}",
        float("inf"),
        "zero_or_raise",
    ),
    ("rewards/gold-empty", NEW, "gold '' against an empty box", "\\boxed{}", "", "zero_or_raise"),
    ("rewards/gold-blank", NEW, "gold '   ' against \\boxed{ }", "\\boxed{ }", "   ", "zero_or_raise"),
    ("rewards/gold-true", NEW, "gold True (a boolean) against \\boxed{True}", "\\boxed{True}", True, "zero_or_raise"),
    ("rewards/gold-dict", NEW, "gold {} (a dict) against \\boxed{\\{\\}}", "\\boxed{\\{\\}}", {}, "zero_or_raise"),
    ("rewards/gold-list-1_2", NEW, "gold [1, 2] (a list) against \\boxed{1,2}", "\\boxed{1,2}", [1, 2], "one_or_raise"),
    (
        "rewards/gold-list-strings",
        NEW,
        "gold ['1', '2'] against \\boxed{1,2}",
        "\\boxed{1,2}",
        ["1", "2"],
        "one_or_raise",
    ),
    ("rewards/gold-set", NEW, "gold {1, 2} (a set) against \\boxed{1,2}", "\\boxed{1,2}", {1, 2}, "one_or_raise"),
    ("rewards/gold-empty-list", NEW, "gold [] against \\boxed{[]}", "\\boxed{[]}", [], "zero_or_raise"),
    # what already worked
    ("rewards/plain-right", CONTROL, "\\boxed{42} against 42", "\\boxed{42}", "42", 1),
    ("rewards/plain-wrong", CONTROL, "\\boxed{41} against 42", "\\boxed{41}", "42", 0),
    ("rewards/hashes-int-gold", CONTROL, "'#### 42' against gold 42 (int)", "#### 42", 42, 1),
    ("rewards/gold-float-27.0", CONTROL, "AMC gold 27.0 (float) against \\boxed{27}", "\\boxed{27}", 27.0, 1),
    ("rewards/gold-aime-0042", CONTROL, "AIME gold '0042' against \\boxed{42}", "\\boxed{42}", "0042", 1),
    ("rewards/frac-vs-decimal", CONTROL, "gold \\frac{1}{2} against \\boxed{0.5}", "\\boxed{0.5}", "\\frac{1}{2}", 1),
    ("rewards/decimal-vs-frac", CONTROL, "gold 0.5 against \\boxed{\\frac12}", "\\boxed{\\frac12}", "0.5", 1),
    (
        "rewards/sqrt",
        CONTROL,
        "gold \\frac{\\sqrt{3}}{2} against \\boxed{\\frac{\\sqrt3}{2}}",
        "\\boxed{\\frac{\\sqrt3}{2}}",
        "\\frac{\\sqrt{3}}{2}",
        1,
    ),
    ("rewards/answer-is-fraction", CONTROL, "'the answer is 3/4' against 3/4", "The answer is 3/4", "3/4", 1),
    ("rewards/scientific", CONTROL, "gold 2.5e-3 against \\boxed{0.0025}", "\\boxed{0.0025}", "2.5e-3", 1),
    (
        "rewards/huge-exponent-wrong",
        CONTROL,
        "\\boxed{1e100000000} against 1 (must not build the number)",
        "\\boxed{1e100000000}",
        "1",
        0,
    ),
    (
        "rewards/huge-exponent-right",
        CONTROL,
        "\\boxed{1e100000000} against the same",
        "\\boxed{1e100000000}",
        "1e100000000",
        1,
    ),
    ("rewards/megabyte-of-digits", CONTROL, "a completion of 1 MB of digits against 7", "9" * 1_000_000, "7", 0),
    (
        "rewards/unterminated-box",
        CONTROL,
        "an unterminated \\boxed{5 against 5: the last number (the documented fallback)",
        "so \\boxed{5",
        "5",
        1,
    ),
    ("rewards/deep-braces", CONTROL, "3000 nested braces in the box against 1", DEEP, "1", 0),
    (
        "rewards/power-tower",
        CONTROL,
        "\\boxed{9^{9^{9^{9^{9}}}}} against 1 (time-limited check)",
        "\\boxed{9^{9^{9^{9^{9}}}}}",
        "1",
        0,
    ),
    ("rewards/nul-bytes", CONTROL, "NUL bytes around \\boxed{5}", "\x00\\boxed{5}\x00", "5", 1),
    ("rewards/empty-completion", CONTROL, "an empty completion against 5", "", "5", 0),
    ("rewards/none-completion", CONTROL, "a None completion against 5", None, "5", 0),
    (
        "rewards/conversational",
        CONTROL,
        "a conversational completion [{'role': 'assistant', ...}]",
        [{"role": "assistant", "content": "\\boxed{7}"}],
        "7",
        1,
    ),
    ("rewards/last-box-counts", CONTROL, "two boxes, the last one right", "\\boxed{1} no, \\boxed{2}", "2", 1),
    ("rewards/set-latex", CONTROL, "gold \\{1,2\\} against \\boxed{\\{2,1\\}}", "\\boxed{\\{2,1\\}}", "\\{1,2\\}", 1),
    ("rewards/interval", CONTROL, "gold [1,2) against \\boxed{(1,2]}", "\\boxed{(1,2]}", "[1,2)", 0),
    ("rewards/boxed-nan-vs-number", CONTROL, "\\boxed{nan} against 5", "\\boxed{nan}", "5", 0),
    # the verifier's worker
]


def reward_cases() -> list[Case]:
    checks = [
        reward_case(
            "rewards/boxed-format",
            CONTROL,
            "boxed_format on a boxed and an unboxed completion",
            {"call": "boxed_format", "completions": ["\\boxed{3}", "3"]},
            [1.0, 0.0],
        ),
        verifier_case(
            "rewards/worker-killed-once",
            LISTED,
            "the check's worker is killed during a right answer's check "
            "(once): it must be retried, not scored 0 as a wrong answer",
            "die_once",
            1.0,
        ),
        verifier_case(
            "rewards/worker-always-dies",
            CONTROL,
            "a worker that dies on every check: 0 and counted as an error",
            "die_always",
            0.0,
            {"errors": 1},
        ),
        verifier_case(
            "rewards/check-hangs",
            CONTROL,
            "a check that never returns: 0 after the time limit, counted",
            "sleep_long",
            0.0,
            {"timeouts": 1},
            verifier_timeout=2.0,
        ),
        verifier_case(
            "rewards/check-raises",
            CONTROL,
            "a check that raises: 0 (a malformed answer), not a crash",
            "raise_always",
            0.0,
        ),
    ]
    return [
        *(acc(*row) for row in ACCURACY),
        *checks,
        reward_case(
            "rewards/right-answers-under-load",
            "round3",
            "\\frac{1}{2} against gold 0.5, each by a fresh "
            "worker, on a machine loaded with 8 busy processes, a 1 s limit (the check itself takes ~10 ms): "
            "math-verify's first use inside the limit scored right answers 0",
            {"call": "fresh_verifiers", "pairs": [("\\frac{1}{2}", "0.5")] * 4, "load": 8, "timeout": 1.0},
            [1.0] * 4,
            timeout=240,
        ),
        verifier_case(
            "rewards/worker-killed-while-starting",
            "round3",
            "the check's worker is killed while it starts "
            "(once): the run crashed with 'did not start within 120 s; its error is printed above'",
            None,
            1.0,
            check_path="bench_faults_start:answers",
        ),
    ]
