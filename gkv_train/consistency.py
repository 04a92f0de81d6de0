"""Does training see what inference saw? Compare trainer log-probs under a record with the rollout's own."""

from __future__ import annotations

import torch

from gkv_train.logprobs import token_logprobs


def logprob_mismatch(model, out, record, temperature: float = 1.0) -> float:
    """Max |trainer - rollout| log-prob over the real completion tokens of a rollout ``out``
    (``rollout.engine.RolloutOutput``) when the trainer attends under ``record`` (None: plain causal)."""
    with torch.no_grad():
        trainer = token_logprobs(
            model, out.sequences, out.attention_mask, out.num_completion_tokens, record, temperature=temperature
        )
    return (trainer - out.logprobs)[out.completion_mask.bool()].abs().max().item()


def consistency_report(model, out, temperature: float = 1.0) -> dict:
    """The rollout's record against two controls that must fail: a plain causal mask, and the per-layer masks
    rotated by one layer (None for ``full``, which has no record)."""
    report = {
        "max_abs_logprob_diff": logprob_mismatch(model, out, out.record, temperature),
        "causal_mask_diff": logprob_mismatch(model, out, None, temperature),
        "rotated_layers_diff": None,
    }
    if out.record is not None:
        report["rotated_layers_diff"] = logprob_mismatch(model, out, rotate_layers(out.record), temperature)
    return report


def rotate_layers(record):
    """The record with each layer's part moved to the next layer: a control that must not reproduce a rollout."""
    return record.roll(1, dims=1) if isinstance(record, torch.Tensor) else record.roll_layers(1)
