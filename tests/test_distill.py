"""Distillation into a compressed-cache student on tiny models."""

import datasets
import pytest
import torch
from conftest import random_prompts  # noqa: F401  (fixtures)

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_train.config.options import DistillOptions
from gkv_train.config.train_config import DistillTrainConfig
from gkv_train.evaluation.traces import generate_traces, load_traces, write_traces
from gkv_train.logprobs import token_divergence
from gkv_train.models import load_model
from gkv_train.training.distill import CompressedDistillationTrainer


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
        recipe="distill_onpolicy" if mode == "onpolicy" else "distill",
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
    from gkv_train.logprobs import divergence_under_record

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


def test_solution_traces_mark_the_given_note_and_distillation_puts_no_loss_on_it(tmp_path):
    """``source=solution`` traces (count_recall): the note tokenised on its own as the engine feeds it, then the
    solution and the stop token, ``given`` its length, each graded correct. Distillation's loss (sft) over such a
    trace is the cross-entropy of the tokens after the note only; the control (given 0) covers the note too and
    differs."""
    from gkv_rewards.verify import MathVerifier
    from gkv_rollout.engine import encode_prompts
    from gkv_train.evaluation.traces import solution_traces
    from gkv_train.problems.tasks import count_recall_task

    model, tokenizer = load_model("tiny")
    problems = count_recall_task(3, count_to=6)
    rows = solution_traces(tokenizer, problems, "{problem}", tokenizer.eos_token_id, MathVerifier())
    for row, problem in zip(rows, problems):
        note = tokenizer(problem["continuation"], add_special_tokens=False)["input_ids"]
        assert row["completion_ids"][: row["given"]] == note and row["given"] == len(note)
        assert row["completion_ids"][-1] == tokenizer.eos_token_id and row["correct"]
        assert row["completion"] == problem["continuation"] + problem["solution"]
    path = tmp_path / "traces.jsonl"
    write_traces(rows, path)
    data = load_traces(str(path))
    trainer = make_trainer(tmp_path, data, divergence="sft")
    trainer.args.compression = CompressionConfig("full")
    batch = {"rows": [data[i] for i in range(len(data))]}
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, batch).item()
        control = trainer.compute_loss(trainer.model, {"rows": [{**r, "given": 0} for r in batch["rows"]]}).item()
        expected, count = 0.0, 0
        for row in rows:
            ids = encode_prompts(tokenizer, [row["prompt"]])[0]  # as the engine encodes it
            full = torch.tensor([ids + row["completion_ids"]])
            logits = trainer.model(input_ids=full).logits[0, len(ids) - 1 : -1].float()  # sft: at temperature 1
            nll = torch.nn.functional.cross_entropy(logits, full[0, len(ids) :], reduction="none")
            expected += nll[row["given"] :].sum().item()
            count += len(row["completion_ids"]) - row["given"]
    assert abs(loss - expected / count) < 1e-4 and abs(control - loss) > 1e-3
    with pytest.raises(ValueError, match="solution does not pass its own check"):
        wrong = problems.map(lambda p: {"solution": p["solution"].replace("6\n", "")})
        solution_traces(tokenizer, wrong, "{problem}", tokenizer.eos_token_id, MathVerifier())
    for given in ("-1", "1.5", "true", "10000"):
        (tmp_path / "bad.jsonl").write_text(
            "".join(
                line[: line.rindex('"given": ')] + f'"given": {given}}}\n' for line in path.read_text().splitlines()
            )
        )
        with pytest.raises(ValueError, match=f"record 1: given={given.replace('true', 'True')} must be a whole"):
            load_traces(str(tmp_path / "bad.jsonl"))
