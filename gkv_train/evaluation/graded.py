"""Generate and grade: the one loop that held-out evaluation (``gkv_train.training.launch``), ``scripts/evaluate.py``
(``gkv_train.evaluation.evaluate``) and teacher traces (``gkv_train.evaluation.traces``) share."""

from __future__ import annotations

from dataclasses import dataclass

from gkv_rewards.grading import Grade, grade_completions, required_column
from gkv_rewards.verify import MathVerifier
from gkv_rollout.config import SamplingConfig
from gkv_rollout.engine import RolloutEngine, RolloutOutput


@dataclass
class GradedRollout:
    """A rollout and its grades; rows are problems repeated ``num_samples`` times, in order.

    out: the rollout; golds: the gold answer of each row; grades: each row's ``Grade`` (correct, the extracted
    answer, the decoded text, whether the check timed out or failed, whether the required text was copied)."""

    out: RolloutOutput
    golds: list[str]
    grades: list[Grade]


def generate_and_grade(
    engine: RolloutEngine, tokenizer, problems, prompts: list[str], sampling: SamplingConfig, verify: MathVerifier
) -> GradedRollout:
    """Sample ``sampling.num_samples`` completions of each prompt (one per problem of ``problems``, a dataset
    with ``answer`` and optionally ``required`` and ``continuation`` columns) and grade each against its problem's
    answer. A ``continuation`` is the text every completion of its problem begins with, fed as if sampled
    (``RolloutEngine.generate(prefixes=...)``); the completion graded holds it."""
    prefixes = None
    if "continuation" in problems.column_names:
        prefixes = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in problems["continuation"]]
    out = engine.generate(prompts, sampling, prefixes=prefixes)
    n = sampling.num_samples
    golds = [gold for gold in problems["answer"] for _ in range(n)]
    grades = grade_completions(tokenizer, out.completions(), golds, verify, required_column(problems, n))
    return GradedRollout(out, golds, grades)
