"""GRPO under compressed caches on tiny models: learning direction, loss types, record through shuffle/split."""

import os

import datasets
import pytest
import torch

from gkv_rollout.config import CompressionConfig
from gkv_train.config.options import SparseRLOptions
from gkv_train.config.train_config import GRPOTrainConfig
from gkv_train.models import load_model
from gkv_train.training.grpo import (
    CompressedGRPOTrainer,
    clip_overlong_advantages,
    rollout_correction,
)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
PROMPTS = ["abc", "hello there", "x = 1", "12345678", "The cat", "Q: ok?", "zz", "Once upon"]


def even_first_token(completion_ids=(), **_):
    """Toy reward: 1 when the first completion token has an even id."""
    return [float(ids[0] % 2 == 0) if ids else 0.0 for ids in completion_ids]


def odd_first_token(completion_ids=(), **_):
    return [1.0 - r for r in even_first_token(completion_ids)]


def make_trainer(
    tmp_path,
    compression=None,
    train_with_record=True,
    steps=1,
    lr=1e-3,
    loss_type="dapo",
    reward=even_first_token,
    rollout_is=None,
    rows=None,
    rl=None,
    **args,
):
    model, tokenizer = load_model("tiny")
    settings = dict(
        output_dir=str(tmp_path),
        prompts_per_step=2,  # x num_generations: 8 rows
        num_generations=4,
        max_completion_length=24,
        max_steps=steps,
        learning_rate=lr,
        report_to=[],
        logging_steps=1,
        save_steps=10**6,  # no checkpoint
        temperature=1.0,
        loss_type=loss_type,
        seed=0,
    )
    config = GRPOTrainConfig(
        **{**settings, **args},
        compression=compression or CompressionConfig("gkv", budget=12, window=4, interval=4),
        rl=rl or SparseRLOptions(train_with_record=train_with_record, rollout_is=rollout_is),
    )
    return CompressedGRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        processing_class=tokenizer,
        train_dataset=datasets.Dataset.from_list(rows or [{"prompt": p} for p in PROMPTS]),
    )


def even_mass(trainer):
    """Mean probability of an even first token over the prompts."""
    model, tok = trainer.model, trainer.processing_class
    masses = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tok(prompt)["input_ids"]])
            probs = model(input_ids=ids).logits[0, -1].softmax(-1)
            masses.append(probs[0::2].sum())
    return torch.stack(masses).mean().item()


@pytest.mark.parametrize("reward, sign", [(even_first_token, 1), (odd_first_token, -1)])
def test_one_step_moves_towards_reward(tmp_path, reward, sign):
    """Every prompt, 8 samples each: one step raises the probability of what the reward favours."""
    trainer = make_trainer(tmp_path, lr=3e-4, reward=reward, prompts_per_step=8, num_generations=8)
    before = even_mass(trainer)
    trainer.train()
    assert sign * (even_mass(trainer) - before) > 1e-3


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "bnpo", "cispo"])
def test_loss_types_run(tmp_path, loss_type):
    trainer = make_trainer(tmp_path, loss_type=loss_type)
    trainer.train()
    assert torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))


def test_reference_log_probs_use_the_record(tmp_path):
    """With a KL term, the first step's reference is the policy itself: the KL is zero only if the reference
    forward attends under the same record as the policy forward."""
    trainer = make_trainer(tmp_path, beta=0.1)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert abs(log["kl"]) < 1e-6


def mismatches(trainer):
    return [h["mismatch/max_abs"] for h in trainer.state.log_history if "mismatch/max_abs" in h]


def test_record_survives_shuffle_and_split(tmp_path):
    """Two steps, each generation batch shuffled and split in two micro-batches with gradient accumulation."""
    trainer = make_trainer(tmp_path, steps=2, gradient_accumulation_steps=2)
    trainer.train()
    found = mismatches(trainer)
    assert len(found) == 2 and max(found) <= 1e-4


def test_s4r_record_survives_shuffle_and_split(tmp_path):
    trainer = make_trainer(
        tmp_path,
        compression=CompressionConfig.of("s4r", eta=0.4, window=4, sinks=1),
        steps=2,
        gradient_accumulation_steps=2,
    )
    trainer.train()
    found = mismatches(trainer)
    assert len(found) == 2 and max(found) <= 1e-4


def test_dropped_masks_show_a_large_mismatch(tmp_path):
    trainer = make_trainer(tmp_path, steps=2, train_with_record=False)
    trainer.train()
    assert min(mismatches(trainer)) > 1e-2


