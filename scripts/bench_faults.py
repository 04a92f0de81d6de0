"""A hostile-input and fault probe of a checkout: ~180 cases through ``train.py``, ``scripts/evaluate.py``,
``scripts/generate_traces.py`` and the reward functions, each outcome classified against what is right.

    python scripts/bench_faults.py --tag before --repo /path/to/old/checkout   # results/bench_faults_before.json
    python scripts/bench_faults.py --tag after                                 # this checkout
    python scripts/bench_faults.py --list                                      # the cases
    python scripts/bench_faults.py --tag after --cases 'rewards/*'             # a subset (glob, or a substring)

Every case runs in its own subprocesses (``--python`` on the ``--repo`` checkout: the working folder is a fresh
folder of the case, ``PYTHONPATH`` is the checkout, and every case checks that ``gkv_train`` was imported from
there), under ``nice``, ``OMP_NUM_THREADS=1``, ``HF_HUB_OFFLINE=1``, an address-space cap (``--memory-gb``,
RLIMIT_AS: a runaway allocation fails in the child instead of exhausting the machine) and a per-case time limit
(the whole process group is killed at the limit). A ``sitecustomize`` module put first on the children's
``PYTHONPATH`` records where ``gkv_train`` was imported from and every model load
(``gkv_train.models.load_model``, ``PreTrainedModel.from_pretrained``); it changes nothing else. Results go to
``<out>/cases.jsonl`` as each case finishes; a case already there is not run again (``--fresh`` starts over), so
an interrupted probe continues. At the end: one JSON line on stdout (the table), ``<results>/bench_faults_<tag>.json``
(command, date, the checkout's commit, the table, every case's outcome and detail) and ``bench_faults_<tag>.md``.

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
message; so that the table shows both), ``new`` (not in that list).
A full disk is a tmpfs of a few KB mounted on the case's output folder where ``mount`` is allowed (root): writes
fail with ENOSPC as on a real full disk. Without that permission a file-size limit (RLIMIT_FSIZE) stands in:
writes then fail with EFBIG ("File too large"), per file rather than in total; the results name which was used.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
OUTCOMES = ("ok", "clear_error", "unclear_error", "silent_wrong", "crash", "hang", "data_lost")
CATEGORIES = ("harness", "rewards", "configuration", "data", "state_faults", "output")
KINDS = ("listed", "control", "new")
REFUSAL_CODE = 2
TRACEBACK = "Traceback (most recent call last)"
HYDRA_DUMP = "Error executing job"
TAIL = 1500  # characters of each stream kept per process in cases.jsonl

SITECUSTOMIZE = '''"""Written by scripts/bench_faults.py for its child processes: appends to $BENCH_FAULTS_MARKS where
gkv_train is imported from and every model load. Changes nothing else."""
import functools
import importlib.abc
import json
import os
import sys
import time

_PATH = os.environ.get("BENCH_FAULTS_MARKS")


def _mark(event, **fields):
    if not _PATH:
        return
    try:
        with open(_PATH, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), "time": time.time(), **fields}) + "\\n")
    except OSError:
        pass


def _imported(module):
    _mark("import", module=module.__name__, file=getattr(module, "__file__", None))


def _wrap_load_model(module):
    _imported(module)
    original = module.load_model

    @functools.wraps(original)
    def load_model(*args, **kwargs):
        _mark("model_load", via="gkv_train.models.load_model", args=[str(a) for a in args[:1]])
        return original(*args, **kwargs)

    module.load_model = load_model


def _wrap_from_pretrained(module):
    cls = getattr(module, "PreTrainedModel", None)
    raw = None if cls is None else cls.__dict__.get("from_pretrained")
    if not isinstance(raw, classmethod):
        return
    original = raw.__func__

    @functools.wraps(original)
    def from_pretrained(klass, *args, **kwargs):
        _mark("model_load", via="PreTrainedModel.from_pretrained", args=[str(a) for a in args[:1]])
        return original(klass, *args, **kwargs)

    cls.from_pretrained = classmethod(from_pretrained)


_HOOKS = {"gkv_train": _imported, "gkv_train.models": _wrap_load_model,
          "transformers.modeling_utils": _wrap_from_pretrained}


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        hook = _HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def run(module):
            exec_module(module)
            try:
                hook(module)
            except Exception:
                pass

        loader.exec_module = run
        return spec


if _PATH:
    sys.meta_path.insert(0, _AfterImport())
'''

CHECKS_MODULE = '''"""Written by scripts/bench_faults.py: answer checks for the reward worker that misbehave on
purpose."""
import os
import signal
import time


def die_once(gold, pred):
    """Killed (SIGKILL) the first time ever (a marker file, $BENCH_FAULTS_DIE_MARKER, remembers); then the real
    check."""
    marker = os.environ["BENCH_FAULTS_DIE_MARKER"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    from gkv_rewards.verify import answers_match

    return answers_match(gold, pred)


def die_always(gold, pred):
    os.kill(os.getpid(), signal.SIGKILL)


def sleep_long(gold, pred):
    time.sleep(120)
    return True


def raise_always(gold, pred):
    raise ValueError("malformed")
'''

# The reward cases' child: evaluates its spec (a Python literal; nan / inf allowed) and prints one result line.
REWARD_CHILD = r'''
import json, sys, time
spec = eval(open(sys.argv[1]).read(), {"nan": float("nan"), "inf": float("inf"), "__builtins__": {"set": set}})
start = time.time()
try:
    if spec["call"] == "accuracy":
        from gkv_rewards.functions import accuracy, verifier_stats
        out = {"scores": accuracy(prompts=None, completions=spec["completions"], answer=spec["answers"]),
               "stats": verifier_stats()}
    elif spec["call"] == "boxed_format":
        from gkv_rewards.functions import boxed_format
        out = {"scores": boxed_format(prompts=None, completions=spec["completions"])}
    else:
        from gkv_rewards.verify import CHECK, MathVerifier
        verifier = MathVerifier(timeout=spec.get("timeout", 5.0), check=spec.get("check", CHECK))
        out = {"scores": [float(verifier(pred, gold)) for pred, gold in spec["pairs"]], "stats": dict(verifier.stats)}
        verifier.close()
except Exception as err:
    out = {"raised": type(err).__name__, "message": str(err)[:400]}
out["seconds"] = time.time() - start
print("BENCH_RESULT " + json.dumps(out, default=str), flush=True)
'''


# ----------------------------------------------------------------------------------------------------- running


@dataclass
class Proc:
    """One finished child: exit code (negative: killed by that signal), output, seconds, whether it ran past its
    limit, and what the sitecustomize recorded (``marks``)."""

    argv: list[str]
    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool
    marks: list[dict]

    @property
    def model_loaded(self) -> bool:
        return any(m["event"] == "model_load" for m in self.marks)

    def record(self) -> dict:
        return {"argv": self.argv, "rc": self.rc, "seconds": round(self.seconds, 2), "timed_out": self.timed_out,
                "model_loaded": self.model_loaded, "stdout_tail": self.out[-TAIL:], "stderr_tail": self.err[-TAIL:]}


@dataclass
class Verdict:
    outcome: str
    detail: str
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        assert self.outcome in OUTCOMES, self.outcome


class Running:
    """A child started in the background (signals, concurrent runs); ``wait`` turns it into a ``Proc``. Its output
    is read through pipes (a file-size limit given to the child does not apply to them)."""

    def __init__(self, ctx: "Context", argv: list[str], popen: subprocess.Popen, marks: Path):
        self.ctx, self.argv, self.popen, self.marks = ctx, argv, popen, marks
        self.start = time.time()
        self._chunks: dict[str, list[bytes]] = {"out": [], "err": []}
        self._readers = [threading.Thread(target=self._read, args=(stream, self._chunks[key]), daemon=True)
                         for key, stream in (("out", popen.stdout), ("err", popen.stderr))]  # fmt: skip
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, chunks: list[bytes]) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            chunks.append(chunk)

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def wait(self, timeout: float) -> Proc:
        timed_out = False
        try:
            self.popen.wait(max(timeout - (time.time() - self.start), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
        kill_group(self.popen)
        for reader in self._readers:
            reader.join(10)
        text = {k: b"".join(v).decode(errors="replace") for k, v in self._chunks.items()}
        proc = Proc(self.argv, None if timed_out else self.popen.returncode, text["out"], text["err"],
                    time.time() - self.start, timed_out, read_marks(self.marks))  # fmt: skip
        self.ctx.procs.append(proc)
        return proc


def kill_group(popen: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child leads its own session: reward workers, relaunched
    processes), then reap the child."""
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    popen.wait()


def read_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def read_marks(path: Path) -> list[dict]:
    marks = []
    for line in read_text(path).splitlines():
        try:
            marks.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return marks


def import_roots(repo: Path) -> list[Path]:
    """The folders a checkout's packages import from: its three distributions' (rollout/, rewards/, the root),
    or an older tree's root alone."""
    split = (repo / "rollout" / "gkv_rollout").is_dir()
    return [repo / "rollout", repo / "rewards", repo] if split else [repo]


