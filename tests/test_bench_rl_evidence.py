"""gkv-train compare (scripts/bench_rl_evidence.py runs the same) as main (--quick, the train and eval stages at a
given learning rate): two workers share the jobs (each run trained and evaluated once), the results file holds
every recipe's hierarchical interval and paired difference per condition, each trained adapter is kept in fp16, the
tables render, and a third call reads every run back without training or evaluating anything; on a new machine (the
output root gone) the results file is the memory: nothing is trained again or dropped, and a results file of other
settings is refused."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
BF16 = {"ACCELERATE_MIXED_PRECISION": "bf16"}
RUNS = ("rl_sparse-s0-lr0.0001", "sparse_rl-s0-lr0.0001", "rl_sparse-s1-lr0.0001", "sparse_rl-s1-lr0.0001")


def test_two_workers_share_the_runs_and_the_results_hold_intervals_over_seeds(tmp_path):
    results, adapters = tmp_path / "results.json", tmp_path / "adapters"
    command = [  # the installed command (scripts/bench_rl_evidence.py runs the same: the tests below)
        sys.executable,
        "-m",
        "gkv_train.cli",
        "compare",
        "--quick",
        "--lr",
        "1e-4",
        "--seeds",
        "0",
        "1",
        "--recipes",
        "rl_sparse",
        "sparse_rl",
        "--stages",
        "train",
        "eval",
        "--output-root",
        str(tmp_path / "out"),
        "--results",
        str(results),
        "--adapters",
        str(adapters),
        "--figures",
        str(tmp_path / "curves.png"),
    ]
    workers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    outputs = [w.communicate(timeout=900) for w in workers]
    for worker, (_, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-3000:]
    launched = "".join(err for _, err in outputs)
    for run in RUNS:  # each run trained once and evaluated once per condition, by one of the two workers
        assert launched.count(f"output_dir={tmp_path / 'out' / 'train' / run}") == 1
        for condition in ("full", "gkv-b24"):
            assert launched.count(f"output_dir={tmp_path / 'out' / 'eval' / run / condition}") == 1
    training = json.loads(results.read_text())["training"]
    resolved = training["settings"]["train"]["resolved"]  # what each recipe's name stands for, every default
    assert set(resolved) == {"rl_sparse", "sparse_rl"} and "rl.overlong_advantage_clip" in resolved["rl_sparse"]
    assert resolved["sparse_rl"]["rl.train_with_record"] is False and "seed" not in resolved["rl_sparse"]
    assert training["learning_rate"] == 1e-4 and training["lr_sweep"] == {} and not training["partial"]
    assert list(training["models"]) == ["untrained", *RUNS]  # seed by seed
    assert set(training["recipes"]) == {"full", "gkv-b24"}
    for condition in training["recipes"].values():
        assert set(condition) == {"untrained", "rl_sparse", "sparse_rl"}
        rl_sparse = condition["rl_sparse"]
        assert rl_sparse["seeds"] == 2 and len(rl_sparse["per_seed"]) == 2 and len(rl_sparse["pass@1_ci95"]) == 2
        assert condition["sparse_rl"]["rl_sparse_minus"]["seeds"] == 2  # paired over both seeds
        assert sum(b["samples"] for b in rl_sparse["by_rounds"]) == 4  # 2 problems x 1 sample x 2 seeds
        assert len(rl_sparse["at_limit_per_seed"]) == len(rl_sparse["pass@1_stopped_per_seed"]) == 2
    for pairs in training["differences"].values():  # every pair, not only RL-Sparse's
        assert set(pairs) == {"rl_sparse - sparse_rl", "rl_sparse - untrained", "sparse_rl - untrained"}
        assert pairs["rl_sparse - sparse_rl"]["seeds"] == 2
    for run in RUNS:
        with safe_open(str(adapters / run / "adapter_model.safetensors"), "pt") as f:
            assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.float16"}
        config = json.loads((adapters / run / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "tiny"  # as given (--model), never a path of this machine
    assert (tmp_path / "curves.png").is_file()
    from gkv_train.evidence.tables import tables

    published = json.loads(results.read_text())
    for view in ("lr", "training", "rounds", "drift", "differences", "cost"):
        table = tables(view, published)
        assert training["commit"] in table and "partial" not in table
    assert "| sparse_rl |" in tables("training", published)
    assert "| rl_sparse seed 1 |" in tables("drift", published)
    assert "| rl_sparse | 2 | 2 |" in tables("cost", published)  # one step of each of two seeds, timed
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "gkv-train train " not in again.stderr  # read back, nothing rerun
    assert "gkv-train evaluate " not in again.stderr
    reread = json.loads(results.read_text())["training"]
    assert {k: v for k, v in reread.items() if k != "date"} == {k: v for k, v in training.items() if k != "date"}
    report = subprocess.run(
        [*command[: command.index("--stages")], "--stages", "report", *command[command.index("--stages") + 3 :]],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # rebuilt from the folders, nothing run
    assert report.returncode == 0, report.stderr[-3000:]
    assert "gkv-train train " not in report.stderr and "gkv-train evaluate " not in report.stderr
    rebuilt = json.loads(results.read_text())["training"]
    assert rebuilt["recipes"] == training["recipes"] and rebuilt["differences"] == training["differences"]
    shutil.rmtree(tmp_path / "out")  # a new machine: only the results file and the kept adapters are left
    fewer = [*command[: command.index("--seeds")], "--seeds", "0", *command[command.index("--seeds") + 3 :]]
    fewer += ["--eval-budgets", "24", "20", "--fresh-seeds", "2"]  # one seed, one more budget, fresh problems
    moved = subprocess.run(fewer, capture_output=True, text=True, timeout=600, check=False)
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert "gkv-train train " not in moved.stderr  # nothing trained again
    assert moved.stderr.count("gkv-train evaluate ") == 6  # the new conditions only: untrained and the two seed-0 runs
    assert moved.stderr.count("gkv-b24-seed2 plots=false seed=2") == 3  # the fresh problems: their own stream
    fresh = json.loads(results.read_text())["training"]
    assert list(fresh["recipes"]) == ["full", "gkv-b24", "gkv-b24-seed2", "gkv-b20"]
    assert fresh["differences"]["gkv-b24-seed2"]["rl_sparse - sparse_rl"]["seeds"] == 1
    assert "gkv-b24-seed2" in tables("training", {"training": fresh})
    models = fresh["models"]
    assert list(models) == ["untrained", *RUNS]  # seed 1, not asked for this time, stays
    for run in RUNS:
        assert models[run]["cells"]["gkv-b24"] == training["models"][run]["cells"]["gkv-b24"]
        assert models[run]["curve"] == training["models"][run]["curve"]
    assert models["rl_sparse-s0-lr0.0001"]["cells"]["gkv-b20"]["fp16_adapter"]  # its training folder is gone
    assert "fp16_adapter" not in models["untrained"]["cells"]["gkv-b20"]
    other = [
        *command[: command.index("--output-root")],
        "--temperature",
        "0.7",
        *command[command.index("--output-root") :],
    ]
    refused = subprocess.run(other, capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode != 0 and "temperature" in refused.stderr and "gkv-train train " not in refused.stderr
    other_rate = [*command[: command.index("--lr") + 1], "1e-3", *command[command.index("--lr") + 2 :]]
    refused_rate = subprocess.run(other_rate, capture_output=True, text=True, timeout=300, check=False)
    assert refused_rate.returncode != 0 and "learning rate 0.0001" in refused_rate.stderr
    no_rate = [*command[: command.index("--lr")], *command[command.index("--lr") + 2 :]]  # no sweep here either
    for stages in (["cross", "--cross-adapters", str(adapters)], ["report"]):  # would publish without its runs
        call = [*no_rate[: no_rate.index("--stages") + 1], *stages, *no_rate[no_rate.index("--stages") + 3 :]]
        refused_none = subprocess.run(call, capture_output=True, text=True, timeout=300, check=False)
        assert refused_none.returncode != 0 and "learning rate 0.0001: --lr 0.0001" in refused_none.stderr
    third_seed = [*command[: command.index("--seeds") + 1], "0", "1", "3", *command[command.index("--seeds") + 3 :]]
    bf16 = subprocess.run(  # the launcher's precision: rl_sparse would compose to bf16 training, pooled with fp32
        third_seed, capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **BF16}
    )
    assert bf16.returncode != 0 and "recipe rl_sparse now composes to other" in bf16.stderr
    assert "precision: 'fp32' there, 'bf16' here" in bf16.stderr and "output_dir=" not in bf16.stderr  # nothing run
    assert json.loads(results.read_text())["training"]["models"] == models  # left as it was


def test_a_variant_is_a_recipe_with_overrides_of_its_own(tmp_path, capsys):
    from gkv_train.evidence.command import parse_arguments
    from gkv_train.evidence.plan import training_runs
    from gkv_train.evidence.runs import train_keys

    ablation = ["--variant", "rl_sparse_noclip", "rl_sparse", "rl.overlong_advantage_clip=false"]
    args = parse_arguments(["--output-root", str(tmp_path), "--recipes", "rl_sparse", "rl_sparse_noclip", *ablation])
    assert training_runs(args, 1e-4)[:2] == [("rl_sparse", 0), ("rl_sparse_noclip", 0)]
    keys = train_keys("rl_sparse_noclip", 0, 1e-4, args)
    plain = train_keys("rl_sparse", 0, 1e-4, args)
    assert "recipe=rl_sparse" in keys and keys[-1] == "rl.overlong_advantage_clip=false"
    assert f"output_dir={tmp_path / 'train' / 'rl_sparse_noclip-s0-lr0.0001'}" in keys
    assert [k for k in keys if not k.startswith("output_dir=")][:-1] == [
        k for k in plain if not k.startswith("output_dir=")
    ]  # the same run otherwise
    tighter = ["--variant", "rl_sparse_b128", "rl_sparse", "compression.budget=128"]
    args = parse_arguments(["--output-root", str(tmp_path), "--recipes", "rl_sparse_b128", *tighter])
    keys = train_keys("rl_sparse_b128", 0, 1e-4, args)
    assert [k for k in keys if k.startswith("compression.budget=")] == ["compression.budget=128"]  # replaced
    for wrong in (
        ["--recipes", "rl_sparse_noclip"],  # not defined
        ["--variant", "rl_sparse", "rl_full", "seed=1"],  # a recipe's name
        ["--variant", "Bad-s1", "rl_sparse"],  # a name run folders cannot be parsed back from
        ["--variant", "x", "nope", "a=b"],  # no such recipe
        ["--variant", "x", "rl_sparse", "flag"],  # not an override
        ["--variant", "untrained", "rl_sparse", "a=b"],  # the untrained model's name
        ["--variant", "x", "rl_sparse", "seed=3"],  # a key the bench keeps track of runs by
        ["--variant", "x", "rl_sparse", "data.limit=8"],  # the problems: the same for every recipe
    ):
        with pytest.raises(SystemExit):
            parse_arguments(["--output-root", str(tmp_path), *wrong])
        assert "error:" in capsys.readouterr().err


def test_fresh_problems_are_checked_to_be_fresh(tmp_path, capsys):
    """``--fresh-seeds``: a seed whose test problems a stage trains on, chooses with or reports (the main
    evaluation's seed, the methods stage's seed 1) is refused, naming the overlap; a seed whose problems only
    ``train.py``'s own end-of-run evaluation also drew (a run's seed: nothing reads it) passes with a line saying
    so; a seed no run has passes silently; conditions and their seeds read back."""
    from gkv_train.evidence.command import parse_arguments
    from gkv_train.evidence.design import conditions, parse_condition
    from gkv_train.evidence.runs import check_fresh

    def call(*seeds):
        argv = ["--quick", "--seeds", "0", "2", "--output-root", str(tmp_path)]
        return parse_arguments([*argv, "--fresh-seeds", *map(str, seeds)])

    args = call(3, 5)
    check_fresh(args)
    assert "never read" not in capsys.readouterr().err
    assert conditions(args) == ["full", "gkv-b24", "gkv-b24-seed3", "gkv-b24-seed5"]
    assert conditions(args, fresh=False) == ["full", "gkv-b24"]
    seeded, full = parse_condition("gkv-b24-seed5", args), parse_condition("full", args)
    assert (seeded.method, seeded.budget, seeded.seed, seeded.run) == ("gkv", 24, 5, "gkv-b24")
    assert (full.method, full.budget, full.seed, full.run) == (None, None, 0, "full")
    check_fresh(call(2))  # seed 2's runs evaluated its first two test problems at their end, and nothing read them
    assert "2 of its problems are also in train.py's own evaluation, seed 2 (never read)" in capsys.readouterr().err
    for seed, what in ((0, "main evaluation"), (1, "methods stage")):
        with pytest.raises(SystemExit, match=f"--fresh-seeds {seed}: .* not fresh, .*{what}"):
            check_fresh(call(3, seed))


def test_the_methods_stage_keeps_the_rows_it_published(tmp_path):
    """The methods stage (--quick: every eviction method, the G-KV forms and S4R at budget 24) publishes each row
    as it comes; a later call with the same settings, on another machine (another output root: no evaluation
    folders), takes every row from the results file and runs nothing."""
    results = tmp_path / "results.json"

    def methods(root: str):
        command = [
            sys.executable,
            str(ROOT / "scripts" / "bench_rl_evidence.py"),
            "--quick",
            "--stages",
            "methods",
            "--output-root",
            str(tmp_path / root),
            "--results",
            str(results),
        ]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    first = methods("here")
    section = json.loads(results.read_text())["methods"]
    assert not section["partial"] and {"gkv", "gkv-mean", "gkv-sum", "s4r"} <= set(section["table"]["methods"])
    again = methods("elsewhere")
    assert "gkv-train evaluate " in first.stderr and "gkv-train evaluate " not in again.stderr
    assert json.loads(results.read_text())["methods"]["table"] == section["table"]


def test_seeds_resampled_on_their_own_assume_no_likeness_between_recipes():
    """The pre-registered interval resamples each recipe's seeds on its own (problems once per draw, shared): where
    seed s of one recipe equals seed s of the other plus a constant, the seed-paired interval is that constant
    alone while the independent one spreads with the seeds; the judged table reads it as fixed in advance."""
    from gkv_train.evidence.summary import compare
    from gkv_train.evidence.tables import JUDGED, judged_table
    from gkv_train.stats import independent_interval

    seeds = [[0.2] * 8, [0.5] * 8, [0.8] * 8]
    cells = {i: {"correct": [[v] for v in s]} for i, s in enumerate(seeds)}
    shifted = {i: {"correct": [[v + 0.1] for v in s]} for i, s in enumerate(seeds)}
    d = compare(shifted, cells)
    assert d["difference"] == pytest.approx(0.1) and d["ci95"] == pytest.approx([0.1, 0.1])
    assert d["difference_seeds_independent"] == pytest.approx(0.1) and d["seeds_independent"] == [3, 3]
    low, high = d["ci95_seeds_independent"]
    assert low < 0 < 0.1 < high  # the seeds' spread, which pairing hides
    assert independent_interval(seeds, seeds) == pytest.approx(independent_interval(seeds, seeds, seed=0))
    (pair, fresh, _), (_, main, _) = JUDGED["copy_recall"]
    variants = {"rl_sparse_noclip": {"recipe": "rl_sparse"}, "rl_full_noclip": {"recipe": "rl_full"}}
    section = {
        "settings": {"task": {"name": "copy_recall"}, "train": {"variants": variants, "seeds": [0, 1, 2]}},
        "differences": {fresh: {pair: d}, main: {pair: {**d, "ci95_seeds_independent": [0.01, 0.2]}}},
    }
    table = judged_table(section)
    row = f"| RL-Sparse minus RL-Full | {fresh} | 3 and 3 | +0.100 | [{low:+.3f}, {high:+.3f}] |"
    assert f"{row} +0.100 [+0.100, +0.100] over 3 | not separated (judged) |" in table
    assert (
        f"| {main} | 3 and 3 | +0.100 | [+0.010, +0.200] | +0.100 [+0.100, +0.100] over 3 | "
        "RL-Sparse better (reported) |" in table
    )
    section["settings"]["train"]["seeds"] = [0, 1, 2, 3]
    assert "not separated (judged), so far: 3 of 4 seeds |" in judged_table(section)
    section["settings"]["task"]["name"] = "long_recall"  # its two judged differences, none published yet
    assert "| RL-Sparse minus RL-Full | gkv-b128 | - |" in judged_table(section)
    assert "| RL-Sparse minus sparse_rl_noclip | gkv-b128 | - |" in judged_table(section)  # no variant: its name


def test_a_recipe_with_more_seeds_is_compared_over_all_of_them_when_seeds_stand_on_their_own():
    """Where one recipe has seeds the other lacks, the seed-paired difference stands on the seeds both have, and the
    independent one on every seed of each: extra seeds that score lower move the independent estimate and leave the
    paired one (a comparison over the common seeds alone would hide them); the untrained model's one evaluation
    counts once there, and pairs with every seed."""
    from gkv_train.evidence.summary import compare
    from gkv_train.evidence.tables import differences_table, judged_table

    def cell(value):
        return {"correct": [[value]] * 8}

    mine = {0: cell(0.8), 1: cell(0.8), 2: cell(0.8), 3: cell(0.2), 4: cell(0.2), 5: cell(0.2)}
    other = {0: cell(0.3), 1: cell(0.3), 2: cell(0.3)}
    d = compare(mine, other)
    assert d["seeds"] == 3 and d["difference"] == pytest.approx(0.5)  # seeds 0-2 only
    assert d["seeds_independent"] == [6, 3] and d["difference_seeds_independent"] == pytest.approx(0.2)
    low, high = d["ci95_seeds_independent"]
    assert low < 0.2 < high < 0.5  # the paired estimate lies outside it: the extra seeds count
    untrained = compare(mine, {None: cell(0.1)})
    assert untrained["seeds"] == 6 and untrained["seeds_independent"] == [6, 1]
    assert untrained["difference"] == pytest.approx(untrained["difference_seeds_independent"]) == pytest.approx(0.4)
    assert compare(mine, {7: cell(0.1)}) == {}  # no seed in common: nothing to pair
    condition, pair = "gkv-b128", "rl_sparse_noclip - sparse_rl_noclip"
    assert "+0.500 [+0.50, +0.50] * (3) / +0.200 [" in differences_table({"differences": {condition: {pair: d}}})
    section = {
        "settings": {"task": {"name": "long_recall"}, "train": {"seeds": [0, 1, 2]}},
        "differences": {condition: {pair: d}},
    }
    assert f"| {condition} | 6 and 3 | +0.200 | [{low:+.3f}, {high:+.3f}] | +0.500 [+0.500, +0.500] over 3 |" in (
        judged_table(section)
    )


def test_published_settings_of_an_earlier_version_are_read_under_todays_keys(monkeypatch):
    """A results file whose recipes were trained under keys since renamed (``sampling.max_new_tokens``, CHANGELOG
    2026-12-06; a method's own options under ``compression.options``, empty there when none was set, 2026-12-07) still
    matches a recipe that composes to the same values under today's keys (``moved.current_keys``); a value that
    differs is refused, named by today's key."""
    import argparse

    from gkv_train.evidence import published as memory

    old = {"sampling.max_new_tokens": 96, "sampling.num_generations": 8, "temperature": 0.6}
    old = {"rl_sparse": old, "sparse_rl": {**old, "compression.options.alpha": 0.5}, "rl_full": {**old}}
    old["rl_full"]["compression.options"] = {}
    monkeypatch.setattr(memory, "published", lambda args: {"settings": {"train": {"resolved": old}}})
    today = {"max_completion_length": 96, "num_generations": 8, "temperature": 0.6, "chunk_given": False}
    resolved = {"rl_sparse": today, "sparse_rl": {**today, "compression.alpha": 0.5}, "rl_full": today}
    args = argparse.Namespace(results=Path("results.json"), _resolved=resolved)
    memory.check_resolved(args)  # the same settings under their old names
    args._resolved = {**resolved, "rl_sparse": {**today, "max_completion_length": 128}}
    with pytest.raises(SystemExit, match="max_completion_length: 96 there, 128 here"):
        memory.check_resolved(args)
    args._resolved = {**resolved, "sparse_rl": {**today, "compression.alpha": 0.8}}
    with pytest.raises(SystemExit, match="compression.alpha: 0.5 there, 0.8 here"):
        memory.check_resolved(args)


def test_long_recall_runs_train_on_its_story_with_the_grpo_recipes_only(tmp_path, capsys):
    """``--task long_recall``: every run's task keys name it with its 80 sentences and the story's token budget, no
    copy_recall key; the fresh-problem check draws long_recall's problems; distillation (which refuses a given
    story) and copy_recall's ``--copy-share`` are refused before any work."""
    from gkv_train.evidence.command import parse_arguments
    from gkv_train.evidence.design import settings
    from gkv_train.evidence.runs import check_fresh, problem_texts, train_keys

    args = parse_arguments(
        ["--task", "long_recall", "--recipes", "rl_sparse", "rl_full", "--output-root", str(tmp_path)]
    )
    keys = train_keys("rl_sparse", 0, 3e-4, args)
    assert {"data.name=long_recall", "data.sentences=80", "max_completion_length=1040"} <= set(keys)
    assert "gradient_checkpointing=true" in keys and settings(args)["train"]["task_keys"] == keys[-1:]  # memory
    assert not [k for k in keys if "copy_" in k.split("=", 1)[0]] and settings(args)["task"] == {
        "name": "long_recall",
        "sentences": 80,
    }
    assert "has" in next(iter(problem_texts(args, "test", 0, 2)))  # long_recall's prompts
    args.fresh_seeds = [args.eval_seed]
    with pytest.raises(SystemExit, match="main evaluation"):
        check_fresh(args)
    nowhere = ["--stages", "cross", "--cross-adapters", str(tmp_path / "nowhere")]  # no kept adapters there
    for wrong in (["--recipes", "distill"], ["--copy-share", "0.5"], ["--probe-methods", "nope"], nowhere):
        with pytest.raises(SystemExit):
            parse_arguments(["--task", "long_recall", "--output-root", str(tmp_path), *wrong])
        assert "error:" in capsys.readouterr().err
    assert settings(parse_arguments(["--output-root", str(tmp_path)]))["task"]["copy_share"] == 0.4  # copy_recall's
    defaults = parse_arguments(["--task", "long_recall"])
    assert defaults.recipes == ["rl_sparse", "sparse_rl", "rl_full"] and defaults.round_bins == [0, 60, 64]
    assert "distill" in parse_arguments([]).recipes


def test_the_cross_stage_evaluates_the_other_tasks_models_once(tmp_path):
    """``--stages cross``: every kept adapter under ``--cross-adapters`` (here one LoRA adapter of the tiny model,
    as if trained on long_recall) is evaluated on this task with the full cache and at the training budget, beside
    the untrained model, and compared with it per problem (the ``cross`` table); a call on another machine (a new
    output root) takes the cells from the results file, evaluates nothing and keeps them all, the untrained
    model's too."""
    from peft import LoraConfig, get_peft_model

    from gkv_train.models import load_model

    adapters = tmp_path / "other_task"
    model, _ = load_model("tiny")
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(
        adapters / "rl_sparse-s0-lr0.0003"
    )
    (adapters / "notes").mkdir()  # not a run folder: left alone
    results = tmp_path / "results.json"

    def cross(root: str, folder: Path = adapters, ok: bool = True, stage: str = "cross") -> subprocess.CompletedProcess:
        command = [sys.executable, str(ROOT / "scripts" / "bench_rl_evidence.py"), "--quick"]  # no rate: none needed
        command += ["--seeds", "0", "--recipes", "rl_sparse", "--stages", stage, "--cross-adapters", str(folder)]
        command += ["--output-root", str(tmp_path / root), "--results", str(results)]
        command += ["--adapters", str(tmp_path / "kept"), "--figures", str(tmp_path / "c.png")]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
        return proc

    first = cross("here")
    assert first.stderr.count("gkv-train evaluate ") == 4  # untrained and the other task's run, full and gkv-b24
    assert not json.loads(results.read_text())["training"]["partial"]  # this folder holds the cross cells only
    assert not (tmp_path / "c.png").exists()  # no training curve to draw
    section = json.loads(results.read_text())["training"]["cross"]
    assert set(section["models"]) == {"rl_sparse-s0-lr0.0003"}
    for condition in ("full", "gkv-b24"):
        row = section["recipes"][condition]["rl_sparse"]
        assert row["seeds"] == 1 and "ci95" in row["minus_untrained"]
    from gkv_train.evidence.tables import tables

    cross_rows = tables("cross", json.loads(results.read_text()))
    assert "| rl_sparse | 1 |" in cross_rows and "| untrained | 1 |" in cross_rows
    assert cross_rows.index("| untrained |") < cross_rows.index("| rl_sparse |")
    assert "gkv-train evaluate " not in cross("here", stage="report").stderr
    assert not json.loads(results.read_text())["training"]["partial"]  # rebuilt, still whole
    held = json.loads(results.read_text())["training"]
    assert "gkv-train evaluate " not in cross("elsewhere").stderr
    moved = json.loads(results.read_text())["training"]  # the untrained model's cells stay, nothing is dropped
    assert moved["models"] == held["models"] and moved["cross"] == held["cross"]
    assert "gkv-train evaluate " not in cross("third").stderr
    shutil.copytree(adapters, tmp_path / "retrained")  # the same run names, other models: their cells are not these
    refused = cross("elsewhere", tmp_path / "retrained", ok=False)
    assert "holds the cross cells of the models under" in refused.stderr and "gkv-train evaluate " not in refused.stderr


def test_the_cost_of_a_step_is_read_from_the_runs_metrics_once_per_step(tmp_path):
    """``curve`` keeps a step logged twice (a run resumed after a kill) once, its last row; the ``cost`` view gives
    per recipe the median seconds of a step over every step of every run, each run's median, and the rollout's
    part."""
    from gkv_train.evidence.summary import curve
    from gkv_train.evidence.tables import cost_table

    rows = [
        {"step": 1, "loss": 0.1, "step_time": 10.0, "rollout/seconds": 6.0},
        {"step": 2, "loss": 0.1, "step_time": 99.0, "rollout/seconds": 90.0},  # killed, then logged again
        {"step": 2, "loss": 0.1, "step_time": 12.0, "rollout/seconds": 8.0},
        {"step": 2, "train_runtime": 30.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = curve(tmp_path)
    assert found["step_time"] == [[1, 10.0], [2, 12.0]] and found["rollout/seconds"] == [[1, 6.0], [2, 8.0]]
    other = {"step_time": [[1, 30.0], [2, 40.0]], "rollout/seconds": [[1, 20.0], [2, 20.0]]}
    section = {"models": {"a": {"recipe": "rl_sparse", "curve": found}, "b": {"recipe": "rl_sparse", "curve": other}}}
    # steps 10, 12, 30, 40: median 21; the runs' medians 11 and 35; rollout 6, 8, 20, 20: 14; the rest 4, 4, 10, 20: 7
    assert "| rl_sparse | 2 | 4 | 21 | 11, 35 | 14 | 7 |" in cost_table(section)
    assert cost_table({"models": {}}) == "(no step timed yet)\n"


def test_count_recall_runs_train_with_its_count_and_reward(tmp_path, capsys):
    """``--task count_recall``: every run's task keys name it with its count (no sentences, no copy_recall key) and
    its own reward (``staged_score``); the fresh-problem check draws its notes (one prompt for every problem);
    distillation is refused before any work."""
    from gkv_train.evidence.command import parse_arguments
    from gkv_train.evidence.design import settings
    from gkv_train.evidence.runs import problem_texts, train_keys

    args = parse_arguments(["--task", "count_recall", "--output-root", str(tmp_path)])
    keys = train_keys("rl_sparse", 0, 3e-4, args)
    assert {"data.name=count_recall", "data.count_to=160", "max_completion_length=640"} <= set(keys)
    assert "rewards=[gkv_rewards.functions.staged_score]" in keys and not [k for k in keys if "sentences" in k]
    assert settings(args)["task"] == {"name": "count_recall", "count_to": 160}
    assert settings(args)["train"]["reward"] == "gkv_rewards.functions.staged_score"
    notes = problem_texts(args, "test", 0, 3)
    assert len(notes) == 3 and all(n.startswith("Note: the code is") for n in notes)
    assert args.recipes == ["rl_sparse", "sparse_rl", "rl_full"]
    with pytest.raises(SystemExit):
        parse_arguments(["--task", "count_recall", "--output-root", str(tmp_path), "--recipes", "distill"])
    assert "error:" in capsys.readouterr().err


def test_eval_controls_and_the_hidden_number_are_conditions_and_task_keys(tmp_path, capsys):
    """``--eval-controls``: G-KV keeping each prompt and Random Attention at the training budget, after its G-KV
    cell, in the eval and cross stages, each an evaluate.py run of its method with its keys (the bench's window and
    interval); recorded in the settings only when asked. ``--number-in-prompt false``: long_recall's prompts
    without the number, in every run's task keys and the settings; refused for another task."""
    from gkv_train.evidence.command import parse_arguments
    from gkv_train.evidence.design import conditions, parse_condition, settings
    from gkv_train.evidence.plan import every_job
    from gkv_train.evidence.runs import problem_texts

    argv = ["--task", "long_recall", "--output-root", str(tmp_path), "--train-budget", "128", "--eval-budgets", "128"]
    args = parse_arguments([*argv, "--eval-controls", "keep_prompt", "random_attention", "--lr", "3e-4"])
    assert conditions(args) == ["full", "gkv-b128", "keep_prompt-b128", "random_attention-b128"]
    kept = parse_condition("keep_prompt-b128", args)
    assert (kept.method, kept.budget, kept.keys, kept.run) == ("gkv", 128, ["compression.keep_prompt=true"], "gkv-b128")
    assert parse_condition("random_attention-b128", args).run == "random_attention-b128"
    assert parse_condition("full", args).method is None and parse_condition("gkv-b96-seed3", args).seed == 3
    evaluations = {j.name.split("@")[1] for j in every_job(args) if j.kind == "eval"}
    assert {"keep_prompt-b128", "random_attention-b128"} <= evaluations
    assert settings(args)["eval"]["controls"] == ["keep_prompt", "random_attention"]
    plain = parse_arguments(argv)
    assert conditions(plain) == ["full", "gkv-b128"] and "controls" not in settings(plain)["eval"]
    with pytest.raises(ValueError, match="not an evaluation condition"):
        parse_condition("snapkv-b128", args)
    hidden = parse_arguments([*argv, "--number-in-prompt", "false"])
    assert settings(hidden)["task"] == {"name": "long_recall", "sentences": 80, "number_in_prompt": False}
    assert "number_in_prompt" not in settings(plain)["task"]
    assert not any(c.isdigit() for p in problem_texts(hidden, "test", 0, 4) for c in p)
    for wrong in (["--task", "copy_recall", "--number-in-prompt", "false"], [*argv, "--eval-controls", "snapkv"]):
        with pytest.raises(SystemExit):
            parse_arguments(["--output-root", str(tmp_path), *wrong])
        assert "error:" in capsys.readouterr().err


def test_the_controls_table_gives_the_share_of_the_gap_each_rule_closes():
    """(rule - G-KV) / (full - G-KV) per model, by hand: untrained 0.5 full, 0.25 G-KV, 0.5 under keep_prompt (all of
    the gap) and 0.25 under random_attention (none); a model without a gap shows "-". The control: a section without
    a rule has no table."""
    from gkv_train.evidence.tables import controls_table

    def figures(p: float, seeds: int = 1) -> dict:
        return {"pass@1": p, "pass@1_ci95": [p, p], "seeds": seeds}

    section = {
        "settings": {"train": {"budget": 128}},
        "cross": {
            "recipes": {
                "full": {"untrained": figures(0.5), "rl_full": figures(0.75, 2)},
                "gkv-b128": {"untrained": figures(0.25), "rl_full": figures(0.75, 2)},
                "keep_prompt-b128": {"untrained": figures(0.5), "rl_full": figures(0.5, 2)},
                "random_attention-b128": {"untrained": figures(0.25)},
            }
        },
    }
    rows = {line.split(" | ")[0][2:]: line[:-2].split(" | ") for line in controls_table(section).splitlines()[2:]}
    assert rows["untrained"][5] == "1.00" and rows["untrained"][7] == "0.00"
    assert rows["rl_full"][1] == "2" and rows["rl_full"][5] == "-" and rows["rl_full"][6] == "-"
    del section["cross"]["recipes"]["keep_prompt-b128"], section["cross"]["recipes"]["random_attention-b128"]
    assert controls_table(section) == "(no rule evaluated yet)\n"


def test_a_task_of_ones_own_by_name_or_file(tmp_path):
    """Any task gkv-train takes (``--task arithmetic``) or a file of one's own (``--data-path``, ``{split}`` for its
    train and test files): every run's keys name it, without the built-in tasks' sizes; GRPO's reward is the
    recipes' own unless ``--reward``; the fresh-problem check draws it as train.py does."""
    from gkv_train.evidence.command import parse_arguments
    from gkv_train.evidence.design import settings
    from gkv_train.evidence.runs import problem_texts, train_keys

    args = parse_arguments(["--task", "arithmetic", "--max-new-tokens", "32", "--lr", "1e-4"])
    keys = train_keys("rl_sparse", 0, 1e-4, args, make_traces=False)
    assert "data.name=arithmetic" in keys and "rewards=[gkv_rewards.functions.accuracy]" in keys
    assert not any(k.startswith(("data.sentences", "data.count_to", "data.copy")) for k in keys)
    assert settings(args)["task"] == {"name": "arithmetic"} and len(problem_texts(args, "test", 0, 5)) == 5

    for split in ("train", "test"):
        rows = [{"question": f"{split} {i} + 1 = ?", "answer": str(i + 1)} for i in range(6)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = str(tmp_path / "{split}.jsonl")
    args = parse_arguments(["--data-path", path, "--max-new-tokens", "8", "--reward", "gkv_rewards.functions.accuracy"])
    keys = train_keys("rl_full", 1, 1e-4, args, make_traces=False)
    assert "data.name=null" in keys and f"data.path='{path}'" in keys and "data.split=train" in keys
    assert problem_texts(args, "test", 0, 6) == {f"test {i} + 1 = ?" for i in range(6)}
    assert settings(args)["task"] == {"name": None, "path": path}


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--task", "no_such_task", "--max-new-tokens", "8"], "--task no_such_task: its train split cannot be read"),
        (["--task", "gsm8k", "--max-new-tokens", "8"], "--task gsm8k: its train split cannot be read"),
        (["--data-path", "missing/{split}.jsonl", "--max-new-tokens", "8"], "--data-path missing/{split}.jsonl"),
        (["--task", "arithmetic"], "--max-new-tokens: arithmetic has no default"),
        (["--task", "long_recall", "--data-path", "x.jsonl"], "--data-path replaces the task's problems"),
        (["--task", "arithmetic", "--max-new-tokens", "8", "--reward", "nowhere.nothing"], "--reward nowhere.nothing"),
    ],
)
def test_a_task_that_cannot_run_is_refused_before_any_work(argv, named, capsys, tmp_path):
    """An unknown task, a preset without a train split, a missing file, no length for a task without defaults, a
    file beside a built-in task, a reward that does not import: one ``error:`` line naming the argument, exit 2."""
    from gkv_train.evidence.command import parse_arguments

    with pytest.raises(SystemExit) as stop:
        parse_arguments([*argv, "--output-root", str(tmp_path / "out")])
    assert stop.value.code == 2 and named in capsys.readouterr().err


def test_compare_trains_and_evaluates_a_task_of_ones_own(tmp_path):
    """``gkv-train compare`` on a file of one's own (``--data-path``): a seed of RL-Sparse trained and evaluated
    with the full cache and under G-KV against the untrained model, the results holding its cells."""
    for split in ("train", "test"):
        rows = [{"question": f"What is {i} plus 2?", "answer": str(i + 2)} for i in range(8)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = tmp_path / "results.json"
    command = [
        *(sys.executable, "-m", "gkv_train.cli", "compare", "--quick", "--lr", "1e-4", "--seeds", "0"),
        *("--recipes", "rl_sparse", "--stages", "train", "eval", "--data-path", str(tmp_path / "{split}.jsonl")),
        *("--output-root", str(tmp_path / "out"), "--results", str(results), "--adapters", str(tmp_path / "kept")),
        *("--figures", str(tmp_path / "curves.png")),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    training = json.loads(results.read_text())["training"]
    assert training["settings"]["task"] == {"name": None, "path": str(tmp_path / "{split}.jsonl")}
    assert set(training["models"]) == {"untrained", "rl_sparse-s0-lr0.0001"} and not training["partial"]
    assert set(training["recipes"]["gkv-b24"]) == {"untrained", "rl_sparse"}
    assert "rewards=[gkv_rewards.functions.accuracy]" in done.stderr


def test_published_runs_compare_by_what_their_settings_mean(monkeypatch):
    """A published record written before a shared compression option was left to the method (``pool: max`` written
    out, ``compression.options: {}``, ``do_eval`` which no run reads) matches today's composition of the same run;
    a key added since is not held against it unless the earlier version ran otherwise (``chunk_given``: token by
    token before it existed). Controls: another pool, and a record without ``chunk_given`` against today's
    default, are refused naming the key."""
    import argparse

    from gkv_train.evidence import published as memory

    old = {"compression.method": "gkv", "compression.budget": 128, "compression.pool": "max", "temperature": 0.6}
    old = {"rl_sparse": {**old, "compression.options": {}, "do_eval": False}}
    monkeypatch.setattr(memory, "published", lambda args: {"settings": {"train": {"resolved": old}}})
    today = {"compression.method": "gkv", "compression.budget": 128, "compression.pool": None, "temperature": 0.6}
    today = {**today, "chunk_given": False, "data.count_to": 160}
    args = argparse.Namespace(results=Path("results.json"), _resolved={"rl_sparse": today})
    memory.check_resolved(args)
    args._resolved = {"rl_sparse": {**today, "compression.pool": "avg"}}
    with pytest.raises(SystemExit, match="compression.pool: 'max' there, 'avg' here"):
        memory.check_resolved(args)
    args._resolved = {"rl_sparse": {**today, "chunk_given": True}}
    with pytest.raises(SystemExit, match="chunk_given: False there, True here.*--train-keys"):
        memory.check_resolved(args)


def test_train_keys_reach_every_run_and_a_variant_keeps_its_own(capsys):
    """``--train-keys`` overrides every run's train.py keys (recorded in the settings); a variant's own override
    of the same key wins for its runs; a key the bench keeps track of (``seed``, ``data.*``) is refused."""
    from gkv_train.evidence.command import parse_arguments
    from gkv_train.evidence.design import settings
    from gkv_train.evidence.runs import train_keys

    argv = ["--lr", "1e-4", "--train-keys", "chunk_given=false", "steps_per_generation=2"]
    argv += ["--variant", "chunked", "rl_sparse", "chunk_given=true", "--recipes", "rl_sparse", "chunked"]
    args = parse_arguments(argv)
    plain, variant = (train_keys(name, 0, 1e-4, args, make_traces=False) for name in ("rl_sparse", "chunked"))
    assert {"chunk_given=false", "steps_per_generation=2"} <= set(plain) and "chunk_given=true" not in plain
    assert "chunk_given=true" in variant and "chunk_given=false" not in variant
    assert settings(args)["train"]["train_keys"] == ["chunk_given=false", "steps_per_generation=2"]
    with pytest.raises(SystemExit):
        parse_arguments(["--lr", "1e-4", "--train-keys", "data.limit=3"])
    assert "--train-keys: data.limit=3 would change the runs" in capsys.readouterr().err


def test_the_published_long_recall_runs_still_compose_as_todays_recipes():
    """results/bench_rl_evidence_long_recall.json's recipes, composed today with its own command: the same runs but
    for ``chunk_given`` (added since; its runs fed the story token by token), which ``--train-keys`` sets back."""
    import shlex

    from gkv_train.evidence import published as memory
    from gkv_train.evidence.command import parse_arguments

    found = json.loads((ROOT / "results" / "bench_rl_evidence_long_recall.json").read_text())["training"]
    argv = shlex.split(found["command"])[2:]
    with pytest.raises(SystemExit, match=r"\(chunk_given: False there, True here\)"):
        memory.check_resolved(parse_arguments(argv))
    memory.check_resolved(parse_arguments([*argv, "--train-keys", "chunk_given=false"]))


def test_count_recall_cells_say_where_each_completion_restated_the_code(tmp_path):
    """A count_recall evaluation's cell holds, per sample, how far the count had got when the completion first
    restated the note's code before the count's end (None: it did not); a recipe's figures give the share that do
    (per seed, and over seeds and problems with its interval) and the median count by then; the ``writing`` view
    shows them. The control: the same folder read as another task's has no such field, and the view says so."""
    from gkv_train.evidence.summary import samples_of, summarize_recipe
    from gkv_train.evidence.tables import writing_table

    note = "Note: the code is {code}.\n"
    count = "\n".join(str(i) for i in range(1, 11))
    texts = {  # problem -> its two completions: the code after the count; restated after 5 of 10; never
        0: [note + count + "\nCode: 1234", note + "1\n2\n3\n4\n5\nthe code is 1234\n" + count + "\nCode: 1234"],
        1: [note + "1\n2\n3", note + "5678\n" + count],
    }
    gold = {0: "1234", 1: "5678"}
    folder = tmp_path / "eval"
    (folder / "gkv-b24").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"runs": [{"run": "gkv-b24"}]}))
    rows = [
        {"problem_id": p, "completion": t.format(code=gold[p]), "gold": gold[p], "correct": 1, "score": 1.0}
        | {"length": 40}
        for p, pair in texts.items()
        for t in pair
    ]
    (folder / "gkv-b24" / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = samples_of(folder, "gkv-b24", count_to=10)
    assert found["restated"] == [[None, 0.5], [None, 0.0]]
    figures = summarize_recipe([found, found], interval=16, limit=64)
    assert figures["restated"] == 0.5 and figures["restated_per_seed"] == [0.5, 0.5]
    assert figures["restated_at_median"] == 0.25 and len(figures["restated_ci95"]) == 2  # of 0.5, 0, 0.5, 0
    section = {"recipes": {"gkv-b24": {"rl_sparse": figures}}}
    assert "| gkv-b24 | rl_sparse | 2 | 0.500 [" in writing_table(section)
    plain = samples_of(folder, "gkv-b24")
    assert "restated" not in plain and "restated" not in summarize_recipe([plain], interval=16, limit=64)
    section = {"recipes": {"gkv-b24": {"rl_sparse": summarize_recipe([plain], interval=16, limit=64)}}}
    assert writing_table(section) == "(no count_recall model evaluated yet)\n"


def test_a_kept_adapter_names_its_base_as_the_bench_was_given_it(tmp_path):
    """The run's own adapter config names its base resolved (a path of this machine); the kept fp16 copy names it as
    ``--model`` gave it, so a committed adapter holds no machine path. The control: the run's config is untouched."""
    import torch
    from safetensors.torch import save_file

    from gkv_train.evidence.runs import keep_adapter

    run = tmp_path / "run"
    run.mkdir()
    save_file({"w": torch.ones(2, dtype=torch.float32)}, run / "adapter_model.safetensors")
    (run / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "base"), "r": 2}))
    keep_adapter(run, tmp_path / "kept", replace=True, base="../outputs/base")
    kept = json.loads((tmp_path / "kept" / "adapter_config.json").read_text())
    assert kept == {"base_model_name_or_path": "../outputs/base", "r": 2}
    assert json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tmp_path / "base")
