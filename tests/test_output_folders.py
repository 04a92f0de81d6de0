"""Where each job may write (``gkv_train.runs.outputs``), through the real entry points on the tiny model: train.py,
scripts/evaluate.py, scripts/generate_traces.py and ``gkv-train export`` refuse, before any work, an output holding
what is not theirs (a user's folder, an exported model, a finished run, another traces file), the folder of the model
they read, an empty ``output_dir=``, a training set that cannot fill one generation batch, and a resume whose
optimizer state is missing or unlisted; every refusal names the folder and what to pass, and leaves every byte as
it was. The controls: an empty folder, ``overwrite=true``, a resume of the same run, an evaluation re-run into its
own folder and a re-export with ``--overwrite`` all work."""

import errno
import json
import shutil
from pathlib import Path

import pytest
from entry_points import run_each, run_warm

from faults.round5 import unlist_optimizer, write_users_folder  # the fault cases' setups: one home

ROOT = Path(__file__).resolve().parents[1]

TRAIN = ROOT / "train.py"
EVALUATE = ROOT / "scripts" / "evaluate.py"
TRACES = ROOT / "scripts" / "generate_traces.py"
# the issue's $T and $E: a one-step run, a one-problem evaluation (the settings every case starts from)
T = ["model=tiny", "max_steps=1", "data.limit=2", "max_completion_length=8", "eval_data.limit=1"]
T += ["prompts_per_step=1", "num_generations=2"]
E = ["model=tiny", "data.limit=1", "max_completion_length=8", "num_generations=1", "plots=false"]
R = ["model=tiny", "data.limit=1", "max_completion_length=4", "num_generations=1", "keep_incorrect=true"]
EXPORT = "import sys\nfrom gkv_train.cli import main\nmain()\n"  # `gkv-train ...` as a script run_each can run


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative name: equal before and after means nothing was lost."""
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(Path(folder).rglob("*")) if f.is_file()}


def refusal(result) -> str:
    """The one line of a run refused before any work: exit code 2, ``error: ...`` last on stderr, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), result.stderr[-3000:]
    return line


def ran(proc) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished two-step run trained into an empty folder made beforehand (the control: an empty folder is
    written), one saved with save_only_model=true, and the first one exported (into a new folder)."""
    root = tmp_path_factory.mktemp("runs")
    finished, model_only, exported = root / "finished", root / "model_only", root / "exported"
    finished.mkdir()
    ran(run_warm(TRAIN, [*T, "max_steps=2", f"output_dir={finished}"], ROOT))
    ran(run_warm(TRAIN, [*T, "save_only_model=true", f"output_dir={model_only}"], ROOT))
    (root / "export.py").write_text(EXPORT)
    ran(run_warm(root / "export.py", ["export", str(finished), str(exported)], root))
    return root


def copy(runs: Path, name: str, to: Path) -> Path:
    """A copy of the fixture's folder ``name`` at ``to`` (each case damages or offers its own)."""
    shutil.copytree(runs / name, to)
    return to