class Context:
    """What a case runs with: the checkout, the interpreter, a fresh work folder (the children's working folder),
    the limits; ``procs`` collects every child's record."""

    def __init__(self, repo: Path, python: str, work: Path, site: Path, memory_bytes: int, data_dir: Path | None):
        self.repo, self.python, self.work, self.site = repo, python, work, site
        self.memory_bytes, self.data_dir = memory_bytes, data_dir
        self.procs: list[Proc] = []
        self.notes: dict = {}
        self._count = 0

    def env(self, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR", "PYTHONSTARTUP")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(self.site), *map(str, import_roots(self.repo))]), OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", WANDB_MODE="offline",
            BENCH_FAULTS_DIE_MARKER=str(self.work / "worker-died-once"),
        )
        if self.data_dir is not None:
            env["GKV_DATA_DIR"] = str(self.data_dir)
        env.update(extra or {})
        return env

    def path(self, text: str) -> str:
        return text.replace("{work}", str(self.work))

    def entry(self, script: str, overrides: dict) -> list[str]:
        """``[python, <repo>/<script>, key=value, ...]`` ({work} in values: this case's folder)."""
        pairs = [f"{k}={self.path(hydra_value(v))}" for k, v in overrides.items()]
        return [self.python, str(self.repo / script), *pairs]

    def start(self, argv: list[str], fsize: int | None = None, env: dict | None = None) -> Running:
        self._count += 1
        marks = self.work / f".proc{self._count}.marks"
        limits = (self.memory_bytes, fsize)

        def child_setup():
            os.setsid()
            os.nice(10)
            resource.setrlimit(resource.RLIMIT_AS, (limits[0], limits[0]))
            if limits[1] is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limits[1], limits[1]))

        popen = subprocess.Popen(
            argv, cwd=self.work, env=self.env({"BENCH_FAULTS_MARKS": str(marks), **(env or {})}),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=child_setup,
        )
        return Running(self, argv, popen, marks)

    def run(self, argv: list[str], timeout: float, fsize: int | None = None, env: dict | None = None) -> Proc:
        return self.start(argv, fsize, env).wait(timeout)

    @contextmanager
    def full_disk(self, name: str, kilobytes: int):
        """A folder that fills after ``kilobytes``: yields (path, fsize) where fsize is the RLIMIT_FSIZE to give
        the children (None when a tmpfs of that size is mounted on the folder)."""
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        mounted = False
        if os.geteuid() == 0 and shutil.which("mount"):
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(path)],
                                  capture_output=True, check=False)  # fmt: skip
            mounted = done.returncode == 0
        self.notes["full_disk"] = "tmpfs (ENOSPC)" if mounted else "RLIMIT_FSIZE (EFBIG)"
        try:
            yield path, None if mounted else kilobytes * 1024
        finally:
            if mounted:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def hydra_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return str(value)


# ------------------------------------------------------------------------------------------------- classifying


def failure_message(err: str) -> str:
    """What a failed child said: its last ``error:`` line, else the exception line of its last traceback, else
    its last paragraph joined by " / " (Hydra's HYDRA_FULL_ERROR hint left out)."""
    lines = [line.rstrip() for line in err.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    if TRACEBACK in err:
        after = [l for l in err.rsplit(TRACEBACK, 1)[1].splitlines() if "HYDRA_FULL_ERROR" not in l]
        exception = [l for l in after if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)?\b.*", l)
                     and not l.startswith((" ", "\t"))]  # fmt: skip
        if exception:
            return exception[-1]
    paragraphs = "\n".join(line for line in err.splitlines() if "HYDRA_FULL_ERROR" not in line).strip().split("\n\n")
    return " / ".join(line.strip() for line in paragraphs[-1].splitlines() if line.strip())


def names_all(text: str, patterns: list[str]) -> bool:
    return all(re.search(p, text, re.IGNORECASE) for p in patterns)


def judge_refusal(proc: Proc, names: list[str], before_load: bool = True, must_not_exist: list[Path] = (),
                  code: int | None = REFUSAL_CODE) -> Verdict:
    """A case that expects a refusal (see the module docstring for the outcomes); ``code``: the exit code a clear
    refusal has (None: any but 0, for a failure of the machine, such as a full disk, rather than of the input)."""
    if proc.timed_out:
        return Verdict("hang", f"no answer within {proc.seconds:.0f} s (killed)")
    if proc.rc == 0:
        return Verdict("silent_wrong", "exit 0: the bad input was accepted")
    if proc.rc < 0:
        return Verdict("crash", f"killed by signal {signal.Signals(-proc.rc).name}: {failure_message(proc.err)[:200]}")
    message = failure_message(proc.err)
    dump = TRACEBACK in proc.err or HYDRA_DUMP in proc.err
    named = names_all(message, names)
    if dump and not named:
        return Verdict("crash", f"exit {proc.rc}, traceback: {message[:300]}")
    problems = []
    if dump:
        problems.append("a traceback" + (" (Hydra's dump)" if HYDRA_DUMP in proc.err else ""))
    if not named:
        problems.append(f"the message does not name the problem ({' & '.join(names)})")
    if code is not None and proc.rc != code:
        problems.append(f"exit {proc.rc}, not {code}")
    if not message.startswith("error:"):
        problems.append("no 'error:' line")
    if before_load and proc.model_loaded:
        problems.append("only after the model loaded")
    left = [str(p) for p in must_not_exist if Path(p).exists()]
    if left:
        problems.append(f"left {', '.join(left)} behind")
    if problems:
        return Verdict("unclear_error", "; ".join(problems) + f": {message[:300]}")
    return Verdict("clear_error", message[:300])


def judge_result(proc: Proc, check: Callable[[], str | None]) -> Verdict:
    """A case that expects a result: ``check()`` returns what is wrong with it, or None."""
    if proc.timed_out:
        return Verdict("hang", f"no result within {proc.seconds:.0f} s (killed)")
    if proc.rc != 0:
        how = f"killed by signal {signal.Signals(-proc.rc).name}" if proc.rc < 0 else f"exit {proc.rc}"
        return Verdict("crash", f"{how} on a valid input: {failure_message(proc.err)[:300]}")
    problem = check()
    return Verdict("silent_wrong", problem) if problem else Verdict("ok", "right result")


def judge_either(proc: Proc, names: list[str], check: Callable[[], str | None], before_load: bool = True) -> Verdict:
    """A case where a right result and a clear refusal are both right."""
    if proc.rc == 0 and not proc.timed_out:
        return judge_result(proc, check)
    return judge_refusal(proc, names, before_load)


# ------------------------------------------------------------------------------------------------ output reading


def strict_json(text: str):
    """``json.loads`` that refuses NaN / Infinity (what a strict parser does)."""

    def constant(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=constant)


def strict_file(path: Path) -> str | None:
    """None when ``path`` is strict JSON (or JSONL, every line), else what is wrong."""
    if not path.is_file():
        return f"{path.name} missing"
    text = path.read_text()
    try:
        if path.suffix == ".jsonl":
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    strict_json(line)
        else:
            strict_json(text)
    except ValueError as err:
        return f"{path.name} is not strict JSON: {err}"
    return None


def last_json_line(text: str):
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        return None
    try:
        return strict_json(lines[-1])
    except ValueError:
        return None


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def training_steps(out: Path) -> list[int]:
    """The steps of the training records of ``metrics.jsonl`` (those with a loss), in the order logged."""
    return [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]


def complete_checkpoints(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")
                  if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file())  # fmt: skip


def half_written(out: Path) -> list[str]:
    return [p.name for p in out.glob("checkpoint-*") if p.is_dir() and not (p / "trainer_state.json").is_file()]


def eval_problems(ctx: Context, run: str = "full", out: str = "{work}/out") -> int | None:
    path = Path(ctx.path(out)) / run / "summary.json"
    return json.loads(path.read_text()).get("problems") if path.is_file() else None


def samples_problem(ctx: Context, n: int, problems: int, run: str = "full", out: str = "{work}/out") -> str | None:
    """What is wrong with ``<out>/<run>/samples.jsonl`` and its summary for ``problems`` x ``n`` samples, or None:
    every (problem, sample) once, the summary's count and pass@1 equal to those of the samples."""
    folder = Path(ctx.path(out)) / run
    samples = read_jsonl(folder / "samples.jsonl")
    keys = [(s.get("problem_id"), s.get("sample")) for s in samples]
    if len(keys) != len(set(keys)):
        return f"samples.jsonl holds {len(keys) - len(set(keys))} duplicated samples ({len(keys)} lines)"
    if len(keys) != problems * n:
        return f"samples.jsonl holds {len(keys)} samples, not {problems} x {n}"
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        return "no summary.json"
    summary = json.loads(summary_path.read_text())
    if summary.get("problems") != problems:
        return f"summary counts {summary.get('problems')} problems, not {problems}"
    right = sum(bool(s.get("correct")) for s in samples) / len(samples)
    if summary.get("pass@1") is None or abs(summary["pass@1"] - right) > 1e-9:
        return f"summary pass@1 {summary.get('pass@1')} but the samples give {right}"
    return None


