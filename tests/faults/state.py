"""State and fault cases: signals, resumes, concurrent runs, full disks, damaged checkpoints."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Callable

from faults.harness import (
    Case,
    Context,
    Proc,
    Running,
    Verdict,
    complete_checkpoints,
    failure_message,
    half_written,
    judge_refusal,
    judge_result,
    last_json_line,
    overrides,
    read_jsonl,
    read_text,
    refuse,
    samples_problem,
    training_steps,
)


def start_entry(ctx: Context, entry: str, changes: dict, fsize=None) -> Running:
    script, ov = overrides(entry, changes)
    return ctx.start(ctx.entry(script, ov), fsize)


def wait_for(predicate: Callable[[], bool], running: Running, limit: float) -> bool:
    """Poll ``predicate`` every 0.1 s until it holds (True), the child exits or ``limit`` seconds pass (False)."""
    end = time.time() + limit
    while time.time() < end:
        if predicate():
            return True
        if running.popen.poll() is not None:
            return predicate()
        time.sleep(0.1)
    return False


LONG_TRAIN = {"max_steps": 150, "max_completion_length": 16, "data.limit": 8}


def steps_problem(out: Path, max_steps: int) -> str | None:
    """None when ``metrics.jsonl`` logged each step 1..max_steps once and the run's evaluation is there."""
    steps = training_steps(out)
    twice = sorted({s for s in steps if steps.count(s) > 1})
    if twice:
        return f"steps logged twice in metrics.jsonl: {twice[:10]}{' ...' if len(twice) > 10 else ''}"
    if sorted(steps) != list(range(1, max_steps + 1)):
        missing = sorted(set(range(1, max_steps + 1)) - set(steps))
        return f"metrics.jsonl lacks steps {missing[:10]}"
    if not (out / "eval.json").is_file():
        return "no eval.json"
    return None


def interrupted_train(sig: int, save_steps: int):
    """Train, send ``sig`` once step 3 is logged, then resume=last to the end."""

    def run(ctx: Context) -> Verdict:
        out = ctx.work / "out"
        changes = {**LONG_TRAIN, "save_steps": save_steps}
        running = start_entry(ctx, "train", changes)
        if not wait_for(lambda: max(training_steps(out), default=0) >= 3, running, 120):
            proc = running.wait(1)
            said = failure_message(proc.err)[:300]
            return Verdict("crash", f"the run ended or stalled before step 3: exit {proc.rc}: {said}")
        reached = max(training_steps(out))
        running.signal(sig)
        proc = running.wait(90)
        if proc.timed_out:
            return Verdict("hang", f"still running 90 s after {signal.Signals(sig).name}")
        saved = complete_checkpoints(out)
        extra = {"step_at_signal": reached, "checkpoints": saved}
        if sig == signal.SIGTERM:
            if not saved or saved[-1] < reached:
                return Verdict(
                    "data_lost",
                    f"SIGTERM after step {reached} (save_steps={save_steps}): exit {proc.rc}, "
                    f"newest complete checkpoint {saved[-1] if saved else 'none'}; "
                    f"said: {failure_message(proc.err)[:150]!r}",
                    extra,
                )
        if half_written(out):
            return Verdict("data_lost", f"half-written checkpoint folders left: {half_written(out)}", extra)
        resumed = ctx.run(ctx.entry(*overrides("train", {**changes, "resume": "last"})), 240)
        verdict = judge_result(resumed, lambda: steps_problem(out, LONG_TRAIN["max_steps"]))
        if (
            verdict.outcome == "ok"
            and sig == signal.SIGTERM
            and not re.search(r"SIGTERM|signal|terminat|preempt", proc.err + read_text(out / "train.log"), re.I)
        ):
            return Verdict(
                "unclear_error", "saved and resumed, but the stop was not reported (no message naming SIGTERM)", extra
            )
        verdict.extra.update(extra)
        return verdict

    return run


LONG_EVAL = {"data.limit": 10, "batch_problems": 1, "num_generations": 2, "max_completion_length": 24}


