import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gkv_rewards import functions
from gkv_rewards.extract import drop_thousands_separators, extract_answer, gold_answer, last_boxed, last_number
from gkv_rewards.functions import accuracy, boxed_format, verifier_stats
from gkv_rewards.grading import grade_completions
from gkv_rewards.verify import MathVerifier, Verdict, as_number, numbers_equal
from gkv_train.problems.data import DataConfig, load_problems

# Completions with known verdicts against their gold; "defect": the case failed before commas were read as list
# separators outside well-formed numbers and golds that are no answer were refused (45bc814).
ROOT = Path(__file__).resolve().parents[1]
CASES = [json.loads(line) for line in open(Path(__file__).parent / "fixtures" / "grading_cases.jsonl")]
GRADED = [c for c in CASES if "correct" in c]
REJECTED = [c for c in CASES if c.get("rejected")]


def test_extraction_order_and_nesting():
    assert last_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert extract_answer(r"It is 3, finally \boxed{7}.") == "7"
    assert extract_answer("Steps...\n#### 1,234") == "1234"
    assert extract_answer("So the answer is 42.") == "42"
    assert extract_answer("We get 3 apples and then 5 pears.") == "5"
    assert extract_answer("no digits here") is None
    assert extract_answer("the answer is 1,2") == "1,2" and extract_answer("#### 1,2") == "1,2"
    assert last_number("so x = 1,-2, done") == "1,-2" and last_number("it costs $12,345,678.") == "12345678"
    assert last_number("between 3 and 5, then 7") == "7"


@pytest.mark.parametrize(
    "text, kept",
    [
        ("1,000", "1000"),
        ("12,345,678", "12345678"),
        ("-1,234.5", "-1234.5"),
        ("$1,000", "$1000"),
        ("1,2", "1,2"),
        ("1,0", "1,0"),
        ("3,5", "3,5"),
        ("12,34", "12,34"),
        ("1,000,2", "1,000,2"),
        ("1,0000", "1,0000"),
        ("0.1,234", "0.1,234"),
        ("(1,000, 2)", "(1000, 2)"),
    ],
)
def test_thousands_separators_only_in_well_formed_numbers(text, kept):
    assert drop_thousands_separators(text) == kept
    assert (as_number(text) is None) == ("," in kept or "(" in kept)


@pytest.fixture(scope="module")
def verifier():
    verify = MathVerifier(timeout=30)
    yield verify
    verify.close()


@pytest.mark.parametrize("case", GRADED, ids=[f"{i}-{c['note']}" for i, c in enumerate(GRADED)])
def test_grading_corpus(case, verifier):
    """Each completion, through extraction and the worker, gets its verdict against its gold, in time."""
    timeouts = verifier.stats["timeouts"]
    assert verifier(extract_answer(case["completion"]), case["gold"]) is case["correct"]
    assert verifier.stats["timeouts"] == timeouts