def write_jsonl(path: Path, records: list) -> Path:
    """``records`` as lines: a dict as JSON (NaN written as the bare NaN that json.dumps allows), a string as is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for record in records:
            f.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return path


# --------------------------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str
    category: str
    kind: str
    about: str
    run: Callable[[Context], Verdict]
    timeout: float = 120.0

    def __post_init__(self):
        assert self.category in CATEGORIES and self.kind in KINDS, self.name


TRAIN = {"model": "tiny", "max_steps": 1, "prompts_per_step": 1, "sampling.num_generations": 2, "sampling.max_new_tokens": 8,
         "data.limit": 4, "eval_data.limit": 2, "output_dir": "{work}/out"}  # fmt: skip
EVAL = {"model": "tiny", "sampling.num_generations": 1, "sampling.max_new_tokens": 4, "data.limit": 2, "output_dir": "{work}/out",
        "plots": False}  # fmt: skip
TRACES = {"model": "tiny", "sampling.num_generations": 1, "sampling.max_new_tokens": 4, "data.limit": 2,
          "output": "{work}/traces.jsonl", "keep_incorrect": True}  # fmt: skip
SCRIPTS = {"train": ("train.py", TRAIN), "evaluate": ("scripts/evaluate.py", EVAL),
           "traces": ("scripts/generate_traces.py", TRACES)}  # fmt: skip
FILE_DATA = {"data.name": None, "data.path": "{work}/data.jsonl"}


def overrides(entry: str, changes: dict) -> tuple[str, dict]:
    """The script of ``entry`` and its base overrides updated with ``changes`` (a value ``...`` drops the key)."""
    script, base = SCRIPTS[entry]
    merged = {**base, **changes}
    return script, {k: v for k, v in merged.items() if v is not ...}


def refuse(name, category, kind, about, entry, changes, names, before_load=True, setup=None, must_not_exist=(),
           timeout=120.0) -> Case:
    """A case whose right outcome is a clear refusal (``names``: patterns its message must match)."""

    def run(ctx: Context) -> Verdict:
        if setup:
            setup(ctx)
        script, ov = overrides(entry, changes)
        proc = ctx.run(ctx.entry(script, ov), timeout)
        return judge_refusal(proc, names, before_load, [Path(ctx.path(p)) for p in must_not_exist])

    return Case(name, category, kind, about, run, timeout)


def result(name, category, kind, about, entry, changes, check, setup=None, timeout=180.0) -> Case:
    """A case whose right outcome is exit 0 with ``check(ctx, proc)`` returning None."""

    def run(ctx: Context) -> Verdict:
        if setup:
            setup(ctx)
        script, ov = overrides(entry, changes)
        proc = ctx.run(ctx.entry(script, ov), timeout)
        return judge_result(proc, lambda: check(ctx, proc))

    return Case(name, category, kind, about, run, timeout)


def either(name, category, kind, about, entry, changes, names, check, before_load=True, setup=None,
           timeout=180.0) -> Case:
    """A case where a clear refusal and a right result (``check``) are both right."""

    def run(ctx: Context) -> Verdict:
        if setup:
            setup(ctx)
        script, ov = overrides(entry, changes)
        proc = ctx.run(ctx.entry(script, ov), timeout)
        return judge_either(proc, names, lambda: check(ctx, proc), before_load)

    return Case(name, category, kind, about, run, timeout)


# ---- rewards


def reward_case(name, kind, about, spec: dict, expect, timeout=60.0) -> Case:
    """A reward function or the verifier called directly in a child. ``expect``: the list of scores, or
    ``zero_or_raise`` / ``one_or_raise`` (the score, or a clear ValueError / TypeError naming the gold answer)."""

    def run(ctx: Context) -> Verdict:
        spec_file = ctx.work / "spec.py"
        spec_file.write_text(repr(spec))
        proc = ctx.run([ctx.python, "-c", REWARD_CHILD, str(spec_file)], timeout)
        if proc.timed_out:
            return Verdict("hang", f"no score within {proc.seconds:.0f} s")
        found = [l for l in proc.out.splitlines() if l.startswith("BENCH_RESULT ")]
        if proc.rc != 0 or not found:
            return Verdict("crash", f"exit {proc.rc}: {failure_message(proc.err)[:300]}")
        got = json.loads(found[-1].split(" ", 1)[1])
        extra = {"got": got}
        if "raised" in got:
            raised = f"{got['raised']}: {got['message'][:200]}"
            if isinstance(expect, str):
                if got["raised"] in ("ValueError", "TypeError") and re.search(r"gold|answer", got["message"], re.I):
                    return Verdict("clear_error", raised, extra)
                unclear = got["raised"] in ("ValueError", "TypeError")  # refused, but not naming the gold
                return Verdict("unclear_error" if unclear else "crash", raised, extra)
            return Verdict("crash", f"raised on a valid input: {raised}", extra)
        scores = got["scores"]
        want = {"zero_or_raise": [0.0], "one_or_raise": [1.0]}[expect] if isinstance(expect, str) else expect
        if scores != want:
            return Verdict("silent_wrong", f"scored {scores}, right is {want}", extra)
        return Verdict("ok", f"scored {scores} in {got['seconds']:.1f} s", extra)

    return Case(name, "rewards", kind, about, run, timeout)


def acc(name, kind, about, completion, gold, expect, timeout=60.0) -> Case:
    return reward_case(name, kind, about, {"call": "accuracy", "completions": [completion], "answers": [gold]},
                       [float(expect)] if not isinstance(expect, str) else expect, timeout)  # fmt: skip


def verifier_case(name, kind, about, check_name, expect_score, expect_stats=None, timeout=60.0,
                  verifier_timeout=5.0) -> Case:
    """The verifier with a misbehaving check (``CHECKS_MODULE``) on one right answer ('42' vs '42')."""
    spec = {"call": "verifier", "check": f"bench_faults_checks:{check_name}", "timeout": verifier_timeout,
            "pairs": [("42", "42")]}  # fmt: skip
    inner = reward_case(name, kind, about, spec, [expect_score], timeout)

    def run(ctx: Context) -> Verdict:
        verdict = inner.run(ctx)
        if verdict.outcome == "ok" and expect_stats:
            stats = verdict.extra["got"].get("stats", {})
            missing = {k: v for k, v in expect_stats.items() if stats.get(k, 0) < v}
            if missing:
                return Verdict("silent_wrong", f"scored {expect_score} but stats {stats} count none of {missing}",
                               verdict.extra)  # fmt: skip
        return verdict

    return Case(name, "rewards", kind, about, run, timeout)


def reward_cases() -> list[Case]:
    L, C, N = "listed", "control", "new"
    deep = "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}"
    cases = [
        # commas: lists vs thousands separators
        acc("rewards/boxed-1_2-vs-12", L, "\\boxed{1,2} against gold 12", "\\boxed{1,2}", "12", 0),
        acc("rewards/boxed-3_5-vs-35", L, "\\boxed{3,5} against gold 35", "\\boxed{3,5}", "35", 0),
        acc("rewards/math500-457-boxed-21", L, "MATH-500 line 457 (gold -2,1): \\boxed{-21}", "\\boxed{-21}", "-2,1",
            0),
        acc("rewards/math500-457-boxed-1_-2", L, "MATH-500 line 457 (gold -2,1): \\boxed{1,-2}", "\\boxed{1,-2}",
            "-2,1", 1),
        acc("rewards/gold-1_0-vs-10", L, "gold 1,0 against \\boxed{10}", "\\boxed{10}", "1,0", 0),
        acc("rewards/boxed-12_34-vs-1234", N, "a malformed thousands group \\boxed{12,34} against 1234",
            "\\boxed{12,34}", "1234", 0),
        acc("rewards/boxed-1_0-vs-10", N, "\\boxed{1,0} against gold 10", "\\boxed{1,0}", "10", 0),
        acc("rewards/boxed-35-vs-3_5", N, "\\boxed{35} against the list gold 3,5", "\\boxed{35}", "3,5", 0),
        acc("rewards/answer-is-list", N, "'the answer is 1,-2' (no box) against gold -2,1",
            "So the answer is 1,-2.", "-2,1", 1),
        acc("rewards/boxed--2_1-same-order", C, "\\boxed{-2,1} against gold -2,1", "\\boxed{-2,1}", "-2,1", 1),
        acc("rewards/boxed-3_space-5-vs-3_5", N, "\\boxed{3, 5} against gold 3,5", "\\boxed{3, 5}", "3,5", 1),
        acc("rewards/boxed-1_000-vs-1000", C, "a thousands separator \\boxed{1,000} against 1000", "\\boxed{1,000}",
            "1000", 1),
        acc("rewards/hashes-1_234", C, "GSM8K '#### 1,234' against 1234", "so #### 1,234", "1234", 1),
        acc("rewards/last-number-1_000", C, "the last number '1,000 apples' against gold 1000 (int)",
            "She has 1,000 apples.", 1000, 1),
        acc("rewards/tuple-order", C, "an ordered pair (2,1) against (1,2)", "\\boxed{(2,1)}", "(1,2)", 0),
        acc("rewards/decimal-vs-list", C, "\\boxed{1.2} against the list gold 1,2", "\\boxed{1.2}", "1,2", 0),
        # golds that are no answer
        acc("rewards/gold-nan-text", L, "gold 'nan' against \\boxed{nan}", "\\boxed{nan}", "nan", "zero_or_raise"),
        acc("rewards/gold-None-text", L, "gold 'None' against \\boxed{None}", "\\boxed{None}", "None", "zero_or_raise"),
        acc("rewards/gold-nan-float", L, "gold NaN (a JSON NaN) against \\boxed{nan}", "\\boxed{nan}", float("nan"),
            "zero_or_raise"),
        acc("rewards/gold-None", L, "gold None against \\boxed{None}", "\\boxed{None}", None, "zero_or_raise"),
        acc("rewards/gold-list-2", L, "gold [2] (a list) against \\boxed{2}: read as the text '[2]'", "\\boxed{2}",
            [2], "one_or_raise"),
        acc("rewards/gold-null-text", N, "gold 'null' against \\boxed{null}", "\\boxed{null}", "null", "zero_or_raise"),
        acc("rewards/gold-inf-float", N, "gold inf (a float) against \\boxed{inf}", "\\boxed{inf}", float("inf"),
            "zero_or_raise"),
        acc("rewards/gold-empty", N, "gold '' against an empty box", "\\boxed{}", "", "zero_or_raise"),
        acc("rewards/gold-blank", N, "gold '   ' against \\boxed{ }", "\\boxed{ }", "   ", "zero_or_raise"),
        acc("rewards/gold-true", N, "gold True (a boolean) against \\boxed{True}", "\\boxed{True}", True,
            "zero_or_raise"),
        acc("rewards/gold-dict", N, "gold {} (a dict) against \\boxed{\\{\\}}", "\\boxed{\\{\\}}", {}, "zero_or_raise"),
        acc("rewards/gold-list-1_2", N, "gold [1, 2] (a list) against \\boxed{1,2}", "\\boxed{1,2}", [1, 2],
            "one_or_raise"),
        acc("rewards/gold-list-strings", N, "gold ['1', '2'] against \\boxed{1,2}", "\\boxed{1,2}", ["1", "2"],
            "one_or_raise"),
        acc("rewards/gold-set", N, "gold {1, 2} (a set) against \\boxed{1,2}", "\\boxed{1,2}", {1, 2}, "one_or_raise"),
        acc("rewards/gold-empty-list", N, "gold [] against \\boxed{[]}", "\\boxed{[]}", [], "zero_or_raise"),
        # what already worked
        acc("rewards/plain-right", C, "\\boxed{42} against 42", "\\boxed{42}", "42", 1),
        acc("rewards/plain-wrong", C, "\\boxed{41} against 42", "\\boxed{41}", "42", 0),
        acc("rewards/hashes-int-gold", C, "'#### 42' against gold 42 (int)", "#### 42", 42, 1),
        acc("rewards/gold-float-27.0", C, "AMC gold 27.0 (float) against \\boxed{27}", "\\boxed{27}", 27.0, 1),
        acc("rewards/gold-aime-0042", C, "AIME gold '0042' against \\boxed{42}", "\\boxed{42}", "0042", 1),
        acc("rewards/frac-vs-decimal", C, "gold \\frac{1}{2} against \\boxed{0.5}", "\\boxed{0.5}", "\\frac{1}{2}", 1),
        acc("rewards/decimal-vs-frac", C, "gold 0.5 against \\boxed{\\frac12}", "\\boxed{\\frac12}", "0.5", 1),
        acc("rewards/sqrt", C, "gold \\frac{\\sqrt{3}}{2} against \\boxed{\\frac{\\sqrt3}{2}}",
            "\\boxed{\\frac{\\sqrt3}{2}}", "\\frac{\\sqrt{3}}{2}", 1),
        acc("rewards/answer-is-fraction", C, "'the answer is 3/4' against 3/4", "The answer is 3/4", "3/4", 1),
        acc("rewards/scientific", C, "gold 2.5e-3 against \\boxed{0.0025}", "\\boxed{0.0025}", "2.5e-3", 1),
        acc("rewards/huge-exponent-wrong", C, "\\boxed{1e100000000} against 1 (must not build the number)",
            "\\boxed{1e100000000}", "1", 0),
        acc("rewards/huge-exponent-right", C, "\\boxed{1e100000000} against the same", "\\boxed{1e100000000}",
            "1e100000000", 1),
        acc("rewards/megabyte-of-digits", C, "a completion of 1 MB of digits against 7", "9" * 1_000_000, "7", 0),
        acc("rewards/unterminated-box", C, "an unterminated \\boxed{5 against 5: the last number (the documented "
            "fallback)", "so \\boxed{5", "5", 1),
        acc("rewards/deep-braces", C, "3000 nested braces in the box against 1", deep, "1", 0),
        acc("rewards/power-tower", C, "\\boxed{9^{9^{9^{9^{9}}}}} against 1 (time-limited check)",
            "\\boxed{9^{9^{9^{9^{9}}}}}", "1", 0),
        acc("rewards/nul-bytes", C, "NUL bytes around \\boxed{5}", "\x00\\boxed{5}\x00", "5", 1),
        acc("rewards/empty-completion", C, "an empty completion against 5", "", "5", 0),
        acc("rewards/none-completion", C, "a None completion against 5", None, "5", 0),
        acc("rewards/conversational", C, "a conversational completion [{'role': 'assistant', ...}]",
            [{"role": "assistant", "content": "\\boxed{7}"}], "7", 1),
        acc("rewards/last-box-counts", C, "two boxes, the last one right", "\\boxed{1} no, \\boxed{2}", "2", 1),
        acc("rewards/set-latex", C, "gold \\{1,2\\} against \\boxed{\\{2,1\\}}", "\\boxed{\\{2,1\\}}", "\\{1,2\\}", 1),
        acc("rewards/interval", C, "gold [1,2) against \\boxed{(1,2]}", "\\boxed{(1,2]}", "[1,2)", 0),
        acc("rewards/boxed-nan-vs-number", C, "\\boxed{nan} against 5", "\\boxed{nan}", "5", 0),
        reward_case("rewards/boxed-format", C, "boxed_format on a boxed and an unboxed completion",
                    {"call": "boxed_format", "completions": ["\\boxed{3}", "3"]}, [1.0, 0.0]),
        # the verifier's worker
        verifier_case("rewards/worker-killed-once", L, "the check's worker is killed during a right answer's check "
                      "(once): it must be retried, not scored 0 as a wrong answer", "die_once", 1.0),
        verifier_case("rewards/worker-always-dies", C, "a worker that dies on every check: 0 and counted as an error",
                      "die_always", 0.0, {"errors": 1}),
        verifier_case("rewards/check-hangs", C, "a check that never returns: 0 after the time limit, counted",
                      "sleep_long", 0.0, {"timeouts": 1}, verifier_timeout=2.0),
        verifier_case("rewards/check-raises", C, "a check that raises: 0 (a malformed answer), not a crash",
                      "raise_always", 0.0),
    ]
    return cases


# ---- configuration


def config_cases() -> list[Case]:
    L, C, N = "listed", "control", "new"
    K = "configuration"
    gone = ["{work}/out"]
    cases = [
        refuse("configuration/train-max_grad_norm-negative", K, L, "max_grad_norm=-1 accepted", "train",
               {"max_grad_norm": -1}, ["max_grad_norm"]),
        refuse("configuration/train-beta-negative", K, L, "beta=-0.1 (a negative KL weight) accepted", "train",
               {"beta": -0.1}, ["beta"]),
        refuse("configuration/train-epsilon-negative", K, L, "epsilon=-0.2 (a negative clip range) accepted", "train",
               {"epsilon": -0.2}, ["epsilon"]),
        refuse("configuration/train-grad-accum-zero", K, L, "gradient_accumulation_steps=0: ZeroDivisionError",
               "train", {"gradient_accumulation_steps": 0}, ["gradient_accumulation_steps"]),
        refuse("configuration/train-lora-r-zero", K, L, "lora.r=0 fails only after the model loads", "train",
               {"lora.enabled": True, "lora.r": 0}, [r"lora|\br\b"]),
        refuse("configuration/train-learning-rate-negative", K, L, "learning_rate=-1 fails only after the model loads",
               "train", {"learning_rate": -1}, [r"learning.rate"]),
        refuse("configuration/train-max-new-tokens-huge", K, L, "sampling.max_new_tokens=1000000000: a huge allocation after "
               "the model loads", "train", {"sampling.max_new_tokens": 1_000_000_000}, ["max_new_tokens"], before_load=False),
        either("configuration/train-rl_full-s4r", K, L, "recipe=rl_full compression.method=s4r: compressed rollouts "
               "trained without their record", "train", {"recipe": "rl_full", "compression.method": "s4r",
                                                           "max_steps": 2},
               [r"s4r|record|rl_full|compression"], lambda ctx, proc: mismatch_problem(ctx)),
        refuse("configuration/train-eval-limit-zero", K, N, "eval_data.limit=0 (read as 256 held-out problems)",
               "train", {"eval_data.limit": 0}, ["limit"]),
        refuse("configuration/train-eval-samples-zero", K, N, "eval_samples=0", "train", {"eval_samples": 0},
               ["eval_samples"]),
        refuse("configuration/train-warmup-negative", K, N, "warmup_steps=-1", "train", {"warmup_steps": -1},
               ["warmup"]),
        refuse("configuration/train-reward-missing", K, N, "rewards=[no.such.reward] (imported after the model "
               "loads)", "train", {"rewards": ["no.such.reward"]}, ["reward"]),
        refuse("configuration/train-lora-dropout", K, N, "lora.dropout=1.5", "train",
               {"lora.enabled": True, "lora.dropout": 1.5}, ["dropout"]),
        refuse("configuration/train-prompt-template-field", K, N, "data.prompt_template with an unknown field {foo}",
               "train", {"data.prompt_template": "'Q: {foo}'"}, ["template"]),
        refuse("configuration/train-output-dir-is-file", K, N, "output_dir names an existing file", "train",
               {"output_dir": "{work}/afile"}, ["afile"], setup=lambda ctx: (ctx.work / "afile").write_text("x\n")),
        refuse("configuration/train-temperature-zero", K, C, "sampling.temperature=0 in training (validated)", "train",
               {"sampling.temperature": 0}, ["temperature"]),
        refuse("configuration/train-temperature-nan", K, C, "sampling.temperature=nan", "train", {"sampling.temperature": "nan"},
               ["temperature"]),
        refuse("configuration/train-top-p", K, C, "sampling.top_p=1.5", "train", {"sampling.top_p": 1.5}, ["top_p"]),
        refuse("configuration/train-num-generations-one", K, C, "sampling.num_generations=1 under GRPO", "train",
               {"sampling.num_generations": 1}, ["num_generations"]),
        refuse("configuration/train-max-steps-zero", K, C, "max_steps=0", "train", {"max_steps": 0}, ["max_steps"]),
        refuse("configuration/train-save-steps-zero", K, C, "save_steps=0", "train", {"save_steps": 0}, ["save_steps"]),
        refuse("configuration/train-prompts-per-step-zero", K, C, "prompts_per_step=0", "train",
               {"prompts_per_step": 0}, ["prompts_per_step"]),
        refuse("configuration/train-unknown-key", K, C, "a misspelled key num_generation=2 (did you mean)", "train",
               {"num_generation": 2}, ["num_generation", "num_generations"]),
        refuse("configuration/train-wrong-type", K, C, "max_steps=abc", "train", {"max_steps": "abc"}, ["max_steps"]),
        refuse("configuration/train-loss-type", K, C, "loss_type=foo", "train", {"loss_type": "foo"}, ["loss_type"]),
        refuse("configuration/train-precision", K, C, "precision=fp16", "train", {"precision": "fp16"}, ["precision"]),
        refuse("configuration/train-method-unknown", K, C, "compression.method=foo", "train",
               {"compression.method": "foo"}, ["foo"]),
        refuse("configuration/train-budget-below-window", K, C, "compression.budget=4 with window 8", "train",
               {"compression.budget": 4}, ["budget"]),
        refuse("configuration/train-model-missing", K, C, "model=./no/such/model", "train",
               {"model": "./no/such/model"}, ["no/such/model"]),
        refuse("configuration/train-tracker-unknown", K, C, "report_to=[nosuchtracker]", "train",
               {"report_to": ["nosuchtracker"]}, ["nosuchtracker"]),
        refuse("configuration/train-derived-field", K, C, "per_device_train_batch_size=4 (derived here)", "train",
               {"per_device_train_batch_size": 4}, ["prompts_per_step"]),
        refuse("configuration/train-trl-duplicate", K, C, "trl.learning_rate=1 (the old prefix of TRL's fields)",
               "train", {"trl.learning_rate": 1}, ["learning_rate"]),
        refuse("configuration/train-moved-key", K, C, "max_new_tokens=8 (now sampling.max_new_tokens)", "train",
               {"max_new_tokens": 8}, ["sampling.max_new_tokens"]),
        refuse("configuration/train-resume-and-overwrite", K, C, "resume=last overwrite=true", "train",
               {"resume": "last", "overwrite": True}, ["overwrite", "resume"]),
        refuse("configuration/train-levels", K, C, "data.levels=[7]", "train", {"data.levels": [7]}, ["level"]),
        refuse("configuration/train-rollout-is", K, C, "rl.rollout_is=foo", "train", {"rl.rollout_is": "foo"},
               ["rollout_is"]),
        refuse("configuration/train-compile-s4r", K, C, "sampling.compile_decode=true with s4r", "train",
               {"sampling.compile_decode": True, "compression.method": "s4r"}, ["compile_decode"]),
        refuse("configuration/train-reward-weights", K, C, "two reward_weights for one reward", "train",
               {"reward_weights": [1, 2]}, ["reward_weights"]),
        refuse("configuration/eval-budgets-zero", K, L, "budgets=[0] runs at 2048", "evaluate",
               {"methods": ["gkv"], "budgets": [0]}, ["budget"]),
        refuse("configuration/eval-limit-zero", K, L, "data.limit=0 becomes 256 problems", "evaluate",
               {"data.limit": 0}, ["limit"]),
        refuse("configuration/eval-max-new-tokens-huge", K, L, "sampling.max_new_tokens=1000000000: a huge allocation after "
               "the model loads", "evaluate", {"sampling.max_new_tokens": 1_000_000_000}, ["max_new_tokens"],
               before_load=False),
        refuse("configuration/eval-budgets-negative", K, N, "budgets=[-5]", "evaluate",
               {"methods": ["gkv"], "budgets": [-5]}, ["budget"]),
        refuse("configuration/eval-num-generations-zero", K, C, "sampling.num_generations=0", "evaluate",
               {"sampling.num_generations": 0}, ["num_generations"]),
        refuse("configuration/eval-temperature-negative", K, C, "sampling.temperature=-1", "evaluate", {"sampling.temperature": -1},
               ["temperature"]),
        refuse("configuration/eval-method-unknown", K, C, "methods=[nosuch]", "evaluate", {"methods": ["nosuch"]},
               ["nosuch"]),
        refuse("configuration/eval-batch-problems-zero", K, C, "batch_problems=0", "evaluate", {"batch_problems": 0},
               ["batch_problems"]),
        refuse("configuration/eval-precision", K, C, "precision=fp8", "evaluate", {"precision": "fp8"}, ["precision"]),
        refuse("configuration/eval-unknown-key", K, C, "a misspelled key n_sample=2", "evaluate", {"n_sample": 2},
               ["n_sample"]),
        refuse("configuration/eval-adapter-missing", K, C, "adapter=./no/adapter", "evaluate",
               {"adapter": "./no/adapter"}, ["no/adapter"]),
        refuse("configuration/traces-output-is-directory", K, L, "output=<a directory> fails only after the model "
               "loads (and after generating)", "traces", {"output": "{work}/adir"}, ["adir"],
               setup=lambda ctx: (ctx.work / "adir").mkdir()),
        refuse("configuration/traces-max-new-tokens-huge", K, L, "sampling.max_new_tokens=1000000000 in traces", "traces",
               {"sampling.max_new_tokens": 1_000_000_000}, ["max_new_tokens"], before_load=False),
        refuse("configuration/traces-num-generations-zero", K, C, "sampling.num_generations=0", "traces",
               {"sampling.num_generations": 0}, ["num_generations"]),
        refuse("configuration/traces-top-p-zero", K, C, "sampling.top_p=0", "traces", {"sampling.top_p": 0}, ["top_p"]),
        refuse("configuration/train-output-before-validation", K, L, "the output folder is created before validation "
               "(temperature=0)", "train", {"sampling.temperature": 0}, ["temperature"], must_not_exist=gone),
        refuse("configuration/eval-output-before-validation", K, L, "the output folder is created before validation "
               "(num_generations=0)", "evaluate", {"sampling.num_generations": 0}, ["num_generations"], must_not_exist=gone),
    ]
    return cases


def mismatch_problem(ctx: Context) -> str | None:
    """None when every training step of ``{work}/out`` logged a rollout-trainer mismatch below 1e-3."""
    records = [r for r in read_jsonl(Path(ctx.path("{work}/out")) / "metrics.jsonl") if "loss" in r]
    values = [r.get("mismatch/mean_abs") for r in records]
    if not records or any(v is None for v in values):
        return "no mismatch logged"
    worst = max(values)
    return f"trained without the rollout's record: mismatch/mean_abs {worst:.3g}" if worst > 1e-3 else None


# ---- data


def data_file(records: list, name: str = "data.jsonl"):
    """A setup writing ``records`` (``write_jsonl``) to ``{work}/<name>``."""
    return lambda ctx: write_jsonl(ctx.work / name, records)


def q(question="What is 2 + 3?", answer="5", **extra) -> dict:
    return {"question": question, "answer": answer, **extra}


def problems_check(expected: int, golds: list[str] | None = None):
    """An evaluate.py check: ``expected`` problems evaluated (and their golds, in order, when given)."""

    def check(ctx: Context, proc: Proc) -> str | None:
        found = eval_problems(ctx)
        if found != expected:
            return f"{found} problems evaluated, not {expected}"
        if golds is not None:
            samples = read_jsonl(Path(ctx.path("{work}/out")) / "full" / "samples.jsonl")
            seen = [s["gold"] for s in sorted(samples, key=lambda s: (s["problem_id"], s["sample"]))
                    if s["sample"] == 0]  # fmt: skip
            if seen != golds:
                return f"golds {seen}, not {golds}"
        return None

    return check


def data_cases() -> list[Case]:
    L, C, N = "listed", "control", "new"
    K = "data"
    F = FILE_DATA
    at2 = r"data\.jsonl:2\b"
    good = q()
    cases = [
        refuse("data/empty-question", K, L, "a record with an empty question is accepted", "evaluate",
               {**F}, [at2, "question|empty"], setup=data_file([good, q("")])),
        refuse("data/blank-question", K, N, "a record whose question is only spaces", "evaluate", {**F},
               [at2, "question|empty|blank"], setup=data_file([good, q("   \n ")])),
        refuse("data/empty-question-train", K, L, "an empty question under train.py", "train", {**F},
               [at2, "question|empty"], setup=data_file([good, q("")])),
        refuse("data/empty-question-traces", K, L, "an empty question under generate_traces.py", "traces", {**F},
               [at2, "question|empty"], setup=data_file([good, q("")])),
        refuse("data/gold-nan", K, L, "a JSON NaN gold answer (read as the text 'nan')", "evaluate", {**F},
               [at2, "answer|gold"], setup=data_file([good, q(answer=float("nan"))])),
        refuse("data/gold-list", K, L, "a list gold answer [2] (read as the text '[2]')", "evaluate", {**F},
               [at2, "answer|gold"], setup=data_file([good, q(answer=[2])])),
        refuse("data/gold-None-text", K, N, "a gold answer 'None' (a missing value written as text)", "evaluate", {**F},
               [at2, "answer|gold"], setup=data_file([good, q(answer="None")])),
        refuse("data/gold-empty", K, N, "an empty gold answer ''", "evaluate", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer="")])),
        refuse("data/gold-bool", K, N, "a boolean gold answer", "evaluate", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer=True)])),
        refuse("data/gold-dict", K, N, "an object gold answer", "evaluate", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer={"value": 5})])),
        refuse("data/gold-nan-train", K, L, "a NaN gold answer under train.py", "train", {**F}, [at2, "answer|gold"],
               setup=data_file([good, q(answer=float("nan"))])),
        refuse("data/gold-null", K, C, "a null gold answer (checked)", "evaluate", {**F}, [at2, "answer"],
               setup=data_file([good, q(answer=None)])),
        refuse("data/not-json", K, C, "a line that is not JSON", "evaluate", {**F}, [at2, "JSON"],
               setup=data_file([good, '{"question": "x", "answer": '])),
        refuse("data/not-an-object", K, C, "a line holding a JSON array", "evaluate", {**F}, [at2, "object"],
               setup=data_file([good, "[1, 2]"])),
        refuse("data/missing-field", K, C, "no question field", "evaluate", {**F}, ["question"],
               setup=data_file([{"prompt": "x", "answer": "1"}])),
        refuse("data/missing-field-later", K, C, "a later record lacks the answer", "evaluate", {**F},
               [at2, "answer"], setup=data_file([good, {"question": "x"}])),
        refuse("data/empty-file", K, C, "an empty file", "evaluate", {**F}, ["data.jsonl", "no records|empty"],
               setup=data_file([])),
        refuse("data/blank-lines", K, C, "a file of blank lines", "evaluate", {**F}, ["data.jsonl", "no records|empty"],
               setup=data_file(["", "   ", ""])),
        refuse("data/directory-named-jsonl", K, L, "a directory named *.jsonl reported as 'does not exist'",
               "evaluate", {**F}, ["data.jsonl", "director|folder"],
               setup=lambda ctx: (ctx.work / "data.jsonl").mkdir()),
        refuse("data/missing-file", K, C, "a file that does not exist", "evaluate", {**F},
               ["data.jsonl", "not exist|no such|not found"]),
        refuse("data/unsupported-suffix", K, C, "a .txt file", "evaluate", {**F, "data.path": "{work}/data.txt"},
               ["data.txt"], setup=data_file([good], "data.txt")),
        refuse("data/bad-utf8", K, C, "bytes that are not UTF-8", "evaluate", {**F}, ["data.jsonl"],
               setup=lambda ctx: (ctx.work / "data.jsonl").write_bytes(b'{"question": "\xff\xfe", "answer": "1"}\n')),
        refuse("data/limit-minus-one-file", K, L, "data.limit=-1 on a file drops the last record", "evaluate",
               {**F, "data.limit": -1}, ["limit"], setup=data_file([q(answer="1"), q(answer="2"), q(answer="3")])),
        refuse("data/limit-zero-file", K, L, "data.limit=0 on a file: no problems, a crash in the plot", "evaluate",
               {**F, "data.limit": 0, "plots": True}, ["limit"], setup=data_file([good, good])),
        refuse("data/builtin-limit-minus-one", K, L, "data.limit=-1 on the built-in task loops forever", "traces",
               {"data.limit": -1}, ["limit"], timeout=60),
        refuse("data/builtin-level0-3000", K, L, "data.levels=[0] data.limit=3000: more problems than level 0 holds "
               "(loops forever)", "traces", {"data.levels": [0], "data.limit": 3000},
               [r"level|limit|distinct|problems"], timeout=60),
        refuse("data/builtin-test-too-many", K, C, "data.split=test data.limit=2000 (more than the test pool)",
               "traces", {"data.split": "test", "data.limit": 2000}, ["2000|limit|test"]),
        refuse("data/builtin-levels-empty", K, C, "data.levels=[]", "traces", {"data.levels": []}, ["level"]),
        refuse("data/builtin-distractors-negative", K, C, "data.distractors=-1", "traces", {"data.distractors": -1},
               ["distractors"]),
        refuse("data/path-and-name", K, C, "both data.path and data.name", "evaluate",
               {"data.path": "{work}/data.jsonl"}, [r"data\.path|data\.name"], setup=data_file([good])),
        refuse("data/preset-wrong-split", K, C, "data.name=gsm8k data.split=train (the file holds test)", "evaluate",
               {"data.name": "gsm8k", "data.split": "train"}, ["split"]),
        refuse("data/config-on-file", K, C, "data.config=main with a local file", "evaluate",
               {**F, "data.config": "main"}, ["config"], setup=data_file([good])),
        refuse("data/question-field-missing", K, C, "data.question_field=nosuch", "evaluate",
               {**F, "data.question_field": "nosuch"}, ["nosuch"], setup=data_file([good])),
        refuse("data/prompt-10MB-train", K, L, "a 10 MB prompt under train.py (far beyond the context)", "train",
               {**F}, [r"prompt|context|long|length|token"], before_load=False, timeout=240,
               setup=data_file([q("9 " * 5_000_000)])),
        refuse("data/prompt-beyond-context", K, L, "a prompt longer than the model's context (tiny: 4096 positions; "
               "SmolLM2's 20k-word prompt took > 400 s)", "evaluate", {**F},
               [r"prompt|context|long|length|token"], before_load=False, timeout=240,
               setup=data_file([q("1 + " * 1500 + "1 = ?")])),
        result("data/prompt-within-context", K, C, "a 3000-character prompt (within the context)", "evaluate", {**F},
               problems_check(1), setup=data_file([q("1 + " * 700 + "1 = ?")])),
        result("data/limit-above-size", K, C, "data.limit=5 on a 3-record file", "evaluate", {**F, "data.limit": 5},
               problems_check(3, ["1", "2", "3"]), setup=data_file([q(answer="1"), q(answer="2"), q(answer="3")])),
        result("data/limit-null", K, C, "data.limit=null reads every record", "evaluate", {**F, "data.limit": None},
               problems_check(3), setup=data_file([good, good, good])),
        result("data/question-fields-joined", K, C, "data.question_field=[a,b]", "evaluate",
               {**F, "data.question_field": ["a", "b"]}, problems_check(1),
               setup=data_file([{"a": "Tom has 2.", "b": "How many?", "answer": "2"}])),
        result("data/json-array-file", K, C, "a .json file holding an array", "evaluate",
               {**F, "data.path": "{work}/data.json"}, problems_check(2),
               setup=lambda ctx: (ctx.work / "data.json").write_text(json.dumps([good, good]))),
        result("data/gold-int-and-float", K, C, "golds 42 (int) and 27.0 (float) read as '42' and '27'", "evaluate",
               {**F}, problems_check(2, ["42", "27"]), setup=data_file([q(answer=42), q(answer=27.0)])),
        result("data/preset-gsm8k", K, C, "data.name=gsm8k (the shared test file), 2 problems", "evaluate",
               {"data.name": "gsm8k", "data.split": "test"}, problems_check(2)),
    ]
    return cases


# ---- state and faults


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


LONG_TRAIN = {"max_steps": 150, "sampling.max_new_tokens": 16, "data.limit": 8}


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
                return Verdict("data_lost", f"SIGTERM after step {reached} (save_steps={save_steps}): exit {proc.rc}, "
                               f"newest complete checkpoint {saved[-1] if saved else 'none'}; "
                               f"said: {failure_message(proc.err)[:150]!r}", extra)  # fmt: skip
        if half_written(out):
            return Verdict("data_lost", f"half-written checkpoint folders left: {half_written(out)}", extra)
        resumed = ctx.run(ctx.entry(*overrides("train", {**changes, "resume": "last"})), 240)
        verdict = judge_result(resumed, lambda: steps_problem(out, LONG_TRAIN["max_steps"]))
        if verdict.outcome == "ok" and sig == signal.SIGTERM and not re.search(
            r"SIGTERM|signal|terminat|preempt", proc.err + read_text(out / "train.log"), re.I
        ):
            return Verdict("unclear_error", "saved and resumed, but the stop was not reported (no message naming "
                           "SIGTERM)", extra)  # fmt: skip
        verdict.extra.update(extra)
        return verdict

    return run


LONG_EVAL = {"data.limit": 10, "batch_problems": 1, "sampling.num_generations": 2, "sampling.max_new_tokens": 24}


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
            return Verdict(both_ok_outcome, "both runs exit 0 into one folder" + (
                "" if both_ok_outcome == "ok" else ": one run's results replaced the other's"))
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
        changes = {"data.limit": 40, "sampling.max_new_tokens": 16, "sampling.num_generations": 2, "output_dir": str(out)}
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
        earlier = "".join(json.dumps({"id": i, "prompt": "p", "completion": "c", "completion_ids": [5, 2],
                                      "answer": "1", "correct": True}) + "\n" for i in range(20))  # fmt: skip
        target.write_text(earlier)
        changes = {"output": str(target), "sampling.num_generations": 4, "data.limit": 16, "sampling.max_new_tokens": 48}
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


def train_then(changes_first: dict, prepare: Callable[[Context, Path], None] | None, changes_second: dict,
               judge: Callable[[Context, Proc], Verdict]):
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


def state_cases() -> list[Case]:
    L, C, N = "listed", "control", "new"
    K = "state_faults"
    three = {"max_steps": 3}
    six = {"max_steps": 6}

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
        again = ctx.run(ctx.entry(*overrides("evaluate", {"sampling.temperature": 0.3})), 120)
        return judge_refusal(again, ["temperature"])

    def finished_again(ctx: Context, proc: Proc) -> Verdict:
        def check():
            saved = last_json_line(proc.out)
            first = json.loads((ctx.work / "out" / "eval.json").read_text())
            return None if saved == first else f"printed {saved}, the saved evaluation is {first}"

        return judge_result(proc, check)

    cases = [
        Case("state_faults/two-evaluate-one-folder", K, L, "two scripts/evaluate.py runs into one folder at once: "
             "both exit 0 and samples.jsonl is duplicated (pass@1 doubled)",
             concurrent("evaluate", {"data.limit": 6, "batch_problems": 1, "sampling.num_generations": 2, "sampling.max_new_tokens": 24},
                        lambda ctx: samples_problem(ctx, 2, 6), "ok"), 300),
        Case("state_faults/two-train-one-folder", K, L, "two train.py runs into one output_dir at once: both exit 0, "
             "steps logged twice", concurrent("train", {"max_steps": 20, "data.limit": 8}, steps_once,
                                              "data_lost"), 300),
        Case("state_faults/sigterm-train", K, L, "SIGTERM mid-run (save_steps beyond the run): nothing saved, "
             "nothing logged; then resume=last", interrupted_train(signal.SIGTERM, 1000), 400),
        Case("state_faults/sigkill-train-resume", K, C, "SIGKILL mid-run (a checkpoint every step), then resume=last: "
             "finishes with every step logged once", interrupted_train(signal.SIGKILL, 1), 400),
        Case("state_faults/sigkill-evaluate-resume", K, C, "SIGKILL mid-evaluation, then the same call: continues, "
             "every sample once", interrupted_eval(signal.SIGKILL), 300),
        Case("state_faults/sigterm-evaluate-resume", K, C, "SIGTERM mid-evaluation, then the same call",
             interrupted_eval(signal.SIGTERM), 300),
        Case("state_faults/full-disk-train", K, L, "a full disk during a checkpoint save: the error must name the "
             "disk (was 'basic_ios::clear: iostream error'), nothing half-written", full_disk_train, 240),
        Case("state_faults/full-disk-evaluate", K, N, "a full disk while scripts/evaluate.py writes its samples",
             full_disk_eval, 240),
        Case("state_faults/full-disk-traces-keeps-old", K, N, "a full disk while generate_traces.py replaces an "
             "earlier traces file", full_disk_traces, 240),
        Case("state_faults/resume-garbled-metrics", K, C, "resume=last with a damaged last line in metrics.jsonl",
             train_then(three, garble_metrics, {**three, "resume": "last"}, resumed_ok(3)), 400),
        Case("state_faults/resume-staging-leftover", K, C, "resume=last with a leftover .staging folder",
             train_then(three, lambda ctx, out: (out / ".staging" / "checkpoint-9").mkdir(parents=True),
                        {**six, "resume": "last"}, resumed_ok(6)), 400),
        Case("state_faults/resume-bare-checkpoint", K, C, "resume=last beside a bare checkpoint-99 (no trainer state)",
             train_then(three, lambda ctx, out: (out / "checkpoint-99").mkdir(), {**six, "resume": "last"},
                        resumed_ok(6)), 400),
        Case("state_faults/resume-raised-max-steps", K, C, "a finished run continued with a higher max_steps",
             train_then(three, None, {**six, "resume": "last"}, resumed_ok(6)), 400),
        Case("state_faults/resume-finished", K, C, "resume=last on a finished run: nothing trained, the saved "
             "evaluation printed", train_then(three, None, {**three, "resume": "last"}, finished_again), 400),
        Case("state_faults/second-run-refused", K, C, "a second run into a folder holding a run (no resume)",
             train_then(three, None, three, refused(["output_dir|resume|overwrite"])), 400),
        refuse("state_faults/resume-not-a-checkpoint", K, C, "resume=<a folder that is no checkpoint>", "train",
               {"resume": "{work}/nothing"}, ["nothing"], setup=lambda ctx: (ctx.work / "nothing").mkdir()),
        Case("state_faults/evaluate-reused", K, C, "the same evaluation twice: results reused, not duplicated",
             reuse_eval),
        Case("state_faults/evaluate-other-settings", K, C, "another evaluation into a folder of other settings",
             other_settings_eval),
    ]
    return cases


# ---- output


def strict_outputs(out_rel: str, names: list[str], more: Callable[[Context, Proc], str | None] | None = None):
    """A check: every file ``names`` (relative to ``out_rel``, globs allowed) parses strictly, the last stdout line
    is strict JSON, and ``more`` finds nothing."""

    def check(ctx: Context, proc: Proc) -> str | None:
        base = Path(ctx.path(out_rel))
        for pattern in names:
            paths = sorted(base.glob(pattern))
            if not paths:
                return f"no {pattern}"
            for path in paths:
                problem = strict_file(path)
                if problem:
                    return problem
        if last_json_line(proc.out) is None:
            return "the last stdout line is not strict JSON"
        return more(ctx, proc) if more else None

    return check


def pass_at_k_problem(ctx: Context, proc: Proc, n: int, problems: int) -> str | None:
    """Samples and summaries agree: c <= n per problem, pass@k rising in k and equal to the unbiased estimate of
    the samples, counts, lm-eval layout's n-samples."""
    folder = ctx.work / "out" / "full"
    problem = samples_problem(ctx, n, problems)
    if problem:
        return problem
    summary = json.loads((folder / "summary.json").read_text())
    by_problem: dict = {}
    for s in read_jsonl(folder / "samples.jsonl"):
        by_problem.setdefault(s["problem_id"], []).append(bool(s["correct"]))
    for k in range(1, n + 1):
        want = sum(1.0 if n - sum(c) < k else 1 - math.comb(n - sum(c), k) / math.comb(n, k)
                   for c in by_problem.values()) / len(by_problem)  # fmt: skip
        if abs((summary.get(f"pass@{k}") or 0) - want) > 1e-9:
            return f"pass@{k} {summary.get(f'pass@{k}')} but the samples give {want}"
        if k > 1 and summary[f"pass@{k}"] < summary[f"pass@{k - 1}"] - 1e-12:
            return f"pass@{k} < pass@{k - 1}"
    if any(len(c) > n for c in by_problem.values()):
        return "a problem has more than n samples"
    if summary.get("verifier_checks") != problems * n:
        return f"verifier_checks {summary.get('verifier_checks')}, not {problems * n}"
    results = json.loads((ctx.work / "out" / "results.json").read_text())
    counts = [v.get("original") for v in results.get("n-samples", {}).values()]
    if counts != [problems]:
        return f"results.json n-samples {counts}, not [{problems}]"
    return None


