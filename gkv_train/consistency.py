"""Does training see what inference saw? Compare trainer log-probs under a record with the rollout's own."""

from __future__ import annotations

import torch

from gkv_train.logprobs import token_logprobs


def logprob_mismatch(model, out, record, temperature: float = 1.0, backend: str = "auto") -> dict[str, float]:
    """``mismatch_stats`` of the trainer's log-probs against a rollout ``out``'s (``rollout.engine.RolloutOutput``)
    over its real completion tokens, the trainer attending under ``record`` (None: plain causal) with the mask
    ``backend`` (auto, sdpa, flex)."""
    with torch.no_grad():
        trainer = token_logprobs(
            model, out.sequences, out.attention_mask, out.num_completion_tokens, record, temperature=temperature,
            backend=backend,
        )
    return mismatch_stats(trainer, out.logprobs, out.completion_mask)


def consistency_report(model, out, temperature: float = 1.0, backend: str = "auto") -> dict:
    """The rollout's record (max and mean |diff|, KL) against two controls that must fail: a plain causal mask,
    and the per-layer masks rotated by one layer (None for ``full``, which has no record)."""
    own = logprob_mismatch(model, out, out.record, temperature, backend)
    report = {
        "max_abs_logprob_diff": own["max_abs"],
        "mean_abs_logprob_diff": own["mean_abs"],
        "kl": own["kl"],
        "causal_mask_diff": logprob_mismatch(model, out, None, temperature, backend)["max_abs"],
        "rotated_layers_diff": None,
    }
    if out.record is not None:
        rotated = logprob_mismatch(model, out, out.record.roll_layers(1), temperature, backend)
        report["rotated_layers_diff"] = rotated["max_abs"]
    return report


def mismatch_stats(trainer_logps, rollout_logps, mask) -> dict[str, float]:
    """Rollout vs trainer log-probs over the completion tokens: mean and max |diff|, and KL(rollout || trainer)
    estimated from the rollout's own samples with the non-negative k3 estimator exp(d) - d - 1, d = t - r."""
    mask = mask.bool()
    d = (trainer_logps - rollout_logps)[mask].double()  # float64: the k3 terms cancel to ~1e-12
    if d.numel() == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0, "kl": 0.0}
    return {"mean_abs": d.abs().mean().item(), "max_abs": d.abs().max().item(), "kl": (d.exp() - d - 1).mean().item()}
