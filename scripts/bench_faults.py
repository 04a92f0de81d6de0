"""A hostile-input and fault probe of a checkout: ~180 cases through ``train.py``, ``scripts/evaluate.py``,
``scripts/generate_traces.py`` and the reward functions, each outcome classified against what is right.

    python scripts/bench_faults.py --tag before65 --repo /path/to/old/checkout   # a run in results/bench_faults.json
    python scripts/bench_faults.py --tag after65                                 # this checkout
    python scripts/bench_faults.py --list                                        # the cases
    python scripts/bench_faults.py --tag try --cases 'rewards/*' --results outputs/bench_faults/try.json   # a subset
                                                     # (globs, or substrings), outside the committed results file

Every case runs in its own subprocesses (``--python`` on the ``--repo`` checkout: the working folder is a fresh
folder of the case, ``PYTHONPATH`` is the checkout, and every case checks that ``gkv_train`` was imported from
there), under ``nice``, ``OMP_NUM_THREADS=1``, ``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``, an address-space
cap (``--memory-gb``, RLIMIT_AS: a runaway allocation fails in the child instead of exhausting the machine) and a
per-case time limit (the whole process group is killed at the limit). A ``sitecustomize`` module put first on the
children's ``PYTHONPATH`` records where ``gkv_train`` was imported from and every model load
(``gkv_train.models.load_model``, ``PreTrainedModel.from_pretrained``); it changes nothing else. Results go to
``<out>/cases.jsonl`` as each case finishes; a case already there is not run again (``--fresh`` starts over), so
an interrupted probe continues. At the end: one JSON line on stdout (the table), every case's outcome in
``<out>/cases.md``, and the run in ``--results`` (``results/bench_faults.json``, the bench's one results file:
every run of every round, each with its tag, round, command, date, the checkout's commit, its tables and its
seconds to a clear refusal; a run of the same tag replaced). Every case's outcome and detail is kept for the runs
of the latest round (``--round``, by default the tag without ``before``/``after``: ``before64`` and ``after64`` are
round ``64``); an earlier round's per-case rows are dropped when a newer round's run arrives (they stay in git's
history: ``git show 95a190a:results/bench_faults_before37.md``). Two probes may finish at once: the file is
rewritten under a lock.

Outcomes (one per case; ``ok`` and ``clear_error`` are the right ones):

* ``ok``: the case expects a result and gets it right (exit 0, every check of the case holds), or a case that
  accepts either a result or a refusal gets the right result.
* ``clear_error``: the case expects a refusal and gets a clear one: exit code 2, a line ``error: ...`` on stderr
  that names the problem (the case's patterns: the key, the file and line, ...), no Python traceback and no
  Hydra "Error executing job" dump, and, for a configuration or data error, no model loaded first (the refusal
  must come before any work). A reward function called directly refuses clearly by raising ValueError or
  TypeError with a message naming the gold answer.
* ``unclear_error``: refused (non-zero exit, nothing produced) and the problem is named, but not cleanly: through a
  traceback or Hydra's dump, with another exit code than 2, only after the model loaded, or leaving the output
  folder behind where the case says none may be created; or a clean message that does not name the problem.
* ``silent_wrong``: exit 0 (or a returned score) and the result is wrong: a bad value accepted, a wrong reward,
  duplicated samples, a value silently replaced, a step logged twice.
* ``crash``: an unexpected failure: a traceback whose message does not name the problem (ZeroDivisionError,
  "can't allocate memory", "iostream error", ...), death by a signal, or a valid input refused.
* ``hang``: the case's time limit passed (the process group is killed).
* ``data_lost``: work that should survive did not: SIGTERM leaving no checkpoint of the steps done, a failed
  write destroying the previous file, a checkpoint folder left half-written, two runs overwriting each other.

Case kinds: ``listed`` (a defect found by the earlier probe of issue 24: on the code before the fixes it comes out
wrong), ``control`` (what the code handled already: a right result, or a check that existed, whatever the form of its
message; so that the table shows both), ``new`` (not in that list), ``round3`` (a defect found by the third probe,
issue 37: the newer paths — the lm-eval model, S4R refresh, resume, TRL keys, user methods, reward workers under
load, damaged checkpoints), ``round4`` (issue 54's: damaged runs, long_recall's story, recipe files, checkpoints
without manifests, the natural haystack, keys that cannot apply, adapter folders, unbounded inputs, library calls;
written as data, ``tests/faults/round4.py``), ``round5`` (issue 64's, in round four's row shape,
``tests/faults/round5.py``: output folders written over, no-op training, resumes without their optimizer state,
plug-in methods' contracts (their score's result, a module failing at import), settings accepted and ignored;
``tests/faults/round5_cache.py``: the model cache's content, adapters against their base, ``gkv-train check``).
A full disk is a tmpfs of a few KB mounted on the case's output folder where ``mount`` is allowed (root): writes
fail with ENOSPC as on a real full disk. Without that permission a file-size limit (RLIMIT_FSIZE) stands in:
writes then fail with EFBIG ("File too large"), per file rather than in total; the results name which was used.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gkv_train.jsonio import read_results, write_atomically

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the cases and their harness (tests/faults/)

from faults.cases import all_cases  # noqa: E402
from faults.harness import CATEGORIES, KINDS, OUTCOMES, ROOT, Case, read_jsonl, run_case, write_site  # noqa: E402

# ---------------------------------------------------------------------------------------------------------- main

# the results file before its first run, and what gkv_train.jsonio.read_results checks a found one against
EMPTY = {"bench": "faults", "runs": []}


def select(cases: list[Case], pattern: str | None) -> list[Case]:
    """Cases whose name matches ``pattern``: comma-separated globs, or substrings where there is no glob
    character."""
    if not pattern:
        return cases
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    return [
        c
        for c in cases
        if any(fnmatch.fnmatchcase(c.name, p) if any(ch in p for ch in "*?[") else p in c.name for p in parts)
    ]


def git(repo: Path, *args) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def table(records: list[dict], by: str = "category") -> dict:
    """{group: {cases, <outcome>: count, ...}} over ``records`` grouped by ``by`` (category or kind), plus
    ``total``."""
    rows = {}
    for group in [*(CATEGORIES if by == "category" else KINDS), "total"]:
        chosen = [r for r in records if group in (r[by], "total")]
        if chosen:
            rows[group] = {"cases": len(chosen), **{o: sum(r["outcome"] == o for r in chosen) for o in OUTCOMES}}
    return rows


def markdown(rows: dict, records: list[dict], tag: str, commit: str | None) -> str:
    """The table by category, the same by kind of case, and every case's outcome."""
    head = [
        "category",
        "cases",
        "ok",
        "clear errors",
        "unclear errors",
        "silent wrong",
        "crashes",
        "hangs",
        "data lost",
    ]
    lines = [
        f"Hostile-input and fault probe, `{tag}` (commit {commit}): outcomes per category",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for category, row in rows.items():
        cells = [row["cases"], *(row[o] for o in OUTCOMES)]
        name = f"**{category}**" if category == "total" else category
        lines.append(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "By kind of case (listed: a defect of issue 24's list; control: handled before, result or check; "
        "new: not in the list; round3: a defect of issue 37's list; round4: of issue 54's; round5: of issue 64's):",
        "",
        "| kind | " + " | ".join(head[1:]) + " |",
        "|" + "---|" * len(head),
    ]
    for kind, row in table(records, "kind").items():
        lines.append(f"| {kind} | " + " | ".join(str(c) for c in [row["cases"], *(row[o] for o in OUTCOMES)]) + " |")
    lines += ["", "| case | kind | outcome | detail |", "|---|---|---|---|"]
    for r in records:
        detail = r["detail"].replace("|", "\\|").replace("\n", " ")[:220]
        lines.append(f"| `{r['name']}` | {r['kind']} | {r['outcome']} | {detail} |")
    return "\n".join(lines) + "\n"


VIEWS = ("runs", "categories", "kinds", "refusals")


def refusal_seconds(records: list[dict]) -> dict | None:
    """Seconds from a configuration case's start to its clear refusal over ``records``: how many, the median, the
    90th percentile and the most (None when none was refused clearly)."""
    seconds = sorted(
        r["seconds"] for r in records if r["category"] == "configuration" and r["outcome"] == "clear_error"
    )
    if not seconds:
        return None
    return {
        "cases": len(seconds),
        "median": statistics.median(seconds),
        "p90": seconds[int(0.9 * (len(seconds) - 1))],
        "most": seconds[-1],
    }


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s views of the results file (``results/bench_faults.json``), each of one round's
    runs: ``VIEW_ROUND`` (``runs_64``: the runs of round ``64``). ``runs``, each run's totals on a row, with its tag,
    date, the checkout's commit and the command; ``categories`` and ``kinds``, a row per category (kind of case) and
    run; ``refusals``, per run the seconds from a configuration case's start to its clear refusal (before any model
    loads, except for the few cases a model's own limits refuse, such as a token count past its context)."""
    head = ["cases", "ok", "clear errors", "unclear errors", "silent wrong", "crashes", "hangs", "data lost"]
    kind, _, round_ = view.partition("_")
    rounds = list(dict.fromkeys(run["round"] for run in result["runs"]))
    if kind not in VIEWS or round_ not in rounds:
        raise SystemExit(
            f"error: bench_faults has the views {', '.join(VIEWS)} of a round (VIEW_ROUND, rounds: "
            f"{', '.join(rounds)}), not {view!r}"
        )
    runs = [run for run in result["runs"] if run["round"] == round_]
    commands = "; ".join(f"`{run['command']}`" for run in runs)
    if kind == "refusals":
        lines = [
            "| run | configuration cases refused clearly | median s | 90th percentile s | most s |",
            "|---|---|---|---|---|",
        ]
        for run in runs:
            if run["refusals"]:
                cells = [run["refusals"][k] for k in ("cases", "median", "p90", "most")]
                lines.append(f"| {run['tag']} | " + " | ".join(f"{c:g}" for c in cells) + " |")
        return "\n".join(lines) + f"\n\n{commands}\n"
    if kind == "runs":
        lines = ["| run | commit | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 2)]
        for run in runs:
            total = run["table"]["total"]
            commit = run["repo_commit"][:7] + (" (uncommitted changes)" if run.get("repo_dirty") else "")
            cells = [f"{run['tag']} ({run['date'][:10]})", commit, total["cases"], *(total[o] for o in OUTCOMES)]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        return (
            "\n".join(lines) + f"\n\n{commands} (each row: the run's date and the commit of the checkout it probed)\n"
        )
    by, key = ("category", "table") if kind == "categories" else ("kind", "table_by_kind")
    lines = [f"| {by} | run | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 2)]
    groups = list(dict.fromkeys(g for run in runs for g in run[key]))
    for group in groups:
        for run in runs:
            row = run[key].get(group)
            if row is not None:
                name = f"**{group}**" if group == "total" else group
                lines.append(
                    f"| {name} | {run['tag']} | "
                    + " | ".join(str(c) for c in [row["cases"], *(row[o] for o in OUTCOMES)])
                    + " |"
                )
    return "\n".join(lines) + f"\n\n{commands}\n"


def with_run(result: dict, run: dict) -> dict:
    """``result`` with ``run`` in it: a run of the same tag replaced, the others kept in order, and per-case rows
    kept only for the runs of ``run``'s round."""
    runs = [r for r in result["runs"] if r["tag"] != run["tag"]]
    runs = [r if r["round"] == run["round"] else {k: v for k, v in r.items() if k != "cases"} for r in runs]
    return {**result, "runs": [*runs, run]}


def store_run(path: Path, run: dict) -> None:
    """``run`` into the results file at ``path``, read and rewritten under a lock (two probes may end at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:  # beside it, ignored by git
        fcntl.flock(lock, fcntl.LOCK_EX)
        write_atomically(path, local(json.dumps(with_run(read_results(path, EMPTY), run), indent=1)) + "\n")


def local(text: str) -> str:
    """``text`` with this machine's folders written relative to the checkout (``../outputs/...``,
    ``../wt-before``): the results are committed, and no path of one machine belongs there."""
    begins = r"(?:(?<![\w./-])|(?<=\\[nt]))"  # a path's start: not inside a name, or after an escaped \n / \t
    return re.sub(begins + re.escape(str(ROOT.parent) + "/"), "../", text)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to probe (default: this one)")
    parser.add_argument("--tag", default="after", help="names the run: before64, after64, ...")
    parser.add_argument(
        "--round", help="the round the run belongs to (default: the tag without before/after: before64 -> 64)"
    )
    parser.add_argument("--cases", help="comma-separated globs (or substrings) of case names")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the children's interpreter, with the project's dependencies (default: this one)",
    )
    parser.add_argument(
        "--out", type=Path, help="per-case results and work folders (default outputs/bench_faults/<tag>)"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=ROOT / "results" / "bench_faults.json",
        help="the results file the run goes into (every round's runs)",
    )
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space cap of every child (RLIMIT_AS)")
    parser.add_argument("--data-dir", type=Path, help="GKV_DATA_DIR for the children (default: as the code finds it)")
    parser.add_argument("--fresh", action="store_true", help="forget the finished cases of --out and start over")
    parser.add_argument("--keep", action="store_true", help="keep each case's work folder")
    args = parser.parse_args(argv)
    if args.results.suffix != ".json" or args.results.is_dir():
        parser.error(f"--results {args.results}: a .json file (the bench's results file: every run goes into it)")
    args.round = args.round or re.sub(r"^(before|after)_?", "", args.tag) or args.tag
    return args


def run_cases(cases: list[Case], args, repo: Path, out: Path, site: Path) -> list[dict]:
    """Each case's record, in the order of ``cases``: those finished in ``out/cases.jsonl`` read back, the others
    run now and appended as each ends."""
    results_path = out / "cases.jsonl"
    done = {r["name"]: r for r in read_jsonl(results_path)}
    for number, case in enumerate(cases, 1):
        if case.name in done:
            continue
        record = run_case(
            case, repo, args.python, out / "work", site, int(args.memory_gb * 2**30), args.data_dir, args.keep
        )
        with open(results_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        done[case.name] = record
        print(
            f"[{number}/{len(cases)}] {case.name}: {record['outcome']} ({record['seconds']:.0f} s) "
            f"{record['detail'][:150]}",
            file=sys.stderr,
            flush=True,
        )
    return [done[c.name] for c in cases]


def write_results(
    args, argv, records: list[dict], out: Path, repo: Path, commit: str, dirty: bool, started: float
) -> None:
    """The run into ``--results``, every case's outcome in ``out/cases.md``, the table on stderr, one JSON line."""
    rows = table(records)
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(["bench_faults.py", *argv])
    summary = {
        "bench": "faults",
        "tag": args.tag,
        "round": args.round,
        "command": command,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "repo": str(repo),
        "repo_commit": commit,
        "repo_dirty": dirty,
        "memory_gb": args.memory_gb,
        "full_disk": sorted({r["extra"]["full_disk"] for r in records if "full_disk" in r.get("extra", {})}),
        "seconds_this_call": round(time.time() - started, 1),
        "seconds_all_cases": round(sum(r["seconds"] for r in records), 1),
        "table": rows,
        "table_by_kind": table(records, "kind"),
        "refusals": refusal_seconds(records),
        "cases": [
            {k: r[k] for k in ("name", "category", "kind", "about", "outcome", "detail", "seconds", "extra")}
            for r in records
        ],
    }
    store_run(args.results, summary)
    text = local(markdown(rows, records, args.tag, commit))
    write_atomically(out / "cases.md", text)
    print(text.split("\n\n| case")[0], file=sys.stderr)
    print(json.dumps({k: summary[k] for k in ("bench", "tag", "round", "repo_commit", "table")}), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    cases = select(all_cases(), args.cases)
    if args.list:
        for c in cases:
            print(f"{c.name:55s} {c.kind:8s} {c.about}")
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if not cases:
        print(f"error: no case matches {args.cases!r} (see --list)", file=sys.stderr)
        return 2
    try:
        read_results(args.results, EMPTY)  # a file that is not the bench's is refused before any case runs
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    repo = args.repo.resolve()
    if not (repo / "train.py").is_file():
        print(f"error: --repo {repo} is not a gkv-train checkout (no train.py)", file=sys.stderr)
        return 2
    commit = git(repo, "rev-parse", "HEAD")
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no")
    out = (args.out or ROOT / "outputs" / "bench_faults" / args.tag).resolve()
    if args.fresh:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    meta = {
        "repo": str(repo),
        "commit": commit,
        "dirty": bool(dirty),
        "python": args.python,
        "memory_gb": args.memory_gb,
    }
    if meta_path.is_file() and json.loads(meta_path.read_text()) != meta:
        print(
            f"error: {out} holds results of {json.loads(meta_path.read_text())}, not {meta}: pass --fresh or "
            "another --out",
            file=sys.stderr,
        )
        return 2
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    started = time.time()
    records = run_cases(cases, args, repo, out, write_site(out / "site"))
    write_results(args, argv, records, out, repo, commit, bool(dirty), started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