def test_full_cache_mismatch_is_zero(tmp_path):
    trainer = make_trainer(tmp_path, compression=CompressionConfig("full"), train_with_record=False, recipe="rl_full")
    trainer.train()
    assert max(mismatches(trainer)) <= 1e-4


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate"])
def test_rollout_importance_sampling_runs(tmp_path, mode):
    trainer = make_trainer(tmp_path, rollout_is=mode)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["sampling/rollout_is_weight/mean"] == pytest.approx(1.0, abs=1e-3)  # rl_sparse: no mismatch
    assert log["mismatch/max_abs"] <= 1e-4


def test_a_loss_that_is_not_ratio_times_advantage_is_refused(tmp_path):
    """vespo (TRL's) weights sequences with its own function of the importance ratio: scaling its advantages is not
    TRL's correction (``rl.rollout_is``), so the trainer's arguments refuse it before any work (the ratio losses
    are accepted above)."""
    with pytest.raises(ValueError, match="unknown loss_type 'vespo'; choose one of .*'dapo'"):
        make_trainer(tmp_path, rollout_is="token_truncate", loss_type="vespo", importance_sampling_level="sequence")


def test_overlong_advantages_are_clamped():
    advantages = torch.tensor([-1.0, -1.0, 0.5, -0.3])
    lengths = torch.tensor([24, 24, 24, 10])
    ended = torch.tensor([False, True, False, True])
    clipped = clip_overlong_advantages(advantages, lengths, ended, limit=24)
    assert torch.equal(clipped, torch.tensor([0.0, -1.0, 0.5, -0.3]))


def test_truncated_importance_weights():
    trainer_lp = torch.tensor([[-1.0, -1.0, -2.0], [-1.0, -1.0, 0.0]])
    rollout_lp = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, -5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    token, keep = rollout_correction(trainer_lp, rollout_lp, mask, SparseRLOptions(rollout_is="token_truncate"))
    assert torch.allclose(token, torch.tensor([[1.0, 2.0, torch.e**-1], [1.0, 1.0, 1.0]]))
    assert torch.equal(keep, mask.float())  # nothing rejected without rejection or veto
    seq, _ = rollout_correction(trainer_lp, rollout_lp, mask, SparseRLOptions(rollout_is="sequence_truncate"))
    assert seq.shape == (2, 1) and torch.allclose(seq, torch.tensor([[1.0], [1.0]]))


