import time

import pytest

from gkv_train.rewards.extract import extract_answer, gold_answer, last_boxed
from gkv_train.rewards.functions import accuracy, boxed_format
from gkv_train.rewards.verify import MathVerifier, as_number, numbers_equal


def test_extraction_order_and_nesting():
    assert last_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert extract_answer(r"It is 3, finally \boxed{7}.") == "7"
    assert extract_answer("Steps...\n#### 1,234") == "1234"
    assert extract_answer("So the answer is 42.") == "42"
    assert extract_answer("We get 3 apples and then 5 pears.") == "5"
    assert extract_answer("no digits here") is None


def test_gold_answers_of_each_dataset():
    assert gold_answer("She pays 2 * 3 = 6 dollars.\n#### 18") == "18"  # GSM8K
    assert gold_answer(27.0) == "27"  # AMC floats
    assert gold_answer("025") == "025" and numbers_equal(as_number("025"), as_number("25"))  # AIME zero-padded
    assert gold_answer(r"\frac{14}{3}") == r"\frac{14}{3}"  # MATH-500 LaTeX


@pytest.mark.parametrize(
    "a, b, equal",
    [("0.5", "1/2", True), ("1e5", "100000", True), ("2.5e-3", "1/400", True), ("-3/4", "-0.75", True),
     ("1e100000000", "10e99999999", True), ("1e100000000", "5", False), ("0", "0.0e7", True), ("-1", "1", False),
     ("1e-100000000", "0", False), ("$1,000", "1000", True), ("20%", "20", True)],
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
        assert verify.stats == {"checks": 9, "timeouts": 0, "errors": 0}
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


def test_reward_callables():
    completions = [r"... \boxed{6}", "#### 5", [{"role": "assistant", "content": "the answer is 6"}]]
    assert accuracy(completions=completions, answer=["6", "6", "6"]) == [1.0, 0.0, 1.0]
    assert boxed_format(completions=completions) == [1.0, 0.0, 0.0]
