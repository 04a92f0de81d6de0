"""Distillation into a compressed-cache student: a full-attention teacher, a student under its own record.

Two data modes share one trainer (a ``transformers.Trainer`` subclass, so checkpoints, resume, logging and
multi-process training are the standard ones):

* ``offline``: rows are teacher traces (prompt + completion ids). Each step replays them through the current
  student with the compressed cache (``RolloutEngine.replay``: compressions at the points a sampled rollout of
  those tokens would have, the tokens up to each one in one forward), and trains the student under the record
  that replay wrote.
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

import torch
from transformers import Trainer

from gkv_rewards.functions import accuracy
from gkv_rollout.engine import RolloutEngine
from gkv_rollout.sampling import head_logprobs, rollout_seed
from gkv_train.config.options import rollout_sampling
from gkv_train.config.train_config import DistillTrainConfig
from gkv_train.console import rollout_progress
from gkv_train.logprobs import divergence_under_record
from gkv_train.training.consistency import mismatch_stats
from gkv_train.training.distributed import generation_model


class CompressedDistillationTrainer(Trainer):
    """Student under its compressed cache's record, teacher with full attention (frozen)."""

    def __init__(self, *args, teacher, tokenizer, **kwargs):
        """``Trainer``'s arguments; ``args`` a ``DistillTrainConfig`` (TrainingArguments with the compression,
        the distillation options and sampling); ``teacher``: the frozen full-attention model."""
        config = args[1] if len(args) > 1 else kwargs.get("args")
        if not isinstance(config, DistillTrainConfig):
            raise TypeError(
                f"args must be a DistillTrainConfig (TrainingArguments with compression, distill and sampling), got "
                f"{type(config).__name__}"
            )
        super().__init__(*args, processing_class=tokenizer, data_collator=lambda rows: {"rows": rows}, **kwargs)
        self.teacher = teacher.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self._last_metrics: dict[str, list[float]] = {}

    def _rollout(self, rows):
        """Replay the traces (offline) or sample (on-policy) with the current student and its compression."""
        prompts = [row["prompt"] for row in rows]
        with generation_model(self) as student:  # ZeRO-3: the weights gathered
            engine = RolloutEngine(student, self.tokenizer, self.args.compression)
            if self.args.distill.mode == "offline":
                sampling = rollout_sampling(self.args, self.args.seed, num_samples=1)
                return engine.replay(prompts, [row["completion_ids"] for row in rows], sampling)
            seed = rollout_seed(self.args.seed, self.state.global_step, self.accelerator.process_index)
            sampling = rollout_sampling(self.args, seed, num_samples=1)
            with rollout_progress(len(prompts), sampling.max_new_tokens, self.accelerator.is_main_process) as progress:
                return engine.generate(prompts, sampling, progress=progress)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        start = time.perf_counter()
        out = self._rollout(inputs["rows"])
        rollout_seconds = time.perf_counter() - start
        given = torch.tensor([row.get("given") or 0 for row in inputs["rows"]], device=out.sequences.device)
        positions = torch.arange(out.num_completion_tokens, device=given.device)
        trained = out.completion_mask.bool() & (positions[None, :] >= given[:, None])  # no loss on given tokens
        with self.accelerator.autocast():  # precision=bf16: the LM heads too run as in the rollout's forward
            loss, hidden = self._student_loss(model, out, trained, rollout_seconds)
        if self.args.distill.mode == "onpolicy" and "answer" in inputs["rows"][0]:
            self._last_metrics.setdefault("reward", []).append(self._accuracy(inputs["rows"], out))
        return (loss, {"hidden": hidden}) if return_outputs else loss

    def _accuracy(self, rows, out) -> float:
        """Mean accuracy of the student's own samples under its compressed cache (on-policy mode): the same
        reward GRPO's curves log as ``reward``, so every recipe's training curve reads alike."""
        texts = self.tokenizer.batch_decode(
            [ids[:n] for ids, n in zip(out.completion_ids.tolist(), out.completion_lengths.tolist())],
            skip_special_tokens=True,
        )
        scores = accuracy(
            completions=texts, answer=[row["answer"] for row in rows], required=[row.get("required") for row in rows]
        )
        return sum(scores) / len(scores)

    def _student_loss(self, model, out, trained, rollout_seconds: float):
        """The divergence from the teacher on the rollout's ``trained`` tokens (bool [B, C]: the real completion
        tokens after any given beginning), the student under the rollout's record; logs the rollout-trainer
        mismatch. Returns the loss and the student's final hidden states at those tokens [N, d]."""
        total, student_hidden, targets, student_head = divergence_under_record(
            model,
            self.teacher,
            out,
            self.args.distill.divergence,
            self.args.temperature,
            self.args.distill.chunk_tokens,
            self.args.mask_backend,
            base=self.accelerator.unwrap_model(model),
            trained=trained,
        )
        targets_mask = trained
        loss = total / targets_mask.sum().clamp_min(1)
        with torch.no_grad():
            student_logps = head_logprobs(
                student_hidden, student_head, targets, self.args.temperature, self.args.distill.chunk_tokens
            )
        mismatch = mismatch_stats(student_logps, out.logprobs[targets_mask], torch.ones_like(targets, dtype=torch.bool))
        metrics = {f"mismatch/{k}": v for k, v in mismatch.items()}
        metrics.update(
            {
                "distill/loss": loss.item(),
                "rollout/retention": out.retention.mean().item(),
                "rollout/memory_share": out.memory_share.mean().item(),
                "rollout/tokens_per_s": out.stats["tokens_per_s"],
                "rollout/seconds": rollout_seconds,
                "completions/mean_length": out.completion_lengths.float().mean().item(),
            }
        )
        for name, value in metrics.items():
            self._last_metrics.setdefault(name, []).append(value)
        return loss, student_hidden

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds the mean of the per-step metrics gathered since the last log."""
        if self._last_metrics and "loss" in logs:
            logs.update({name: sum(v) / len(v) for name, v in self._last_metrics.items()})
            self._last_metrics = {}
        super().log(logs, start_time)