def test_sparse_rl_correction():
    """Sparse-RL's settings: weights truncated at 1.5 and normalised to mean 1 over the batch's tokens, tokens
    outside [0.5, 1.5] rejected, a completion with a token ratio below 1e-4 vetoed."""
    ratios = torch.tensor([[1.0, 1.2, 3.0, 0.4], [1.0, 1e-5, 1.0, 1.0], [0.9, 1.1, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    options = SparseRLOptions(
        rollout_is="token_truncate",
        rollout_is_cap=1.5,
        rollout_is_normalize=True,
        rollout_rejection=[0.5, 1.5],
        rollout_veto=1e-4,
    )
    weights, keep = rollout_correction(ratios.log(), torch.zeros(3, 4), mask, options)
    truncated = ratios.clamp(max=1.5) * mask
    assert torch.allclose(weights * mask, truncated / (truncated.sum() / mask.sum()))
    assert torch.allclose((weights * mask).sum() / mask.sum(), torch.tensor(1.0))
    assert torch.equal(keep, torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="rollout_rejection"):
        SparseRLOptions(rollout_rejection=[1.2, 1.5])
    with pytest.raises(ValueError, match="rollout_veto"):
        SparseRLOptions(rollout_veto=2.0)


GIVEN_ROWS = [{"prompt": p, "continuation": f"{p} then the story goes on and on."} for p in PROMPTS[:2]]


def even_last_token(completion_ids=(), **_):
    """Toy reward on what the policy sampled last (a given beginning is the same in every sample)."""
    return [float(ids[-1] % 2 == 0) if ids else 0.0 for ids in completion_ids]


@pytest.mark.parametrize("chunk_given", [True, False])
def test_the_rollout_statistics_count_the_sampled_tokens_and_the_forwards(tmp_path, monkeypatch, chunk_given):
    """GRPO's rollouts take chunk_given from the configuration: with it the given beginnings go through in fewer
    forwards than steps; rollout/tokens_per_s counts the sampled tokens only (the engine's sampled_tokens_per_s,
    below its rate of every completion token), rollout/forwards and rollout/given_seconds are the engine's."""
    from gkv_rollout.engine import RolloutEngine

    outputs = []
    generate = RolloutEngine.generate

    def spy(engine, *args, **kwargs):
        outputs.append(generate(engine, *args, **kwargs))
        return outputs[-1]

    monkeypatch.setattr(RolloutEngine, "generate", spy)
    trainer = make_trainer(
        tmp_path, max_completion_length=64, reward=even_last_token, rows=GIVEN_ROWS, chunk_given=chunk_given
    )
    _, sampled = given_batch(trainer)
    (out,) = outputs
    stats, metrics = out.stats, trainer._metrics["train"]
    assert (stats["forwards"] < stats["steps"] - 1) == chunk_given
    assert stats["sampled_tokens"] == int(sampled.sum()) < stats["new_tokens"]
    assert 0 < stats["sampled_tokens_per_s"] < stats["tokens_per_s"]
    assert metrics["rollout/tokens_per_s"] == [stats["sampled_tokens_per_s"]]
    assert metrics["rollout/forwards"] == [float(stats["forwards"])]
    assert metrics["rollout/given_seconds"] == [stats["given_seconds"]] and stats["given_seconds"] > 0


def given_batch(trainer):
    """One generation batch of ``GIVEN_ROWS`` (4 samples each), and the mask of the sampled completion tokens."""
    trainer.model.train()
    batch = trainer._generate_and_score_completions([dict(r) for r in GIVEN_ROWS for _ in range(4)])
    tokenizer = trainer.processing_class
    lengths = [len(tokenizer(r["continuation"], add_special_tokens=False)["input_ids"]) for r in GIVEN_ROWS]
    sampled = batch["completion_mask"].clone()
    for row in range(sampled.size(0)):
        sampled[row, : lengths[row // 4]] = 0
    return batch, sampled


def test_a_given_beginning_carries_no_loss_no_kl_and_no_ratio(tmp_path, monkeypatch):
    """A completion that begins with given text (long_recall's story): the rollout feeds it, and the loss, its KL
    term and the loss's normaliser are taken over the sampled tokens only, as computed by hand on those tokens
    (over every completion token, the control, they differ); Sparse-RL's correction sees the sampled tokens
    only."""
    trainer = make_trainer(
        tmp_path, beta=0.1, max_completion_length=64, reward=even_last_token, rows=GIVEN_ROWS, num_generations=4
    )
    with torch.no_grad():  # the policy away from the reference: a KL on every token
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    batch, sampled = given_batch(trainer)
    completions = trainer.processing_class.batch_decode(batch["completion_ids"])
    assert all(c.startswith(GIVEN_ROWS[i // 4]["continuation"]) for i, c in enumerate(completions))
    assert torch.equal(batch["sampled_mask"], sampled) and (sampled.sum(1) > 0).all()
    assert batch["num_items_in_batch"].item() == sampled.sum().item()
    trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before a loss
    loss = trainer.compute_loss(trainer.model, batch)
    with torch.no_grad():
        logps = trainer._trainer_logps(batch)
    gap = batch["ref_per_token_logps"] - logps
    per_token = -batch["advantages"][:, None] + 0.1 * (gap.exp() - gap - 1)  # the rollout policy: ratio 1
    by_hand = (per_token * sampled).sum() / sampled.sum()
    every = (per_token * batch["completion_mask"]).sum() / batch["completion_mask"].sum()
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-4, abs=1e-6)
    assert abs(every.item() - by_hand.item()) > 1e-3

    seen = []

    def spy(trainer_logps, rollout_logps, mask, options):
        seen.append(mask.clone())
        return rollout_correction(trainer_logps, rollout_logps, mask, options)

    monkeypatch.setattr("gkv_train.training.grpo.rollout_correction", spy)
    dense = SparseRLOptions(
        train_with_record=False, rollout_is="token_truncate", rollout_is_normalize=True, rollout_rejection=(0.5, 1.5)
    )
    trainer = make_trainer(
        tmp_path, max_completion_length=64, reward=even_last_token, rows=GIVEN_ROWS, num_generations=4, rl=dense
    )
    batch, sampled = given_batch(trainer)
    assert len(seen) == 1 and torch.equal(seen[0], sampled.to(seen[0].dtype))
    assert (batch["tool_mask"] * batch["completion_mask"])[sampled == 0].sum() == 0  # given: out of the loss
