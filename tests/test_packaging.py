"""The packages as a user installs them: three wheels (not editable), ``gkv_train`` with the recipes inside,
``gkv_rollout`` and ``gkv_rewards``, whose ``gkv-train`` command works from any folder."""

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# one worker: the wheels are built from the source folders (their build/ and *.egg-info), once
pytestmark = pytest.mark.xdist_group("packaging")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(folder the wheels were installed into, the file names of each wheel by its distribution folder, the
    wheels' paths)."""
    build, target = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("site")
    try:
        import setuptools

        isolation = [] if int(setuptools.__version__.split(".")[0]) < 68 else ["--no-build-isolation"]
    except ImportError:
        isolation = []
    pip = [sys.executable, "-m", "pip", "-q"]
    folders = {"gkv_train": ROOT, "gkv_rollout": ROOT / "rollout", "gkv_rewards": ROOT / "rewards"}
    # the builds write into the source folders (build/, *.egg-info): one at a time, whichever worker runs them (a
    # fresh-clone CI run once had two workers building there at once: "File exists: build/bdist...")
    lock = Path(tempfile.gettempdir()) / f"gkv-wheels-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]}.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        subprocess.run(
            [*pip, "wheel", "--no-deps", *isolation, "-w", str(build), *map(str, folders.values())], check=True
        )
    wheels = {name: next(build.glob(f"{name}-*.whl")) for name in folders}
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), *map(str, wheels.values())], check=True)
    return target, {name: zipfile.ZipFile(wheel).namelist() for name, wheel in wheels.items()}, list(wheels.values())


def run(target: Path, folder: Path, *args: str, **env) -> subprocess.CompletedProcess:
    """``gkv-train ARGS`` from the installed copy only: PYTHONPATH is the install folder, never the checkout."""
    environ = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1", **env}
    command = [sys.executable, str(target / "bin" / "gkv-train"), *args]
    return subprocess.run(command, check=False, cwd=folder, env=environ, capture_output=True, text=True, timeout=600)


def test_each_wheel_holds_one_package(installed):
    _, wheels, _ = installed
    for package, names in wheels.items():
        top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        assert top == {package}, top  # no generic top-level rollout / rewards / recipes
    expected = {
        "gkv_rollout": ["gkv_rollout/engine.py", "gkv_rollout/contract/eviction.py"],
        "gkv_rewards": ["gkv_rewards/verify.py", "gkv_rewards/worker.py"],
        "gkv_train": ["gkv_train/recipes/train.yaml", "gkv_train/recipes/recipe/rl_sparse.yaml", "gkv_train/cli.py"],
    }
    for package, names in expected.items():
        assert set(names) <= set(wheels[package]), (package, set(names) - set(wheels[package]))
    # every subpackage of the checkout ships (gkv_train.evidence, behind gkv-train compare, once did not)
    for package, folder in (("gkv_train", ROOT / "gkv_train"), ("gkv_rollout", ROOT / "rollout" / "gkv_rollout")):
        inits = {str(p.relative_to(folder.parent)) for p in folder.rglob("__init__.py")}
        assert inits <= set(wheels[package]), (package, inits - set(wheels[package]))


def test_command_runs_from_any_folder(installed, tmp_path):
    target, _, _ = installed
    assert "gkv-train train" in run(target, tmp_path).stdout
    bad = run(target, tmp_path, "fit")
    assert bad.returncode != 0 and "unknown command 'fit'" in bad.stderr
    compare = run(target, tmp_path, "compare", "--help")
    assert compare.returncode == 0 and "--recipes" in compare.stdout, compare.stderr

    check = run(target, tmp_path, "check", "--model", "tiny", "--batch", "2", "--max-new-tokens", "12")
    assert check.returncode == 0, check.stderr
    assert '"consistent": true' in check.stdout
    assert all(f.startswith(str(target)) for f in _module_files(target, tmp_path)), _module_files(target, tmp_path)

    # evaluate: Hydra finds the packaged recipes, the presets' data comes through GKV_DATA_DIR (none lies beside an
    # installed package: without it the error names the variable, tests/test_data.py), the answer checker starts
    # from the installed package
    out = tmp_path / "svamp"
    evaluate = run(
        target,
        tmp_path,
        "evaluate",
        "model=tiny",
        "data.name=svamp",
        "data.split=test",
        "data.limit=2",
        "max_completion_length=4",
        "num_generations=1",
        "methods=[full]",
        f"output_dir={out}",
        "plots=false",
        GKV_DATA_DIR=str(ROOT.parent / "shared" / "data"),
    )
    assert evaluate.returncode == 0, evaluate.stderr
    assert (out / "results.json").is_file() and "svamp" in (out / "results.json").read_text()


def _module_files(target: Path, folder: Path) -> list[str]:
    """Where the command's Python imports gkv_train and its rollout from (the install folder, not the checkout)."""
    modules = "('gkv_train.cli', 'gkv_rollout.engine', 'gkv_rewards.worker')"
    code = f"import importlib.util as u; print(*(u.find_spec(m).origin for m in {modules}))"
    environ = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=folder, env=environ, capture_output=True, text=True
    )
    return out.stdout.split()


@pytest.mark.floor
def test_installing_beside_the_stack_replaces_nothing(installed, tmp_path):
    """pip installing the three wheels into this environment (in CI's floor lane: the GPU image's older stack,
    torch 2.11 / transformers 5.17) would add only what is missing and replace no installed distribution (pip's
    own dry-run report)."""
    from importlib.metadata import distributions

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report), *map(str, installed[2])],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    present = {canonical(d.metadata["Name"]): d.version for d in distributions()}
    planned = {
        canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    ours = {"gkv-train", "gkv-rollout", "gkv-rewards"}
    replaced = {
        name: f"{present[name]} -> {version}"
        for name, version in planned.items()
        if name in present and name not in ours
    }
    assert not replaced, replaced
    assert "torch" in present and "transformers" in present