# (case, setup: tmp, runs, cwd -> (the folder that must stay byte for byte, overrides), words the refusal names ({tmp}:
# the case's folder, {cwd}: the current folder of every case, which the last one keeps whole))
TRAIN_CASES = [
    (
        "users-folder",  # 1: README.md and config.json were replaced by the model card and the model's config
        lambda tmp, runs, cwd: (write_users_folder(tmp / "mine"), [f"output_dir={tmp / 'mine'}"]),
        ["output_dir {tmp}/mine is not empty (README.md, config.json, notes.txt)", "overwrite=true"],
    ),
    (
        "users-folder-resume-last",  # resume=last found no checkpoint there and started from scratch into it
        lambda tmp, runs, cwd: (write_users_folder(tmp / "mine"), [f"output_dir={tmp / 'mine'}", "resume=last"]),
        ["output_dir {tmp}/mine is not empty", "holds no training run"],
    ),
    (
        "exported-model",  # 1: an exported model's folder written over by a run of another model
        lambda tmp, runs, cwd: (copy(runs, "exported", tmp / "exp"), [f"output_dir={tmp / 'exp'}"]),
        ["output_dir {tmp}/exp is not empty (README.md, config.json", "overwrite=true"],
    ),
    (
        "model-is-output-dir",  # 1: model=X output_dir=X: the base weights replaced by the trained ones
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [f"model={tmp / 'x'}", f"output_dir={tmp / 'x'}", "overwrite=true"],
        ),
        ["output_dir={tmp}/x is model={tmp}/x", "overwrite=true says"],
    ),
    (
        "model-inside-output-dir",  # overwrite=true would remove the checkpoint it trains from
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [f"model={tmp / 'x' / 'checkpoint-2'}", f"output_dir={tmp / 'x'}", "overwrite=true"],
        ),
        ["output_dir={tmp}/x holds model={tmp}/x/checkpoint-2"],
    ),
    (
        "model-is-output-dir-relative",  # the same folder named two ways, from the current folder
        lambda tmp, runs, cwd: (copy(runs, "exported", cwd / "x"), ["model=./x", "output_dir=x", "overwrite=true"]),
        ["output_dir=x is model=./x"],
    ),
    (
        "model-is-output-dir-linked",  # output_dir a link to the model's folder
        lambda tmp, runs, cwd: (
            copy(runs, "exported", tmp / "exp"),
            [f"model={tmp / 'exp'}", f"output_dir={link(tmp / 'link', tmp / 'exp')}", "overwrite=true"],
        ),
        ["output_dir={tmp}/link is model={tmp}/exp"],
    ),
    (
        "resume-other-run-into-a-run",  # review 1: the run there cut back to the checkpoint's step, written over
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [
                f"output_dir={tmp / 'x'}",
                f"resume={copy(runs, 'finished', tmp / 'other') / 'checkpoint-1'}",
                "resume_other_run=true",
                "max_steps=3",
            ],
        ),
        ["output_dir {tmp}/x holds another run", "starts in a new or empty folder"],
    ),
    (
        "tilde-output-dir",  # review 3: checked at $HOME/mine, written into ./~/mine (the user's)
        lambda tmp, runs, cwd: (write_users_folder(cwd / "~" / "mine"), ["output_dir='./~/mine'"]),
        ["output_dir {cwd}/~/mine is not empty (README.md, config.json, notes.txt)"],
    ),
    (
        "into-a-runs-checkpoint",  # review 4: overwrite=true cleared the checkpoint as a run's folder
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [f"output_dir={tmp / 'x' / 'checkpoint-2'}", "overwrite=true"],
        ),
        ["output_dir={tmp}/x/checkpoint-2 lies in a training run's folder {tmp}/x", "overwrite=true or not"],
    ),
    (
        "prompts-per-step-over-data",  # 5: 0 steps trained, the untrained model saved, rc 0
        lambda tmp, runs, cwd: (tmp, [f"output_dir={tmp / 'out'}", "prompts_per_step=3", "data.limit=2"]),
        ["data: 2 training prompts, fewer than one generation batch takes (3: prompts_per_step=3", "data.limit"],
    ),
    (
        "steps-per-generation-over-data",  # 5
        lambda tmp, runs, cwd: (tmp, [f"output_dir={tmp / 'out'}", "steps_per_generation=3"]),
        ["data: 2 training prompts, fewer than one generation batch takes (3:", "steps_per_generation=3"],
    ),
    (
        "resume-save-only-model",  # 6: a fresh optimizer and scheduler without a word
        lambda tmp, runs, cwd: (
            copy(runs, "model_only", tmp / "m"),
            [f"output_dir={tmp / 'm'}", "resume=last", "max_steps=2", "save_only_model=true"],
        ),
        ["checkpoint-1 holds no optimizer or scheduler state (optimizer.pt, scheduler.pt", "resume_model_only=true"],
    ),
    (
        "resume-manifest-without-optimizer",  # 6: the damage check passed, PytorchStreamReader failed after loading
        lambda tmp, runs, cwd: (
            unlist_optimizer(copy(runs, "finished", tmp / "x")),
            [f"output_dir={tmp / 'x'}", f"resume={tmp / 'x' / 'checkpoint-2'}", "max_steps=3"],
        ),
        ["checkpoint-2/optimizer.pt is not listed in its manifest"],
    ),
    (
        "resume-last-manifest-without-optimizer",  # every checkpoint so damaged: refused, not started from scratch
        lambda tmp, runs, cwd: (
            unlist_optimizer(copy(runs, "finished", tmp / "x")),
            [f"output_dir={tmp / 'x'}", "resume=last", "max_steps=3"],
        ),
        ["checkpoint-1: ", "checkpoint-2: ", "optimizer.pt is not listed in its manifest", "overwrite=true"],
    ),
    (
        "empty-output-dir",  # 4: output_dir= wrote hydra/ and train.log into the current folder, then crashed
        lambda tmp, runs, cwd: (cwd, ["output_dir="]),
        ["output_dir is empty", "output_dir=."],
    ),
]


