"""The lm-evaluation-harness model ``gkv`` (gkv_train/evaluation/lm_eval_model.py): scores equal the model's own
under the full cache and the rollout's under compression; a local task (a YAML reading a local JSONL) runs offline
from Python and through lm-eval's own command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from gkv_train.evaluation.lm_eval_model import CompressedLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def local_task(folder: Path) -> Path:
    """A generation task and a multiple-choice task over four local problems."""
    rows = [{"problem": f"What is {a} plus {b}?", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (2, 2)]]
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        'doc_to_text: "{{problem}} Answer:"\n'
    )
    (folder / "gen.yaml").write_text(
        f'task: gkv_local_gen\n{common}output_type: generate_until\ndoc_to_target: "{{{{answer}}}}"\n'
        'generation_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 8\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n"
    )
    (folder / "mc.yaml").write_text(
        f"task: gkv_local_mc\n{common}output_type: multiple_choice\n"
        'doc_to_choice: ["{{answer}}", "0"]\ndoc_to_target: 0\nmetric_list:\n  - metric: acc\n'
    )
    return folder


def test_loglikelihood_is_the_models_under_the_full_cache():
    lm = CompressedLM(pretrained="tiny", method="full")
    context, continuation = "The answer is", " 42"
    ((score, _),) = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    ids = lm._encode(context + continuation)
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    n = len(lm._encode(context))
    direct = sum(logits[i - 1, ids[i]].item() for i in range(n, len(ids)))
    assert abs(score - direct) < 1e-4


def test_a_greedy_generation_scores_as_greedy_under_compression():
    """What the engine generates greedily under gkv, teacher-forced back through it: every token the argmax, the
    summed log-prob the rollout's; the control: another continuation is not greedy. generate_until returns that
    generation's text."""
    from gkv_rollout.config import SamplingConfig

    lm = CompressedLM(pretrained="tiny", method="gkv", budget=16, window=4, interval=8)
    context = lm._encode("A prompt long enough to be compressed after its prefill, and then again.")
    rollout = lm.engine.generate([context], SamplingConfig(max_new_tokens=20, temperature=0.0))
    tokens = rollout.completions()[0]
    (score, greedy), (_, other) = lm._score([(context, tokens), (context, tokens[:-1] + [(tokens[-1] + 1) % 100])])
    assert greedy and not other
    assert abs(score - rollout.logprobs[0].sum().item()) < 1e-3
    assert lm.stats[-1]["method"] == "gkv" and lm.stats[-1]["batch_compressions"] >= 2  # prefill and decode rounds
    request = Instance(
        "generate_until",
        {},
        (lm.tokenizer.decode(context, skip_special_tokens=True), {"until": [], "max_gen_toks": 20}),
        0,
    )
    assert lm.generate_until([request]) == [lm.tokenizer.decode(tokens, skip_special_tokens=True)]


