"""GRPO under a compressed KV cache: TRL's ``GRPOTrainer`` with our rollout engine and record masks.

What the subclass changes (TRL 1.16, pinned):

* Generation goes through ``RolloutEngine`` (``rollout_func``), with the recipe's compression.
* The record of each rollout joins the batch (``Record.to_batch``: tensors with a leading batch dimension),
  so TRL's shuffling and splitting carry it; every log-prob the trainer computes (old policy, reference,
  current) runs under the record of its rows. Data flow: ``_generate_and_score_completions`` opens a
  ``LogpsScope``; inside it TRL calls ``rollout_func`` (which puts the rollout's record in the scope) and then
  computes the old/reference log-probs (which read it); on return the record goes into the batch. A loss
  computation opens a scope with the record read back from its batch. ``_get_per_token_logps_and_entropies``
  runs each chunk of rows inside ``logical_forward`` with the attention context of those rows.
* Optionally, advantages of completions that hit the length limit are clamped to >= 0 (``overlong_advantage_clip``,
  off by default).
* Optional correction of the rollout-trainer mismatch (``rollout_correction``): truncated importance sampling
  (``rollout_is``), applied by scaling the per-token advantages, which equals TRL's multiplication of the
  per-token loss for the ratio-times-advantage losses (grpo, dapo, dr_grpo, bnpo, cispo, sapo); token rejection
  and a sequence veto (``rollout_rejection``, ``rollout_veto``), applied through TRL's loss mask (``tool_mask``).
  With ``train_with_record=false`` and a compressed rollout these make Sparse-RL's dense learner (recipe
  ``sparse_rl``).
* Every step logs the rollout-trainer log-prob mismatch (mean / max abs diff, KL), retention and tokens/s.
"""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from gkv_rollout.config import SamplingConfig
from gkv_rollout.contract import attention_context, record_from_batch
from gkv_rollout.contract.attention import use_kv_attention
from gkv_rollout.contract.record import Record
from gkv_rollout.engine import RolloutEngine, RolloutOutput
from gkv_rollout.sampling import rollout_seed
from gkv_train.config.options import SparseRLOptions
from gkv_train.config.train_config import GRPOTrainConfig
from gkv_train.console import rollout_progress
from gkv_train.logprobs import logical_forward
from gkv_train.problems.data import GIVEN
from gkv_train.training.consistency import mismatch_stats
from gkv_train.training.distributed import generation_model, is_zero3


def rollout_correction(trainer_logps, rollout_logps, mask, options: SparseRLOptions):
    """How the mismatch between trainer and rollout log-probs is corrected (``SparseRLOptions``): (importance
    weights float [B, T] per token, [B, 1] per sequence, or None; keep float [B, T]: 1 for the completion tokens
    that stay in the loss, 0 for padding, rejected tokens and vetoed completions).

    trainer_logps, rollout_logps float [B, T]; mask [B, T] completion tokens. With the Sparse-RL settings (recipe
    ``sparse_rl``) this is its correction: token weights truncated at 1.5 and normalised to mean 1 over the batch,
    tokens outside [0.5, 1.5] rejected, a completion with a token ratio below 1e-4 vetoed.
    """
    mask = mask.float()
    d = (trainer_logps - rollout_logps) * mask
    weights = None
    if options.rollout_is is not None:
        per_sequence = options.rollout_is == "sequence_truncate"
        weights = (d.sum(-1, keepdim=True) if per_sequence else d).exp().clamp(max=options.rollout_is_cap)
        if options.rollout_is_normalize:
            mean = weights.mean() if per_sequence else (weights * mask).sum() / mask.sum().clamp_min(1.0)
            weights = weights / mean.clamp_min(1e-8)
    keep = mask
    if options.rollout_rejection is not None:
        low, high = options.rollout_rejection
        ratio = d.exp()
        keep = keep * ((ratio >= low) & (ratio <= high))
    if options.rollout_veto is not None:
        vetoed = ((d < math.log(options.rollout_veto)) & mask.bool()).any(-1, keepdim=True)
        keep = keep * ~vetoed
    return weights, keep


def clip_overlong_advantages(advantages, lengths, ended, limit: int) -> torch.Tensor:
    """Clamp to >= 0 the advantages [B] of completions that reached ``limit`` tokens without a stop token:
    being cut off is not evidence that the reasoning was wrong.

    lengths int [B] completion lengths; ended bool [B] whether each completion ends with a stop token.
    """
    overlong = (lengths >= limit) & ~ended
    return torch.where(overlong, advantages.clamp(min=0.0), advantages)