def interrupted_eval(sig: int):
    def run(ctx: Context) -> Verdict:
        samples = ctx.work / "out" / "full" / "samples.jsonl"
        running = start_entry(ctx, "evaluate", LONG_EVAL)
        if not wait_for(lambda: len(read_jsonl(samples)) >= 4, running, 120):
            running.wait(1)
            return Verdict("crash", "the evaluation ended or stalled before two batches")
        running.signal(sig)
        proc = running.wait(60)
        if proc.timed_out:
            return Verdict("hang", f"still running 60 s after {signal.Signals(sig).name}")
        kept = len(read_jsonl(samples))
        again = ctx.run(ctx.entry(*overrides("evaluate", LONG_EVAL)), 180)
        verdict = judge_result(again, lambda: samples_problem(ctx, 2, 10))
        verdict.extra["samples_kept"] = kept
        return verdict

    return run


def concurrent(entry: str, changes: dict, consistent: Callable[[Context], str | None], both_ok_outcome: str):
    """Two identical runs into one folder at once. Right: both succeed with consistent outputs (``ok``), or one
    succeeds and the other is refused clearly, naming the folder (``clear_error``). Both succeeding with
    inconsistent outputs is ``silent_wrong`` when ``consistent`` finds duplicates, else ``both_ok_outcome``."""

    def run(ctx: Context) -> Verdict:
        first = start_entry(ctx, entry, changes)
        second = start_entry(ctx, entry, changes)
        a, b = first.wait(240), second.wait(240)
        if a.timed_out or b.timed_out:
            return Verdict("hang", "a run did not finish within 240 s")
        problem = consistent(ctx)
        if a.rc == 0 and b.rc == 0:
            if problem:
                return Verdict("silent_wrong", f"both runs exit 0: {problem}")
            return Verdict(
                both_ok_outcome,
                "both runs exit 0 into one folder"
                + ("" if both_ok_outcome == "ok" else ": one run's results replaced the other's"),
            )
        if a.rc != 0 and b.rc != 0:
            said = [failure_message(p.err)[:150] for p in (a, b)]
            return Verdict("crash", f"both runs failed: {said[0]} | {said[1]}")
        refused = a if a.rc != 0 else b
        verdict = judge_refusal(refused, [re.escape(str(ctx.work / "out"))], before_load=False)
        if problem and verdict.outcome in ("clear_error", "unclear_error"):
            return Verdict("silent_wrong", f"one run refused, but: {problem}")
        return verdict

    return run


def steps_once(ctx: Context) -> str | None:
    """None when no step of ``{work}/out/metrics.jsonl`` is logged twice."""
    steps = training_steps(ctx.work / "out")
    twice = sorted({s for s in steps if steps.count(s) > 1})
    return f"steps logged twice in metrics.jsonl: {twice}" if twice else None


DISK = [r"no space|ENOSPC|disk|space left|file too large|EFBIG"]  # what an error on a full disk must say


def full_disk_train(ctx: Context) -> Verdict:
    with ctx.full_disk("out", 2048) as (out, fsize):
        proc = ctx.run(ctx.entry(*overrides("train", {"max_steps": 2, "output_dir": str(out)})), 180, fsize=fsize)
        half = half_written(out)
        staged = [p.name for p in (out / ".staging").glob("*")] if (out / ".staging").is_dir() else []
    extra = {"full_disk": ctx.notes["full_disk"]}
    if proc.rc == 0 and not proc.timed_out:
        return Verdict("silent_wrong", "exit 0 although a save cannot fit", extra)
    if half or staged:
        return Verdict("data_lost", f"half-written checkpoints left: {half or staged}", extra)
    verdict = judge_refusal(proc, DISK, before_load=False, code=None)
    verdict.extra.update(extra)
    return verdict


def full_disk_eval(ctx: Context) -> Verdict:
    with ctx.full_disk("out", 48) as (out, fsize):
        changes = {
            "data.limit": 40,
            "max_completion_length": 16,
            "num_generations": 2,
            "output_dir": str(out),
        }
        proc = ctx.run(ctx.entry(*overrides("evaluate", changes)), 180, fsize=fsize)
    verdict = judge_refusal(proc, DISK, before_load=False, code=None)
    if verdict.outcome == "silent_wrong":
        verdict = Verdict("silent_wrong", "exit 0 although the results cannot fit")
    verdict.extra["full_disk"] = ctx.notes["full_disk"]
    return verdict


