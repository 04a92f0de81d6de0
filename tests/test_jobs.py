"""gkv_train.evidence.jobs: job claims shared by processes (two workers, a killed worker, a released claim, a race),
and done markers that a resumed pipeline reads."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gkv_train.evidence import jobs

HOLD = textwrap.dedent(
    """
    import sys, time
    from gkv_train.evidence import jobs
    taken = jobs.claim(sys.argv[1], "train/run-a")
    print("taken" if taken else "refused", flush=True)
    if taken and sys.argv[2] == "release":
        jobs.release(sys.argv[1], "train/run-a")
        print("released", flush=True)
    time.sleep(float(sys.argv[3]))
    """
)


def holder(root, then: str = "hold", seconds: float = 60.0) -> subprocess.Popen:
    """A worker process that claims ``train/run-a`` and says so, then holds (or releases) and sleeps."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), then, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    if proc.stdout.readline().strip() != "taken":
        proc.kill()
        raise AssertionError("the worker did not take the free job")
    return proc


def test_a_job_held_by_a_live_worker_is_refused_to_another(tmp_path):
    worker = holder(tmp_path)
    try:
        assert not jobs.claim(tmp_path, "train/run-a")  # the other worker holds it
        assert jobs.claim(tmp_path, "train/run-b")  # another job is free
        jobs.release(tmp_path, "train/run-b")
    finally:
        worker.kill()
        worker.wait()


def test_a_killed_workers_job_is_free_at_once(tmp_path):
    worker = holder(tmp_path)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    assert (tmp_path / "claims" / "train__run-a").is_file()  # the file stays; the lock went with the process
    assert jobs.claim(tmp_path, "train/run-a")
    jobs.release(tmp_path, "train/run-a")
    assert not (tmp_path / "claims" / "train__run-a").exists()


def test_a_released_job_is_free_while_its_worker_lives(tmp_path):
    worker = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), "release", "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout.readline().strip() == "taken" and worker.stdout.readline().strip() == "released"
        assert jobs.claim(tmp_path, "train/run-a")
        jobs.release(tmp_path, "train/run-a")
    finally:
        worker.kill()
        worker.wait()


RACE = textwrap.dedent(
    """
    import sys, time
    from gkv_train.evidence import jobs
    if sys.argv[3] == "no-lock":  # the control: a claim that always succeeds
        jobs.claim, jobs.release = (lambda root, key: True), (lambda root, key: None)
    held = 0
    marker = sys.argv[1] + "/inside"
    start = float(sys.argv[2])  # the same moment for every worker, after they all started
    time.sleep(max(0.0, start - time.time()))
    while time.time() < start + 2:
        if jobs.claim(sys.argv[1], "eval/x"):
            with open(marker, "a") as f:
                f.write("in\\n")
            time.sleep(0.001)
            lines = open(marker).read().splitlines()
            if lines.count("in") - lines.count("out") != 1:
                print("overlap", flush=True)
            with open(marker, "a") as f:
                f.write("out\\n")
            held += 1
            jobs.release(sys.argv[1], "eval/x")
    print(held, flush=True)
    """
)


def race(folder, lock: str) -> list[list[str]]:
    """Four processes claiming and releasing one job as fast as they can for the same two seconds (from 5 s after
    they are started), each writing ``in`` and ``out`` around its hold and printing ``overlap`` where it finds
    another inside; their outputs."""
    folder.mkdir()
    start = str(time.time() + 5)
    procs = [
        subprocess.Popen([sys.executable, "-c", RACE, str(folder), start, lock], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    return [p.communicate(timeout=120)[0].split() for p in procs]


def test_racing_workers_never_hold_one_job_together(tmp_path):
    outputs = race(tmp_path / "locked", "lock")
    assert all("overlap" not in out for out in outputs), outputs
    assert sum(int(out[-1]) for out in outputs) > 4
    # the control: without the lock the same race finds workers inside together
    assert any("overlap" in out for out in race(tmp_path / "unlocked", "no-lock"))


def test_a_claim_is_taken_once_per_process(tmp_path):
    assert jobs.claim(tmp_path, "train/run-a")
    with pytest.raises(RuntimeError, match="claimed by this process already"):
        jobs.claim(tmp_path, "train/run-a")
    jobs.release(tmp_path, "train/run-a")
    with pytest.raises(RuntimeError, match="not claimed by this process"):
        jobs.release(tmp_path, "train/run-a")


def test_done_markers_survive_the_process_and_are_written_whole(tmp_path):
    assert not jobs.is_done(tmp_path, "eval/run-a@gkv")
    done = f"from gkv_train.evidence import jobs; jobs.mark_done({str(tmp_path)!r}, 'eval/run-a@gkv')"
    subprocess.run([sys.executable, "-c", done], check=True)
    assert jobs.is_done(tmp_path, "eval/run-a@gkv")  # a resumed pipeline skips it
    marker = jobs.done_marker(tmp_path, "eval/run-a@gkv")
    assert time.strptime(marker.read_text(), "%Y-%m-%d %H:%M:%S")
    assert [p.name for p in marker.parent.iterdir()] == [marker.name]  # no temporary file left


SPAWN = textwrap.dedent(
    """
    import subprocess, sys
    from gkv_train.evidence import jobs
    assert jobs.claim(sys.argv[1], "train/run-a")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=jobs.held())
    print(child.pid, flush=True)
    child.wait()
    """
)


def test_a_jobs_command_keeps_it_claimed_after_its_worker_is_killed(tmp_path):
    """The worker's command inherits the claim (``held``: ``pass_fds``): killing the worker alone leaves the job
    held while the command runs; when it ends too, the job is free."""
    worker = subprocess.Popen([sys.executable, "-c", SPAWN, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    command = int(worker.stdout.readline())
    try:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert not jobs.claim(tmp_path, "train/run-a")  # the command still runs
    finally:
        os.kill(command, signal.SIGKILL)
    for _ in range(100):  # the command's end is seen when its process is reaped (by init: it lost its parent)
        if jobs.claim(tmp_path, "train/run-a"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the job stayed claimed after its command ended")
    jobs.release(tmp_path, "train/run-a")
