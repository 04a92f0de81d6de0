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
