"""The layers import one way: contract (gkv_train.rollout.contract, folder rollout/contract) <- rollout
(gkv_train.rollout, folder rollout/) <- trainers (gkv_train); everything is imported under the one package
``gkv_train``; module names are unique; record formats are told apart in one place only."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"gkv_train": "gkv_train", "rollout": "gkv_train.rollout", "rewards": "gkv_train.rewards"}
TRAINERS = ("gkv_train.grpo", "gkv_train.distill")


def modules() -> dict[str, Path]:
    """Module name -> file, for the three top-level folders (gkv_train/rollout and gkv_train/rewards are links
    to the folders rollout/ and rewards/, which the package installs as gkv_train.rollout, gkv_train.rewards)."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("**/*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[0] in ("rollout", "rewards") and folder == "gkv_train":
                continue  # the links
            name = ".".join((package, *parts[:-1]) if parts[-1] == "__init__" else (package, *parts))
            found[name] = path
    return found


def project_imports(source: str) -> set[str]:
    """Every project module a source file imports (at any depth: lazy imports count)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.split(".")[0] in FOLDERS}


def layer(module: str) -> int:
    """0 the contract, 1 the rollout, 2 the trainers and jobs; -1 the rewards (outside the layers)."""
    if module.startswith("gkv_train.rollout.contract"):
        return 0
    if module.startswith("gkv_train.rollout"):
        return 1
    return -1 if module.startswith("gkv_train.rewards") else 2


def upward_imports(module: str, source: str) -> list[str]:
    """Imports of ``module`` (given its source) from a higher layer; rewards count as above the rollout."""
    imported = project_imports(source)
    upward = [m for m in imported if layer(m) > layer(module)]
    if layer(module) <= 1:
        upward += [m for m in imported if m.startswith("gkv_train.rewards")]
    return sorted(upward)


def unpackaged_imports(source: str) -> list[str]:
    """Imports of the folders by their bare names (``rollout.engine``), which an installed package lacks."""
    return sorted(m for m in project_imports(source) if m.split(".")[0] != "gkv_train")


MODULES = modules()


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) >= 0))
def test_imports_run_one_way(module):
    upward = upward_imports(module, MODULES[module].read_text())
    assert not upward, f"{module} (layer {layer(module)}) imports a higher layer: {upward}"


@pytest.mark.parametrize("path", sorted(ROOT.glob("*.py")) + sorted((ROOT / "scripts").glob("*.py")) + sorted(
    (ROOT / "tests").glob("*.py")) + sorted(MODULES.values()), ids=lambda p: str(p.relative_to(ROOT)))
def test_everything_imports_the_package(path):
    if path == ROOT / "scripts" / "compare_reference.py":
        pytest.skip("falls back to the layout of an older tree given as --project-root (the 'before' of a comparison)")
    assert not unpackaged_imports(path.read_text()), f"{path} imports {unpackaged_imports(path.read_text())}"


def test_no_trainer_imports_another():
    for module, path in MODULES.items():
        if module.startswith("gkv_train") and module != "gkv_train.launch":
            imported = project_imports(path.read_text()) & set(TRAINERS)
            assert not (imported - {module}), f"{module} imports the trainer(s) {imported}"


def test_module_names_are_unique():
    names = [m.rsplit(".", 1)[-1] for m in MODULES if not MODULES[m].name == "__init__.py"]
    assert sorted(set(names)) == sorted(names), [n for n in set(names) if names.count(n) > 1]


def record_switches(source: str) -> list[int]:
    """Lines of ``isinstance(<a record>, <a record type or Tensor>)`` calls."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            on_record = "record" in ast.dump(node.args[0]).lower()
            if on_record and any(f"'{t}'" in ast.dump(node.args[1]) for t in ("EvictionRecord", "S4RRecord", "Tensor")):
                lines.append(node.lineno)
    return lines


def test_record_formats_are_told_apart_in_one_place():
    """No ``isinstance`` on a record's type outside the registry (rollout/contract/__init__.py)."""
    for module, path in MODULES.items():
        if module != "gkv_train.rollout.contract":
            assert not record_switches(path.read_text()), f"{module} switches on a record type"


def test_the_controls_would_fail():
    """The checks see a violation when there is one."""
    contract, engine = "gkv_train.rollout.contract.record", "gkv_train.rollout.engine"
    assert upward_imports(contract, "from gkv_train.rollout.engine import RolloutEngine\n") == [engine]
    assert upward_imports(engine, "def f():\n    from gkv_train.grpo import x\n") == ["gkv_train.grpo"]
    assert upward_imports(engine, "import gkv_train.rewards.verify\n") == ["gkv_train.rewards.verify"]
    assert upward_imports("gkv_train.grpo", "from gkv_train.rollout.engine import RolloutEngine\n") == []
    assert unpackaged_imports("from rollout.engine import RolloutEngine\nimport rewards\n") == ["rewards", "rollout.engine"]
    assert record_switches("if isinstance(out.record, S4RRecord):\n    pass\n") == [1]
    assert record_switches("x = isinstance(record, torch.Tensor)\n") == [1]