def s4r_rank_check(ctx: Context, proc: Proc) -> str | None:
    """The rank recorded for an s4r run is one the tiny model can have (its key width, 2 KV heads x 16 = 32)."""
    found = []
    for path in [*(ctx.work / "out").glob("s4r*/summary.json"), *(ctx.work / "out").glob("s4r*/run.json")]:
        if path.is_file():
            found += re.findall(r'"rank": (\d+)', path.read_text())
    if not found:
        return "no rank recorded"
    too_big = [int(r) for r in found if int(r) > 32]
    return f"recorded rank {too_big[0]} but ran at most 32 (the model's key width)" if too_big else None


def train_outputs(ctx: Context, proc: Proc) -> str | None:
    problem = steps_problem(ctx.work / "out", 2)
    if problem:
        return problem
    evaluation = json.loads((ctx.work / "out" / "eval.json").read_text())
    if evaluation.get("problems") != 2 or not 0 <= evaluation.get("accuracy", -1) <= 1:
        return f"eval.json {evaluation}"
    return None


def traces_outputs(ctx: Context, proc: Proc) -> str | None:
    rows = read_jsonl(ctx.work / "traces.jsonl")
    line = last_json_line(proc.out) or {}
    fields = {"id", "prompt", "completion", "completion_ids", "answer", "correct"}  # later: check_timed_out, ...
    if any(not fields <= set(r) for r in rows):
        return "a trace lacks fields"
    if line.get("written") != len(rows) or line.get("samples") != 3 * 2 or len(rows) != 6:
        return f"printed {line}, file has {len(rows)} rows (keep_incorrect: 6)"
    if line.get("correct") != sum(r["correct"] for r in rows):
        return "correct count differs from the file"
    return None


