import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from entry_points import run_each

from gkv_rewards.verify import CHECK
from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.engine import RolloutEngine
from gkv_train.evaluation.evaluate import evaluate_compression
from gkv_train.evaluation.metrics import pass_at_k
from gkv_train.jsonio import file_identity, read_jsonl
from gkv_train.models import load_model
from gkv_train.problems.tasks import arithmetic_task
from gkv_train.runs.run_folder import claim_run_dir

from verifier_probe import PAIRS, SCRIPT_WITH_ANSWERS, write_problems

ROOT = Path(__file__).resolve().parents[1]


def strict_json(text):
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} written into JSON"))


@pytest.mark.parametrize("n, c", [(4, 0), (4, 1), (4, 3), (5, 2), (6, 6), (7, 3)])
def test_pass_at_k_matches_brute_force(n, c):
    """pass@k = probability that a random k-subset of the n samples holds a correct one."""
    samples = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(samples, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(brute)


@pytest.mark.floor
def test_evaluate_script_writes_every_output(tmp_path):
    args = [
        "model=tiny",
        "data.limit=5",
        "num_generations=2",
        "max_completion_length=12",
        "methods=[full,gkv,streaming]",
        "budgets=[8,10]",
        "compression.window=2",
        "compression.interval=4",
        f"output_dir={tmp_path}",
    ]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["run"] for r in result["runs"]] == ["full", "gkv-b8", "gkv-b10", "streaming-b8", "streaming-b10"]
    for run in result["runs"]:
        samples = read_jsonl(tmp_path / run["run"] / "samples.jsonl")
        assert len(samples) == 10 and {s["problem_id"] for s in samples} == set(range(5))
        assert set(samples[0]) >= {"problem_id", "completion", "extracted", "correct", "length", "retention"}
        assert {"pass@1", "pass@2", "retention", "retention_correct", "mean_completion_length", "tokens_per_s"} <= set(
            run
        )
        assert (run["retention"] == 1.0) == (run["run"] == "full")
        low, high = run["pass@1_ci95"]
        assert 0 <= low <= run["pass@1"] <= high <= 1
    assert "window: 2" in (tmp_path / "hydra" / "config.yaml").read_text()  # the resolved configuration
    assert (tmp_path / "pass_at_1_vs_budget.png").stat().st_size > 0
    assert (tmp_path / "retained_density.png").stat().st_size > 0
    summary = strict_json((tmp_path / "summary.json").read_text())  # what produced the results, and with what
    assert summary["config"]["compression"]["window"] == 2 and summary["config"]["num_generations"] == 2
    assert summary["model"]["model"] == "tiny" and summary["data"]["name"] == "arithmetic"
    assert {"torch", "transformers", "trl", "python"} <= set(summary["versions"])
    assert summary["versions"]["git_dirty"] in (True, False) and len(summary["versions"]["git_commit"]) == 40
    full = summary["runs"][0]["retention_by_position"]
    assert full == pytest.approx([1.0] * len(full))  # no binning artefacts, whatever the sequence lengths
    results = strict_json((tmp_path / "results.json").read_text())  # lm-evaluation-harness's layout
    assert {"results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config"} <= set(results)
    task = results["results"]["arithmetic_gkv-b8"]
    assert task["pass@1,none"] == result["runs"][1]["pass@1"] and "pass@1_stderr,none" in task
    assert results["configs"]["arithmetic_gkv-b8"]["compression"]["budget"] == 8
    table = proc.stderr[proc.stderr.index("pass@1 [95% interval]") :].splitlines()  # method x budget on the console
    assert table[1].split() == ["method", "budget", "8", "budget", "10"]
    assert [row.split()[0] for row in table[2:5]] == ["full", "gkv", "streaming"]
    assert "pass@1 [95% interval]" in (tmp_path / "evaluate.log").read_text()  # the console, kept