def refusals(script, table, runs, tmp: Path, cwd: Path) -> dict:
    """``script`` once per row of ``table`` (one interpreter, ``run_each``), every case from the current folder
    ``cwd`` (the last row's, kept whole with what the rows put there) and with ``$HOME`` a folder that does not
    exist (a ``~`` that were expanded would find nothing there): per case, its result, its folder, the folder that
    must stay whole, its bytes before, and the words its refusal names."""
    cases = {}
    for name, setup, words in table:
        (tmp / name).mkdir()
        folder, overrides = setup(tmp / name, runs, cwd)
        words = [w.replace("{tmp}", str(tmp / name)).replace("{cwd}", str(cwd)) for w in words]
        cases[name] = (tmp / name, folder, folder_bytes(folder), words, overrides)
    base = {TRAIN: T, EVALUATE: E, TRACES: R}[script]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(tmp / "home"))
        results = run_each(script, [[*base, *case[-1]] for case in cases.values()], cwd=cwd)
    return {name: (result, *case[:4]) for (name, case), result in zip(cases.items(), results)}


def link(path: Path, target: Path) -> Path:
    """``path``, made a symbolic link to ``target``."""
    path.symlink_to(target)
    return path


def assert_refused_whole(result, folder: Path, before: dict, words: list[str]) -> None:
    """A refusal naming ``words`` that left ``folder`` as it was (nothing lost, nothing left behind)."""
    line = refusal(result)
    assert all(word in line for word in words), (words, line)
    assert folder_bytes(folder) == before, folder


@pytest.fixture(scope="module")
def train_refusals(runs, tmp_path_factory):
    """train.py once per TRAIN_CASES row (``refusals``)."""
    return refusals(TRAIN, TRAIN_CASES, runs, tmp_path_factory.mktemp("train"), tmp_path_factory.mktemp("cwd"))


@pytest.mark.parametrize("case", [name for name, _, _ in TRAIN_CASES])
def test_train_refuses_what_is_not_its_own_and_leaves_it_whole(train_refusals, case):
    result, tmp, folder, before, words = train_refusals[case]
    assert_refused_whole(result, folder, before, words)
    assert not (tmp / "out").exists()


