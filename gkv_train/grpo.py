"""GRPO under a compressed KV cache: TRL's ``GRPOTrainer`` with our rollout engine and record masks.

What the subclass changes (TRL 1.16, pinned):

* Generation goes through ``RolloutEngine`` (``rollout_func``), with the recipe's compression.
* The record of each rollout joins the batch (``evict_at``, or ``s4r_*`` tensors for S4R; leading batch
  dimension), so TRL's shuffling and splitting carry it; every log-prob the trainer computes (old policy, reference, current) runs
  under the record's masks. The masks reach the attention through a forward pre-hook that adds
  ``kv_context`` (and the logical ``position_ids`` the rollout used) to the model's keyword arguments.
* Advantages of completions that hit the length limit are clamped to >= 0 (``overlong_advantage_clip``).
* Optional truncated importance sampling between rollout and trainer log-probs (``rollout_is``), applied by
  scaling the per-token advantages, which equals TRL's multiplication of the per-token loss for the
  ratio-times-advantage losses (grpo, dapo, dr_grpo, bnpo, cispo, sapo).
* Every step logs the rollout-trainer log-prob mismatch (mean / max abs diff, KL), retention and tokens/s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from trl import GRPOTrainer

from gkv_train.attention import use_kv_attention
from gkv_train.masks import attention_context
from gkv_train.record import logical_positions
from gkv_train.s4r import S4RRecord
from rollout.config import CompressionConfig, SamplingConfig
from rollout.engine import RolloutEngine

IS_MODES = ("token_truncate", "sequence_truncate")
RATIO_LOSSES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo")


@dataclass(frozen=True)
class SparseRLOptions:
    """What RL-Sparse adds to TRL's GRPO options.

    compression: the rollout's cache compression (``full`` for RL-Full).
    train_with_record: attend under the rollout's record in every trainer forward (False drops the masks: a
        control that must show a large mismatch).
    overlong_advantage_clip: clamp the advantage of completions that hit ``max_completion_length`` to >= 0.
    rollout_is: ``token_truncate`` or ``sequence_truncate`` importance sampling between rollout and trainer
        log-probs, ratio capped at ``rollout_is_cap``; None disables it.
    mask_backend: ``auto`` (FlexAttention on CUDA, SDPA elsewhere), ``sdpa`` or ``flex``.
    """

    compression: CompressionConfig = field(default_factory=lambda: CompressionConfig("gkv"))
    train_with_record: bool = True
    overlong_advantage_clip: bool = True
    rollout_is: str | None = None
    rollout_is_cap: float = 2.0
    mask_backend: str = "auto"

    def __post_init__(self):
        if self.rollout_is is not None and self.rollout_is not in IS_MODES:
            raise ValueError(f"unknown rollout_is mode {self.rollout_is!r}; choose one of {IS_MODES} or null")
        if self.rollout_is_cap <= 0:
            raise ValueError(f"rollout_is_cap must be positive, got {self.rollout_is_cap}")


def record_to_batch(record) -> dict[str, torch.Tensor]:
    """Batch entries carrying a rollout's record (tensors with a leading batch dimension, which TRL's shuffling
    and splitting move with the rows): ``evict_at`` for the G-KV family, ``s4r_*`` for S4R, none for full."""
    if record is None:
        return {}
    return record.to_batch() if isinstance(record, S4RRecord) else {"evict_at": record}


def record_from_batch(batch):
    """The record of a (shuffled, split) batch, or None."""
    return batch["evict_at"] if "evict_at" in batch else S4RRecord.from_batch(batch)


def truncated_is_weights(trainer_logps, rollout_logps, mask, mode: str, cap: float) -> torch.Tensor:
    """Importance weights min(exp(trainer - rollout), cap): per token [B, T] or per sequence [B, 1].

    trainer_logps, rollout_logps float [B, T]; mask [B, T] completion tokens.
    """
    diff = (trainer_logps - rollout_logps) * mask
    if mode == "sequence_truncate":
        diff = diff.sum(-1, keepdim=True)
    return diff.exp().clamp(max=cap)


def clip_overlong_advantages(advantages, lengths, ended, limit: int) -> torch.Tensor:
    """Clamp to >= 0 the advantages [B] of completions that reached ``limit`` tokens without a stop token:
    being cut off is not evidence that the reasoning was wrong.

    lengths int [B] completion lengths; ended bool [B] whether each completion ends with a stop token.
    """
    overlong = (lengths >= limit) & ~ended
    return torch.where(overlong, advantages.clamp(min=0.0), advantages)


def mismatch_stats(trainer_logps, rollout_logps, mask) -> dict[str, float]:
    """Rollout vs trainer log-probs over the completion tokens: mean and max |diff|, and KL(rollout || trainer)
    estimated from the rollout's own samples with the non-negative k3 estimator exp(d) - d - 1, d = t - r."""
    mask = mask.bool()
    d = (trainer_logps - rollout_logps)[mask].double()  # float64: the k3 terms cancel to ~1e-12
    if d.numel() == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0, "kl": 0.0}
    return {"mean_abs": d.abs().mean().item(), "max_abs": d.abs().max().item(), "kl": (d.exp() - d - 1).mean().item()}


class CompressedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose rollouts run with a compressed KV cache and whose forwards see what they saw."""

    def __init__(self, *args, sparse: SparseRLOptions | None = None, **kwargs):
        if kwargs.get("rollout_func") is not None:
            raise ValueError("CompressedGRPOTrainer generates with its own rollout engine")
        self.sparse = sparse or SparseRLOptions()
        self._record = None  # record of the rows the next log-prob computation sees
        self._context = None  # attention context of the forward in flight
        self._rollout_logps = None  # rollout log-probs of the rows of the loss computation in flight
        self._generation = None  # the RolloutOutput of the generation batch being scored
        super().__init__(*args, rollout_func=self._rollout, **kwargs)
        models = [self.accelerator.unwrap_model(self.model)] + ([self.ref_model] if self.ref_model is not None else [])
        for model in models:
            use_kv_attention(model)
            model.register_forward_pre_hook(self._add_attention_context, with_kwargs=True)

    # ---- generation -------------------------------------------------------------------------------------
    def _rollout(self, prompts, trainer) -> dict:
        """``rollout_func``: sample with the compressed cache; keep the record for this generation batch."""
        model = self.accelerator.unwrap_model(self.model)
        engine = RolloutEngine(model, self.processing_class, self.sparse.compression)
        sampling = SamplingConfig(
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.args.seed * 100_003 + self.state.global_step * 1_009 + self.accelerator.process_index,
            stop_token_ids=tuple(self.eos_token_ids),
        )
        was_training = model.training
        model.eval()
        try:
            out = engine.generate(prompts, sampling)
        finally:
            model.train(was_training)
        self._generation = out
        self._record = out.record if self.sparse.train_with_record else None
        completions = out.completions()
        return {
            "prompt_ids": out.prompts(),
            "completion_ids": completions,
            "logprobs": [out.logprobs[i, : len(c)].tolist() for i, c in enumerate(completions)],
        }

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        start = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        out = self._generation
        output.update(record_to_batch(out.record))
        mask = output["completion_mask"]
        advantages = output["advantages"]
        if self.sparse.overlong_advantage_clip:
            ended = torch.tensor([c[-1] in self.eos_token_ids for c in out.completions()], device=advantages.device)
            advantages = clip_overlong_advantages(advantages, out.completion_lengths, ended, self.max_completion_length)
        if self.sparse.rollout_is is not None:
            if self.loss_type not in RATIO_LOSSES:
                raise ValueError(f"rollout_is works with the loss types {RATIO_LOSSES}, not {self.loss_type}")
            if "old_per_token_logps" not in output:
                with torch.no_grad():
                    output["old_per_token_logps"] = self._trainer_logps(output)
            weights = truncated_is_weights(
                output["old_per_token_logps"], output["sampling_per_token_logps"], mask,
                self.sparse.rollout_is, self.sparse.rollout_is_cap,
            )
            advantages = advantages[:, None] * weights
            self._metrics[mode]["sampling/rollout_is_weight/mean"].append(weights.mean().item())
        output["advantages"] = advantages
        self._record = None
        stats = out.stats
        self._metrics[mode]["rollout/tokens_per_s"].append(stats["tokens_per_s"])
        self._metrics[mode]["rollout/seconds"].append(time.perf_counter() - start)
        self._metrics[mode]["rollout/retention"].append(out.retention.mean().item())
        self._metrics[mode]["rollout/compressions"].append(float(stats["compressions"]))
        return output

    def _trainer_logps(self, batch):
        """Policy log-probs of a generation batch's completions, under its record (``self._record``)."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.model, ids, mask, batch["completion_ids"].shape[1], batch_size=self.args.per_device_train_batch_size
        )
        return logps

    # ---- training forward -------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        self._record = record_from_batch(inputs) if self.sparse.train_with_record else None
        reference = inputs.get("old_per_token_logps")
        # Without stored old log-probs the current policy is still the rollout policy (one optimizer step per
        # generation), so the loss forward itself measures the mismatch.
        self._rollout_logps = None if reference is not None else inputs.get("sampling_per_token_logps")
        mode = "train" if self.model.training else "eval"
        if reference is not None and "sampling_per_token_logps" in inputs:
            self._log_mismatch(mode, reference, inputs["sampling_per_token_logps"], inputs["completion_mask"])
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._record = self._rollout_logps = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kwargs):
        record, rollout_logps = self._record, self._rollout_logps
        self._rollout_logps = None  # measured once per loss computation
        batch_size = batch_size or input_ids.size(0)
        outputs = []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            self._context = None if record is None else attention_context(
                self.accelerator.unwrap_model(model), record[rows], attention_mask[rows], self.sparse.mask_backend
            )
            try:
                outputs.append(super()._get_per_token_logps_and_entropies(
                    model, input_ids[rows], attention_mask[rows], logits_to_keep, **kwargs
                ))
            finally:
                self._context = None
        logps = torch.cat([o[0] for o in outputs])
        entropies = None if outputs[0][1] is None else torch.cat([o[1] for o in outputs])
        aux = None if outputs[0][2] is None else torch.stack([o[2] for o in outputs]).mean()
        if rollout_logps is not None:
            mode = "train" if self.model.training else "eval"
            self._log_mismatch(mode, logps.detach(), rollout_logps, attention_mask[:, -logits_to_keep:])
        return logps, entropies, aux

    def _add_attention_context(self, module, args, kwargs):
        """Forward pre-hook: logical positions (as in the rollout) and, under a record, its masks."""
        mask = kwargs.get("attention_mask")
        if mask is None or mask.dim() != 2 or "kv_context" in kwargs:
            return None
        kwargs["position_ids"] = logical_positions(mask)
        if self._context is not None:
            kwargs["kv_context"] = self._context
        return args, kwargs

    def _log_mismatch(self, mode, trainer_logps, rollout_logps, mask):
        for name, value in mismatch_stats(trainer_logps, rollout_logps, mask).items():
            self._metrics[mode][f"mismatch/{name}"].append(value)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        start = time.perf_counter()
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._loss_start, self._loss_tokens = start, int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        return loss

    def training_step(self, model, inputs, num_items_in_batch):
        """TRL generates inside the first training step of a generation batch; the training throughput counts
        the forward and backward of the micro-batch only."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        seconds = time.perf_counter() - self._loss_start
        self._metrics["train"]["train/tokens_per_s"].append(self._loss_tokens / seconds)
        return loss