def test_a_run_stands_at_its_methods_budget(tmp_path):
    """A sweep's run is named and tabled at the budget its method runs with: given (swept), else the method's own
    default (not a copy held by the configuration); a method that reads no budget (``s4r``) at the swept one, else
    at none: a line across the figure and one result in every column of the table, beside methods at a budget."""
    from gkv_train.config.eval_config import EvalConfig
    from gkv_train.evaluation.evaluate import run_budget, run_name
    from gkv_train.evaluation.report import plot_summaries, results_table

    unswept = EvalConfig(model="tiny", methods=["full", "gkv", "s4r"]).compressions()
    assert [run_name(c) for c in unswept] == ["full", "gkv-b2048", "s4r"]
    assert [run_budget(c) for c in unswept] == [None, 2048, None]
    swept = EvalConfig(model="tiny", methods=["gkv", "s4r"], budgets=[64]).compressions()
    assert [run_name(c) for c in swept] == ["gkv-b64", "s4r-b64"]  # as before: the swept budget names s4r's run
    run = {"pass@1": 0.5, "pass@1_ci95": [0.25, 0.75], "retention": 0.5}
    run |= {"retention_by_position": [1.0, 0.5], "retained_density": [0.5, 0.5]}
    summaries = [
        {**run, "run": run_name(c), "budget": run_budget(c), "compression": c.identity(), "retention": i / 4}
        for i, c in enumerate(unswept)
    ]
    table = results_table(summaries).splitlines()
    assert table[1].split() == ["method", "budget", "2048"] and table[4].split()[:2] == ["s4r", "0.500"]
    assert [p.name for p in plot_summaries(summaries, tmp_path, "t")] == [
        "pass_at_1_vs_budget.png",
        "retained_density.png",
    ]


def test_retention_by_position_is_exact_for_any_length():
    """Each token spreads over the bins it overlaps: with every token kept, every bin's retention is exactly 1
    (plain binning of k / T gives 0.9-1.1 when T is not a multiple of the bin count), and a kept prefix of
    half the sequence shows as 1 then 0."""
    from gkv_train.evaluation.metrics import position_overlap

    for length in (7, 49, 50, 51, 333):
        overlap = position_overlap(length, 50)
        assert overlap.sum() == pytest.approx(50)  # every token counted once in all
        present = overlap.sum(0)
        assert present == pytest.approx(torch.ones(50, dtype=torch.float64))  # every bin fully covered
        half = (torch.arange(length) < length / 2).double() @ overlap
        share = half / present
        cut = math.ceil(length / 2) / length  # the kept tokens cover [0, cut)
        bins = torch.arange(50)
        assert share[(bins + 1) / 50 <= cut] == pytest.approx(1.0)
        assert share[bins / 50 >= cut] == pytest.approx(0.0)
    plain = torch.bincount(((torch.arange(333) + 0.5) / 333 * 50).long(), minlength=50).double() * 50 / 333
    assert plain.max() - plain.min() > 0.1  # the artefact the overlap removes