def output_cases() -> list[Case]:
    L, C, N = "listed", "control", "new"
    K = "output"
    eval_files = ["summary.json", "results.json", "full/summary.json", "full/run.json", "full/samples.jsonl",
                  "full/density.jsonl"]  # fmt: skip
    cases = [
        either("output/s4r-rank-recorded", K, L, "compression.s4r.rank=1000 for s4r: clamped to the model's width but "
               "recorded as given", "evaluate", {"compression.method": "s4r", "compression.s4r.rank": 1000},
               ["rank"], s4r_rank_check, before_load=False),
        result("output/evaluate-strict-json", K, C, "every evaluate.py JSON file and line parses strictly (3 "
               "problems x 3 samples, uneven batches)", "evaluate",
               {"data.limit": 3, "sampling.num_generations": 3, "batch_problems": 2},
               strict_outputs("{work}/out", eval_files, lambda ctx, proc: pass_at_k_problem(ctx, proc, 3, 3))),
        result("output/evaluate-one-problem", K, C, "one problem, one sample: undefined intervals written as null",
               "evaluate", {"data.limit": 1}, strict_outputs("{work}/out", eval_files,
                                                              lambda ctx, proc: pass_at_k_problem(ctx, proc, 1, 1))),
        result("output/evaluate-with-plots", K, C, "plots on: both figures written", "evaluate",
               {"plots": True}, strict_outputs("{work}/out", eval_files, lambda ctx, proc: figures_problem(ctx))),
        result("output/evaluate-sweep", K, C, "methods=[full,gkv,snapkv] budgets=[16,32]: one run per pair",
               "evaluate", {"methods": ["full", "gkv", "snapkv"], "budgets": [16, 32], "compression.window": 4,
                            "compression.interval": 4}, strict_outputs("{work}/out", ["*/summary.json", "summary.json"],
                                                                        lambda ctx, proc: sweep_problem(ctx, proc))),
        result("output/train-strict-json", K, C, "train.py: metrics.jsonl and eval.json strict, each step once",
               "train", {"max_steps": 2}, strict_outputs("{work}/out", ["metrics.jsonl", "eval.json"], train_outputs)),
        result("output/train-rl-full", K, C, "recipe=rl_full: metrics and evaluation strict", "train",
               {"recipe": "rl_full", "max_steps": 2}, strict_outputs("{work}/out", ["metrics.jsonl", "eval.json"],
                                                                      train_outputs)),
        result("output/train-s4r-record", K, C, "compression.method=s4r in rl_sparse: trained under the record "
               "(mismatch < 1e-3)", "train", {"compression.method": "s4r", "max_steps": 2},
               lambda ctx, proc: mismatch_problem(ctx)),
        result("output/traces-strict-json", K, C, "generate_traces.py: each line strict, counts agree", "traces",
               {"data.limit": 3, "sampling.num_generations": 2}, strict_outputs("{work}", ["traces.jsonl"], traces_outputs)),
        result("output/distill-offline", K, C, "recipe=distill from a traces file: strict outputs, each step once",
               "train", {"recipe": "distill", "max_steps": 2, "distill.traces": "{work}/traces.jsonl"},
               lambda ctx, proc: distill_problem(ctx, proc), setup=tiny_traces),
    ]
    return cases


