"""Scoring sampled completions against gold answers: decode, extract the final answer, verify. The one path used
by training's held-out evaluation, ``scripts/evaluate.py`` and teacher traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gkv_rewards.extract import copied, extract_answer
from gkv_rewards.verify import MathVerifier


@dataclass(frozen=True)
class Grade:
    """One completion's text, extracted answer (None: none found), verdict, whether the check timed out, and
    whether it ended in an error (its worker died twice: no verdict); in both cases ``correct`` is False.
    ``copied``: the completion reproduces what its problem requires (``copied``); when not, ``correct`` is False
    whatever the answer. ``share``: the share of the required lines it copied in order (1.0 when none are
    required); ``score``: that share when the answer is right, else 0 (``gkv_rewards.functions.copy_score``)."""

    text: str
    answer: str | None
    correct: bool
    timed_out: bool
    error: bool
    copied: bool = True
    share: float = 1.0
    score: float = 0.0


def grade_completions(
    tokenizer,
    completion_ids: Sequence[Sequence[int]],
    golds: Sequence[str],
    verify: MathVerifier,
    required: Sequence[str | None] | None = None,
) -> list[Grade]:
    """Grade token-id completions (special tokens dropped when decoding) against ``golds``, one per completion;
    ``required`` (one per completion, a dataset's ``required`` column): what each must also reproduce."""
    if len(golds) != len(completion_ids):
        raise ValueError(f"{len(golds)} gold answers for {len(completion_ids)} completions")
    required = [None] * len(golds) if required is None else required
    grades = []
    for text, gold, needed in zip(tokenizer.batch_decode(completion_ids, skip_special_tokens=True), golds, required):
        copy = copied(text, needed)
        answer = extract_answer(copy.rest)
        verdict = verify.judge(answer, gold)
        grades.append(
            Grade(
                text,
                answer,
                verdict.correct and copy.ok,
                verdict.timed_out,
                verdict.error,
                copy.ok,
                copy.share,
                copy.share * verdict.correct,
            )
        )
    return grades


def required_column(problems, samples: int) -> list[str | None] | None:
    """A problem set's ``required`` column repeated per sample (None when it has none)."""
    if "required" not in problems.column_names:
        return None
    return [needed for needed in problems["required"] for _ in range(samples)]