@pytest.mark.parametrize(
    "damage, recomputed",
    [
        ("interrupted", 2),  # after the first batch, in the middle of writing the second: batches 1 and 2 of 3
        ("garbled_middle", 1),  # one unparsable line inside batch 1
        ("cut_first", 1),  # the first line cut short
    ],
)
def test_interrupted_or_damaged_evaluation_resumes(tmp_path, monkeypatch, damage, recomputed):
    model, tokenizer = load_model("tiny")
    problems = arithmetic_task(6, "test")
    compression = CompressionConfig("gkv", budget=10, window=2, interval=4)
    sampling = SamplingConfig(max_new_tokens=10, num_samples=2, seed=1)
    template = "{problem}"
    whole = evaluate_compression(model, tokenizer, problems, compression, sampling, tmp_path / "a", 2, template)

    lines = (tmp_path / "a" / "samples.jsonl").read_text().splitlines(keepends=True)
    density = (tmp_path / "a" / "density.jsonl").read_text()
    (tmp_path / "b").mkdir()
    if damage == "interrupted":
        (tmp_path / "b" / "samples.jsonl").write_text("".join(lines[:5]) + lines[5][:20])
        density = density.splitlines()[0] + "\n"
    elif damage == "garbled_middle":
        (tmp_path / "b" / "samples.jsonl").write_text("".join(lines[:5]) + "}{ garbled\n" + "".join(lines[6:]))
    else:
        (tmp_path / "b" / "samples.jsonl").write_text(lines[0][:20] + "\n" + "".join(lines[1:]))
    (tmp_path / "b" / "density.jsonl").write_text(density)
    calls = []
    original = RolloutEngine.generate
    monkeypatch.setattr(RolloutEngine, "generate", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    resumed = evaluate_compression(model, tokenizer, problems, compression, sampling, tmp_path / "b", 2, template)
    assert len(calls) == recomputed
    assert resumed["problems"] == 6

    def outcome(run):  # everything but the timing
        return [
            {k: v for k, v in s.items() if k != "tokens_per_s"} for s in read_jsonl(tmp_path / run / "samples.jsonl")
        ]

    assert outcome("b") == outcome("a")
    for key in ("pass@1", "pass@2", "retention"):
        assert resumed[key] == pytest.approx(whole[key])


def test_evaluate_script_checks_answers_and_keys_results_by_settings(tmp_path):
    """Inside scripts/evaluate.py (its checker worker does not re-import it), answers of every kind get their
    right verdict with no timeout; results go to a default folder named after model and data; a rerun there with
    another temperature is refused, naming the difference."""
    data = write_problems(tmp_path / "latex.jsonl")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    args = [
        "model=tiny",
        "data.name=null",
        f"data.path={data}",
        "num_generations=1",
        "max_completion_length=4",
        "plots=false",
    ]
    code = SCRIPT_WITH_ANSWERS.format(
        tests=str(ROOT / "tests"),
        script=str(ROOT / "scripts" / "evaluate.py"),
        answers=[a for _, a, _ in PAIRS],
        check=CHECK,
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = strict_json(proc.stdout.strip().splitlines()[-1])
    run_dir = tmp_path / "outputs" / "eval" / "tiny_latex" / "full"
    assert (tmp_path / result["output_dir"]).resolve() == run_dir.parent
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert [s["correct"] for s in samples] == [equal for _, _, equal in PAIRS]
    assert result["runs"][0]["verifier_timeouts"] == 0 and result["runs"][0]["verifier_errors"] == 0
    summary = strict_json((run_dir / "summary.json").read_text())
    assert summary["pass@1"] == pytest.approx(sum(e for _, _, e in PAIRS) / len(PAIRS))

    other = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), *args, "temperature=0.3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert other.returncode != 0 and "overwrite=true" in other.stderr
    assert "results made with other temperature:" in other.stderr  # the key to write, not the identity's entry
    assert read_jsonl(run_dir / "samples.jsonl") == samples


def test_evaluate_script_saves_a_check_whose_worker_died_as_an_error(tmp_path):
    """Inside scripts/evaluate.py, with the real worker: a check whose worker is killed (and killed again on the
    retry) is saved with check_error, counted in verifier_errors and named on stderr, not taken for a wrong answer;
    a comma outside a thousands group is a list (gold 1,0 is no 10), the other checks keep their verdicts."""
    cases = [("1,0", "10", False), ("-2,1", "1,-2", True), ("5", "die", None), ("1234", "1,234", True)]
    data = write_problems(tmp_path / "died.jsonl", [g for g, _, _ in cases])
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    args = [
        "model=tiny",
        "data.name=null",
        f"data.path={data}",
        "num_generations=1",
        "max_completion_length=4",
        "plots=false",
        f"output_dir={tmp_path / 'out'}",
    ]
    code = SCRIPT_WITH_ANSWERS.format(
        tests=str(ROOT / "tests"),
        script=str(ROOT / "scripts" / "evaluate.py"),
        answers=[a for _, a, _ in cases],
        check="verifier_probe:answers_or_die",
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = read_jsonl(tmp_path / "out" / "full" / "samples.jsonl")
    assert [s["correct"] for s in samples] == [bool(equal) for _, _, equal in cases]
    assert [s["check_error"] for s in samples] == [equal is None for _, _, equal in cases]
    assert not any(s["check_timed_out"] for s in samples)
    summary = strict_json((tmp_path / "out" / "full" / "summary.json").read_text())
    assert summary["verifier_errors"] == 1 and summary["verifier_timeouts"] == 0 and summary["verifier_checks"] == 4
    assert strict_json(proc.stdout.strip().splitlines()[-1])["runs"][0]["verifier_errors"] == 1
    assert "full: 1 answer checks have no verdict" in proc.stderr
    assert "the answer-check worker died; restarted, check retried (gold '5', answer 'die')" in proc.stderr
    assert "the answer-check worker died again: no verdict, counted as an error (gold '5'" in proc.stderr


def test_file_identity_follows_content_not_place_or_time(tmp_path):
    data = tmp_path / "a" / "svamp.jsonl"
    data.parent.mkdir()
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    copy = tmp_path / "b" / "svamp.jsonl"  # a re-created data folder: another place, another mtime
    copy.parent.mkdir()
    copy.write_bytes(data.read_bytes())
    os.utime(copy, (0, 0))
    assert file_identity(copy) == file_identity(data)
    copy.write_text('{"question": "1+1", "answer": "3"}\n')  # control: the same size, other content
    assert file_identity(copy) != file_identity(data)
    big = tmp_path / "weights.bin"  # larger than two samples: the first and last bytes are read
    big.write_bytes(bytes(300))
    before = file_identity(big, sample_bytes=100)
    big.write_bytes(bytes(299) + b"x")
    assert file_identity(big, sample_bytes=100) != before


def test_run_folders_are_keyed_by_settings(tmp_path):
    settings = {"model": {"model": "tiny", "files": []}, "sampling": {"temperature": 0.6, "seed": 0}}
    claim_run_dir(tmp_path / "run", settings, overwrite=False)
    (tmp_path / "run" / "samples.jsonl").write_text('{"batch": 0}\n')
    claim_run_dir(tmp_path / "run", settings, overwrite=False)  # the same run: its results stay
    assert (tmp_path / "run" / "samples.jsonl").is_file()
    other = {**settings, "model": {"model": "other", "files": [["/m/model.safetensors", 1, 2]]}}
    with pytest.raises(FileExistsError, match=r"other model\.files, model\.model: choose another output_dir"):
        claim_run_dir(tmp_path / "run", other, overwrite=False)
    claim_run_dir(tmp_path / "run", other, overwrite=True)
    assert not (tmp_path / "run" / "samples.jsonl").exists()
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "samples.jsonl").write_text('{"batch": 0}\n')  # written before run.json existed
    with pytest.raises(FileExistsError, match="unknown settings"):
        claim_run_dir(tmp_path / "legacy", settings, overwrite=False)
    cooler = {**other, "sampling": {"temperature": 0.3, "seed": 0}}  # named by its configuration key when mapped
    with pytest.raises(FileExistsError, match=r"other temperature: choose"):
        claim_run_dir(tmp_path / "run", cooler, overwrite=False, keys={"sampling.temperature": "temperature"})


# scripts/evaluate.py whose rollouts wait, once the first has started ($STARTED written), until $GATE exists.
GATED_EVALUATE = """
import os, runpy, sys, time
from pathlib import Path
from gkv_rollout.engine import RolloutEngine
generate = RolloutEngine.generate
def gated(self, *args, **kwargs):
    Path(os.environ["STARTED"]).touch()
    while not Path(os.environ["GATE"]).exists():
        time.sleep(0.05)
    return generate(self, *args, **kwargs)
RolloutEngine.generate = gated
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def evaluate_py(args, cwd=ROOT, **kwargs):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "evaluate.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        **kwargs,
    )


def test_a_second_evaluation_into_a_live_folder_is_refused(tmp_path):
    """Two evaluations into one output_dir would both append every batch to samples.jsonl: the second is refused
    at once (exit 2), naming the first's PID and start time, and the first's results are
    those of a lone run; the folder's lock goes with its holder."""
    out, gate, started = tmp_path / "out", tmp_path / "gate", tmp_path / "started"
    args = [
        "model=tiny",
        "data.limit=6",
        "num_generations=2",
        "max_completion_length=8",
        "plots=false",
        f"output_dir={out}",
    ]
    first = subprocess.Popen(
        [sys.executable, "-c", GATED_EVALUATE, str(ROOT / "scripts" / "evaluate.py"), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GATE": str(gate), "STARTED": str(started)},
    )
    try:
        deadline = time.monotonic() + 300
        while not started.exists():  # in its first rollout batch
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.1)
        holder = json.loads((out / ".run.lock").read_text())
        assert holder["pid"] == first.pid
        second = evaluate_py(args)
        assert second.returncode == 2, second.stderr[-3000:]
        line = second.stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: output_dir {out} is in use by another run (pid {first.pid} on host ")
        assert holder["started"] in line and "Traceback" not in second.stderr
        gate.touch()
        assert first.wait(timeout=600) == 0, first.communicate()[1][-3000:]
    finally:
        first.kill()
    samples = read_jsonl(out / "full" / "samples.jsonl")
    assert len(samples) == 12 and len({(s["problem_id"], s["sample"]) for s in samples}) == 12
    again = evaluate_py(args)  # the holder is gone: the same run is taken up again (nothing left to compute)
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_jsonl(out / "full" / "samples.jsonl") == samples


EVALUATE_REFUSALS = [
    ("methods=[gkv] budgets=[0]", "budgets are token counts: each must be at least 1, got [0]"),
    (
        "methods=[s4r] compression.rank=64",
        "compression.rank=64 exceeds what {model} allows: an S4R basis has at most KV heads x head dim = 2 x 16 = 32",
    ),
    (
        "max_completion_length=100000",
        "max_completion_length=100000 does not fit {model}'s context of 4096 tokens",
    ),
    ("data.limit=0", "data.limit must be at least 1"),
    ("output_dir={tmp}/a_file", "output_dir={tmp}/a_file is a file, not a folder"),
    (
        "data.name=long_recall max_completion_length=64",
        "the evaluation: the given beginning of problem 0's completions (long_recall's story, data.sentences) is",
    ),
    (
        "data.name=long_recall data.sentences=4096 max_completion_length=3000",
        "which leaves nothing to sample within max_completion_length=3000: lower data.sentences: the model's context "
        "(max_position_embeddings) leaves",  # raising max_completion_length, once advised, cannot fit it
    ),
    ("data.sentences=13", "data.sentences=13 applies to data.name=copy_recall / long_recall only, not to data.name="),
    ("data.name=copy_recall data.distractors=2", "data.distractors=2 applies to data.name=arithmetic only"),
    ("data.name=gsm8k data.copy_required=places", "data.copy_required='places' applies to data.name=copy_recall"),
    ("methods=[s4r] compression.eta=1e-9", "compression.eta=1e-09 is below what S4R's smallest"),
    (
        "methods=[full,gkv] budgets=[64] compression.keep_prompt=true",
        "compression.keep_prompt: the prompt of problem 8 in the evaluation has 121 tokens; with the window (16) it "
        "fills the budget (64), which holds the kept prompt: set compression.budget above 137",
    ),
    ("methods=[gkv,s4r] compression.keep_prompt=true", "compression.keep_prompt=true does not apply to compression."),
    ("compression.keep_prompt=maybe", "compression.keep_prompt='maybe': expected true or false"),
    ("adapter={tmp}/empty", "adapter={tmp}/empty: {tmp}/empty/adapter_config.json is not a PEFT adapter's"),
    ("adapter={tmp}/garbage", "adapter={tmp}/garbage: {tmp}/garbage/adapter_config.json is not JSON"),
    ("adapter={tmp}/full", "adapter={tmp}/full holds no adapter_config.json: a full model's folder, given as model="),
    ("adapter={tmp}/weightless", "adapter={tmp}/weightless holds no adapter weights"),
    ("adapter={tmp}/other_base", "adapter={tmp}/other_base was trained on tiny-qwen2 (base_model_name_or_path in its"),
    ("adapter={tmp}/deep", "adapter={tmp}/deep does not fit model={model}: it holds weights for model.layers.4."),
    ("seed=100000000000000000000000", "seed must be an integer in [0, 2**63 - 1]"),
]


def lora_adapter(folder: Path, base: str, kind: str = "tiny-llama", **shape) -> Path:
    """A rank-4 LoRA adapter (q_proj, v_proj) of a tiny model of ``kind`` and ``shape`` saved in ``folder``, its
    configuration naming ``base`` as its base model."""
    from peft import LoraConfig, get_peft_model

    from gkv_train.models import tiny_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(tiny_model(kind, **shape), lora).save_pretrained(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base}))
    return folder