def test_train_controls(runs, tmp_path):
    """The controls of the train rows: overwrite=true writes into the user's folder (the run's files of those names
    replaced, the user's notes kept), here with exactly one generation batch of prompts (data.limit=3,
    steps_per_generation=3: the boundary of the no-op refusal), which trains its step; a save_only_model checkpoint
    of another run, resumed into a new folder (resume_other_run=true: a new run there) with resume_model_only=true,
    trains on; resume_model_only is refused where the checkpoint holds its optimizer state; resume=last of a
    finished run is the same run (nothing to do), a save_only_model run's too (its optimizer state, which it lacks,
    is never loaded)."""
    mine = write_users_folder(tmp_path / "mine")
    ran(run_warm(TRAIN, [*T, "data.limit=3", "steps_per_generation=3", f"output_dir={mine}", "overwrite=true"], ROOT))
    assert (mine / "notes.txt").read_text() == "the user's notes.txt\n"
    assert json.loads((mine / "eval.json").read_text())["steps"] == 1
    assert "the user's" not in (mine / "README.md").read_text()
    model_only, moved = copy(runs, "model_only", tmp_path / "m"), tmp_path / "moved"
    resumed = [f"output_dir={moved}", f"resume={model_only / 'checkpoint-1'}", "resume_other_run=true", "max_steps=2"]
    ran(run_warm(TRAIN, [*T, *resumed, "save_only_model=true", "resume_model_only=true"], ROOT))
    assert json.loads((moved / "eval.json").read_text())["steps"] == 2
    finished = copy(runs, "finished", tmp_path / "x")
    flagged, again, again_model_only = run_each(
        TRAIN,
        [
            [*T, f"output_dir={finished}", "resume=last", "max_steps=2", "resume_model_only=true"],
            [*T, f"output_dir={finished}", "resume=last", "max_steps=2"],
            [*T, f"output_dir={model_only}", "resume=last", "save_only_model=true"],
        ],
        cwd=tmp_path,
    )
    assert "holds its optimizer and scheduler state, which a resume continues: drop resume_model_only" in refusal(
        flagged
    )
    assert again.returncode == 0 and "holds a finished run (2 steps, max_steps=2): nothing to do" in again.stderr
    assert again_model_only.returncode == 0, again_model_only.stderr[-3000:]
    assert "holds a finished run (1 steps, max_steps=1): nothing to do" in again_model_only.stderr


def test_the_rule_on_paths(tmp_path):
    """``check_output`` directly: a new folder inside a model's folder that is no training run's is written (review 6:
    train model=base output_dir=base/ft, an evaluation there, a traces file in a subfolder), a traces file directly in
    the model's folder is not; a folder where a run stopped before it wrote train.log (hydra/ only: review 7) is
    started afresh, also with resume=last."""
    from gkv_train.config.eval_config import EvalConfig, TracesConfig
    from gkv_train.runs.output_dir import RunFolder, check_run_folder, resume_checkpoint
    from gkv_train.runs.outputs import check_output

    base = write_users_folder(tmp_path / "base", ("config.json", "model.safetensors"))
    check_output("train", str(base / "ft"), "output_dir", inputs={"model": str(base)})
    check_output("evaluate", str(base / "eval"), "output_dir", inputs={"model": str(base)})
    check_output("traces", str(base / "sub" / "traces.jsonl"), "output", inputs={"model": str(base)})
    with pytest.raises(ValueError, match=f"output={base}/traces.jsonl lies inside model={base}: a file there"):
        check_output("traces", str(base / "traces.jsonl"), "output", inputs={"model": str(base)})
    started = tmp_path / "started"
    (started / "hydra").mkdir(parents=True)
    (started / "hydra" / "config.yaml").write_text("model: tiny\n")
    check_run_folder(RunFolder(output_dir=str(started)))
    check_run_folder(RunFolder(output_dir=str(started), resume="last"))
    assert resume_checkpoint(RunFolder(output_dir=str(started), resume="last"), None, "tiny") is None
    # review 3: a leading ~ is made the home folder once, in the configuration (as training's by TrainingArguments),
    # so that the check, which never expands, and the job read one path
    assert EvalConfig(output_dir="~/r").output_dir == TracesConfig(output="~/r").output == str(Path.home() / "r")


