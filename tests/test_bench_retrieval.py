"""scripts/bench_retrieval.py as main (--quick, every stage): the retrieval tasks reached by name through
evaluate.py, the probe's chosen contexts, the table's S4R and eviction rows at the same memory (each reporting the
share it reached), S4R's ablations, and the results file's sections with where they came from."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tables_of(results: Path, view: str) -> str:
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); from bench_retrieval import tables; "
        f"print(tables({view!r}, json.load(open({str(results)!r}))))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout


def test_the_needle_split_reads_the_block_s4r_samples():
    """in_recent_block says whether the needle's first token is among the recent block of the positions S4R samples
    for its bases (gkv_rollout.lowrank.sample_positions over the non-sink prompt tokens), at each eta."""
    from gkv_rollout.lowrank import sample_positions
    from gkv_train.benchmarks.retrieval_stages import in_recent_block

    sinks, prompt = 4, 300
    for eta in (0.2, 0.4):
        rest = prompt - sinks
        count = round(eta * rest)
        recent = set((sample_positions(rest, count, 0.7)[-round(count * 0.7) :] + sinks).tolist())
        for needle in range(sinks, prompt):
            assert in_recent_block({"prompt": prompt, "needle": needle}, eta, sinks) == (needle in recent), needle


def test_quick_retrieval_bench(tmp_path):
    results = tmp_path / "results.json"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench_retrieval.py"),
        "--quick",
        "--output-root",
        str(tmp_path),
        "--results",
        str(results),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["probe"]["chosen"] == {"vt": 64}  # --quick: min_full 0, one context
    entry = line["table"]["table"]["vt"]
    assert set(entry["etas"]) == {"0.2", "0.4"}
    for eta, cells in entry["etas"].items():
        assert set(cells) == {"budget", "s4r", "snapkv", "gkv", "streaming"}
        assert abs(cells["s4r"]["memory_share"] - float(eta)) < 0.2  # S4R's stored state, near the eta asked
    assert set(line["ablations"]["table"]["vt"]) == {"default", "window_1"} and line["ablations"]["eta"] == 0.4
    published = json.loads(results.read_text())
    assert all(published[stage]["commit"] for stage in ("probe", "table", "ablations"))
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); from bench_retrieval import tables; "
        f"r = json.load(open({str(results)!r})); print('\\n'.join(tables(v, r) for v in ('probe', 'table', "
        "'ablations')))"
    )
    pages = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert "| vt | " in pages and "| vt (64) |" in pages and "(memory 0." in pages  # the docs' views (render_docs.py)
    fair = line["fair"]  # S4R's fair test: the natural haystack, a control, eviction matched on S4R's memory
    (entry,) = fair["table"].values()
    cells = entry["etas"]["0.4"]
    assert list(fair["table"]) == ["niah_single/questions"] and entry["mean_prompt"] > 96
    assert {"s4r", "exact_both", "snapkv"} <= set(cells) and not fair["partial"]
    assert cells["snapkv"]["budget"] == round(
        cells["s4r"]["memory_share"] * (entry["mean_prompt"] + cells["s4r"]["mean_completion_length"])
    )
    for name in ("s4r", "exact_both", "snapkv"):
        parts = cells[name]["by_needle"]
        assert parts["inside"]["problems"] + parts["before"]["problems"] == 2
    assert cells["s4r"]["minus_s4r"] == {"difference": 0.0, "ci95": [0.0, 0.0]}  # paired with itself
    for name in ("exact_both", "snapkv"):  # paired on the same problems: the difference of the two means
        assert abs(cells[name]["minus_s4r"]["difference"] - (cells[name]["pass@1"] - cells["s4r"]["pass@1"])) < 1e-9
    assert "| niah_single/questions |" in tables_of(results, "fair")