def figures_problem(ctx: Context) -> str | None:
    missing = [n for n in ("pass_at_1_vs_budget.png", "retained_density.png") if not (ctx.work / "out" / n).is_file()]
    return f"no {', '.join(missing)}" if missing else None


def sweep_problem(ctx: Context, proc: Proc) -> str | None:
    runs = {p.parent.name for p in (ctx.work / "out").glob("*/summary.json")}
    want = {"full", "gkv-b16", "gkv-b32", "snapkv-b16", "snapkv-b32"}
    if runs != want:
        return f"runs {sorted(runs)}, not {sorted(want)}"
    line = last_json_line(proc.out) or {}
    return None if len(line.get("runs", [])) == 5 else f"the JSON line lists {len(line.get('runs', []))} runs, not 5"


def tiny_traces(ctx: Context) -> None:
    """A traces file for the tiny model (its character tokenizer: id = code point - 29; 2 = end of sequence)."""
    prompt = "What is 2 + 3?\nPut your final answer in \\boxed{}."
    completion = "\\boxed{5}"
    ids = [ord(c) - 29 for c in completion] + [2]
    rows = [{"id": i, "prompt": prompt, "completion": completion, "completion_ids": ids, "answer": "5", "correct": True}
            for i in range(4)]  # fmt: skip
    write_jsonl(ctx.work / "traces.jsonl", rows)