# (case, setup: tmp, runs, cwd -> (the folder that must stay byte for byte, overrides), words: as TRAIN_CASES)
EVALUATE_CASES = [
    (
        "into-a-finished-run",  # 2: the run's hydra/config.yaml (which export reads) and overrides.yaml replaced
        lambda tmp, runs, cwd: (copy(runs, "finished", tmp / "x"), [f"output_dir={tmp / 'x'}"]),
        ["output_dir {tmp}/x is a training run's folder (checkpoint-1, checkpoint-2, eval.json", "hydra/config.yaml"],
    ),
    (
        "into-a-finished-run-overwrite",
        lambda tmp, runs, cwd: (copy(runs, "finished", tmp / "x"), [f"output_dir={tmp / 'x'}", "overwrite=true"]),
        ["output_dir {tmp}/x is a training run's folder", "overwrite=true or not"],
    ),
    (
        "into-a-runs-checkpoint",  # review 4
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [f"output_dir={tmp / 'x' / 'checkpoint-2'}", "overwrite=true"],
        ),
        ["output_dir={tmp}/x/checkpoint-2 lies in a training run's folder {tmp}/x", "overwrite=true or not"],
    ),
    (
        "in-the-runs-folder-it-evaluates",  # review 6: refused as a run's inside, not as "over the model it reads"
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [f"model={tmp / 'x'}", f"output_dir={tmp / 'x' / 'eval'}"],
        ),
        ["output_dir={tmp}/x/eval lies in a training run's folder {tmp}/x"],
    ),
    (
        "model-is-output-dir",
        lambda tmp, runs, cwd: (copy(runs, "finished", tmp / "x"), [f"model={tmp / 'x'}", f"output_dir={tmp / 'x'}"]),
        ["output_dir={tmp}/x is model={tmp}/x"],
    ),
    (
        "users-folder",
        lambda tmp, runs, cwd: (
            write_users_folder(tmp / "mine", ("summary.json", "notes.txt")),
            [f"output_dir={tmp / 'mine'}"],
        ),
        ["output_dir {tmp}/mine is not empty (notes.txt, summary.json) and holds no evaluation", "overwrite=true"],
    ),
    (
        "tilde-output-dir",  # review 3: checked at $HOME/mine, written into ./~/mine (the user's)
        lambda tmp, runs, cwd: (
            write_users_folder(cwd / "~" / "mine", ("summary.json", "notes.txt")),
            ["output_dir='./~/mine'"],
        ),
        ["output_dir {cwd}/~/mine is not empty (notes.txt, summary.json)"],
    ),
    (
        "empty-output-dir",  # 4: a summary.json in the current folder replaced
        lambda tmp, runs, cwd: (write_users_folder(cwd, ("summary.json",)), ["output_dir="]),
        ["output_dir is empty"],
    ),
]


@pytest.fixture(scope="module")
def evaluate_refusals(runs, tmp_path_factory):
    """scripts/evaluate.py once per EVALUATE_CASES row (``refusals``)."""
    return refusals(EVALUATE, EVALUATE_CASES, runs, tmp_path_factory.mktemp("eval"), tmp_path_factory.mktemp("cwd"))


@pytest.mark.parametrize("case", [name for name, _, _ in EVALUATE_CASES])
def test_evaluate_refuses_what_is_not_its_own_and_leaves_it_whole(evaluate_refusals, case):
    result, _, folder, before, words = evaluate_refusals[case]
    assert_refused_whole(result, folder, before, words)


def test_evaluate_controls(tmp_path):
    """An evaluation into an empty folder, re-run into its own folder (its results reused), and overwrite=true into a
    user's folder (the evaluation's files of those names replaced, the user's other files kept)."""
    out = tmp_path / "eval"
    out.mkdir()
    first = run_warm(EVALUATE, [*E, f"output_dir={out}"], tmp_path)
    ran(first)
    samples = (out / "full" / "samples.jsonl").read_bytes()
    ran(run_warm(EVALUATE, [*E, f"output_dir={out}"], tmp_path))
    assert (out / "full" / "samples.jsonl").read_bytes() == samples
    mine = write_users_folder(tmp_path / "mine", ("summary.json", "notes.txt"))
    ran(run_warm(EVALUATE, [*E, f"output_dir={mine}", "overwrite=true"], tmp_path))
    assert (mine / "notes.txt").read_text() == "the user's notes.txt\n"
    assert json.loads((mine / "summary.json").read_text())["runs"][0]["run"] == "full"


