"""Reward functions for TRL trainers: plain callables ``f(prompts, completions, **columns) -> list[float]``.

A recipe names them by import path (``gkv_rewards.functions.accuracy``), so users can add their own the same way.
Dataset columns arrive as keyword lists (``answer`` here).
"""

from __future__ import annotations

import re

from gkv_rewards.extract import copies_in_order, extract_answer
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
    ``required`` column, the completion reproduces it: ``copies_in_order``), else 0.0 (also for a check that
    timed out or ended in an error: both are counted in ``verifier_stats``)."""
    required = [None] * len(answer) if required is None else required
    texts = [completion_text(c) for c in completions]
    return [float(copies_in_order(text, needed) and _VERIFIER(extract_answer(text), gold))
            for text, gold, needed in zip(texts, answer, required)]  # fmt: skip


def boxed_format(prompts=None, completions=(), **_) -> list[float]:
    """1.0 when the completion puts its final answer in ``\\boxed{}``, else 0.0 (an optional format reward)."""
    return [float(bool(_BOXED_ONCE.search(completion_text(c)))) for c in completions]


def verifier_stats() -> dict:
    """The shared verifier's ``stats`` since start-up (checks, timeouts, errors, retries, malformed; for the
    logs)."""
    return dict(_VERIFIER.stats)
