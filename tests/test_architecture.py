"""The layers import one way: contract (gkv_rollout.contract) <- rollout (gkv_rollout) <- trainers (gkv_train);
the rewards (gkv_rewards) sit outside the layers. So do gkv_train's groups, in the layers ARCHITECTURE.md gives, and
no module imports itself back round a cycle. Every source file has exactly one module name (three
distributions: gkv_train at the root, gkv_rollout in rollout/, gkv_rewards in rewards/; no links, no path edits);
module names are unique; record formats are told apart in one place only."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"gkv_train": "gkv_train", "rollout/gkv_rollout": "gkv_rollout", "rewards/gkv_rewards": "gkv_rewards"}
TRAINERS = ("gkv_train.training.grpo", "gkv_train.training.distill")
# the folders Python puts first on sys.path for this project's files: the root (train.py, installed gkv_train),
# the two distributions' folders (installed gkv_rollout, gkv_rewards), and the folders of scripts and tests
IMPORT_ROOTS = (ROOT, ROOT / "rollout", ROOT / "rewards", ROOT / "scripts", ROOT / "tests")


def modules() -> dict[str, Path]:
    """Module name -> file, for the three packages."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("**/*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts[:-1]) if parts[-1] == "__init__" else (package, *parts))
            found[name] = path
    return found


def module_names(path: Path, roots=IMPORT_ROOTS) -> list[str]:
    """Every name ``path`` is importable under from ``roots``: the dotted path from a root whose every folder on
    the way is a package (holds an ``__init__.py``)."""
    names = []
    for root in roots:
        if not path.is_relative_to(root):
            continue
        parts = path.relative_to(root).with_suffix("").parts
        folders = [root.joinpath(*parts[:i]) for i in range(1, len(parts))]
        if all((f / "__init__.py").is_file() for f in folders):
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def source_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / f for f in out if not f.startswith("scripts/reference/") and (ROOT / f).is_file()]


def test_every_file_has_one_module_name():
    """No file is importable under two names (the old layout: gkv_train/rollout was a link to rollout/, so
    ``rollout.methods`` and ``gkv_train.rollout.methods`` were two module objects with two registries)."""
    twice = {str(p.relative_to(ROOT)): n for p in source_files() if len(n := module_names(p)) > 1}
    assert not twice, twice
    links = [
        f
        for f in subprocess.run(
            ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.splitlines()
        if f.startswith("120000")
    ]
    assert not links, links
    assert all(module_names(path) == [name] for name, path in MODULES.items())


def test_the_packages_resolve_to_their_folders_from_the_root():
    """From the repository root (where scripts and train.py run), the installed names resolve to the folders,
    and the folders' bare names are no packages."""
    code = (
        "import importlib.util as u, gkv_rollout.methods as m, gkv_rewards.grading as g, gkv_train.cli as c; "
        "print(m.__file__, g.__file__, c.__file__, u.find_spec('rollout.methods'), u.find_spec('rewards.grading'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    methods, grading, cli, bare_rollout, bare_rewards = out.stdout.split()
    assert Path(methods) == ROOT / "rollout" / "gkv_rollout" / "methods.py"
    assert Path(grading) == ROOT / "rewards" / "gkv_rewards" / "grading.py"
    assert Path(cli) == ROOT / "gkv_train" / "cli.py" and bare_rollout == bare_rewards == "None"


def imported_names(source: str) -> set[str]:
    """Every module a source file imports (at any depth: lazy imports count)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def project_imports(source: str) -> set[str]:
    """Every project module a source file imports."""
    return {n for n in imported_names(source) if n.split(".")[0] in (*FOLDERS.values(), "rollout", "rewards")}


def layer(module: str) -> int:
    """0 the contract, 1 the rollout, 2 the trainers and jobs; -1 the rewards (outside the layers)."""
    if module.startswith("gkv_rollout.contract"):
        return 0
    if module.startswith("gkv_rollout"):
        return 1
    return -1 if module.startswith("gkv_rewards") else 2


def upward_imports(module: str, source: str) -> list[str]:
    """Imports of ``module`` (given its source) from a higher layer; rewards count as above the rollout."""
    imported = project_imports(source)
    upward = [m for m in imported if layer(m) > layer(module)]
    if layer(module) <= 1:
        upward += [m for m in imported if m.startswith("gkv_rewards")]
    return sorted(upward)


def unpackaged_imports(source: str) -> list[str]:
    """Imports of the folders by their bare names (``rollout.engine``), which no installed package has."""
    return sorted(m for m in project_imports(source) if m.split(".")[0] not in FOLDERS.values())


MODULES = modules()


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) >= 0))
def test_imports_run_one_way(module):
    upward = upward_imports(module, MODULES[module].read_text())
    assert not upward, f"{module} (layer {layer(module)}) imports a higher layer: {upward}"


@pytest.mark.parametrize(
    "path",
    sorted(ROOT.glob("*.py"))
    + sorted((ROOT / "scripts").glob("*.py"))
    + sorted((ROOT / "tests").glob("*.py"))
    + sorted(MODULES.values()),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_everything_imports_the_package(path):
    if path == ROOT / "scripts" / "compare_reference.py":
        pytest.skip("falls back to the layout of an older tree given as --project-root (the 'before' of a comparison)")
    assert not unpackaged_imports(path.read_text()), f"{path} imports {unpackaged_imports(path.read_text())}"


def test_no_trainer_imports_another():
    for module, path in MODULES.items():
        if module.startswith("gkv_train") and module != "gkv_train.training.algorithms":  # the job objects
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
        if module != "gkv_rollout.contract":
            assert not record_switches(path.read_text()), f"{module} switches on a record type"


def test_the_controls_would_fail():
    """The checks see a violation when there is one."""
    contract, engine = "gkv_rollout.contract.record", "gkv_rollout.engine"
    assert upward_imports(contract, "from gkv_rollout.engine import RolloutEngine\n") == [engine]
    assert upward_imports(engine, "def f():\n    from gkv_train.training.grpo import x\n") == [
        "gkv_train.training.grpo"
    ]
    assert upward_imports(engine, "import gkv_rewards.verify\n") == ["gkv_rewards.verify"]
    assert upward_imports("gkv_train.training.grpo", "from gkv_rollout.engine import RolloutEngine\n") == []
    assert unpackaged_imports("from rollout.engine import RolloutEngine\nimport rewards\n") == [
        "rewards",
        "rollout.engine",
    ]


def test_a_second_module_name_is_seen(tmp_path):
    """The control: a distribution folder that is a package itself gives its files a second name."""
    package = tmp_path / "rollout" / "gkv_rollout"
    package.mkdir(parents=True)
    for init in (tmp_path / "rollout" / "__init__.py", package / "__init__.py", package / "methods.py"):
        init.write_text("")
    names = module_names(package / "methods.py", roots=(tmp_path, tmp_path / "rollout"))
    assert names == ["rollout.gkv_rollout.methods", "gkv_rollout.methods"]
    (tmp_path / "rollout" / "__init__.py").unlink()
    assert module_names(package / "methods.py", roots=(tmp_path, tmp_path / "rollout")) == ["gkv_rollout.methods"]
    assert record_switches("if isinstance(out.record, S4RRecord):\n    pass\n") == [1]
    assert record_switches("x = isinstance(record, torch.Tensor)\n") == [1]


def test_the_four_attention_contexts_implement_the_contract_protocol():
    """The caches and the records' masks are what ``kv_attention`` hands a layer to: ``AttentionContext``."""
    import inspect

    from gkv_rollout.contract.attention import AttentionContext
    from gkv_rollout.contract.eviction import EvictionMasks
    from gkv_rollout.contract.s4r_record import S4RMasks
    from gkv_rollout.eviction_cache import EvictionCache
    from gkv_rollout.s4r_cache import S4RCache

    wanted = inspect.signature(AttentionContext.attend)
    for cls in (EvictionCache, S4RCache, EvictionMasks, S4RMasks):
        assert inspect.signature(cls.attend) == wanted, cls

    class Drifted:  # the control: an implementation whose signature drifted is seen
        def attend(self, module, query, key, value, attention_mask, scale=None, dropout=0.0): ...

    assert inspect.signature(Drifted.attend) != wanted


def test_the_layout_names_every_module():
    """ARCHITECTURE.md's layout table names every module of the three packages by its path and every script by its
    file name (so a module added without a line there, or renamed, fails here)."""
    layout = (ROOT / "ARCHITECTURE.md").read_text().split("## Layout", 1)[1]
    folders = (ROOT / "gkv_train", ROOT / "rollout" / "gkv_rollout", ROOT / "rewards" / "gkv_rewards")
    packages = [path for folder in folders for path in folder.rglob("*.py")]
    unnamed = [
        str(p.relative_to(ROOT)) for p in packages if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in layout
    ]
    scripts = [p for p in (ROOT / "scripts").rglob("*.py") if "reference" not in p.parts and p.name != "__init__.py"]
    unnamed += [str(p.relative_to(ROOT)) for p in scripts if p.name not in layout]
    assert not unnamed, f"ARCHITECTURE.md's layout does not name {unnamed}"


def benchmark_imports(source: str, own: str) -> set[str]:
    """The benchmarks (``bench_*``, ``gpu_check``: a script or a ``gkv_train.benchmarks`` module, by its last name)
    a source file imports, at any depth, other than ``own``."""
    names = imported_names(source) | {
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    last = {n.rsplit(".", 1)[-1] for n in names}
    return {n for n in last if n.startswith("bench_") or n == "gpu_check"} - {own}


def test_no_benchmark_imports_another():
    """What two benchmarks share lives in the package or a helper (``_common``, ``_rollout_timing``), never in one of
    them: a benchmark changed for its own sake cannot change another's figures. A script imports at most the
    benchmark of its own name (``scripts/bench_retrieval.py``: ``gkv_train.benchmarks.bench_retrieval``). The
    controls: an import of another benchmark is seen, by the script's name and by the package's."""
    files = [*(ROOT / "scripts").rglob("*.py"), *(ROOT / "gkv_train" / "benchmarks").glob("*.py")]
    found = {
        str(p.relative_to(ROOT)): imported for p in files if (imported := benchmark_imports(p.read_text(), p.stem))
    }
    assert not found, found
    assert benchmark_imports("def f():\n    import bench_rollout\n", "bench_scaling") == {"bench_rollout"}
    assert benchmark_imports("from gkv_train.benchmarks import bench_s4r\n", "bench_scaling") == {"bench_s4r"}
    assert not benchmark_imports("from gkv_train.benchmarks.bench_s4r import main\n", "bench_s4r")


def imported_modules(source: str) -> set[str]:
    """The project modules a source file imports, every import statement at any depth (a function's import and a
    type checker's count: an order of layers holds for both); ``from package import module`` names that module."""
    submodules = {
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    return (imported_names(source) | submodules) & set(MODULES)


def import_loops(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every set of nodes of ``graph`` (node -> the nodes it imports) that import each other, directly or round a
    cycle (its strongly connected components of more than one node), each sorted; [] when the imports run one way."""

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for child in graph.get(todo.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    reach = {node: reachable(node) for node in graph}
    return sorted({tuple(sorted(m for m in reach[n] if n in reach.get(m, ()))) for n in graph if n in reach[n]})


def loops_named(graph: dict[str, set[str]]) -> str:
    """The failure's message: the loops of ``graph`` and the pairs in them that import each other directly."""
    pairs = sorted((a, b) for a in graph for b in graph[a] if a < b and a in graph.get(b, ()))
    return f"these import each other: {import_loops(graph)}; directly, the pairs {pairs}"


def test_no_module_imports_itself_back():
    """No import cycle among the project's modules, every import statement counted, a function's and a type
    checker's (``gkv_rollout.config`` -> ``methods`` -> ``eviction_cache`` -> ``config`` went round until a method
    became one dataclass; then ``eviction_cache`` named ``methods.Method`` for a type checker while ``methods`` builds
    the cache, which sits below it); a package's ``__init__`` imported by its own submodules is not a cycle.
    Controls: a pair and a longer loop written in are found and named; a function's and a type checker's imports
    are seen."""
    graph = {
        module: {m for m in imported_modules(path.read_text()) if m != module and not module.startswith(m + ".")}
        for module, path in MODULES.items()
    }
    assert import_loops(graph) == [], loops_named(graph)
    looped = {**graph, "gkv_rollout.scoring": graph["gkv_rollout.scoring"] | {"gkv_rollout.methods"}}
    [loop] = import_loops(looped)  # methods -> scoring -> methods, and methods -> eviction_cache -> scoring
    assert {"gkv_rollout.methods", "gkv_rollout.scoring"} <= set(loop)
    assert import_loops({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e"}, "e": {"c"}}) == [
        ("a", "b"),
        ("c", "d", "e"),
    ]
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    source = (
        "if TYPE_CHECKING:\n    from gkv_rollout.methods import Method\ndef f():\n    from gkv_rollout import engine\n"
    )
    assert imported_modules(source) == {"gkv_rollout.methods", "gkv_rollout.engine", "gkv_rollout"}


def group(module: str) -> str:
    """The group of a ``gkv_train`` module: its subpackage (``gkv_train.runs``), or the module itself when it sits at
    the top (``gkv_train.models``)."""
    return ".".join(module.split(".")[:2])


def group_imports() -> dict[str, set[str]]:
    """gkv_train's groups -> the other groups their modules import (every import statement: ``imported_modules``)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if module.startswith("gkv_train."):
            imported = {group(m) for m in imported_modules(path.read_text()) if m.startswith("gkv_train.")}
            graph.setdefault(group(module), set()).update(imported - {group(module)})
    return graph


def test_no_gkv_train_groups_import_each_other():
    """gkv_train's groups (its subpackages, and each module at its top) are layers: no two import each other,
    directly or round a cycle, though no module cycle is needed for that (``evaluation.metrics`` ->
    ``training.logprobs`` while ``training.launch`` -> ``evaluation.evaluate``). The control: a group is its
    subpackage, or the module at the top."""
    graph = group_imports()
    assert import_loops(graph) == [], loops_named(graph)
    assert group("gkv_train.runs.checkpoints") == "gkv_train.runs" and group("gkv_train.models") == "gkv_train.models"


def documented_layers() -> dict[str, int]:
    """ARCHITECTURE.md's layers of gkv_train's groups (the table after ``<!-- gkv_train layers -->``): group
    (``gkv_train.runs``) -> its layer."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    assert "<!-- gkv_train layers -->\n" in text, "ARCHITECTURE.md gives no layers of gkv_train's groups"
    table = text.split("<!-- gkv_train layers -->\n", 1)[1].split("\n\n", 1)[0]
    return {
        f"gkv_train.{name}": int(layer)
        for layer, groups in re.findall(r"^\| (\d+) \| ([^|]+) \|", table, re.M)
        for name in re.findall(r"`(\w+)`", groups)
    }


def against_the_layers(graph: dict[str, set[str]], layers: dict[str, int]) -> list[tuple[str, str]]:
    """The imports (group, the group it imports) of ``graph`` that do not go down to a lower layer."""
    return sorted((g, m) for g, imported in graph.items() for m in imported if layers[m] >= layers[g])


def test_gkv_train_groups_import_down_the_documented_layers():
    """ARCHITECTURE.md gives every gkv_train group a layer, and each group imports only groups of lower layers: the
    order written down is the code's. The controls: an import up, or within a layer, is named."""
    layers, graph = documented_layers(), group_imports()
    assert sorted(layers) == sorted(graph), "ARCHITECTURE.md's layers name other groups than gkv_train has"
    assert against_the_layers(graph, layers) == []
    assert against_the_layers(
        {"gkv_train.runs": {"gkv_train.cli", "gkv_train.problems", "gkv_train.models"}}, layers
    ) == [
        ("gkv_train.runs", "gkv_train.cli"),
        ("gkv_train.runs", "gkv_train.problems"),
    ]