def full_disk_traces(ctx: Context) -> Verdict:
    """A traces file from an earlier call is there; this call's write fails on a full disk: the earlier file must
    stay whole (written through a temporary file and a rename), no partial temporary file may stay behind (it
    would keep the disk full), and the error must name the disk."""
    with ctx.full_disk("disk", 16) as (disk, fsize):
        target = disk / "traces.jsonl"
        earlier = "".join(
            json.dumps(
                {"id": i, "prompt": "p", "completion": "c", "completion_ids": [5, 2], "answer": "1", "correct": True}
            )
            + "\n"
            for i in range(20)
        )
        target.write_text(earlier)
        changes = {
            "output": str(target),
            "num_generations": 4,
            "data.limit": 16,
            "max_completion_length": 48,
        }
        proc = ctx.run(ctx.entry(*overrides("traces", changes)), 180, fsize=fsize)
        intact = read_text(target) == earlier
        left = sorted(p.name for p in disk.iterdir() if p != target and not p.name.endswith(".lock"))
    extra = {"full_disk": ctx.notes["full_disk"]}
    if proc.rc == 0 and not proc.timed_out:
        return Verdict("silent_wrong", "exit 0 although the traces cannot fit", extra)
    if not intact:
        return Verdict("data_lost", "the earlier traces file was destroyed by the failed write", extra)
    if left:
        return Verdict("unclear_error", f"the failed write left {', '.join(left)} behind on the full disk", extra)
    verdict = judge_refusal(proc, DISK, before_load=False, code=None)
    verdict.extra.update(extra)
    return verdict


def train_then(
    changes_first: dict,
    prepare: Callable[[Context, Path], None] | None,
    changes_second: dict,
    judge: Callable[[Context, Proc], Verdict],
):
    """Train once (must succeed), ``prepare`` the folder, train again with ``changes_second``, ``judge`` it."""

    def run(ctx: Context) -> Verdict:
        out = ctx.work / "out"
        first = ctx.run(ctx.entry(*overrides("train", changes_first)), 180)
        if first.rc != 0:
            return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
        if prepare:
            prepare(ctx, out)
        second = ctx.run(ctx.entry(*overrides("train", changes_second)), 180)
        return judge(ctx, second)

    return run


def garble_metrics(ctx: Context, out: Path) -> None:
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "loss": NaN, "cut off\n')
    (out / "eval.json").unlink()  # a run that stopped before its end


LISTED, CONTROL, NEW, ROUND3 = ("listed", "control", "new", "round3")  # the kinds of case (bench_faults.KINDS)
CATEGORY = "state_faults"
THREE_STEPS = {"max_steps": 3}
SIX_STEPS = {"max_steps": 6}
TWO_STEPS = {"max_steps": 2, "save_steps": 1}


def resumed_ok(max_steps):
    return lambda ctx, proc: judge_result(proc, lambda: steps_problem(ctx.work / "out", max_steps))


def refused(names):
    return lambda ctx, proc: judge_refusal(proc, names, before_load=True)


def reuse_eval(ctx: Context) -> Verdict:
    first = ctx.run(ctx.entry(*overrides("evaluate", {"data.limit": 3})), 120)
    if first.rc != 0:
        return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
    again = ctx.run(ctx.entry(*overrides("evaluate", {"data.limit": 3})), 120)
    return judge_result(again, lambda: samples_problem(ctx, 1, 3))


def other_settings_eval(ctx: Context) -> Verdict:
    first = ctx.run(ctx.entry(*overrides("evaluate", {})), 120)
    if first.rc != 0:
        return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
    again = ctx.run(ctx.entry(*overrides("evaluate", {"temperature": 0.3})), 120)
    return judge_refusal(again, ["temperature"])


def finished_again(ctx: Context, proc: Proc) -> Verdict:

    def check():
        saved = last_json_line(proc.out)
        first = json.loads((ctx.work / "out" / "eval.json").read_text())
        return None if saved == first else f"printed {saved}, the saved evaluation is {first}"

    return judge_result(proc, check)


