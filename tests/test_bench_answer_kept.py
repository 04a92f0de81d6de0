"""scripts/bench_answer_kept.py as main, on the tiny model's long_recall: the spans it measures spell the number,
the shares come from the rollout's record (every part holds every span when the budget never compresses: the
control that must come out 1; at a small budget the chance span is dropped somewhere), the report holds each
recipe and the judged difference, and a second call recomputes nothing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TRAINED = "rl_sparse_noclip-s0-lr0.0003"


def evidence(tmp_path: Path, budget: int) -> Path:
    """An rl_evidence results file with the settings and cells the bench reads: the untrained model and one run."""
    cells = {f"gkv-b{budget}": {"problems": [0, 1, 2], "correct": [[1, 0], [0, 0], [1, 1]]}}
    settings = {
        "model": "tiny",
        "task": {"name": "long_recall", "sentences": 3},
        "window": 4,
        "interval": 4,
        "train": {"budget": budget},
        "eval": {"split": "test", "problems": 3, "seed": 0},
    }
    path = tmp_path / f"evidence-{budget}.json"
    models = {"untrained": {"cells": cells}, TRAINED: {"cells": cells}}
    path.write_text(json.dumps({"training": {"settings": settings, "models": models}}))
    return path


def adapter(folder: Path) -> Path:
    """A LoRA adapter of the tiny model whose update is not zero (so the trained model differs)."""
    from peft import LoraConfig, get_peft_model

    from gkv_train.models import load_model

    model, _ = load_model("tiny")
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "k_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p, generator=torch.Generator().manual_seed(0)) * 0.5)
    peft.save_pretrained(folder / TRAINED)
    return folder


def run(tmp_path: Path, budget: int, adapters: Path) -> tuple[dict, Path]:
    out, results = tmp_path / f"out-{budget}", tmp_path / f"kept-{budget}.json"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench_answer_kept.py"),
        "--evidence",
        str(evidence(tmp_path, budget)),
        "--adapters",
        str(adapters),
        "--output-root",
        str(out),
        "--results",
        str(results),
        "--batch",
        "2",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(results.read_text()), out


def test_shares_come_from_the_record_and_the_report_holds_the_judged_difference(tmp_path):
    adapters = adapter(tmp_path / "adapters")
    whole, out = run(tmp_path, 4096, adapters)  # never compresses: every part holds every span
    for name in ("untrained", TRAINED):
        assert whole["per_model"][name] == {"prompt": 1.0, "story": 1.0, "either": 1.0, "control": 1.0}

    section, out = run(tmp_path, 24, adapters)
    rows = [r for part in sorted(out.glob("untrained-*.json")) for r in json.loads(part.read_text())]
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert all(len(r["spans"]["control"]) == len(r["spans"]["story"]) == 2 for r in rows)  # two digits
    shares = [r[p] for r in rows for p in ("prompt", "story", "either", "control")]
    assert all(0 <= s <= 1 for s in shares) and min(shares) < 1  # the small budget drops something
    assert all(r["either"] >= max(r["prompt"], r["story"]) for r in rows)
    recipes = section["recipes"]
    assert set(recipes) == {"untrained", "rl_sparse_noclip"} and recipes["untrained"]["seeds"] == 1
    held, not_held = recipes["untrained"]["pass@1_when_held"], recipes["untrained"]["pass@1_when_not_held"]
    assert held[1] + not_held[1] == 6  # every evaluation sample of the three problems, on one side
    difference = section["differences"]["rl_sparse_noclip minus untrained"]
    per_model = section["per_model"]
    assert abs(difference["difference"] - (per_model[TRAINED]["either"] - per_model["untrained"]["either"])) < 1e-9
    assert difference["ci95"][0] <= difference["difference"] <= difference["ci95"][1]

    stamps = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    again, _ = run(tmp_path, 24, adapters)  # resumed: nothing rolled out again
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    assert again["per_model"] == section["per_model"]
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_answer_kept import tables

    recipes, differences = tables("recipes", section), tables("differences", section)
    assert recipes.count("\n| ") == 2 and "| untrained | 1 |" in recipes and "bench_answer_kept.py" in recipes
    assert "rl_sparse_noclip minus untrained | 1 and 1 |" in differences


def test_problem_shares_read_the_record_at_the_story_s_last_token():
    """A hand-built record: which parts hold which span is known, so are the shares. A key evicted at the query's
    own position is not seen by it, one evicted a position later is: the query position cannot be off by one."""
    import random

    from gkv_rollout.contract.eviction import NEVER, EvictionRecord
    from gkv_train.benchmarks.bench_answer_kept import problem_shares
    from gkv_train.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    problem = "Ava has 47 apples. Tell the story."
    prompt = tokenizer("<user> 47 " + problem, add_special_tokens=False)[
        "input_ids"
    ]  # the number before the problem too
    text = "Ava has 47 apples. Then Ava goes to the park and sings. Then Ava reads. At the end of the day, Ava has"
    story = tokenizer(text, add_special_tokens=False)["input_ids"]
    p = len(prompt)
    query = p + len(story) - 1
    evict_at = torch.full((1, 2, 1, query + 1), NEVER, dtype=torch.int32)  # [B, L, Hkv, T]: two parts
    in_prompt = [k for k in range(p) if tokenizer.decode(prompt[k : k + 2]) == "47"][-1]
    in_story = p + [k for k in range(len(story)) if tokenizer.decode(story[k : k + 2]) == "47"][0]
    evict_at[0, 0, 0, in_prompt] = query  # part 0 dropped the prompt's number before the query
    evict_at[0, 0, 0, in_story] = query + 1  # ... and holds the story's (dropped only after the query)
    evict_at[0, 1, 0, in_story + 1] = 5  # part 1 dropped the story's number long ago, holds the prompt's
    shares = problem_shares(EvictionRecord(evict_at), 0, prompt, story, "47", problem, tokenizer, random.Random(0))
    assert shares["spans"]["prompt"] == [in_prompt, in_prompt + 1]  # the problem's 47, not the template's
    assert shares["spans"]["story"] == [in_story, in_story + 1]
    assert (shares["prompt"], shares["story"], shares["either"], shares["control"]) == (0.5, 0.5, 1.0, 1.0)
    assert shares["either_by_layer"] == [1.0, 1.0]
    control = shares["spans"]["control"]
    assert control[0] > in_story + 1 and control[-1] < p + text.index("At the end")


def refused(monkeypatch, capsys, argv: list[str]) -> str:
    """``bench_answer_kept.py argv`` run as main in this process: it must be refused (exit 2) before any work (no
    model measured); its ``error:`` line returned."""
    from gkv_train.benchmarks import bench_answer_kept

    monkeypatch.setattr(bench_answer_kept, "measure", lambda *a, **k: pytest.fail("measured before the refusal"))
    monkeypatch.setattr(sys, "argv", ["bench_answer_kept.py", *argv])
    with pytest.raises(SystemExit) as done:
        bench_answer_kept.main()
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def write_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def hostile(tmp_path: Path, case: str) -> tuple[list[str], list[str]]:
    """(the command line of a hostile ``case``, what its refusal must name). ``--worker 0/2``: the untrained model
    alone, so no adapter is needed where the case is not about one."""
    good = evidence(tmp_path, 24)
    adapters, root = tmp_path / "adapters", tmp_path / "root"
    adapters.mkdir(exist_ok=True)
    base = {"--evidence": str(good), "--adapters": str(adapters), "--output-root": str(root), "--worker": "0/2"}
    settings = json.loads(good.read_text())["training"]["settings"]
    kept = {"evidence": settings, "batch": 2}
    row = {"id": 0, "prompt": 1.0, "story": 1.0, "either": 1.0, "control": 1.0, "either_by_layer": [1.0]}
    changes, names = {
        "batch-0": ({"--batch": "0"}, ["--batch", "expected an integer >= 1"]),
        "worker-0/0": ({"--worker": "0/0"}, ["--worker", "i/n"]),
        "worker-abc": ({"--worker": "abc"}, ["--worker", "i/n"]),
        "worker-1/1": ({"--worker": "1/1"}, ["--worker", "counted from 0"]),
        "evidence-missing": ({"--evidence": str(tmp_path / "none.json")}, ["--evidence", "none.json does not exist"]),
        "evidence-not-json": (
            {"--evidence": str(write_json(tmp_path / "bad.json", "not json {"))},
            ["bad.json is damaged"],
        ),
        "evidence-keyless": (
            {"--evidence": str(write_json(tmp_path / "keyless.json", {"training": {}}))},
            ["keyless.json holds no training.settings.model"],
        ),
        "evidence-without-cell": (
            {
                "--evidence": str(
                    write_json(
                        tmp_path / "nocell.json",
                        {"training": {"settings": settings, "models": {"untrained": {"cells": {"gkv-b64": {}}}}}},
                    )
                )
            },
            ["nocell.json: model untrained has no cell gkv-b24"],
        ),
        "adapters-missing": ({"--adapters": str(tmp_path / "nowhere")}, ["--adapters", "nowhere does not exist"]),
        "adapter-missing": ({"--worker": "1/2"}, [f"adapter=\\S+/{TRAINED}: no such folder"]),
        "results-in-missing-folder": (
            {"--results": str(tmp_path / "no" / "kept.json")},
            ["--results", "the folder \\S+/no does not exist"],
        ),
        "output-root-a-file": ({"--output-root": str(write_json(tmp_path / "afile", "x"))}, ["afile is a file"]),
        "settings-damaged": (
            {"--batch": "2"} | {"_write": {"root/settings.json": "{cut"}},
            ["settings.json is damaged"],
        ),
        "settings-other": (
            {"--batch": "3"} | {"_write": {"root/settings.json": kept}},
            ["measurements of other settings", "another --output-root"],
        ),
        "kept-without-settings": (
            {"--batch": "2"} | {"_write": {"root/untrained-0.json": [row, {**row, "id": 1}]}},
            ["untrained-0.json", "no settings.json"],
        ),
        "kept-cut": (
            {"--batch": "2"} | {"_write": {"root/settings.json": kept, "root/untrained-0.json": '[{"id": 0, "pro'}},
            ["untrained-0.json is damaged"],
        ),
        "kept-keyless": (
            {"--batch": "2"} | {"_write": {"root/settings.json": kept, "root/untrained-0.json": [{"id": 0}]}},
            ["untrained-0.json is damaged", "remove it"],
        ),
        "kept-other-problems": (
            {"--batch": "2"} | {"_write": {"root/settings.json": kept, "root/untrained-2.json": [row]}},
            ["untrained-2.json holds other problems than \\[2\\]"],
        ),
    }[case]
    for name, value in changes.pop("_write", {}).items():
        write_json(tmp_path / name, value)
    argv = [word for key, value in {**base, **changes}.items() for word in (key, value)]
    return argv, names


HOSTILE = [
    "batch-0",
    "worker-0/0",
    "worker-abc",
    "worker-1/1",
    "evidence-missing",
    "evidence-not-json",
    "evidence-keyless",
    "evidence-without-cell",
    "adapters-missing",
    "adapter-missing",
    "results-in-missing-folder",
    "output-root-a-file",
    "settings-damaged",
    "settings-other",
    "kept-without-settings",
    "kept-cut",
    "kept-keyless",
    "kept-other-problems",
]


@pytest.mark.parametrize("case", HOSTILE)
def test_every_argument_and_input_is_checked_before_any_work(tmp_path, monkeypatch, capsys, case):
    """Each hostile command line is refused (exit 2, one ``error:`` line naming the problem) before a model is
    measured, and leaves no output root behind when it had none (``--batch 0`` once wrote settings.json first, so
    every later run into the root was refused); a damaged state file is named (``read_state``)."""
    import re

    argv, names = hostile(tmp_path, case)
    had_root = (tmp_path / "root").exists()
    line = refused(monkeypatch, capsys, argv)
    assert line.startswith("bench_answer_kept.py: error:") or line.startswith("usage")
    assert all(re.search(name, line) for name in names), line
    assert had_root or not (tmp_path / "root").exists()
