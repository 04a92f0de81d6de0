"""Scoring sampled completions against gold answers: decode, extract the final answer, verify. The one path used
by training's held-out evaluation, ``scripts/evaluate.py`` and teacher traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gkv_train.rewards.extract import extract_answer
from gkv_train.rewards.verify import MathVerifier


@dataclass(frozen=True)
class Grade:
    """One completion's text, extracted answer (None: none found), verdict, whether the check timed out, and
    whether it ended in an error (its worker died twice: no verdict); in both cases ``correct`` is False."""

    text: str
    answer: str | None
    correct: bool
    timed_out: bool
    error: bool


def grade_completions(
    tokenizer, completion_ids: Sequence[Sequence[int]], golds: Sequence[str], verify: MathVerifier
) -> list[Grade]:
    """Grade token-id completions (special tokens dropped when decoding) against ``golds``, one per completion."""
    if len(golds) != len(completion_ids):
        raise ValueError(f"{len(golds)} gold answers for {len(completion_ids)} completions")
    grades = []
    for text, gold in zip(tokenizer.batch_decode(completion_ids, skip_special_tokens=True), golds):
        answer = extract_answer(text)
        verdict = verify.judge(answer, gold)
        grades.append(Grade(text, answer, verdict.correct, verdict.timed_out, verdict.error))
    return grades