def damaged_then_resumed(damage_file):
    """Train 2 steps (a checkpoint each), damage ``damage_file`` of checkpoint-2, resume=last to step 3: right
    is resuming from checkpoint-1 with a line naming the damage, every step logged once."""

    def run(ctx: Context) -> Verdict:
        out = ctx.work / "out"
        first = ctx.run(ctx.entry(*overrides("train", TWO_STEPS)), 180)
        if first.rc != 0:
            return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
        damage_file(out / "checkpoint-2")
        proc = ctx.run(ctx.entry(*overrides("train", {**TWO_STEPS, "max_steps": 3, "resume": "last"})), 240)

        def check():
            problem = steps_problem(out, 3)
            if problem:
                return problem
            return None if re.search("checkpoint-2 is damaged", proc.err) else "no line named the damaged checkpoint"

        return judge_result(proc, check)

    return run


def truncate(name):

    def cut(folder: Path) -> None:
        path = folder / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return cut


def garbage(folder: Path) -> None:
    (folder / "trainer_state.json").write_text("{not json")


def resume_damaged(ctx: Context) -> Verdict:
    out = ctx.work / "out"
    first = ctx.run(ctx.entry(*overrides("train", TWO_STEPS)), 180)
    if first.rc != 0:
        return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
    truncate("model.safetensors")(out / "checkpoint-2")
    proc = ctx.run(
        ctx.entry(*overrides("train", {**TWO_STEPS, "max_steps": 3, "resume": str(out / "checkpoint-2")})), 240
    )
    return judge_refusal(proc, ["model.safetensors"])


def export_damaged(ctx: Context) -> Verdict:
    out = ctx.work / "out"
    first = ctx.run(ctx.entry(*overrides("train", {"max_steps": 1})), 180)
    if first.rc != 0:
        return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
    truncate("model.safetensors")(out)
    proc = ctx.run([ctx.python, "-m", "gkv_train.cli", "export", str(out), str(ctx.work / "merged")], 180)
    return judge_refusal(proc, ["model.safetensors"], must_not_exist=[ctx.work / "merged"])


def damaged_model_copy(damage):
    """An evaluation, then the tiny model's converted copy in the model cache (``GKV_TRAIN_CACHE``) damaged by
    ``damage``, then the same evaluation into another folder: right is the same samples as the first, with a line
    naming the copy (it is made again from its source)."""

    def run(ctx: Context) -> Verdict:
        env = {"GKV_TRAIN_CACHE": str(ctx.work / "cache")}
        first = ctx.run(
            ctx.entry(*overrides("evaluate", {"data.limit": 3, "output_dir": "{work}/first"})), 120, env=env
        )
        if first.rc != 0:
            return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
        (copy,) = (ctx.work / "cache").glob("tiny-*")
        damage(copy)
        again = ctx.run(ctx.entry(*overrides("evaluate", {"data.limit": 3})), 120, env=env)

        def check():
            problem = samples_problem(ctx, 1, 3)
            if problem:
                return problem
            before = [s["completion"] for s in read_jsonl(ctx.work / "first" / "full" / "samples.jsonl")]
            after = [s["completion"] for s in read_jsonl(ctx.work / "out" / "full" / "samples.jsonl")]
            if before != after:
                return f"other completions than before the damage: {after} against {before}"
            return None if re.search(f"{re.escape(str(copy))} is damaged", again.err) else "no line named the copy"

        return judge_result(again, check)

    return run


def resume_other(changes_second: dict, names: list[str]):
    """A run into {work}/first (1 step), then one into {work}/out resuming its checkpoint with
    ``changes_second``: refused, naming ``names``, before the model loads."""

    def run(ctx: Context) -> Verdict:
        first = ctx.run(ctx.entry(*overrides("train", {"output_dir": "{work}/first"})), 180)
        if first.rc != 0:
            return Verdict("crash", f"the first run failed: {failure_message(first.err)[:300]}")
        second = {"resume": "{work}/first/checkpoint-1", **changes_second}
        proc = ctx.run(ctx.entry(*overrides("train", second)), 180)
        return judge_refusal(proc, names, must_not_exist=[ctx.work / "out"])

    return run