TRACES_CASES = [
    (
        "over-a-runs-weights",  # 3: a run's model.safetensors replaced by a traces file
        lambda tmp, runs, cwd: (copy(runs, "finished", tmp / "x"), [f"output={tmp / 'x' / 'model.safetensors'}"]),
        ["output={tmp}/x/model.safetensors lies in a training run's folder {tmp}/x", "overwrite=true or not"],
    ),
    (
        "over-a-runs-metrics",  # 3
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [f"output={tmp / 'x' / 'metrics.jsonl'}", "overwrite=true"],
        ),
        ["output={tmp}/x/metrics.jsonl lies in a training run's folder"],
    ),
    (
        "over-a-runs-configuration",  # review 4: hydra/config.yaml (which export reads) replaced
        lambda tmp, runs, cwd: (
            copy(runs, "finished", tmp / "x"),
            [f"output={tmp / 'x' / 'hydra' / 'config.yaml'}", "overwrite=true"],
        ),
        ["output={tmp}/x/hydra/config.yaml lies in a training run's folder {tmp}/x", "overwrite=true or not"],
    ),
    (
        "over-other-traces",  # 3: a traces file made with other settings replaced
        lambda tmp, runs, cwd: (
            write_users_folder(tmp / "t", ("traces.jsonl",)),
            [f"output={tmp / 't' / 'traces.jsonl'}"],
        ),
        ["output={tmp}/t/traces.jsonl exists", "traces are not resumed", "overwrite=true"],
    ),
    (
        "over-other-traces-by-tilde",  # review 3: checked at $HOME/traces.jsonl, written over ./~/traces.jsonl
        lambda tmp, runs, cwd: (write_users_folder(cwd / "~", ("traces.jsonl",)), ["output='./~/traces.jsonl'"]),
        ["output={cwd}/~/traces.jsonl exists"],
    ),
    (
        "into-the-models-folder",
        lambda tmp, runs, cwd: (
            copy(runs, "exported", tmp / "exp"),
            [f"model={tmp / 'exp'}", f"output={tmp / 'exp' / 'traces.jsonl'}"],
        ),
        ["output={tmp}/exp/traces.jsonl lies inside model={tmp}/exp", "the model's own files"],
    ),
    ("empty-output", lambda tmp, runs, cwd: (cwd, ["output="]), ["output is empty"]),
]


def test_traces_refuse_what_is_not_their_own_and_leave_it_whole(runs, tmp_path):
    """scripts/generate_traces.py's rows (``refusals``), and the control: overwrite=true replaces a traces file."""
    (tmp_path / "cwd").mkdir()
    for result, _, folder, before, words in refusals(TRACES, TRACES_CASES, runs, tmp_path, tmp_path / "cwd").values():
        assert_refused_whole(result, folder, before, words)
    target = tmp_path / "over-other-traces" / "t" / "traces.jsonl"
    ran(run_warm(TRACES, [*R, f"output={target}", "overwrite=true"], tmp_path))
    assert json.loads(target.read_text().splitlines()[0])["completion_ids"]