@pytest.fixture(scope="module")
def evaluate_refusals(tmp_path_factory, weightless_model):
    """scripts/evaluate.py run once per EVALUATE_REFUSALS entry, in one interpreter (``entry_points.run_each``)."""
    tmp = tmp_path_factory.mktemp("refusals")
    (tmp / "a_file").write_text("")
    for name, config in (("empty", "{}"), ("garbage", "{garbage"), ("weightless", '{"peft_type": "LORA"}')):
        (tmp / name).mkdir()
        (tmp / name / "adapter_config.json").write_text(config)
    (tmp / "full").mkdir()
    (tmp / "full" / "config.json").write_text("{}")
    lora_adapter(tmp / "other_base", "tiny-qwen2", kind="tiny-qwen2")  # its configuration names another base
    lora_adapter(tmp / "deep", weightless_model, num_hidden_layers=6)  # the model's own base, two layers more
    outs = [tmp / f"out{i}" for i in range(len(EVALUATE_REFUSALS))]
    argvs = [
        [f"model={weightless_model}", f"output_dir={out}", *override.replace("{tmp}", str(tmp)).split()]
        for (override, _), out in zip(EVALUATE_REFUSALS, outs)
    ]
    results = run_each(ROOT / "scripts" / "evaluate.py", argvs, cwd=ROOT)
    return tmp, {override: (r, out) for (override, _), r, out in zip(EVALUATE_REFUSALS, results, outs)}