# (name, kind, about, run, timeout): a case and the function that runs and judges it
ROWS = [
    (
        "state_faults/two-evaluate-one-folder",
        LISTED,
        "two scripts/evaluate.py runs into one folder at once: both exit 0 and samples.jsonl is duplicated (pass@1 "
        "doubled)",
        concurrent(
            "evaluate",
            {"data.limit": 6, "batch_problems": 1, "num_generations": 2, "max_completion_length": 24},
            lambda ctx: samples_problem(ctx, 2, 6),
            "ok",
        ),
        300,
    ),
    (
        "state_faults/two-train-one-folder",
        LISTED,
        "two train.py runs into one output_dir at once: both exit 0, steps logged twice",
        concurrent("train", {"max_steps": 20, "data.limit": 8}, steps_once, "data_lost"),
        300,
    ),
    (
        "state_faults/sigterm-train",
        LISTED,
        "SIGTERM mid-run (save_steps beyond the run): nothing saved, nothing logged; then resume=last",
        interrupted_train(signal.SIGTERM, 1000),
        400,
    ),
    (
        "state_faults/sigkill-train-resume",
        CONTROL,
        "SIGKILL mid-run (a checkpoint every step), then resume=last: finishes with every step logged once",
        interrupted_train(signal.SIGKILL, 1),
        400,
    ),
    (
        "state_faults/sigkill-evaluate-resume",
        CONTROL,
        "SIGKILL mid-evaluation, then the same call: continues, every sample once",
        interrupted_eval(signal.SIGKILL),
        300,
    ),
    (
        "state_faults/sigterm-evaluate-resume",
        CONTROL,
        "SIGTERM mid-evaluation, then the same call",
        interrupted_eval(signal.SIGTERM),
        300,
    ),
    (
        "state_faults/full-disk-train",
        LISTED,
        "a full disk during a checkpoint save: the error must name the disk (was 'basic_ios::clear: iostream "
        "error'), nothing half-written",
        full_disk_train,
        240,
    ),
    (
        "state_faults/full-disk-evaluate",
        NEW,
        "a full disk while scripts/evaluate.py writes its samples",
        full_disk_eval,
        240,
    ),
    (
        "state_faults/full-disk-traces-keeps-old",
        NEW,
        "a full disk while generate_traces.py replaces an earlier traces file",
        full_disk_traces,
        240,
    ),
    (
        "state_faults/resume-garbled-metrics",
        CONTROL,
        "resume=last with a damaged last line in metrics.jsonl",
        train_then(THREE_STEPS, garble_metrics, {**THREE_STEPS, "resume": "last"}, resumed_ok(3)),
        400,
    ),
    (
        "state_faults/resume-staging-leftover",
        CONTROL,
        "resume=last with a leftover .staging folder",
        train_then(
            THREE_STEPS,
            lambda ctx, out: (out / ".staging" / "checkpoint-9").mkdir(parents=True),
            {**SIX_STEPS, "resume": "last"},
            resumed_ok(6),
        ),
        400,
    ),
    (
        "state_faults/resume-bare-checkpoint",
        CONTROL,
        "resume=last beside a bare checkpoint-99 (no trainer state)",
        train_then(
            THREE_STEPS,
            lambda ctx, out: (out / "checkpoint-99").mkdir(),
            {**SIX_STEPS, "resume": "last"},
            resumed_ok(6),
        ),
        400,
    ),
    (
        "state_faults/resume-raised-max-steps",
        CONTROL,
        "a finished run continued with a higher max_steps",
        train_then(THREE_STEPS, None, {**SIX_STEPS, "resume": "last"}, resumed_ok(6)),
        400,
    ),
    (
        "state_faults/resume-finished",
        CONTROL,
        "resume=last on a finished run: nothing trained, the saved evaluation printed",
        train_then(THREE_STEPS, None, {**THREE_STEPS, "resume": "last"}, finished_again),
        400,
    ),
    (
        "state_faults/second-run-refused",
        CONTROL,
        "a second run into a folder holding a run (no resume)",
        train_then(THREE_STEPS, None, THREE_STEPS, refused(["output_dir|resume|overwrite"])),
        400,
    ),
    (
        "state_faults/resume-another-run",
        ROUND3,
        "resume=<another run's checkpoint> output_dir=<new> learning_rate=1e-3: accepted, trains at the other run's "
        "2e-6",
        resume_other({"learning_rate": 0.001}, ["another run"]),
        400,
    ),
    (
        "state_faults/resume-another-architecture",
        ROUND3,
        "resume=<a tiny-llama run's checkpoint> with model=tiny-qwen2: an optimizer param-group traceback",
        resume_other({"model": "tiny-qwen2", "output_dir": "{work}/first"}, ["model"]),
        400,
    ),
    (
        "state_faults/resume-changed-learning-rate",
        ROUND3,
        "resume=last with another learning_rate: the checkpoint's optimizer and scheduler keep the old one, silently",
        train_then(
            {"max_steps": 1},
            None,
            {"max_steps": 2, "resume": "last", "learning_rate": 0.001},
            refused(["learning_rate"]),
        ),
        400,
    ),
    (
        "state_faults/checkpoint-truncated-model",
        ROUND3,
        "the newest checkpoint's model.safetensors truncated: a traceback naming no file, and it still counted as "
        "complete for resume=last",
        damaged_then_resumed(truncate("model.safetensors")),
        500,
    ),
    (
        "state_faults/checkpoint-truncated-optimizer",
        ROUND3,
        "the newest checkpoint's optimizer.pt truncated: torch's reader error",
        damaged_then_resumed(truncate("optimizer.pt")),
        500,
    ),
    (
        "state_faults/checkpoint-garbage-trainer-state",
        ROUND3,
        "garbage in the newest checkpoint's trainer_state.json: one line naming no file",
        damaged_then_resumed(garbage),
        500,
    ),
    (
        "state_faults/resume-damaged-checkpoint",
        ROUND3,
        "resume=<a checkpoint whose model.safetensors is truncated>: a traceback naming no file",
        resume_damaged,
        400,
    ),
    (
        "state_faults/export-damaged-model",
        ROUND3,
        "gkv-train export of a run whose model.safetensors is truncated: a traceback naming no file",
        export_damaged,
        400,
    ),
    (
        "state_faults/model-copy-truncated",
        NEW,
        "the model cache's converted copy (model.safetensors) cut in half after it was written: safetensors' "
        "'incomplete metadata' traceback on every later load, naming no file",
        damaged_model_copy(truncate("model.safetensors")),
        300,
    ),
    (
        "state_faults/model-copy-garbage-config",
        NEW,
        "garbage in the model cache's converted copy (config.json): transformers' 'not a valid JSON file' traceback "
        "on every later load",
        damaged_model_copy(lambda folder: (folder / "config.json").write_text("{not json")),
        300,
    ),
    (
        "state_faults/evaluate-reused",
        CONTROL,
        "the same evaluation twice: results reused, not duplicated",
        reuse_eval,
        120.0,
    ),
    (
        "state_faults/evaluate-other-settings",
        CONTROL,
        "another evaluation into a folder of other settings",
        other_settings_eval,
        120.0,
    ),
]

# (name, kind, about, entry, changes, patterns, options): a case whose right outcome is a clear refusal naming every
# pattern (``refuse``; ``options``: its keywords)
REFUSALS = [
    (
        "state_faults/resume-not-a-checkpoint",
        CONTROL,
        "resume=<a folder that is no checkpoint>",
        "train",
        {"resume": "{work}/nothing"},
        ["nothing"],
        {"setup": lambda ctx: (ctx.work / "nothing").mkdir()},
    ),
    (
        "state_faults/refused-run-leaves-no-folder",
        ROUND3,
        "resume=<missing> into a new output_dir: refused, but the folder was created with a .run.lock in it",
        "train",
        {"resume": "{work}/missing"},
        ["missing"],
        {"must_not_exist": ["{work}/out"]},
    ),
]


def state_cases() -> list[Case]:
    cases = [Case(name, CATEGORY, kind, about, run, timeout) for name, kind, about, run, timeout in ROWS]
    return cases + [
        refuse(name, CATEGORY, kind, about, entry, changes, patterns, **options)
        for name, kind, about, entry, changes, patterns, options in REFUSALS
    ]
