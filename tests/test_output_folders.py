"""Where each job may write (``gkv_train.runs.outputs``), through the real entry points on the tiny model: train.py,
scripts/evaluate.py, scripts/generate_traces.py and ``gkv-train export`` refuse, before any work, an output holding
what is not theirs (a user's folder, an exported model, a finished run, another traces file), the folder of the model
they read, an empty ``output_dir=``, a training set that cannot fill one generation batch, and a resume whose
optimizer state is missing or unlisted; every refusal names the folder and what to pass, and leaves every byte as
it was. The controls: an empty folder, ``overwrite=true``, a resume of the same run, an evaluation re-run into its
own folder and a re-export with ``--overwrite`` all work."""

import json
import shutil
from pathlib import Path

import pytest
from entry_points import run_each, run_warm

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


def users_folder(folder: Path, files=("README.md", "config.json", "notes.txt")) -> Path:
    """A folder of the user's: a README, a configuration and notes that are no run's."""
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).write_text(f"the user's {name}\n")
    return folder


def unlisted_optimizer(run: Path) -> Path:
    """Every checkpoint of ``run`` with optimizer.pt damaged (a byte flipped) and left out of its manifest."""
    for checkpoint in sorted(run.glob("checkpoint-*")):
        manifest = json.loads((checkpoint / "manifest.json").read_text())
        del manifest["files"]["optimizer.pt"]
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))
        data = bytearray((checkpoint / "optimizer.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (checkpoint / "optimizer.pt").write_bytes(bytes(data))
    return run


# (case, setup: tmp, runs -> (the folder that must stay byte for byte, overrides), words the refusal names)
TRAIN_CASES = [
    (
        "users-folder",  # 1: README.md and config.json were replaced by the model card and the model's config
        lambda tmp, runs: (users_folder(tmp / "mine"), [f"output_dir={tmp / 'mine'}"]),
        ["output_dir {tmp}/mine is not empty (README.md, config.json, notes.txt)", "overwrite=true"],
    ),
    (
        "users-folder-resume-last",  # resume=last found no checkpoint there and started from scratch into it
        lambda tmp, runs: (users_folder(tmp / "mine"), [f"output_dir={tmp / 'mine'}", "resume=last"]),
        ["output_dir {tmp}/mine is not empty", "holds no training run"],
    ),
    (
        "exported-model",  # 1: an exported model's folder written over by a run of another model
        lambda tmp, runs: (copy(runs, "exported", tmp / "exp"), [f"output_dir={tmp / 'exp'}"]),
        ["output_dir {tmp}/exp is not empty (README.md, config.json", "overwrite=true"],
    ),
    (
        "model-is-output-dir",  # 1: model=X output_dir=X: the base weights replaced by the trained ones
        lambda tmp, runs: (
            copy(runs, "finished", tmp / "x"),
            [f"model={tmp / 'x'}", f"output_dir={tmp / 'x'}", "overwrite=true"],
        ),
        ["output_dir={tmp}/x is model={tmp}/x", "overwrite=true says"],
    ),
    (
        "model-inside-output-dir",  # overwrite=true would remove the checkpoint it trains from
        lambda tmp, runs: (
            copy(runs, "finished", tmp / "x"),
            [f"model={tmp / 'x' / 'checkpoint-2'}", f"output_dir={tmp / 'x'}", "overwrite=true"],
        ),
        ["output_dir={tmp}/x holds model={tmp}/x/checkpoint-2"],
    ),
    (
        "output-dir-inside-model",
        lambda tmp, runs: (
            copy(runs, "exported", tmp / "exp"),
            [f"model={tmp / 'exp'}", f"output_dir={tmp / 'exp/run'}"],
        ),
        ["output_dir={tmp}/exp/run lies inside model={tmp}/exp"],
    ),
    (
        "empty-output-dir",  # 4: output_dir= wrote hydra/ and train.log into the current folder, then crashed
        lambda tmp, runs: (tmp, ["output_dir="]),
        ["output_dir is empty", "output_dir=."],
    ),
    (
        "prompts-per-step-over-data",  # 5: 0 steps trained, the untrained model saved, rc 0
        lambda tmp, runs: (tmp, [f"output_dir={tmp / 'out'}", "prompts_per_step=3", "data.limit=2"]),
        ["data: 2 training prompts, fewer than one generation batch takes (3: prompts_per_step=3", "data.limit"],
    ),
    (
        "steps-per-generation-over-data",  # 5
        lambda tmp, runs: (tmp, [f"output_dir={tmp / 'out'}", "steps_per_generation=3"]),
        ["data: 2 training prompts, fewer than one generation batch takes (3:", "steps_per_generation=3"],
    ),
    (
        "resume-save-only-model",  # 6: a fresh optimizer and scheduler without a word
        lambda tmp, runs: (
            copy(runs, "model_only", tmp / "m"),
            [f"output_dir={tmp / 'm'}", "resume=last", "max_steps=2", "save_only_model=true"],
        ),
        ["checkpoint-1 holds no optimizer or scheduler state (optimizer.pt, scheduler.pt", "resume_model_only=true"],
    ),
    (
        "resume-manifest-without-optimizer",  # 6: the damage check passed, PytorchStreamReader failed after loading
        lambda tmp, runs: (
            unlisted_optimizer(copy(runs, "finished", tmp / "x")),
            [f"output_dir={tmp / 'x'}", f"resume={tmp / 'x' / 'checkpoint-2'}", "max_steps=3"],
        ),
        ["checkpoint-2/optimizer.pt is not listed in its manifest"],
    ),
    (
        "resume-last-manifest-without-optimizer",  # every checkpoint so damaged: refused, not started from scratch
        lambda tmp, runs: (
            unlisted_optimizer(copy(runs, "finished", tmp / "x")),
            [f"output_dir={tmp / 'x'}", "resume=last", "max_steps=3"],
        ),
        ["checkpoint-1: ", "checkpoint-2: ", "optimizer.pt is not listed in its manifest", "overwrite=true"],
    ),
]


@pytest.fixture(scope="module")
def train_refusals(runs, tmp_path_factory):
    """train.py once per TRAIN_CASES row (one interpreter, ``run_each``), all from the current folder of the
    empty-output-dir case (the others name their folders in full): per case, its result, its tmp folder, the
    folder that must stay whole and its bytes before."""
    cases = {}
    for name, setup, _ in TRAIN_CASES:
        tmp = tmp_path_factory.mktemp(name)
        folder, overrides = setup(tmp, runs)
        cases[name] = (tmp, folder, folder_bytes(folder), [*T, *overrides])
    results = run_each(TRAIN, [argv for *_, argv in cases.values()], cwd=cases["empty-output-dir"][0])
    return {name: (result, *case[:3]) for (name, case), result in zip(cases.items(), results)}


@pytest.mark.parametrize("case, words", [(name, words) for name, _, words in TRAIN_CASES])
def test_train_refuses_what_is_not_its_own_and_leaves_it_whole(train_refusals, case, words):
    result, tmp, folder, before = train_refusals[case]
    line = refusal(result)
    for word in words:
        assert word.replace("{tmp}", str(tmp)) in line, line
    assert folder_bytes(folder) == before  # nothing lost, nothing left behind (hydra/, train.log, the folder)
    assert not (tmp / "out").exists()


def test_train_controls(runs, tmp_path):
    """The controls of the train rows: overwrite=true writes into the user's folder (the run's files of those names
    replaced, the user's notes kept); a resume of a save_only_model checkpoint trains with resume_model_only=true
    (and that flag is refused where the checkpoint holds its optimizer state); resume=last of the finished run is
    the same run (nothing to do)."""
    mine = users_folder(tmp_path / "mine")
    ran(run_warm(TRAIN, [*T, f"output_dir={mine}", "overwrite=true"], ROOT))
    assert (mine / "notes.txt").read_text() == "the user's notes.txt\n" and (mine / "eval.json").is_file()
    assert "the user's" not in (mine / "README.md").read_text()
    model_only = copy(runs, "model_only", tmp_path / "m")
    resumed = [*T, f"output_dir={model_only}", "resume=last", "max_steps=2", "save_only_model=true"]
    ran(run_warm(TRAIN, [*resumed, "resume_model_only=true"], ROOT))
    assert json.loads((model_only / "eval.json").read_text())["steps"] == 2
    finished = copy(runs, "finished", tmp_path / "x")
    flagged, again = run_each(
        TRAIN,
        [
            [*T, f"output_dir={finished}", "resume=last", "max_steps=2", "resume_model_only=true"],
            [*T, f"output_dir={finished}", "resume=last", "max_steps=2"],
        ],
        cwd=tmp_path,
    )
    assert "holds its optimizer and scheduler state, which a resume continues: drop resume_model_only" in refusal(
        flagged
    )
    assert again.returncode == 0 and "holds a finished run (2 steps, max_steps=2): nothing to do" in again.stderr


# (case, setup: tmp, runs -> (the folder that must stay byte for byte, overrides), words the refusal names)
EVALUATE_CASES = [
    (
        "into-a-finished-run",  # 2: the run's hydra/config.yaml (which export reads) and overrides.yaml replaced
        lambda tmp, runs: (copy(runs, "finished", tmp / "x"), [f"output_dir={tmp / 'x'}"]),
        ["output_dir {tmp}/x is a training run's folder (checkpoint-1, checkpoint-2, eval.json", "hydra/config.yaml"],
    ),
    (
        "into-a-finished-run-overwrite",
        lambda tmp, runs: (copy(runs, "finished", tmp / "x"), [f"output_dir={tmp / 'x'}", "overwrite=true"]),
        ["output_dir {tmp}/x is a training run's folder", "overwrite=true or not"],
    ),
    (
        "model-is-output-dir",
        lambda tmp, runs: (copy(runs, "finished", tmp / "x"), [f"model={tmp / 'x'}", f"output_dir={tmp / 'x'}"]),
        ["output_dir={tmp}/x is model={tmp}/x"],
    ),
    (
        "users-folder",
        lambda tmp, runs: (
            users_folder(tmp / "mine", ("summary.json", "notes.txt")),
            [f"output_dir={tmp / 'mine'}"],
        ),
        ["output_dir {tmp}/mine is not empty (notes.txt, summary.json) and holds no evaluation", "overwrite=true"],
    ),
    (
        "empty-output-dir",  # 4: a summary.json in the current folder replaced
        lambda tmp, runs: (users_folder(tmp / "cwd", ("summary.json",)), ["output_dir="]),
        ["output_dir is empty"],
    ),
]


def test_evaluate_refuses_what_is_not_its_own_and_leaves_it_whole(runs, tmp_path):
    """scripts/evaluate.py's rows (one interpreter, from the empty-output-dir case's folder)."""
    cases = []
    for name, setup, words in EVALUATE_CASES:
        (tmp_path / name).mkdir()
        folder, overrides = setup(tmp_path / name, runs)
        cases.append((name, tmp_path / name, folder, folder_bytes(folder), [*E, *overrides], words))
    cwd = tmp_path / "empty-output-dir" / "cwd"
    results = run_each(EVALUATE, [case[-2] for case in cases], cwd=cwd)
    for (name, tmp, folder, before, _, words), result in zip(cases, results):
        line = refusal(result)
        assert all(word.replace("{tmp}", str(tmp)) in line for word in words), (name, line)
        assert folder_bytes(folder) == before, name


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
    mine = users_folder(tmp_path / "mine", ("summary.json", "notes.txt"))
    ran(run_warm(EVALUATE, [*E, f"output_dir={mine}", "overwrite=true"], tmp_path))
    assert (mine / "notes.txt").read_text() == "the user's notes.txt\n"
    assert json.loads((mine / "summary.json").read_text())["runs"][0]["run"] == "full"


TRACES_CASES = [
    (
        "over-a-runs-weights",  # 3: a run's model.safetensors replaced by a traces file
        lambda tmp, runs: (copy(runs, "finished", tmp / "x"), [f"output={tmp / 'x' / 'model.safetensors'}"]),
        ["output={tmp}/x/model.safetensors lies in a training run's folder {tmp}/x", "overwrite=true or not"],
    ),
    (
        "over-a-runs-metrics",  # 3
        lambda tmp, runs: (
            copy(runs, "finished", tmp / "x"),
            [f"output={tmp / 'x' / 'metrics.jsonl'}", "overwrite=true"],
        ),
        ["output={tmp}/x/metrics.jsonl lies in a training run's folder"],
    ),
    (
        "over-other-traces",  # 3: a traces file made with other settings replaced
        lambda tmp, runs: (users_folder(tmp / "t", ("traces.jsonl",)), [f"output={tmp / 't' / 'traces.jsonl'}"]),
        ["output={tmp}/t/traces.jsonl exists", "traces are not resumed", "overwrite=true"],
    ),
    (
        "into-the-models-folder",
        lambda tmp, runs: (
            copy(runs, "exported", tmp / "exp"),
            [f"model={tmp / 'exp'}", f"output={tmp / 'exp' / 'traces.jsonl'}"],
        ),
        ["output={tmp}/exp/traces.jsonl lies inside model={tmp}/exp"],
    ),
    ("empty-output", lambda tmp, runs: (tmp, ["output="]), ["output is empty"]),
]


def test_traces_refuse_what_is_not_their_own_and_leave_it_whole(runs, tmp_path):
    """scripts/generate_traces.py's rows (one interpreter, from the empty-output case's folder), and the control:
    overwrite=true replaces a traces file."""
    cases = []
    for name, setup, words in TRACES_CASES:
        (tmp_path / name).mkdir()
        folder, overrides = setup(tmp_path / name, runs)
        cases.append((name, tmp_path / name, folder, folder_bytes(folder), [*R, *overrides], words))
    results = run_each(TRACES, [case[-2] for case in cases], cwd=tmp_path / "empty-output")
    for (name, tmp, folder, before, _, words), result in zip(cases, results):
        line = refusal(result)
        assert all(word.replace("{tmp}", str(tmp)) in line for word in words), (name, line)
        assert folder_bytes(folder) == before, name
    target = tmp_path / "over-other-traces" / "t" / "traces.jsonl"
    ran(run_warm(TRACES, [*R, f"output={target}", "overwrite=true"], tmp_path))
    assert json.loads(target.read_text().splitlines()[0])["completion_ids"]


def test_export_refuses_what_is_not_its_own_and_checks_before_writing(runs, tmp_path):
    """``gkv-train export``: a folder holding an earlier export (without --overwrite), the run's own folder, a folder
    inside it, another training run's folder (with --overwrite too), and a run whose hydra/config.yaml is a list or
    not YAML (13: found after the merged weights were written) are refused before anything is written; the control:
    --overwrite replaces an earlier export."""
    finished = runs / "finished"
    exported = copy(runs, "exported", tmp_path / "exp")
    other = copy(runs, "finished", tmp_path / "other")
    listed, broken = copy(runs, "finished", tmp_path / "listed"), copy(runs, "finished", tmp_path / "broken")
    (listed / "hydra" / "config.yaml").write_text("- model\n- tiny\n")
    (broken / "hydra" / "config.yaml").write_text("model: [tiny\n")
    cases = [
        ([finished, exported], exported, [f"OUT_DIR {exported} is not empty (README.md, config.json", "--overwrite"]),
        ([finished, finished, "--overwrite"], finished, [f"OUT_DIR={finished} is RUN_DIR={finished}"]),
        ([finished, finished / "sub"], finished, [f"OUT_DIR={finished / 'sub'} lies inside RUN_DIR={finished}"]),
        ([finished, other, "--overwrite"], other, [f"OUT_DIR {other} is a training run's folder"]),
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
    (exported / "model-00002-of-00002.safetensors").write_text("an earlier export's shard")
    ran(run_warm(tmp_path / "export.py", ["export", str(finished), str(exported), "--overwrite"], tmp_path))
    assert not (exported / "model-00002-of-00002.safetensors").exists()
    again, first = folder_bytes(exported), folder_bytes(runs / "exported")
    assert again.pop("README.md") != first.pop("README.md") and again == first  # the card names its own folder