@pytest.mark.xdist_group("evaluate_refusals")  # one worker runs the shared refusals
@pytest.mark.parametrize("override, message", EVALUATE_REFUSALS)
def test_evaluate_refuses_before_any_work(evaluate_refusals, weightless_model, override, message):
    """Values never silently replaced (budgets=[0] not run at 2048, an S4R rank above D' not cut to it and recorded
    as given), limits checked before the model loads (a model without weights): one line, exit 2, no
    output folder."""
    tmp, runs = evaluate_refusals
    proc, out = runs[override]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line == "error: " + line[7:] and message.format(model=weightless_model, tmp=tmp) in line
    assert not out.exists()


def test_each_method_keeps_one_style_across_figures():
    """method_style gives every figure (pass@1 against budget, retained density, the benches' plots) the same colour
    and marker for a method, whatever else the figure shows; the full cache black; distinct built-in methods."""
    from gkv_rollout.registry import registered
    from gkv_train.evaluation.report import method_style

    names = [m for m in registered() if m != "full"]
    styles = {name: (method_style(name)["color"], method_style(name)["marker"]) for name in names}
    assert len(set(styles.values())) == len(names)
    assert method_style("full")["color"] == "black" and "black" not in {c for c, _ in styles.values()}
    assert method_style("gkv-mean") == method_style("gkv-mean")  # a name outside the registry: stable


