"""Scoring sampled completions against gold answers: decode, extract the final answer, verify. The one path used
by training's held-out evaluation, ``scripts/evaluate.py`` and teacher traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from gkv_rewards.extract import copies_in_order, extract_answer
from gkv_rewards.verify import MathVerifier


@dataclass(frozen=True)
class Grade:
    """One completion's text, extracted answer (None: none found), verdict, whether the check timed out, and
    whether it ended in an error (its worker died twice: no verdict); in both cases ``correct`` is False.
    ``copied``: the completion reproduces what its problem requires (``copies_in_order``); when not, ``correct``
    is False whatever the answer."""

    text: str
    answer: str | None
    correct: bool
    timed_out: bool
    error: bool
    copied: bool = True


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
        answer = extract_answer(text)
        verdict = verify.judge(answer, gold)
        copied = copies_in_order(text, needed)
        grades.append(Grade(text, answer, verdict.correct and copied, verdict.timed_out, verdict.error, copied))
    return grades


def required_column(problems, samples: int) -> list[str | None] | None:
    """A problem set's ``required`` column repeated per sample (None when it has none)."""
    if "required" not in problems.column_names:
        return None
    return [needed for needed in problems["required"] for _ in range(samples)]
