"""A benchmark's one results file: ``gkv_train.jsonio.read_results`` (an empty one where there is none; another's,
damaged or a folder refused naming the option and the file), and the scripts that compare trees
(``trace_config.py``, ``compare_reference.py``, with readers of their own: they run on older trees' packages):
every run in it by tag or name (a run of the same name replaced, the others kept), rendered as the docs' table; a
file that is not that script's refused before any work."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "trace_config.py"


def test_read_results_gives_the_file_or_an_empty_one_and_refuses_any_other(tmp_path):
    from gkv_train.jsonio import read_results

    empty = {"benchmark": "methods", "tags": {}}
    made = read_results(tmp_path / "none.json", empty)
    made["tags"]["x"] = 1
    assert made == {"benchmark": "methods", "tags": {"x": 1}} and empty == {"benchmark": "methods", "tags": {}}
    (tmp_path / "ours.json").write_text('{"benchmark": "methods", "tags": {"a": {}}, "note": 1}')
    assert read_results(tmp_path / "ours.json", empty)["tags"] == {"a": {}}
    (tmp_path / "other.json").write_text('{"bench": "faults", "runs": []}')
    (tmp_path / "runs-a-list.json").write_text('{"benchmark": "methods", "tags": []}')
    (tmp_path / "damaged.json").write_text('{"benchmark": "methods", "tags": {')
    (tmp_path / "folder.json").mkdir()
    for name, why in (
        ("other.json", "not methods's results file"),
        ("runs-a-list.json", "a dict of tags"),
        ("damaged.json", "not a JSON file"),
        ("folder.json", "not a JSON file"),
    ):
        with pytest.raises(ValueError, match=f"--output {tmp_path / name} is .*{why}"):
            read_results(tmp_path / name, empty, "--output")
    assert (tmp_path / "other.json").read_text() == '{"bench": "faults", "runs": []}'  # untouched


@pytest.fixture(scope="module")
def trace_config():
    spec = importlib.util.spec_from_file_location("trace_config", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(tag: str, stops: int) -> dict:
    return {
        "benchmark": "trace_config",
        "tag": tag,
        "commit": "abc1234",
        "date": "2026-12-07",
        "command": f"python scripts/trace_config.py --tag {tag}",
        "path": ["gkv_train.cli"],
        "stops": stops,
        "modules": 1,
        "returns": 0,
        "validating_calls": ["gkv_train.config.compose.check_overrides"],
    }


def test_runs_join_the_file_and_a_tag_run_again_replaces_its_run(trace_config, tmp_path):
    result = trace_config.read_results(tmp_path / "trace_config.json")  # none yet: an empty file's content
    for tag, stops in (("before", 10), ("after", 20), ("before", 30)):
        result = trace_config.with_run(result, record(tag, stops))
    assert [(r["tag"], r["stops"]) for r in result["runs"]] == [("after", 20), ("before", 30)]
    table = trace_config.tables("path", result)
    assert "| after (2026-12-07) | abc1234 | 20 |" in table and "| before (2026-12-07) | abc1234 | 30 |" in table
    with pytest.raises(SystemExit, match="the view path"):
        trace_config.tables("paths", result)


def test_a_results_file_that_is_not_trace_configs_is_refused_before_the_trace(trace_config, tmp_path):
    (tmp_path / "other.json").write_text('{"benchmark": "methods", "tags": {}}')
    (tmp_path / "damaged.json").write_text('{"benchmark": "trace_config", "runs": [')
    for name in ("other.json", "damaged.json"):
        with pytest.raises(ValueError, match=f"--results {tmp_path / name}"):
            trace_config.read_results(tmp_path / name)
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--results", str(tmp_path / name)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2 and f"--results {tmp_path / name}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert json.loads((tmp_path / "other.json").read_text()) == {"benchmark": "methods", "tags": {}}  # untouched


@pytest.fixture(scope="module")
def compare_reference():
    spec = importlib.util.spec_from_file_location("compare_reference", ROOT / "scripts" / "compare_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def comparison(project: str, methods: dict) -> dict:
    kept = {m: {"exact": e, "jaccard": j} for m, (e, j) in methods.items()}
    return {
        "script": "compare_reference",
        "command": "python scripts/compare_reference.py",
        "date": "2026-11-30",
        "project": project,
        "by_interval": {"32": {"methods": kept}},
    }


def test_compare_reference_keeps_every_run_by_name_and_refuses_another_file(compare_reference, tmp_path):
    """Every compared tree is a column of the kept table (``-`` where a run left a method out); --output naming a
    file that is not the comparison's is refused while the arguments are read, before any model loads."""
    result = compare_reference.read_runs(tmp_path / "reference_e2e.json")
    assert result == {"script": "compare_reference", "runs": {}}
    result["runs"]["before"] = comparison("old", {"snapkv": (0.1, 0.9), "rkv": (0.0, 0.7)})
    result["runs"]["batch1"] = comparison("new", {"snapkv": (1.0, 1.0)})
    table = compare_reference.tables("kept", result)
    assert "| snapkv | 0.100, 0.900 | 1.000, 1.000 |" in table and "| rkv | 0.000, 0.700 | - |" in table
    (tmp_path / "other.json").write_text('{"benchmark": "trace_config", "runs": []}')
    (tmp_path / "damaged.json").write_text("{")
    for name in ("other.json", "damaged.json"):
        with pytest.raises(SystemExit) as refused:
            compare_reference.parse_args(["--output", str(tmp_path / name)])
        assert refused.value.code == 2