def test_a_failed_evaluation_keeps_its_error_in_the_log(tmp_path):
    """An evaluation that fails after its checks passed (here: an error inside the work) leaves evaluate.log with
    the error, not empty."""
    code = (
        "import sys\n"
        "import gkv_train.evaluation.evaluate as e\n"
        "def boom(*a, **k):\n"
        "    raise RuntimeError('boom inside the evaluation')\n"
        "e.evaluate_compression = boom\n"
        f"sys.argv = ['evaluate', 'model=tiny', 'data.limit=2', 'max_completion_length=4', "
        "'num_generations=1', "
        f"'plots=false', 'output_dir={tmp_path / 'out'}']\n"
        "from gkv_train.cli import evaluate\n"
        "evaluate()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert "boom inside the evaluation" in (tmp_path / "out" / "evaluate.log").read_text()


def test_a_sweep_names_each_run_once():
    """``methods=[gkv,gkv]`` evaluated and reported the run twice: a method or budget named twice is refused naming
    it; a sweep of distinct ones is each run once (full once, whatever the budgets)."""
    from gkv_train.config.eval_config import EvalConfig

    with pytest.raises(ValueError, match=r"methods=\['gkv', 'gkv'\] names gkv twice: each run is evaluated"):
        EvalConfig(methods=["gkv", "gkv"])
    with pytest.raises(ValueError, match=r"budgets=\[64, 32, 64\] names 64 twice"):
        EvalConfig(methods=["gkv"], budgets=[64, 32, 64])
    runs = EvalConfig(methods=["full", "gkv", "snapkv"], budgets=[32, 64]).compressions()
    assert [(run.method, run.budget if run.compresses else None) for run in runs] == [
        ("full", None),
        ("gkv", 32),
        ("gkv", 64),
        ("snapkv", 32),
        ("snapkv", 64),
    ]