def distill_problem(ctx: Context, proc: Proc) -> str | None:
    out = ctx.work / "out"
    for name in ("metrics.jsonl", "eval.json"):
        problem = strict_file(out / name)
        if problem:
            return problem
    steps = training_steps(out)
    return None if sorted(steps) == [1, 2] else f"steps {steps}"


def harness_cases() -> list[Case]:
    def imports_repo(ctx: Context) -> Verdict:
        code = "import gkv_train, gkv_rewards.verify as v; print(gkv_train.__file__); print(v.__file__)"
        proc = ctx.run([ctx.python, "-c", code], 60)

        def check():
            files = proc.out.split()
            outside = [f for f in files if not Path(f).resolve().is_relative_to(ctx.repo.resolve())]
            return f"imported from {outside}, not {ctx.repo}" if outside or len(files) != 2 else None

        return judge_result(proc, check)

    return [Case("harness/imports-repo", "harness", "control", "the children import gkv_train from --repo "
                 "(prints gkv_train.__file__)", imports_repo, 60)]


def all_cases() -> list[Case]:
    cases = [*harness_cases(), *reward_cases(), *config_cases(), *data_cases(), *state_cases(), *output_cases()]
    names = [c.name for c in cases]
    assert not any("," in n for n in names), "a comma separates --cases patterns"
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    return cases


