"""The probe's machinery: the files its children load (``SITECUSTOMIZE``, the misbehaving answer checks), a
child process and its record (``Context``, ``Running``, ``Proc``; ``Forks``: children forked from a warm
interpreter), the outcome rules (``judge_refusal``, ``judge_result``, ``judge_either``), readers of what a child
wrote, and the three kinds of case (``refuse``, ``result``, ``either``). The outcomes are defined in
``scripts/bench_faults.py``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ("ok", "clear_error", "unclear_error", "silent_wrong", "crash", "hang", "data_lost")
CATEGORIES = ("harness", "rewards", "configuration", "data", "state_faults", "output")
KINDS = ("listed", "control", "new", "round3", "round4", "round5")
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

START_MODULE = '''"""Written by scripts/bench_faults.py: an answer check whose worker is killed (SIGKILL) while it
starts, the first time ever (a marker file, $BENCH_FAULTS_START_MARKER, remembers)."""
import os
import signal

_marker = os.environ.get("BENCH_FAULTS_START_MARKER")
if _marker and not os.path.exists(_marker):
    open(_marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)

from gkv_rewards.verify import answers_match as answers  # noqa: E402
'''

# A warm interpreter that starts each child by fork (``Forks``): the entry points' modules imported once, so a child
# that refuses its input costs its own work, not the ~4 s of importing torch and transformers again.
ZYGOTE = '''"""Written by tests/faults/harness.py: imports the modules named in argv once, then serves one JSON
request a line on stdin ({argv, cwd, env, out, err, memory, timeout}) by forking a child that runs argv as
`python ARGV...` would (a script file, `-m MODULE` or `-c CODE`), its stdout and stderr in files; answers one JSON
line {rc, timed_out, seconds} on stdout (rc negative: killed by that signal, as subprocess reports it)."""
import json, os, resource, runpy, signal, sys, time, traceback

import sitecustomize  # records imports and model loads into $BENCH_FAULTS_MARKS: this interpreter's, then each child's

reply = os.fdopen(os.dup(1), "w")  # the answers' own channel: what the imports print goes to stderr
os.dup2(2, 1)
for name in sys.argv[1:]:
    __import__(name)


def run(request):
    os.close(reply.fileno())  # the answers' channel stays the warm interpreter's alone
    os.setsid()
    os.nice(10)
    resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sitecustomize._PATH = request["env"].get("BENCH_FAULTS_MARKS")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    argv = request["argv"]
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException as err:  # the traceback a fresh interpreter prints: from the child's own first frame
        frames = err.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            frames = frames.tb_next
        traceback.print_exception(type(err), err, frames)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    start = time.time()
    pid = os.fork()
    if pid == 0:
        run(request)
    deadline = start + request["timeout"]
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    try:
        os.killpg(pid, signal.SIGKILL)  # what the child left running (reward workers)
    except OSError:
        pass
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    reply.write(json.dumps({"rc": rc, "timed_out": timed_out, "seconds": time.time() - start}) + "\\n")
    reply.flush()
'''

# The reward cases' child: evaluates its spec (a Python literal; nan / inf allowed) and prints one result line.
REWARD_CHILD = r"""
import json, sys, time
spec = eval(open(sys.argv[1]).read(), {"nan": float("nan"), "inf": float("inf"), "__builtins__": {"set": set}})
import subprocess
load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spec.get("load", 0))]
start = time.time()
try:
    if spec["call"] == "accuracy":
        from gkv_rewards.functions import accuracy, verifier_stats
        out = {"scores": accuracy(prompts=None, completions=spec["completions"], answer=spec["answers"]),
               "stats": verifier_stats()}
    elif spec["call"] == "boxed_format":
        from gkv_rewards.functions import boxed_format
        out = {"scores": boxed_format(prompts=None, completions=spec["completions"])}
    elif spec["call"] == "fresh_verifiers":  # each pair checked by a verifier of its own (a worker's first check)
        from gkv_rewards.verify import CHECK, MathVerifier
        out = {"scores": [], "stats": []}
        for pred, gold in spec["pairs"]:
            verifier = MathVerifier(timeout=spec.get("timeout", 5.0), check=spec.get("check", CHECK))
            out["scores"].append(float(verifier(pred, gold)))
            out["stats"].append(dict(verifier.stats))
            verifier.close()
    else:
        from gkv_rewards.verify import CHECK, MathVerifier
        verifier = MathVerifier(timeout=spec.get("timeout", 5.0), check=spec.get("check", CHECK))
        out = {"scores": [float(verifier(pred, gold)) for pred, gold in spec["pairs"]], "stats": dict(verifier.stats)}
        verifier.close()
