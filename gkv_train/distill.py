"""Distillation into a compressed-cache student: a full-attention teacher, a student under its own record.

Two data modes share one trainer (a ``transformers.Trainer`` subclass, so checkpoints, resume, logging and
multi-process training are the standard ones):

* ``offline``: rows are teacher traces (prompt + completion ids). Each step replays them through the current
  student with the compressed cache (``RolloutEngine.replay``), which yields exactly the record a sampled
  rollout of those tokens would have produced, and trains the student under that record.
* ``onpolicy``: rows are prompts. Each step the student samples under compression (with its record), the
  teacher scores the same tokens with full attention, and the student minimises the divergence on its own
  samples.

Losses over completion tokens: ``forward_kl`` (KL(teacher || student) of the softmax at ``temperature``,
scaled by temperature^2) or ``sft`` (cross-entropy on the tokens). The LM heads run over ``chunk_tokens``
tokens at a time (the student's chunk is recomputed in the backward pass), so teacher and student vocabulary
logits are never both held for the whole batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.utils.checkpoint import checkpoint
from transformers import Trainer

from gkv_train.grpo import mismatch_stats
from gkv_train.logprobs import decoder_and_head, head_logprobs
from gkv_train.masks import attention_context
from gkv_train.record import logical_positions
from rollout.config import CompressionConfig, SamplingConfig
from rollout.engine import RolloutEngine

DIVERGENCES = ("forward_kl", "sft")
MODES = ("offline", "onpolicy")


@dataclass
class DistillOptions:
    mode: str = "offline"
    divergence: str = "forward_kl"
    temperature: float = 0.6
    compression: CompressionConfig = field(default_factory=lambda: CompressionConfig("gkv"))
    max_new_tokens: int = 96  # on-policy samples
    top_p: float = 0.95
    chunk_tokens: int = 512
    mask_backend: str = "auto"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown distillation mode {self.mode!r}; choose one of {MODES}")
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"unknown divergence {self.divergence!r}; choose one of {DIVERGENCES}")
        if self.temperature <= 0:
            raise ValueError(f"distillation temperature must be positive, got {self.temperature}")


def token_divergence(student_logits, teacher_logits, targets, divergence: str, temperature: float) -> torch.Tensor:
    """Per-token loss [N] from student and teacher logits [N, V] and the trace tokens targets [N]."""
    if divergence == "sft":
        return -student_logits.float().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    log_q = (student_logits.float() / temperature).log_softmax(-1)
    log_p = (teacher_logits.float() / temperature).log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1) * temperature**2


def _chunk_loss(student_hidden, teacher_hidden, student_head, teacher_head, targets, divergence, temperature):
    teacher_logits = None if teacher_hidden is None else teacher_head(teacher_hidden)
    return token_divergence(student_head(student_hidden), teacher_logits, targets, divergence, temperature).sum()


def chunked_divergence(
    student_hidden, teacher_hidden, student_head, teacher_head, targets, divergence, temperature, chunk_tokens
) -> torch.Tensor:
    """Sum of ``token_divergence`` over N tokens, ``chunk_tokens`` at a time.

    student_hidden [N, d] (with grad), teacher_hidden [N, d] or None for ``sft``, targets int64 [N].
    """
    total = student_hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, student_hidden.shape[0], chunk_tokens):
        rows = slice(start, start + chunk_tokens)
        teacher = None if teacher_hidden is None else teacher_hidden[rows]
        args = (student_hidden[rows], teacher, student_head, teacher_head, targets[rows], divergence, temperature)
        if torch.is_grad_enabled() and student_hidden.requires_grad:
            total = total + checkpoint(_chunk_loss, *args, use_reentrant=False)
        else:
            total = total + _chunk_loss(*args)
    return total


class CompressedDistillationTrainer(Trainer):
    """Student under its compressed cache's record, teacher with full attention (frozen)."""

    def __init__(self, *args, teacher, tokenizer, distill: DistillOptions, seed: int = 0, **kwargs):
        super().__init__(*args, processing_class=tokenizer, data_collator=lambda rows: {"rows": rows}, **kwargs)
        self.teacher = teacher.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.distill = distill
        self.seed = seed
        self._last_metrics: dict[str, list[float]] = {}

    def _rollout(self, rows):
        """Replay the traces (offline) or sample (on-policy) with the current student and its compression."""
        student = self.accelerator.unwrap_model(self.model)
        engine = RolloutEngine(student, self.tokenizer, self.distill.compression)
        was_training = student.training
        student.eval()
        try:
            prompts = [row["prompt"] for row in rows]
            if self.distill.mode == "offline":
                return engine.replay(prompts, [row["completion_ids"] for row in rows],
                                     SamplingConfig(temperature=self.distill.temperature))
            sampling = SamplingConfig(
                max_new_tokens=self.distill.max_new_tokens, temperature=self.distill.temperature,
                top_p=self.distill.top_p, seed=self.seed * 100_003 + self.state.global_step * 1_009
                + self.accelerator.process_index,
            )
            return engine.generate(prompts, sampling)
        finally:
            student.train(was_training)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        start = time.perf_counter()
        out = self._rollout(inputs["rows"])
        rollout_seconds = time.perf_counter() - start
        ids, mask = out.sequences, out.attention_mask
        positions = logical_positions(mask)
        context = attention_context(self.accelerator.unwrap_model(model), out.record, mask, self.distill.mask_backend)
        hidden = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, kv_context=context, use_cache=False,
            logits_to_keep=1, output_hidden_states=True,
        ).hidden_states[-1]
        C = out.num_completion_tokens
        targets_mask = out.completion_mask.bool()
        student_hidden = hidden[:, -C - 1 : -1][targets_mask]
        targets = ids[:, -C:][targets_mask]
        _, student_head = decoder_and_head(self.accelerator.unwrap_model(model))
        teacher_hidden, teacher_head = None, None
        if self.distill.divergence != "sft":
            teacher_decoder, teacher_head = decoder_and_head(self.teacher)
            with torch.no_grad():
                teacher_hidden = teacher_decoder(
                    input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
                ).last_hidden_state[:, -C - 1 : -1][targets_mask]
        total = chunked_divergence(
            student_hidden, teacher_hidden, student_head, teacher_head, targets, self.distill.divergence,
            self.distill.temperature, self.distill.chunk_tokens,
        )
        loss = total / targets_mask.sum().clamp_min(1)
        with torch.no_grad():
            student_logps = head_logprobs(
                student_hidden, student_head, targets, self.distill.temperature, self.distill.chunk_tokens
            )
        mismatch = mismatch_stats(student_logps, out.logprobs[targets_mask], torch.ones_like(targets, dtype=torch.bool))
        metrics = {f"mismatch/{k}": v for k, v in mismatch.items()}
        metrics.update({
            "distill/loss": loss.item(),
            "rollout/retention": out.retention.mean().item(),
            "rollout/tokens_per_s": out.stats["tokens_per_s"],
            "rollout/seconds": rollout_seconds,
            "completions/mean_length": out.completion_lengths.float().mean().item(),
        })
        for name, value in metrics.items():
            self._last_metrics.setdefault(name, []).append(value)
        return (loss, {"hidden": hidden}) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the mean of the per-step metrics gathered since the last log."""
        if self._last_metrics and "loss" in logs:
            logs.update({name: sum(v) / len(v) for name, v in self._last_metrics.items()})
            self._last_metrics = {}
        super().log(logs, start_time)
