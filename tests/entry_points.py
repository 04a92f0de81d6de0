"""Many command lines of one entry-point script in one fresh interpreter: the script runs as ``__main__`` once per
command line, as ``python script ...`` would run it (its folder first on ``sys.path``), with its own exit code,
stdout and stderr; only the imports (torch, transformers, TRL: most of a refused run's seconds) are paid once. For
the checks that refuse a run before any work, where a process per case would spend its time importing. What one
process shares across the cases: modules already imported, a warning shown once, and log handlers that kept the
first case's ``sys.stderr``; so assert on a case's own ``error:`` line, not on warnings or library logs."""

import json
import subprocess
import sys
from types import SimpleNamespace

DRIVER = """
import io, json, os, runpy, sys, time, traceback
script, argvs = sys.argv[1], json.loads(sys.stdin.read())
sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script` sets it
results = []
for argv in argvs:
    out, err = io.StringIO(), io.StringIO()
    sys.argv, sys.stdout, sys.stderr = [script, *argv], out, err
    start, code = time.monotonic(), 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:  # what the interpreter makes of sys.exit(...)
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=err)
    except BaseException:
        traceback.print_exc(file=err)
        code = 1
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                    "seconds": time.monotonic() - start})
print(json.dumps(results))
"""


def run_each(script, argvs: list[list[str]], cwd, timeout: float = 900) -> list[SimpleNamespace]:
    """``python script *argv`` for each ``argv``, in one interpreter: per command line a result with
    ``returncode``, ``stdout``, ``stderr`` (as ``subprocess.run`` gives) and ``seconds``."""
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(script)],
        input=json.dumps(argvs),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [SimpleNamespace(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


# ---- a warm interpreter: one fresh process per command line, the imports paid once ----------------------------
SERVER = """
import json, os, random, runpy, signal, sys
before = dict(os.environ)
for name in sys.argv[1:]:  # what every entry point imports first: most of a short run's seconds
    __import__(name)
added = {k: v for k, v in os.environ.items() if before.get(k) != v}  # what the imports set (they run once)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the command's own process: as `python script *argv` in cwd with env would start it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update({**job["env"], **added})
        random.seed()  # a fresh interpreter's random state, not the server's
        for module, reseed in (("numpy", lambda m: m.random.seed()), ("torch", lambda m: m.seed())):
            if module in sys.modules:
                reseed(sys.modules[module])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)  # block-buffered, as on a pipe
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
        sys.argv = [job["script"], *job["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(job["script"]))
        try:
            runpy.run_path(job["script"], run_name="__main__")
        except SystemExit:
            raise  # the interpreter's own exit: its code, atexit handlers, flushed streams
        except BaseException:
            sys.excepthook(*sys.exc_info())
            sys.exit(1)
        sys.exit(0)
    print(json.dumps({"job": job["id"], "pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"job": job["id"], "returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""
WARM_MODULES = ("gkv_train.config.compose", "gkv_train.training.launch", "gkv_train.training.grpo", "trl")
_warm: dict = {}


def run_warm(script, argv: list[str], cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python script *argv`` in ``cwd`` as ``subprocess.run(..., capture_output=True, text=True)`` returns it,
    run in a fork of one interpreter that imported ``WARM_MODULES`` once: a process per command line with its own
    exit code (a signal's negative), atexit handlers, signal handlers and random state (reseeded), this process's
    environment plus what the imports set; shared with the other command lines: the imported modules and the hash
    seed. A command that needs another environment, or a launcher, runs as a fresh interpreter instead."""
    import itertools
    import os
    import select
    import signal
    import tempfile

    server = _warm.get("server")
    if server is None or server.poll() is not None or _warm.get("env") != dict(os.environ):
        stop_warm()
        server = subprocess.Popen(  # unbuffered: a line read never reads ahead of what ``select`` waits for
            [sys.executable, "-c", SERVER, *WARM_MODULES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        _warm.update(server=server, env=dict(os.environ), jobs=itertools.count())
    job = next(_warm["jobs"])

    def reply(key: str) -> int:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm interpreter stopped (exit code {server.wait()}): see its stderr above")
        answer = json.loads(line)
        assert answer["job"] == job, (answer, job)
        return answer[key]

    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        request = {"id": job, "script": str(script), "argv": argv, "cwd": str(cwd), "env": dict(os.environ)}
        try:
            server.stdin.write((json.dumps({**request, "stdout": out, "stderr": err}) + "\n").encode())
            pid = reply("pid")
            if not select.select([server.stdout], [], [], timeout)[0]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # it ended meanwhile
                    pass
                reply("returncode")
                raise subprocess.TimeoutExpired([script, *argv], timeout)
            code = reply("returncode")
        except BaseException:
            stop_warm()  # never reused out of step
            raise
        with open(out, errors="backslashreplace") as o, open(err, errors="backslashreplace") as e:
            return subprocess.CompletedProcess([script, *argv], code, o.read(), e.read())


def stop_warm() -> None:
    """End the warm interpreter, if one runs (its children have ended: each call waits for its own)."""
    server = _warm.pop("server", None)
    if server is not None and server.poll() is None:
        server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