except Exception as err:
    out = {"raised": type(err).__name__, "message": str(err)[:400]}
finally:
    for burner in load:
        burner.kill()
out["seconds"] = time.time() - start
print("BENCH_RESULT " + json.dumps(out, default=str), flush=True)
"""


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
        return {
            "argv": self.argv,
            "rc": self.rc,
            "seconds": round(self.seconds, 2),
            "timed_out": self.timed_out,
            "model_loaded": self.model_loaded,
            "stdout_tail": self.out[-TAIL:],
            "stderr_tail": self.err[-TAIL:],
        }


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
        self._readers = [
            threading.Thread(target=self._read, args=(stream, self._chunks[key]), daemon=True)
            for key, stream in (("out", popen.stdout), ("err", popen.stderr))
        ]
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
        proc = Proc(
            self.argv,
            None if timed_out else self.popen.returncode,
            text["out"],
            text["err"],
            time.time() - self.start,
            timed_out,
            read_marks(self.marks),
        )
        self.ctx.procs.append(proc)
        return proc


class Forks:
    """A warm interpreter of the checkout (``ZYGOTE``) that starts children by fork: ``run`` is ``Context.run``'s
    for the children it may fork (see there), and gives the same ``Proc`` a fresh interpreter gives (exit code or
    signal, output, marks: the warm interpreter's own imports first). Each child runs with the case's environment,
    working folder, address-space cap and time limit, in its own session.
    What differs from a fresh interpreter: the modules of ``PRELOAD`` are imported before the child starts, so a
    fault in importing them, or state they keep between imports, shows only in a fresh one
    (``scripts/bench_faults.py`` starts every child fresh)."""

    PRELOAD = (
        "gkv_train.cli",
        "gkv_train.config.compose",
        "gkv_train.models",
        "gkv_train.training.launch",
        "gkv_train.evaluation.evaluate",
        "gkv_train.evaluation.traces",
    )

    def __init__(self, repo: Path, python: str, site: Path, folder: Path, data_dir: Path | None = None):
        self.python, self.folder = python, folder
        folder.mkdir(parents=True, exist_ok=True)
        (site / "bench_faults_zygote.py").write_text(ZYGOTE)
        self.marks = folder / "zygote.marks"
        env = Context(repo, python, folder, site, 0, data_dir).env({"BENCH_FAULTS_MARKS": str(self.marks)})
        self.popen = subprocess.Popen(
            [python, str(site / "bench_faults_zygote.py"), *self.PRELOAD],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._count = 0

    def run(self, ctx: "Context", args: list[str], timeout: float) -> Proc:
        ctx._count += 1
        self._count += 1
        marks = ctx.work / f".proc{ctx._count}.marks"
        out, err = self.folder / f"{self._count}.out", self.folder / f"{self._count}.err"
        request = {
            "argv": args,
            "cwd": str(ctx.work),
            "env": ctx.env({"BENCH_FAULTS_MARKS": str(marks)}),
            "out": str(out),
            "err": str(err),
            "memory": ctx.memory_bytes,
            "timeout": timeout,
        }
        self.popen.stdin.write(json.dumps(request) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm interpreter ended (exit {self.popen.wait()})")
        answer = json.loads(line)
        proc = Proc(
            [self.python, *args],
            answer["rc"],
            read_text(out),
            read_text(err),
            answer["seconds"],
            answer["timed_out"],
            read_marks(self.marks) + read_marks(marks),
        )
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)
        ctx.procs.append(proc)
        return proc

    def close(self) -> None:
        self.popen.stdin.close()
        self.popen.wait(30)


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

    def __init__(
        self,
        repo: Path,
        python: str,
        work: Path,
        site: Path,
        memory_bytes: int,
        data_dir: Path | None,
        forks: Forks | None = None,
    ):
        self.repo, self.python, self.work, self.site = repo, python, work, site
        self.memory_bytes, self.data_dir, self.forks = memory_bytes, data_dir, forks
        self.procs: list[Proc] = []
        self.notes: dict = {}
        self._count = 0

    def env(self, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HYDRA_FULL_ERROR", "PYTHONSTARTUP")}
        env.update(
            PYTHONPATH=os.pathsep.join([str(self.site), *map(str, import_roots(self.repo))]),
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            WANDB_MODE="offline",
            BENCH_FAULTS_DIE_MARKER=str(self.work / "worker-died-once"),
            BENCH_FAULTS_START_MARKER=str(self.work / "worker-died-starting"),
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
            argv,
            cwd=self.work,
            env=self.env({"BENCH_FAULTS_MARKS": str(marks), **(env or {})}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=child_setup,
        )
        return Running(self, argv, popen, marks)

    def run(self, argv: list[str], timeout: float, fsize: int | None = None, env: dict | None = None) -> Proc:
        """``argv`` run to its end (or its limit): forked from ``forks`` where one is given and the child needs
        neither a file-size limit nor variables of its own (``env``: a module may read one at import, as
        ``gkv_train.problems.data`` reads ``GKV_DATA_DIR``); else a fresh interpreter."""
        if self.forks is not None and fsize is None and not env and argv[0] == self.python:
            return self.forks.run(self, argv[1:], timeout)
        return self.start(argv, fsize, env).wait(timeout)

    @contextmanager
    def full_disk(self, name: str, kilobytes: int):
        """A folder that fills after ``kilobytes``: yields (path, fsize) where fsize is the RLIMIT_FSIZE to give
        the children (None when a tmpfs of that size is mounted on the folder)."""
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        mounted = False
        if os.geteuid() == 0 and shutil.which("mount"):
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(path)],
                capture_output=True,
                check=False,
            )
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
    """What a failed child said: its last ``error:`` line (argparse's ``prog: error:`` too), else the exception line
    of its last traceback, else its last paragraph joined by " / " (Hydra's HYDRA_FULL_ERROR hint left out)."""
    lines = [line.rstrip() for line in err.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    lines = [re.sub(r"^[\w.\-]+(?: [\w.\-]+)?: (error: )", r"\1", line) for line in lines]  # argparse: "prog: error:"
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    if TRACEBACK in err:
        after = [line for line in err.rsplit(TRACEBACK, 1)[1].splitlines() if "HYDRA_FULL_ERROR" not in line]
        exception = [
            line
            for line in after
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)?\b.*", line)
            and not line.startswith((" ", "\t"))
        ]
        if exception:
            return exception[-1]
    paragraphs = "\n".join(line for line in err.splitlines() if "HYDRA_FULL_ERROR" not in line).strip().split("\n\n")
    return " / ".join(line.strip() for line in paragraphs[-1].splitlines() if line.strip())


def names_all(text: str, patterns: list[str]) -> bool:
    return all(re.search(p, text, re.IGNORECASE) for p in patterns)


def judge_refusal(
    proc: Proc,
    names: list[str],
    before_load: bool = True,
    must_not_exist: list[Path] = (),
    code: int | None = REFUSAL_CODE,
) -> Verdict:
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
    return sorted(
        int(p.name.split("-")[1])
        for p in out.glob("checkpoint-*")
        if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file()
    )


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
    """One hostile case: ``run`` gives its verdict in a fresh ``Context``; ``timeout``: its children's time limit;
    ``quick``: the case is one child refused before any work, nothing run before it (its setup, if any, writes
    files), which every ``make test`` runs (``tests/test_faults.py``)."""

    name: str
    category: str
    kind: str
    about: str
    run: Callable[[Context], Verdict]
    timeout: float = 120.0
    quick: bool = False

    def __post_init__(self):
        assert self.category in CATEGORIES and self.kind in KINDS, self.name


TRAIN = {
    "model": "tiny",
    "max_steps": 1,
    "prompts_per_step": 1,
    "num_generations": 2,
    "max_completion_length": 8,
    "data.limit": 4,
    "eval_data.limit": 2,
    "output_dir": "{work}/out",
}
EVAL = {
    "model": "tiny",
    "num_generations": 1,
    "max_completion_length": 4,
    "data.limit": 2,
    "output_dir": "{work}/out",
    "plots": False,
}
TRACES = {
    "model": "tiny",
    "num_generations": 1,
    "max_completion_length": 4,
    "data.limit": 2,
    "output": "{work}/traces.jsonl",
    "keep_incorrect": True,
}
SCRIPTS = {
    "train": ("train.py", TRAIN),
    "evaluate": ("scripts/evaluate.py", EVAL),
    "traces": ("scripts/generate_traces.py", TRACES),
}
FILE_DATA = {"data.name": None, "data.path": "{work}/data.jsonl"}


LM_EVAL_TASK = """task: faults_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
doc_to_text: "{{{{problem}}}} Answer:"
output_type: generate_until
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
"""


def lm_eval_command(ctx: Context, model_args: str) -> list[str]:
    """``gkv-train lm-eval`` (``python -m gkv_train.cli lm-eval``) with the model ``gkv`` and ``model_args``, on a
    local two-problem task written into the case's folder (offline), results under ``{work}/out``."""
    data = ctx.work / "task.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"What is {a} plus 1?", "answer": str(a + 1)}) + "\n" for a in (1, 2))
    )
    (ctx.work / "task.yaml").write_text(LM_EVAL_TASK.format(data=data))
    return [
        ctx.python,
        "-m",
        "gkv_train.cli",
        "lm-eval",
        "--model",
        "gkv",
        "--model_args",
        ctx.path(model_args),
        "--tasks",
        "faults_gen",
        "--include_path",
        str(ctx.work),
        "--output_path",
        str(ctx.work / "out"),
        "--limit",
        "2",
    ]


def overrides(entry: str, changes: dict) -> tuple[str, dict]:
    """The script of ``entry`` and its base overrides updated with ``changes`` (a value ``...`` drops the key)."""
    script, base = SCRIPTS[entry]
    merged = {**base, **changes}
    return script, {k: v for k, v in merged.items() if v is not ...}


def refuse(
    name, category, kind, about, entry, changes, names, before_load=True, setup=None, must_not_exist=(), timeout=120.0
) -> Case:
    """A case whose right outcome is a clear refusal (``names``: patterns its message must match); ``setup``
    writes the files it reads, if any (quick: nothing runs before the refused child)."""

    def run(ctx: Context) -> Verdict:
        if setup:
            setup(ctx)
        script, ov = overrides(entry, changes)
        proc = ctx.run(ctx.entry(script, ov), timeout)
        return judge_refusal(proc, names, before_load, [Path(ctx.path(p)) for p in must_not_exist])

    return Case(name, category, kind, about, run, timeout, quick=True)


def result(name, category, kind, about, entry, changes, check, setup=None, timeout=180.0) -> Case:
    """A case whose right outcome is exit 0 with ``check(ctx, proc)`` returning None."""

    def run(ctx: Context) -> Verdict:
        if setup:
            setup(ctx)
        script, ov = overrides(entry, changes)
        proc = ctx.run(ctx.entry(script, ov), timeout)
        return judge_result(proc, lambda: check(ctx, proc))

    return Case(name, category, kind, about, run, timeout)


def either(
    name, category, kind, about, entry, changes, names, check, before_load=True, setup=None, timeout=180.0
) -> Case:
    """A case where a clear refusal and a right result (``check``) are both right."""

    def run(ctx: Context) -> Verdict:
        if setup:
            setup(ctx)
        script, ov = overrides(entry, changes)
        proc = ctx.run(ctx.entry(script, ov), timeout)
        return judge_either(proc, names, lambda: check(ctx, proc), before_load)

    return Case(name, category, kind, about, run, timeout)


# ------------------------------------------------------------------------------------------------------ one case


def run_case(
    case: Case,
    repo: Path,
    python: str,
    work_root: Path,
    site: Path,
    memory_bytes: int,
    data_dir: Path | None,
    keep: bool,
    forks: Forks | None = None,
) -> dict:
    work = work_root / f"case-{hashlib.sha1(case.name.encode()).hexdigest()[:10]}"  # no words a pattern could match
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = Context(repo, python, work, site, memory_bytes, data_dir, forks)
    start = time.time()
    try:
        verdict = case.run(ctx)
    except Exception as err:  # a fault of the harness or of a check, not of the code probed: stop, do not record
        raise RuntimeError(f"case {case.name}: the probe itself failed: {type(err).__name__}: {err}") from err
    outside = sorted(
        {
            m["file"]
            for p in ctx.procs
            for m in p.marks
            if m["event"] == "import" and m.get("file") and not Path(m["file"]).resolve().is_relative_to(repo.resolve())
        }
    )
    if outside:
        raise RuntimeError(f"case {case.name}: gkv_train was imported from {outside}, not from {repo}")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "name": case.name,
        "category": case.category,
        "kind": case.kind,
        "about": case.about,
        "outcome": verdict.outcome,
        "detail": verdict.detail,
        "seconds": round(time.time() - start, 1),
        "extra": {**ctx.notes, **verdict.extra},
        "procs": [p.record() for p in ctx.procs],
    }


def write_site(site: Path) -> Path:
    """The folder put first on the children's ``PYTHONPATH``: the ``sitecustomize`` that records imports and model
    loads, and the misbehaving answer checks the reward cases load."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (site / "bench_faults_checks.py").write_text(CHECKS_MODULE)
    (site / "bench_faults_start.py").write_text(START_MODULE)
    return site
