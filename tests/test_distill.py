"""Distillation into a compressed-cache student on tiny models."""

import datasets
import pytest
import torch
from conftest import random_prompts  # noqa: F401  (fixtures)

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_train.config.options import DistillOptions
from gkv_train.config.train_config import DistillTrainConfig
from gkv_train.evaluation.traces import generate_traces, load_traces, write_traces
from gkv_train.models import load_model
from gkv_train.training.distill import CompressedDistillationTrainer
from gkv_train.training.logprobs import token_divergence


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Teacher traces of a tiny model (wrong answers kept: a random model solves nothing)."""
    teacher, tokenizer = load_model("tiny")
    problems = datasets.Dataset.from_list(
        [{"id": i, "problem": p, "answer": "0"} for i, p in enumerate(["1+1", "what is 7", "hello", "3 x 4 = ?"])]
    )
    rows = generate_traces(
        teacher,
        tokenizer,
        problems,
        SamplingConfig(max_new_tokens=20, num_samples=2, seed=0),
        "{problem}",
        keep_incorrect=True,
    )
    path = tmp_path_factory.mktemp("traces") / "traces.jsonl"
    write_traces(rows, path)
    return str(path)


def make_trainer(tmp_path, data, mode="offline", divergence="forward_kl", lr=1e-3, steps=1):
    student, tokenizer = load_model("tiny")
    teacher, _ = load_model("tiny")
    args = DistillTrainConfig(
        output_dir=str(tmp_path),
        prompts_per_step=8,
        max_steps=steps,
        learning_rate=lr,
        report_to=[],
        logging_steps=1,
        save_steps=10**6,  # no checkpoint
        seed=0,
        distill=DistillOptions(mode=mode, divergence=divergence),
        compression=CompressionConfig("gkv", budget=10, window=2, interval=4),
        max_completion_length=20,
        temperature=0.8,
        top_p=1.0,
    )
    return CompressedDistillationTrainer(
        model=student, teacher=teacher, tokenizer=tokenizer, args=args, train_dataset=data
    )


def test_token_divergence_is_kl():
    student = torch.tensor([[0.0, 1.0, 2.0]])
    teacher = torch.tensor([[2.0, 1.0, 0.0]])
    p, log_q = (teacher / 2).softmax(-1), (student / 2).log_softmax(-1)
    expected = (p * (p.log() - log_q)).sum() * 4
    assert torch.allclose(token_divergence(student, teacher, torch.tensor([0]), "forward_kl", 2.0), expected)
    assert token_divergence(teacher, teacher, torch.tensor([0]), "forward_kl", 2.0).abs().item() < 1e-6


def test_one_step_lowers_the_kl_on_its_batch(tmp_path, traces):
    data = load_traces(traces)
    trainer = make_trainer(tmp_path, data, lr=3e-5)
    batch = {"rows": [data[i] for i in range(len(data))]}
    with torch.no_grad():
        before = trainer.compute_loss(trainer.model, batch).item()
    assert before > 0  # the compressed student differs from the full-attention teacher
    trainer.train()
    with torch.no_grad():
        after = trainer.compute_loss(trainer.model, batch).item()
    assert after < before


@pytest.mark.parametrize(
    "mode, divergence", [("offline", "forward_kl"), ("offline", "sft"), ("onpolicy", "forward_kl")]
)
def test_student_logprobs_match_the_rollout(tmp_path, traces, mode, divergence):
    data = load_traces(traces)
    if mode == "onpolicy":
        data = data.select_columns(["prompt"])
    trainer = make_trainer(tmp_path, data, mode=mode, divergence=divergence, steps=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "mismatch/max_abs" in h]
    assert len(logs) == 2 and max(h["mismatch/max_abs"] for h in logs) <= 1e-4
    assert all(0 < h["rollout/retention"] < 1 for h in logs)


def test_bad_distillation_options():
    with pytest.raises(ValueError, match="unknown divergence 'jsd'"):
        DistillOptions(divergence="jsd")
    with pytest.raises(ValueError, match="unknown distillation mode"):
        DistillOptions(mode="online")
    with pytest.raises(FileNotFoundError, match="traces file /nope.jsonl does not exist"):
        load_traces("/nope.jsonl")


def test_one_kl_path_for_training_and_evaluation(traces):
    """compressed_kl (evaluation) and the distillation loss are one function (``divergence_under_record``): a
    model against itself has KL 0 under the full cache and > 0 once its cache evicts (the control), and
    the trainer's loss on the same replayed rows is the evaluation's mean."""
    from gkv_rollout.engine import RolloutEngine
    from gkv_train.evaluation.metrics import compressed_kl
    from gkv_train.training.logprobs import divergence_under_record

    model, tokenizer = load_model("tiny")
    rows = list(load_traces(traces))[:4]
    full = compressed_kl(model, model, tokenizer, rows, CompressionConfig("full"))
    assert full["tokens"] > 0 and abs(full["kl"]) < 1e-6
    cfg = CompressionConfig("gkv", budget=10, window=2, interval=4)
    evicting = compressed_kl(model, model, tokenizer, rows, cfg)
    assert evicting["kl"] > 1e-4
    out = RolloutEngine(model, tokenizer, cfg).replay([r["prompt"] for r in rows], [r["completion_ids"] for r in rows])
    with torch.no_grad():
        total, hidden, targets, _ = divergence_under_record(model, model, out, "forward_kl", 1.0, 512)
    assert hidden.shape[0] == targets.shape[0] == evicting["tokens"]
    assert abs(total.item() / evicting["tokens"] - evicting["kl"]) < 1e-6