@pytest.mark.parametrize("case", REJECTED, ids=[f"{i}-{c['note']}" for i, c in enumerate(REJECTED)])
def test_golds_that_are_no_answer_are_refused(case, verifier, tmp_path):
    """A gold that is null, NaN, empty, a missing value written as text, or not a string or a number is refused
    by the verifier and, at load, with the file and line of its record."""
    with pytest.raises(ValueError, match="gold answer"):
        gold_answer(case["gold"])
    with pytest.raises(ValueError, match="gold answer"):
        verifier(extract_answer(case["completion"]), case["gold"])
    path = tmp_path / "golds.jsonl"
    records = [{"question": "q1", "answer": "2"}, {"question": "q2", "answer": case["gold"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: ")):
        load_problems(DataConfig(path=str(path), name=None, limit=None))


def test_gold_answers_of_each_dataset():
    assert gold_answer("She pays 2 * 3 = 6 dollars.\n#### 18") == "18"  # GSM8K
    assert gold_answer(27.0) == "27"  # AMC floats
    assert gold_answer("025") == "025" and numbers_equal(as_number("025"), as_number("25"))  # AIME zero-padded
    assert gold_answer(r"\frac{14}{3}") == r"\frac{14}{3}"  # MATH-500 LaTeX


@pytest.mark.parametrize(
    "a, b, equal",
    [
        ("0.5", "1/2", True),
        ("1e5", "100000", True),
        ("2.5e-3", "1/400", True),
        ("-3/4", "-0.75", True),
        ("1e100000000", "10e99999999", True),
        ("1e100000000", "5", False),
        ("0", "0.0e7", True),
        ("-1", "1", False),
        ("1e-100000000", "0", False),
        ("$1,000", "1000", True),
        ("20%", "20", True),
    ],
)
def test_exact_numbers_with_any_exponent_are_instant(a, b, equal):
    start = time.perf_counter()
    assert numbers_equal(as_number(a), as_number(b)) is equal
    assert time.perf_counter() - start < 0.5
    assert as_number("1/0") is None and as_number("x") is None and as_number("1e" + "9" * 5000) is None


def test_verifier_numbers_and_latex():
    verify = MathVerifier(timeout=30)
    try:
        assert verify("18", "#### 18") and verify("18.0", 18.0) and verify("25", "025") and verify("$1,000", "1000")
        assert not verify("17", "18") and not verify(None, "18")
        assert verify(r"\frac{14}{3}", r"\frac{14}{3}")
        assert verify(r"\dfrac{1}{2}", "0.5")
        assert not verify(r"\frac{1}{3}", "0.5")
        assert verify.stats == {"checks": 9, "timeouts": 0, "errors": 0, "retries": 0, "malformed": 0}
    finally:
        verify.close()


def _hang(gold, pred):
    time.sleep(60)
    return True


def test_verifier_timeout_really_stops_and_counts():
    verify = MathVerifier(timeout=1.0, check="test_rewards:_hang")
    verify("warm", "up")  # the first check also starts the worker
    start = time.perf_counter()
    assert verify("x+1", "y") is False
    assert time.perf_counter() - start < 20
    assert verify.stats["timeouts"] == 2
    verify.close()


def test_a_check_that_overruns_once_is_retried_on_a_fresh_worker(tmp_path, monkeypatch):
    """An overrun is first retried (a busy moment must not score a right answer 0); only a second one is a
    timeout."""
    monkeypatch.setenv("HANG_ONCE", str(tmp_path / "hung"))
    verify = MathVerifier(timeout=1.0, check="verifier_probe:answers_or_die")
    try:
        assert verify.judge("5", "5") == Verdict(True)
        assert (tmp_path / "hung").exists() and verify.stats["retries"] == 1 and verify.stats["timeouts"] == 0
    finally:
        verify.close()


@pytest.mark.parametrize(
    "check, correct", [("verifier_warm:slow_first_use", True), ("verifier_probe:slow_first_use", False)]
)
def test_first_use_costs_are_paid_before_the_time_limit(monkeypatch, check, correct):
    """A check module's ``warm_up`` runs before the worker is ready, so a first-use cost longer than the limit (here
    2 s against 1 s) never turns a right answer into a timeout; the control, the same check without ``warm_up``,
    times out on both tries."""
    monkeypatch.setenv("SLOW_FIRST_USE", "2")
    verify = MathVerifier(timeout=1.0, check=check)
    try:
        assert verify.judge("0.5", r"\frac{1}{2}") == Verdict(correct, timed_out=not correct)
    finally:
        verify.close()


@pytest.mark.parametrize("check, correct", [(None, True), ("verifier_probe:answers_or_die", False)])
def test_right_answers_score_1_on_a_loaded_machine(check, correct):
    """The real check on a loaded machine (eight busy processes on this machine's cores): every fresh worker gets a
    right LaTeX answer right within a tight limit (0.5 s; warm, the check takes ~0.01 s). The control, the same
    comparison in a module without ``warm_up``, pays math-verify's first parse inside the limit and times out."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(8)]
    try:
        for _ in range(2 if correct else 1):
            verify = MathVerifier(timeout=0.5, **({"check": check} if check else {}))
            try:
                assert verify.judge(r"\frac{1}{2}", "0.5") == Verdict(correct, timed_out=not correct)
            finally:
                verify.close()
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.mark.parametrize("times, starts", [(1, True), (2, False)])
def test_a_worker_that_dies_while_starting_is_started_again(tmp_path, monkeypatch, times, starts):
    """Killed once while starting: started again and the check answered; killed twice: an error that says how it
    ended (not "did not start within 120 s")."""
    monkeypatch.setenv("DIE_AT_START", f"{tmp_path / 'died'}:{times}")
    verify = MathVerifier(timeout=30, check="verifier_probe:answers_or_die")
    try:
        if starts:
            assert verify.judge("5", "5") == Verdict(True) and verify.stats["retries"] == 1
        else:
            with pytest.raises(RuntimeError, match="killed by signal 9 while starting, twice"):
                verify.judge("5", "5")
    finally:
        verify.close()


def test_reward_callables():
    completions = [r"... \boxed{6}", "#### 5", [{"role": "assistant", "content": "the answer is 6"}]]
    assert accuracy(completions=completions, answer=["6", "6", "6"]) == [1.0, 0.0, 1.0]
    assert boxed_format(completions=completions) == [1.0, 0.0, 0.0]


class _Texts:
    """A tokenizer stand-in whose completions decode to the given texts."""

    def __init__(self, texts):
        self.texts = texts

    def batch_decode(self, ids, skip_special_tokens):
        return [self.texts[i] for (i,) in ids]


def test_a_died_worker_is_restarted_and_the_check_retried_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DIE_ONCE", str(tmp_path / "died"))
    verify = MathVerifier(timeout=30, check="verifier_probe:answers_or_die")
    try:
        assert verify.judge("1,-2", "-2,1") == Verdict(True)  # killed once, then answered
        assert (tmp_path / "died").exists() and verify.stats["retries"] == 1 and verify.stats["errors"] == 0
        assert verify.judge("raise", "5") == Verdict(False) and verify.stats["malformed"] == 1  # a wrong answer
    finally:
        verify.close()


def test_a_check_whose_worker_dies_twice_is_an_error_not_a_wrong_answer(monkeypatch):
    """In grading (evaluation, traces) and in the training reward, whose stats the metrics log."""
    verify = MathVerifier(timeout=30, check="verifier_probe:answers_or_die")
    try:
        texts = [r"\boxed{die}", r"\boxed{5}", r"\boxed{4}"]
        grades = grade_completions(_Texts(texts), [[0], [1], [2]], ["5", "5", "5"], verify)
        assert [(g.correct, g.timed_out, g.error) for g in grades] == [
            (False, False, True),
            (True, False, False),
            (False, False, False),
        ]
        assert verify.stats == {"checks": 3, "timeouts": 0, "errors": 1, "retries": 1, "malformed": 0}
        monkeypatch.setattr(functions, "_VERIFIER", verify)
        assert accuracy(completions=texts, answer=["5", "5", "5"]) == [0.0, 1.0, 0.0]
        assert verifier_stats()["errors"] == 2
    finally:
        verify.close()


@pytest.mark.parametrize("check, failures", [(None, 0), ("verifier_probe:always_equal", None)])
def test_sweep_golds_script_on_a_subset(tmp_path, check, failures):
    """scripts/sweep_golds.py as a script: its JSON line (also in --output, with command, date and commit) counts
    golds, self-matches, rewritings and perturbations; a check that takes everything for right (the control) fails
    every perturbation, each listed with its line, and the script exits with 1."""
    out = tmp_path / "sweep.json"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "sweep_golds.py"),
        "--datasets",
        "math500",
        "aime24",
        "--limit",
        "3",
        "--output",
        str(out),
        *(["--check", check] if check else []),
    ]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads(out.read_text()) and "--limit 3" in result["command"] and result["date"]
    assert result["commit"] is not None
    math500 = result["datasets"]["math500"]
    assert math500["golds"] == 3 and math500["self_match"] == 3 and result["datasets"]["aime24"]["golds"] == 3
    assert {"boxed", "dfrac"} <= set(math500["rewritings"])
    assert {"tuple_reversed", "plus_one"} <= set(math500["perturbed"])
    if failures == 0:
        assert proc.returncode == 0 and result["failures"] == 0
        assert all(t["matched"] == t["tried"] for t in math500["rewritings"].values())
        assert all(t["rejected"] == t["tried"] for t in math500["perturbed"].values())
    else:
        perturbed = sum(t["tried"] for d in result["datasets"].values() for t in d["perturbed"].values())
        assert proc.returncode == 1 and result["failures"] == perturbed > 0
        assert {f["line"] for f in math500["failures"]} == {1, 2, 3}
        assert all(f["expected"] is False and f["got"] is True for f in math500["failures"])


def test_required_sentences_must_be_copied_in_order():
    from gkv_rewards.extract import copies_in_order
    from gkv_rewards.functions import accuracy, copy_score

    required = "Then Ava goes to the zoo.\nAt the end of the day, Ava still has"
    good = "Ava has 41 cards. Then Ava  goes to the zoo.\n At the end of the day, Ava still has 41 cards."
    assert copies_in_order(good, required) and copies_in_order("anything", None) and copies_in_order("x", "")
    assert not copies_in_order("At the end of the day, Ava still has 41. Then Ava goes to the zoo.", required)
    assert not copies_in_order("\\boxed{41}", required)  # the answer without the work: the shortcut
    assert accuracy(
        completions=[good, "\\boxed{41}", good], answer=["41", "41", "42"], required=[required, required, required]
    ) == [1.0, 0.0, 0.0]
    assert accuracy(completions=["\\boxed{41}"], answer=["41"]) == [1.0]  # no required column: answer only
    # a column that does not give one value per completion is an error, not fewer rewards than completions
    for reward in (accuracy, copy_score):
        with pytest.raises(ValueError, match="2 completions, 1 answers and 1 required entries"):
            reward(completions=[good, good], answer=["41"], required=[required])
        with pytest.raises(TypeError, match=r"required is 5 \(int\)"):
            reward(completions=[good], answer=["41"], required=[5])
        with pytest.raises(ValueError, match="required asks for 'at least 0 of:' of 1 lines"):
            reward(completions=["\\boxed{41}"], answer=["41"], required=["at least 0 of:\nThen Ava goes"])


def _most_in_order_by_search(flat: str, wanted: list[str]) -> tuple[int, int]:
    """The reference for ``most_in_order``: every subsequence of ``wanted`` tried, each placed at its earliest
    occurrences (the most lines, then the earliest end)."""
    import itertools

    best = (0, 0)
    for size in range(1, len(wanted) + 1):
        for chosen in itertools.combinations(wanted, size):
            at = 0
            for line in chosen:
                found = flat.find(line, at)
                if found < 0:
                    break
                at = found + len(line)
            else:
                if size > best[0] or (size == best[0] and at < best[1]):
                    best = (size, at)
    return best


def test_most_in_order_matches_an_exhaustive_search_and_is_fast():
    """The "at least K of:" chains: the most lines in order and their earliest end equal an exhaustive search on
    random small cases (repeats, overlaps, missing lines); 2,000 required lines against a long text take well under
    the answer check's time limit (before: 800 lines 86 s, 2,000 over 300 s)."""
    import random
    import time

    from gkv_rewards.extract import copied, most_in_order

    rng = random.Random(0)
    for _ in range(300):
        flat = "".join(rng.choice("abc ") for _ in range(rng.randint(0, 14)))
        wanted = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 2))) for _ in range(rng.randint(1, 6))]
        assert most_in_order(flat, wanted) == _most_in_order_by_search(flat, wanted), (flat, wanted)
    lines = [f"Then Ava goes to place {i}." for i in range(2000)]
    text = " ".join(lines[::2] + lines[1::2])  # every other line in order, then the rest: a long search
    start = time.perf_counter()
    copy = copied(text + " 41", "\n".join(["at least 1500 of:", *lines]))
    assert time.perf_counter() - start < 20
    assert (copy.found, copy.needed, copy.ok) == (1001, 1500, False)