def test_export_refuses_what_is_not_its_own_and_checks_before_writing(runs, tmp_path):
    """``gkv-train export``: a folder holding an earlier export (without --overwrite), the run's own folder, a folder
    or a checkpoint inside it, another training run's folder (with --overwrite too), a LoRA run's local base model
    (review 2: replaced by the merged model), and a run whose hydra/config.yaml is a list or not YAML (13: found after
    the merged weights were written) are refused before anything is written; the control: --overwrite replaces an
    earlier export, its shards and their index (review 10) included."""
    finished = runs / "finished"
    exported = copy(runs, "exported", tmp_path / "exp")
    other = copy(runs, "finished", tmp_path / "other")
    listed, broken = copy(runs, "finished", tmp_path / "listed"), copy(runs, "finished", tmp_path / "broken")
    (listed / "hydra" / "config.yaml").write_text("- model\n- tiny\n")
    (broken / "hydra" / "config.yaml").write_text("model: [tiny\n")
    lora, base = copy(runs, "finished", tmp_path / "lora"), copy(runs, "exported", tmp_path / "base")
    adapter = lora / "adapter_config.json"
    adapter.write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": str(base)}))
    inside = f"lies in a training run's folder {finished}"
    cases = [
        ([finished, exported], exported, [f"OUT_DIR {exported} is not empty (README.md, config.json", "--overwrite"]),
        ([finished, finished, "--overwrite"], finished, [f"OUT_DIR={finished} is RUN_DIR={finished}"]),
        ([finished, finished / "sub"], finished, [f"OUT_DIR={finished / 'sub'} {inside}"]),
        (
            [finished, finished / "checkpoint-2", "--overwrite"],
            finished,
            [f"OUT_DIR={finished / 'checkpoint-2'} {inside}"],
        ),
        ([finished, other, "--overwrite"], other, [f"OUT_DIR {other} is a training run's folder"]),
        ([lora, base, "--overwrite"], base, [f"OUT_DIR={base} is {adapter}'s base_model_name_or_path={base}"]),
        ([listed, tmp_path / "a"], listed, [f"{listed / 'hydra' / 'config.yaml'} is damaged (it holds a list"]),
        ([broken, tmp_path / "b"], broken, [f"{broken / 'hydra' / 'config.yaml'} is damaged (not YAML"]),
    ]
    befores = [folder_bytes(folder) for _, folder, _ in cases]
    (tmp_path / "export.py").write_text(EXPORT)
    argvs = [["export", *map(str, words)] for words, _, _ in cases]
    results = run_each(tmp_path / "export.py", argvs, cwd=tmp_path)
    for (argv, folder, words), before, result in zip(cases, befores, results):
        line = refusal(result)
        assert all(word in line for word in words), (argv, line)
        assert folder_bytes(folder) == before, argv
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    for name in ("model-00002-of-00002.safetensors", "model.safetensors.index.json"):
        (exported / name).write_text("an earlier export's shard and index")
    ran(run_warm(tmp_path / "export.py", ["export", str(finished), str(exported), "--overwrite"], tmp_path))
    assert not (exported / "model-00002-of-00002.safetensors").exists()
    assert not (exported / "model.safetensors.index.json").exists()
    again, first = folder_bytes(exported), folder_bytes(runs / "exported")
    assert again.pop("README.md") != first.pop("README.md")  # the card names its own folder
    assert again.pop(".run.lock") != first.pop(".run.lock")  # each export's lock names its process
    assert again == first


def test_export_writes_whole_or_not_at_all_under_its_lock(runs, tmp_path, monkeypatch):
    """Review 10: an export holds OUT_DIR's lock while it writes (a training run or another export into the folder
    is refused meanwhile), and saves into a staging folder first: a save that fails (a full disk) leaves the earlier
    export whole and no staging folder; one that an interrupted export left is no one's (no --overwrite needed)
    and goes."""
    from transformers import PreTrainedModel

    from gkv_train.exits import RunLocked
    from gkv_train.export import export
    from gkv_train.runs.runlock import RunLock

    exported = copy(runs, "exported", tmp_path / "exp")
    (exported / ".run.lock").unlink(missing_ok=True)
    before, seen = folder_bytes(exported), []

    def full_disk(model, folder, *args, **kwargs):
        try:
            RunLock.acquire(exported, "output_dir").release()
            seen.append("free")
        except RunLocked:
            seen.append("locked")
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(PreTrainedModel, "save_pretrained", full_disk)
        with pytest.raises(OSError, match="No space left on device while writing the exported model"):
            export(runs / "finished", exported, overwrite=True)
    assert seen == ["locked"]
    after = folder_bytes(exported)
    after.pop(".run.lock")
    assert after == before
    fresh = tmp_path / "fresh"
    (fresh / ".export-staging").mkdir(parents=True)
    (fresh / ".export-staging" / "model.safetensors").write_text("an interrupted export's part")
    export(runs / "finished", fresh)
    assert not (fresh / ".export-staging").exists() and (fresh / "model.safetensors").stat().st_size > 100
