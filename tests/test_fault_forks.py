"""``faults.harness.Forks``: a child forked from the warm interpreter gives the ``Proc`` a fresh interpreter gives
(exit code, a signal's death, a traceback, output, working folder, environment, the address-space cap, a hang
killed with what it started, the model loads the sitecustomize records); a child with variables of its own runs
fresh (a module may read one at import: the control shows a forked child would not see it)."""

import json
import os
import sys
import time

import pytest

from faults.harness import ROOT, Context, Forks, write_site

MEMORY = 8 * 2**30

SCRIPT = """
import json, os, sys
what = sys.argv[1]
if what == "refuse":
    print("error: beta must be >= 0, got -1", file=sys.stderr)
    sys.exit(2)
if what == "raise":
    raise ZeroDivisionError("division by zero")
if what == "signal":
    os.kill(os.getpid(), 9)
if what == "where":
    print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv, "main": __name__, "path0": sys.path[0],
                      "marker": os.environ.get("BENCH_FAULTS_DIE_MARKER")}))
if what == "allocate":
    block = bytearray(16 * 2**30)
if what == "hang":
    import subprocess, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open("grandchild.pid", "w").write(str(child.pid))
    time.sleep(300)
if what == "load":
    from gkv_train.models import load_model
    try:
        load_model("./no/such/model")
    except Exception as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
"""


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    site = write_site(tmp_path_factory.mktemp("site"))
    forks = Forks(ROOT, sys.executable, site, tmp_path_factory.mktemp("forks"))
    yield site, forks
    forks.close()


def contexts(warm, tmp_path):
    """A context that forks and one that starts fresh interpreters, each with its own work folder holding the
    script."""
    site, forks = warm
    made = []
    for name, given in (("forked", forks), ("fresh", None)):
        work = tmp_path / name
        work.mkdir()
        (work / "child.py").write_text(SCRIPT)
        made.append(Context(ROOT, sys.executable, work, site, MEMORY, None, given))
    return made


def both(warm, tmp_path, what, timeout=60.0):
    forked, fresh = contexts(warm, tmp_path)
    return [ctx.run([ctx.python, str(ctx.work / "child.py"), what], timeout) for ctx in (forked, fresh)]


@pytest.mark.parametrize("what, rc", [("refuse", 2), ("raise", 1), ("signal", -9), ("allocate", 1)])
def test_a_forked_child_ends_as_a_fresh_one(warm, tmp_path, what, rc):
    forked, fresh = both(warm, tmp_path, what)
    assert forked.rc == fresh.rc == rc
    assert not forked.timed_out and not fresh.timed_out
    last = [proc.err.strip().splitlines()[-1] if proc.err.strip() else "" for proc in (forked, fresh)]
    assert last[0] == last[1]  # the error line, the exception, or nothing after a signal
    if what == "raise":  # the same traceback, from the child's own first frame
        texts = [proc.err.replace(os.path.dirname(proc.argv[1]), "WORK") for proc in (forked, fresh)]
        assert "Traceback (most recent call last)" in texts[0] and texts[0] == texts[1]
    if what == "allocate":
        assert last[0] == "MemoryError"  # the cap holds in the forked child too


def test_a_forked_child_runs_where_and_as_a_fresh_one(warm, tmp_path):
    forked, fresh = both(warm, tmp_path, "where")
    seen = [json.loads(proc.out.strip().splitlines()[-1]) for proc in (forked, fresh)]
    for got, proc in zip(seen, (forked, fresh)):
        work = os.path.dirname(proc.argv[1])
        assert got["cwd"] == work and got["path0"] == work and got["main"] == "__main__"
        assert got["argv"] == [proc.argv[1], "where"]
        assert got["marker"] == os.path.join(work, "worker-died-once")  # the case's variables, not the warm one's


def test_a_model_load_is_recorded_in_a_forked_child(warm, tmp_path):
    forked, fresh = both(warm, tmp_path, "load")
    assert forked.rc == fresh.rc == 2
    assert forked.model_loaded and fresh.model_loaded
    imports = [m for m in forked.marks if m["event"] == "import" and m["module"] == "gkv_train"]
    assert imports and imports[0]["file"].startswith(str(ROOT))  # the warm interpreter's import, for run_case


def test_a_hang_is_killed_at_its_limit_with_what_it_started(warm, tmp_path):
    forked, _ = contexts(warm, tmp_path)
    start = time.time()
    proc = forked.run([forked.python, str(forked.work / "child.py"), "hang"], 3.0)
    assert proc.timed_out and time.time() - start < 30
    grandchild = int((forked.work / "grandchild.pid").read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the hung child's own child outlived the limit")


def test_a_child_with_variables_of_its_own_starts_fresh(warm, tmp_path):
    """Control: ``GKV_DATA_DIR`` is read when ``gkv_train.problems.data`` is imported, before any fork; a forked
    child given it would still see the warm interpreter's folder."""
    site, forks = warm
    forked, _ = contexts(warm, tmp_path)
    code = "from gkv_train.problems.data import DATA_DIR; print(DATA_DIR)"
    before = forks._count
    proc = forked.run([forked.python, "-c", code], 60, env={"GKV_DATA_DIR": str(tmp_path)})
    assert proc.out.strip().splitlines()[-1] == str(tmp_path) and forks._count == before
    warm_folder = forks.run(forked, ["-c", code], 60).out.strip().splitlines()[-1]
    assert warm_folder != str(tmp_path)  # what a forked child would have read
