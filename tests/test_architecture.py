"""The layers import one way: contract (rollout/contract) <- rollout <- trainers (gkv_train); module names are
unique; record formats are told apart in one place only."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rollout", "gkv_train", "rewards")
TRAINERS = ("gkv_train.grpo", "gkv_train.distill")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def project_imports(source: str) -> set[str]:
    """Every project module a source file imports (at any depth: lazy imports count)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.split(".")[0] in PACKAGES}


def layer(module: str) -> int:
    if module.startswith("rollout.contract"):
        return 0
    return {"rollout": 1, "gkv_train": 2}.get(module.split(".")[0], -1)


def upward_imports(module: str, source: str) -> list[str]:
    """Imports of ``module`` (given its source) from a higher layer; rewards count as above the rollout."""
    imported = project_imports(source)
    upward = [m for m in imported if layer(m) > layer(module)]
    if layer(module) <= 1:
        upward += [m for m in imported if m.startswith("rewards")]
    return sorted(upward)


MODULES = modules()


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) >= 0))
def test_imports_run_one_way(module):
    upward = upward_imports(module, MODULES[module].read_text())
    assert not upward, f"{module} (layer {layer(module)}) imports a higher layer: {upward}"


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
        if module != "rollout.contract":
            assert not record_switches(path.read_text()), f"{module} switches on a record type"


def test_the_controls_would_fail():
    """The checks see a violation when there is one."""
    assert upward_imports("rollout.contract.record", "from rollout.engine import RolloutEngine\n") == ["rollout.engine"]
    assert upward_imports("rollout.engine", "def f():\n    from gkv_train.grpo import x\n") == ["gkv_train.grpo"]
    assert upward_imports("rollout.cache", "import rewards.verify\n") == ["rewards.verify"]
    assert upward_imports("gkv_train.grpo", "from rollout.engine import RolloutEngine\n") == []
    assert record_switches("if isinstance(out.record, S4RRecord):\n    pass\n") == [1]
    assert record_switches("x = isinstance(record, torch.Tensor)\n") == [1]