# ---------------------------------------------------------------------------------------------------------- main


def select(cases: list[Case], pattern: str | None) -> list[Case]:
    """Cases whose name matches ``pattern``: comma-separated globs, or substrings where there is no glob
    character."""
    if not pattern:
        return cases
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    return [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) if any(ch in p for ch in "*?[") else p in c.name
                                    for p in parts)]  # fmt: skip


def git(repo: Path, *args) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def run_case(case: Case, repo: Path, python: str, work_root: Path, site: Path, memory_bytes: int,
             data_dir: Path | None, keep: bool) -> dict:
    work = work_root / f"case-{hashlib.sha1(case.name.encode()).hexdigest()[:10]}"  # no words a pattern could match
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = Context(repo, python, work, site, memory_bytes, data_dir)
    start = time.time()
    try:
        verdict = case.run(ctx)
    except Exception as err:  # a fault of the harness or of a check, not of the code probed: stop, do not record
        raise RuntimeError(f"case {case.name}: the probe itself failed: {type(err).__name__}: {err}") from err
    outside = sorted({m["file"] for p in ctx.procs for m in p.marks if m["event"] == "import" and m.get("file")
                      and not Path(m["file"]).resolve().is_relative_to(repo.resolve())})  # fmt: skip
    if outside:
        raise RuntimeError(f"case {case.name}: gkv_train was imported from {outside}, not from {repo}")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "name": case.name, "category": case.category, "kind": case.kind, "about": case.about,
        "outcome": verdict.outcome, "detail": verdict.detail, "seconds": round(time.time() - start, 1),
        "extra": {**ctx.notes, **verdict.extra},
        "procs": [p.record() for p in ctx.procs],
    }


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
    head = ["category", "cases", "ok", "clear errors", "unclear errors", "silent wrong", "crashes", "hangs",
            "data lost"]
    lines = [f"Hostile-input and fault probe, `{tag}` (commit {commit}): outcomes per category", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for category, row in rows.items():
        cells = [row["cases"], *(row[o] for o in OUTCOMES)]
        name = f"**{category}**" if category == "total" else category
        lines.append(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "By kind of case (listed: a defect of issue 24's list; control: handled before, result or check; "
              "new: not in the list):",
              "", "| kind | " + " | ".join(head[1:]) + " |", "|" + "---|" * len(head)]
    for kind, row in table(records, "kind").items():
        lines.append(f"| {kind} | " + " | ".join(str(c) for c in [row["cases"], *(row[o] for o in OUTCOMES)]) + " |")
    lines += ["", "| case | kind | outcome | detail |", "|---|---|---|---|"]
    for r in records:
        detail = r["detail"].replace("|", "\\|").replace("\n", " ")[:220]
        lines.append(f"| `{r['name']}` | {r['kind']} | {r['outcome']} | {detail} |")
    return "\n".join(lines) + "\n"


def tables(view: str, runs: dict | list[dict]) -> str:
    """``scripts/render_docs.py``'s view ``runs`` of one or more results files (``bench_faults_<tag>.json``):
    each run's totals on a row, with its tag, date, the checkout's commit and the command."""
    head = ["run", "commit", "cases", "ok", "clear errors", "unclear errors", "silent wrong", "crashes", "hangs",
            "data lost"]  # fmt: skip
    if view != "runs":
        raise SystemExit(f"error: bench_faults has the view runs, not {view!r}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    runs = runs if isinstance(runs, list) else [runs]
    for run in runs:
        total = run["table"]["total"]
        commit = run["repo_commit"][:7] + (" (uncommitted changes)" if run.get("repo_dirty") else "")
        cells = [f"{run['tag']} ({run['date'][:10]})", commit, total["cases"], *(total[o] for o in OUTCOMES)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    commands = "; ".join(f"`{run['command']}`" for run in runs)
    return "\n".join(lines) + f"\n\n{commands} (each row: the run's date and the commit of the checkout it probed)\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to probe (default: this one)")
    parser.add_argument("--tag", default="after", help="names the results: before, after, ...")
    parser.add_argument("--cases", help="comma-separated globs (or substrings) of case names")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--python", default=sys.executable,
                        help="the children's interpreter, with the project's dependencies (default: this one)")
    parser.add_argument("--out", type=Path,
                        help="per-case results and work folders (default outputs/bench_faults/<tag>)")
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="where bench_faults_<tag>.json goes")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space cap of every child (RLIMIT_AS)")
    parser.add_argument("--data-dir", type=Path, help="GKV_DATA_DIR for the children (default: as the code finds it)")
    parser.add_argument("--fresh", action="store_true", help="forget the finished cases of --out and start over")
    parser.add_argument("--keep", action="store_true", help="keep each case's work folder")
    args = parser.parse_args(argv)

    cases = select(all_cases(), args.cases)
    if args.list:
        for c in cases:
            print(f"{c.name:55s} {c.kind:8s} {c.about}")
        print(f"{len(cases)} cases", file=sys.stderr)
        return 0
    if not cases:
        print(f"error: no case matches {args.cases!r} (see --list)", file=sys.stderr)
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
    meta_path, results_path = out / "meta.json", out / "cases.jsonl"
    meta = {"repo": str(repo), "commit": commit, "dirty": bool(dirty), "python": args.python,
            "memory_gb": args.memory_gb}  # fmt: skip
    if meta_path.is_file() and json.loads(meta_path.read_text()) != meta:
        print(f"error: {out} holds results of {json.loads(meta_path.read_text())}, not {meta}: pass --fresh or "
              "another --out", file=sys.stderr)  # fmt: skip
        return 2
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    site = out / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (site / "bench_faults_checks.py").write_text(CHECKS_MODULE)

    done = {r["name"]: r for r in read_jsonl(results_path)}
    started = time.time()
    for number, case in enumerate(cases, 1):
        if case.name in done:
            continue
        record = run_case(case, repo, args.python, out / "work", site, int(args.memory_gb * 2**30), args.data_dir,
                          args.keep)  # fmt: skip
        with open(results_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        done[case.name] = record
        print(f"[{number}/{len(cases)}] {case.name}: {record['outcome']} ({record['seconds']:.0f} s) "
              f"{record['detail'][:150]}", file=sys.stderr, flush=True)  # fmt: skip

    records = [done[c.name] for c in cases]
    rows = table(records)
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(["bench_faults.py", *argv])
    summary = {
        "bench": "faults", "tag": args.tag, "command": command, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "repo": str(repo), "repo_commit": commit, "repo_dirty": bool(dirty), "memory_gb": args.memory_gb,
        "full_disk": sorted({r["extra"]["full_disk"] for r in records if "full_disk" in r.get("extra", {})}),
        "seconds_this_call": round(time.time() - started, 1),
        "seconds_all_cases": round(sum(r["seconds"] for r in records), 1),
        "table": rows, "table_by_kind": table(records, "kind"),
        "cases": [{k: r[k] for k in ("name", "category", "kind", "about", "outcome", "detail", "seconds", "extra")}
                  for r in records],
    }  # fmt: skip
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"bench_faults_{args.tag}.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = markdown(rows, records, args.tag, commit)
    (args.results / f"bench_faults_{args.tag}.md").write_text(text)
    print(text.split("\n\n| case")[0], file=sys.stderr)
    print(json.dumps({k: summary[k] for k in ("bench", "tag", "repo_commit", "table")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