def test_each_line_asks_for_whole_lines_in_order_and_staged_score_never_pays_for_less():
    """``each line:``: every required line a whole line of the text, in order, other lines allowed between; the
    answer read after the last. ``staged_score``: half for the share written, half for the right answer after all
    of it, so stopping early to answer scores below finishing and answering wrong."""
    from gkv_rewards.extract import copied
    from gkv_rewards.functions import accuracy, staged_score

    required = "each line:\n1\n2\n3\n4"
    assert copied("Note: 7.\n1\n2\n 3 \nCode: 9\n4\nCode: 9", required).found == 4  # the code restated between
    assert copied("1\n2\n4\n3\n", required).found == 3  # 4 before 3: three in order
    assert copied("12\n3\n4", required).found == 0  # "12" is not the line "1"
    assert copied("1 2 3 4", required).found == 0  # one line is not four
    texts = ["1\n2\n3\n4\nCode: 9", "1\n2\nCode: 9", "1\n2\n3\n4\nCode: 8", "Code: 9", "1\n2\n3\n4\nCode: 9\n5"]
    scores = staged_score(completions=texts, answer=["9"] * 5, required=[required] * 5)
    assert scores == [1.0, 0.25, 0.5, 0.0, 0.5]  # the last: a number after the code is the answer read
    assert accuracy(completions=texts, answer=["9"] * 5, required=[required] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 completions, 1 answers"):
        staged_score(completions=texts[:2], answer=["9"], required=[required])
