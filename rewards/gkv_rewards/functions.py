"""Reward functions for TRL trainers: plain callables ``f(prompts, completions, **columns) -> list[float]``.

A recipe names them by import path (``gkv_rewards.functions.accuracy``), so users can add their own the same way.
Dataset columns arrive as keyword lists (``answer`` here).
"""

from __future__ import annotations

import re

from gkv_rewards.extract import copied, extract_answer
from gkv_rewards.verify import MathVerifier

_VERIFIER = MathVerifier()
_BOXED_ONCE = re.compile(r"\\boxed\{.+\}", re.DOTALL)


def completion_text(completion) -> str:
    """A completion as text, whether plain or conversational ([{'role': 'assistant', 'content': ...}])."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def accuracy(prompts=None, completions=(), answer=(), required=None, **_) -> list[float]:
    """1.0 when the completion's final answer equals the gold ``answer`` column (and, where the data has a
    ``required`` column, the completion reproduces it: ``gkv_rewards.extract.copied``), else 0.0 (also for a check
    that timed out or ended in an error: both are counted in ``verifier_stats``)."""
    return [
        float(copy.ok and _VERIFIER(extract_answer(copy.rest), gold))
        for copy, gold in _copies(completions, answer, required)
    ]


def copy_score(prompts=None, completions=(), answer=(), required=None, **_) -> list[float]:
    """The share of the ``required`` lines the completion copied in order when its final answer (read after them)
    equals the gold ``answer``, else 0.0; ``accuracy`` for data without a ``required`` column. A graded form of
    ``accuracy`` for copy tasks: every line copied counts, so a policy cannot raise it by copying less (the
    training reward of ``copy_recall`` with ``data.copy_required=places``)."""
    return [
        copy.share * _VERIFIER(extract_answer(copy.rest), gold) if copy.found or not copy.lines else 0.0
        for copy, gold in _copies(completions, answer, required)
    ]


def staged_score(prompts=None, completions=(), answer=(), required=None, **_) -> list[float]:
    """Half for the work, half for the answer after it: 0.5 x the share of the ``required`` lines written in order
    (``gkv_rewards.extract.copied``), plus 0.5 when every one was written and the final answer, read after them,
    equals the gold ``answer``. Writing less never pays: stopping the work early to answer sooner (while the fact
    it needs is still at hand) scores below finishing it and answering wrong (the training reward of
    ``count_recall``). ``accuracy`` is the pass/fail form (1.0 exactly when this is 1.0)."""
    return [
        0.5 * copy.share + 0.5 * float(copy.ok and _VERIFIER(extract_answer(copy.rest), gold))
        for copy, gold in _copies(completions, answer, required)
    ]


def _copies(completions, answer, required):
    """(what each completion copied, its gold answer); ValueError when the columns do not give one value per
    completion (TRL repeats a problem's columns for each of its completions): a shorter column would drop
    completions from the rewards."""
    completions, answer = list(completions), list(answer)
    required = [None] * len(answer) if required is None else list(required)
    if not len(completions) == len(answer) == len(required):
        raise ValueError(
            f"{len(completions)} completions, {len(answer)} answers and {len(required)} required entries: one of "
            "each per completion"
        )
    return [(copied(completion_text(c), needed), gold) for c, gold, needed in zip(completions, answer, required)]


def boxed_format(prompts=None, completions=(), **_) -> list[float]:
    """1.0 when the completion puts its final answer in ``\\boxed{}``, else 0.0 (an optional format reward)."""
    return [float(bool(_BOXED_ONCE.search(completion_text(c)))) for c in completions]


def verifier_stats() -> dict:
    """The shared verifier's ``stats`` since start-up (checks, timeouts, errors, retries, malformed; for the
    logs)."""
    return dict(_VERIFIER.stats)