def test_a_local_task_offline_from_python_and_the_command_line(tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tasks = local_task(tmp_path)
    stats = tmp_path / "stats.jsonl"
    lm = CompressedLM(pretrained="tiny", method="gkv", budget=16, window=4, interval=8, stats=str(stats))
    result = lm_eval.simple_evaluate(
        model=lm, tasks=["gkv_local_gen", "gkv_local_mc"], task_manager=TaskManager(include_path=str(tasks))
    )
    assert set(result["results"]) == {"gkv_local_gen", "gkv_local_mc"}
    lines = [json.loads(line) for line in stats.read_text().splitlines()]
    assert {line["request"] for line in lines} == {"generate_until", "loglikelihood"}
    assert all(0 < line["retention"] <= 1 for line in lines)
    out = tmp_path / "cli"
    command = [
        sys.executable,
        "-m",
        "gkv_train.cli",
        "lm-eval",
        "--model",
        "gkv",
        "--model_args",
        "pretrained=tiny,method=snapkv,budget=16,window=4,interval=8",
        "--tasks",
        "gkv_local_gen",
        "--include_path",
        str(tasks),
        "--output_path",
        str(out),
        "--batch_size",
        "2",  # lm-eval passes it on as the text "2"
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = list(out.rglob("results_*.json"))
    assert written and "gkv_local_gen" in json.loads(written[0].read_text())["results"]


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(budgte=64), "unknown gkv model argument budgte=64; did you mean budget?"),
        (dict(dtype="bfloat16"), "dtype=bfloat16; write precision=fp32 or precision=bf16"),
        (dict(method="s4r", alpha=0.5), "compression.alpha does not apply to compression.method=s4r"),
        (dict(method="gkv", alpha=5), "alpha must lie in [0, 1]"),
        (dict(method="gkv", budget="abc"), "budget=abc: expected int"),
        (dict(method="gkv", budget=16, window=32), "budget (16) must be larger than window (32)"),
        (dict(method="gkv", interval=0), "interval must be a positive number of tokens"),
        (dict(method="s4r", eta=-1), "eta must lie in (0, 1]"),
        (dict(method="s4r", full_layers=99), "compression.full_layers=[99]: tiny has layers 0-"),
        (dict(method="s4r", rank=10**6), "compression.rank=1000000 exceeds what tiny allows"),
        (dict(method="foo"), "unknown compression method 'foo'"),
        (dict(pretrained="/no/such/model"), "model path /no/such/model does not exist"),
        (dict(stats="/no/such/folder/stats.jsonl"), "the folder /no/such/folder does not exist"),
        (dict(max_gen_toks=0), "max_gen_toks=0: expected an integer from 1 to the model's context of 4096 tokens"),
        (dict(max_gen_toks=10**9), "max_gen_toks=1000000000: expected an integer from 1 to the model's context"),
        (dict(batch_size="0"), "batch_size=0: expected an integer >= 1"),
        (dict(batch_size="two"), "batch_size=two: expected an integer >= 1"),
        (dict(device="tpu"), "device=tpu"),
    ],
)
def test_model_arguments_are_refused_before_the_model_loads(monkeypatch, args, message):
    """Every argument is checked first (the model never loads: loading fails the test); a refusal names it."""
    from gkv_train.evaluation import lm_eval_model
    from gkv_train.exits import Refused

    monkeypatch.setattr(lm_eval_model, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(Refused) as err:
        CompressedLM(**{"pretrained": "tiny", **args})
    assert message in str(err.value)


@pytest.mark.parametrize("given", [10**9, 0, "many"])
def test_a_tasks_new_tokens_are_checked_before_the_model_loads(monkeypatch, given):
    """A task's ``max_gen_toks`` (its generation_kwargs) outside [1, the model's context] is refused before any work
    and before the weights load (they load at the first request, after its checks): a billion once allocated 32 GB
    after the model had loaded, 0 was a traceback."""
    from gkv_train.evaluation import lm_eval_model
    from gkv_train.exits import Refused

    monkeypatch.setattr(lm_eval_model, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    lm = CompressedLM(pretrained="tiny", method="gkv", budget=16, window=4)
    fits = Instance("generate_until", {}, ("2 + 2 =", {"until": ["\n"], "max_gen_toks": 8}), 0)
    bad = Instance("generate_until", {}, ("2 + 2 =", {"until": ["\n"], "max_gen_toks": given}), 1)
    with pytest.raises(
        Refused,
        match=rf"max_gen_toks \(the task's generation_kwargs\)={given}: expected an integer "
        r"from 1 to the model's context of 4096 tokens",
    ):
        lm.generate_until([fits, bad])


@pytest.mark.parametrize(
    "model_args, option",
    [("pretrained=tiny,batch_size=0", "batch_size"), ("pretrained=tiny,device=tpu", "device")],
)
def test_lm_evals_own_options_in_model_args_are_refused_naming_the_flag(model_args, option):
    """``--model_args batch_size=...`` / ``device=...``: lm-eval passes its own ``--batch_size`` / ``--device`` (their
    defaults included) as well; once Python's "got multiple values for keyword argument", now a refusal naming
    the flag to use. Without lm-eval's value (Python's simple_evaluate with none), the model argument is read."""
    from gkv_train.exits import Refused

    with pytest.raises(Refused, match=rf"{option}=\S+ in --model_args: lm-eval sets {option} itself \(--{option}"):
        CompressedLM.create_from_arg_string(model_args, {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"})
    lm = CompressedLM.create_from_arg_string("pretrained=tiny,batch_size=3,device=cpu", {"device": None})
    assert lm.batch_size == 3 and lm.device == torch.device("cpu")


def test_a_plug_in_methods_own_option_is_a_model_argument(tmp_path, monkeypatch):
    """A plug-in method's own option by its flat name (``p=1``), as ``compression.p=1`` in train.py: once
    "unknown gkv model argument" (the method was not imported when the names were listed)."""
    from gkv_train.exits import Refused

    (tmp_path / "lm_eval_methods.py").write_text(
        "from dataclasses import dataclass\n"
        "from gkv_rollout.methods import EvictionMethod\n"
        "@dataclass\n"
        "class KeyNormLM(EvictionMethod):\n"
        "    name = 'keynorm_lm'\n"
        "    p: float = 2.0\n"
        "    def score(self, state):\n"
        "        return state.keys.float().norm(p=self.p, dim=-1), None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    lm = CompressedLM.create_from_arg_string("pretrained=tiny,method=lm_eval_methods:KeyNormLM,p=1,budget=16,window=4")
    assert lm.compression.resolved.p == 1.0 and lm.compression.options == {"p": 1.0}
    with pytest.raises(Refused, match="p=one: expected float"):
        CompressedLM(pretrained="tiny", method="lm_eval_methods:KeyNormLM", p="one")


def test_every_compression_option_is_a_model_argument():
    """gkv's alpha, lambda, form and sinks (and S4R's refresh) reach the compression, as CompressionConfig.of
    builds it."""
    from gkv_rollout.config import CompressionConfig

    lm = CompressedLM(
        pretrained="tiny",
        method="gkv",
        budget=32,
        window=4,
        interval=8,
        alpha=0.5,
        sinks=2,
        form="mean",
        **{"lambda": 0.3},
    )
    assert lm.compression == CompressionConfig.of(
        "gkv", budget=32, window=4, interval=8, alpha=0.5, lambda_=0.3, form="mean", sinks=2
    )
    assert CompressedLM(pretrained="tiny", method="s4r", eta=0.5, refresh=16).compression.resolved.refresh == 16


def test_a_typo_through_the_command_line_is_one_line_before_work(tmp_path):
    command = [
        sys.executable,
        "-m",
        "gkv_train.cli",
        "lm-eval",
        "--model",
        "gkv",
        "--model_args",
        "pretrained=tiny,method=gkv,budgte=64",
        "--tasks",
        "gkv_local_gen",
        "--include_path",
        str(local_task(tmp_path)),
        "--output_path",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1"},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: unknown gkv model argument budgte=64; did you mean")
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_a_tasks_generation_settings_the_model_has_not_are_refused_before_any_generation(monkeypatch):
    """A task's ``generation_kwargs`` that the rollout engine does not have (``top_k``, ``repetition_penalty``) were
    silently ignored: refused naming the task, the key and what is honoured, before anything is generated (train.py
    refuses TRL's alike); at the values that change nothing (``top_k: 0``, ``repetition_penalty: 1.0``,
    ``num_beams: 1``) they run."""
    from gkv_train.exits import Refused

    lm = CompressedLM(pretrained="tiny", method="gkv", budget=16, window=4, interval=8)
    plain = {"until": ["\n"], "max_gen_toks": 4, "do_sample": False}

    def request(kwargs: dict, task: str) -> Instance:
        return Instance("generate_until", {}, ("What is 1 plus 1? Answer:", kwargs), 0, metadata=(task, 0, 1))

    generate = lm.engine.generate
    monkeypatch.setattr(lm.engine, "generate", lambda *a, **k: pytest.fail("generated before the check"))
    for key, value in (("top_k", 5), ("repetition_penalty", 1.3), ("num_beams", 4)):
        with pytest.raises(Refused, match=rf"task second: generation_kwargs {key}: {value} is not honoured by the gkv"):
            lm.generate_until([request(plain, "first"), request({**plain, key: value}, "second")])
    monkeypatch.setattr(lm.engine, "generate", generate)
    no_op = {**plain, "top_k": 0, "repetition_penalty": 1.0, "num_beams": 1, "temperature": 0.0}
    assert len(lm.generate_until([request(no_op, "first"), request(plain, "first")])) == 2