@dataclass
class LogpsScope:
    """What the log-prob computations of one block attend under (``CompressedGRPOTrainer._scope``).

    record: the record of the rows they see (None: plain causal attention); rollout_logps: when set, the
    rollout's log-probs [B, C] of those rows, compared once with the trainer's over ``sampled`` ([B, C]: 1 for the
    sampled completion tokens; None: every completion token); generation: the rollout made inside the block (set
    by ``rollout_func``); given: per row, the text its completion begins with (a ``continuation`` column:
    long_recall's story), fed as if sampled, or None.
    """

    record: Record | None = None
    rollout_logps: torch.Tensor | None = None
    sampled: torch.Tensor | None = None
    generation: RolloutOutput | None = None
    given: list[str | None] | None = None


class CompressedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose rollouts run with a compressed KV cache and whose forwards see what they saw."""

    def __init__(self, *args, **kwargs):
        """``GRPOTrainer``'s arguments; ``args`` a ``GRPOTrainConfig`` (TRL's GRPOConfig with the compression and
        the RL-Sparse options among its fields)."""
        config = args[2] if len(args) > 2 else kwargs.get("args")
        if not isinstance(config, GRPOTrainConfig):
            raise TypeError(
                f"args must be a GRPOTrainConfig (TRL's GRPOConfig with compression and rl), got "
                f"{type(config).__name__}"
            )
        if kwargs.get("rollout_func") is not None:
            raise ValueError("CompressedGRPOTrainer generates with its own rollout engine")
        self._scope: LogpsScope | None = None  # set only inside ``scoped``
        self.rl = config.rl  # the RL-Sparse options in use: config.rl with rollout_is=auto resolved (below)
        super().__init__(*args, rollout_func=self._rollout, **kwargs)
        if self.rl.rollout_is == "auto":  # on where bf16 rounding makes rollout and trainer differ
            mode = "token_truncate" if self.args.bf16 else None  # every loss allowed is ratio x advantage
            self.rl = dataclasses.replace(self.rl, rollout_is=mode)
        if is_zero3(self.accelerator) and not self.args.ds3_gather_for_generation:
            raise ValueError(
                "ds3_gather_for_generation=false is not supported: the rollout engine decodes a different number of "
                "steps in each process, so it needs the whole weights (gathered once per generation) under ZeRO-3"
            )
        use_kv_attention(self.accelerator.unwrap_model(self.model))
        if self.ref_model is not None:
            use_kv_attention(self.ref_model)

    @contextmanager
    def scoped(self, scope: LogpsScope):
        """Log-prob computations inside the block attend under ``scope.record``."""
        if self._scope is not None:
            raise RuntimeError("log-prob scopes do not nest")
        self._scope = scope
        try:
            yield scope
        finally:
            self._scope = None

    # ---- generation -------------------------------------------------------------------------------------
    def _rollout(self, prompts, trainer) -> dict:
        """``rollout_func``: sample with the compressed cache; the scope keeps the output for this batch."""
        sampling = SamplingConfig(
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=rollout_seed(self.args.seed, self.state.global_step, self.accelerator.process_index),
            stop_token_ids=tuple(self.eos_token_ids),
            compile_decode=self.args.compile_decode,
            chunk_given=self.args.chunk_given,
        )
        rows = len(prompts)  # TRL passes every sample's prompt (num_generations per problem)
        prefixes = self._given_ids(self._scope.given, rows)
        with (
            generation_model(self) as model,
            rollout_progress(rows, sampling.max_new_tokens, self.accelerator.is_main_process) as progress,
        ):
            out = RolloutEngine(model, self.processing_class, self.args.compression).generate(
                prompts, sampling, progress=progress, prefixes=prefixes
            )
        self._scope.generation = out
        self._scope.record = out.record if self.rl.train_with_record else None
        completions = out.completions()
        # distinct prompts over all processes this step: prompts_per_step when each process has its own share
        everyone = gather_object(list(dict.fromkeys(map(repr, prompts))))
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["prompts/distinct"].append(float(len(set(everyone))))
        found = {
            "prompt_ids": out.prompts(),
            "completion_ids": completions,
            "logprobs": [out.logprobs[i, : len(c)].tolist() for i, c in enumerate(completions)],
        }
        if prefixes is not None:  # TRL's mask of the model's own tokens: the given ones leave loss, KL and ratios
            found["env_mask"] = [[0] * len(p) + [1] * (len(c) - len(p)) for p, c in zip(prefixes, completions)]
        return found

    def _given_ids(self, given: list[str | None] | None, rows: int) -> list[list[int]] | None:
        """The token ids of each row's given beginning (tokenised as the evaluation does: no special tokens), or
        None when no row has one."""
        if not given or all(g is None for g in given):
            return None
        if len(given) != rows:
            raise RuntimeError(f"{len(given)} given beginnings for {rows} rollout rows")
        tokenizer = self.processing_class
        return [tokenizer(g, add_special_tokens=False)["input_ids"] if g else [] for g in given]

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        start = time.perf_counter()
        with self.scoped(LogpsScope(given=[row.get(GIVEN) for row in inputs])) as scope:
            output = super()._generate_and_score_completions(inputs)
        out = scope.generation
        if out.record is not None:
            output.update(out.record.to_batch())
        # the completion tokens the policy sampled (TRL's tool_mask marks a given beginning's tokens 0 here)
        mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
        if "tool_mask" in output:
            output["sampled_mask"] = mask
        advantages = output["advantages"]
        if self.rl.overlong_advantage_clip:
            ended = torch.tensor([c[-1] in self.eos_token_ids for c in out.completions()], device=advantages.device)
            advantages = clip_overlong_advantages(advantages, out.completion_lengths, ended, self.max_completion_length)
        if self.rl.corrects_rollout:
            if "old_per_token_logps" not in output:
                with torch.no_grad():
                    output["old_per_token_logps"] = self._trainer_logps(output)
            weights, keep = rollout_correction(
                output["old_per_token_logps"], output["sampling_per_token_logps"], mask, self.rl
            )
            if weights is not None:
                advantages = advantages[:, None] * weights
                self._metrics[mode]["sampling/rollout_is_weight/mean"].append(weights.mean().item())
            if self.rl.rollout_rejection is not None or self.rl.rollout_veto is not None:
                # TRL's loss mask beside the attention mask: left-out tokens leave the loss and its normaliser
                output["tool_mask"] = keep if "tool_mask" not in output else output["tool_mask"] * keep
                loss_mask = mask * output["tool_mask"]
                output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
                dropped = 1.0 - loss_mask.sum().item() / max(mask.sum().item(), 1.0)
                self._metrics[mode]["sampling/rollout_tokens_dropped"].append(dropped)
        output["advantages"] = advantages
        stats = out.stats
        # the sampled tokens only: a task's given beginning goes through in chunks, far faster than sampling
        self._metrics[mode]["rollout/tokens_per_s"].append(stats["sampled_tokens_per_s"])
        self._metrics[mode]["rollout/forwards"].append(float(stats["forwards"]))
        self._metrics[mode]["rollout/given_seconds"].append(stats["given_seconds"])
        self._metrics[mode]["rollout/seconds"].append(time.perf_counter() - start)
        self._metrics[mode]["rollout/retention"].append(out.retention.mean().item())
        self._metrics[mode]["rollout/memory_share"].append(out.memory_share.mean().item())
        self._metrics[mode]["rollout/compressions"].append(float(stats["compressions"]))
        return output

    def _batch_record(self, batch) -> Record | None:
        """The record the trainer attends under for a batch's rows (None when ``train_with_record`` is off)."""
        return record_from_batch(batch) if self.rl.train_with_record else None

    def _trainer_logps(self, batch):
        """Policy log-probs of a generation batch's completions, under the record it carries."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with self.scoped(LogpsScope(record=self._batch_record(batch))):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                ids,
                mask,
                batch["completion_ids"].shape[1],
                batch_size=self.args.per_device_train_batch_size,
            )
        return logps

    # ---- training forward -------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        reference = inputs.get("old_per_token_logps")
        mode = "train" if self.model.training else "eval"
        sampled = inputs.get("sampled_mask", inputs["completion_mask"])
        if reference is not None and "sampling_per_token_logps" in inputs:
            self._log_mismatch(mode, reference, inputs["sampling_per_token_logps"], sampled)
        # Without stored old log-probs the current policy is still the rollout policy (one optimizer step per
        # generation), so the loss forward itself measures the mismatch.
        rollout_logps = None if reference is not None else inputs.get("sampling_per_token_logps")
        scope = LogpsScope(record=self._batch_record(inputs), rollout_logps=rollout_logps, sampled=sampled)
        with self.scoped(scope):
            return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kwargs
    ):
        scope = self._scope or LogpsScope()
        rollout_logps, scope.rollout_logps = scope.rollout_logps, None  # measured once per loss computation
        batch_size = batch_size or input_ids.size(0)
        unwrapped = self.accelerator.unwrap_model(model)
        outputs = []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            record = None if scope.record is None else scope.record[rows]
            context = attention_context(record, unwrapped, attention_mask[rows], self.args.mask_backend)
            with logical_forward(unwrapped, context):
                outputs.append(
                    super()._get_per_token_logps_and_entropies(
                        model, input_ids[rows], attention_mask[rows], logits_to_keep, **kwargs
                    )
                )
        logps = torch.cat([o[0] for o in outputs])
        entropies = None if outputs[0][1] is None else torch.cat([o[1] for o in outputs])
        aux = None if outputs[0][2] is None else torch.stack([o[2] for o in outputs]).mean()
        if rollout_logps is not None:
            mode = "train" if self.model.training else "eval"
            sampled = attention_mask[:, -logits_to_keep:] if scope.sampled is None else scope.sampled
            self._log_mismatch(mode, logps.detach(), rollout_logps, sampled)
        return logps, entropies, aux

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
        self._metrics["train"]["forward_backward/tokens_per_s"].append(self._loss_tokens / seconds)
        return loss
