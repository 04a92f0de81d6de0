"""The docs' measured tables are the results files' (scripts/render_docs.py): a newer result committed without
its table regenerated fails here; no committed file names a folder of one machine."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_results_table_matches_its_results_file():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_docs.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_block_finds_its_renderer_or_names_what_is_missing(tmp_path):
    """A run-tagged file renders by its benchmark's script (whose ``tables`` may be the package's); several files
    are one view's list; a block whose file no script renders is an error naming it (the control)."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import render_docs as r; "
        "print(r.renderer('bench_faults_after.json'), r.renderer('bench_decode_regime.json'), "
        "r.renderer('bench_rl_evidence_long_recall.json')); "
        "r.renderer('nobody_writes_this.json')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["bench_faults", "bench_decode_regime", "bench_rl_evidence"]
    assert done.returncode != 0 and "results/nobody_writes_this.json" in done.stderr


def test_a_results_file_of_any_name_renders_by_the_benchmark_it_names():
    """``gkv-train compare`` writes ``"benchmark": "rl_evidence"`` into a results file of any name: it renders by
    ``scripts/bench_rl_evidence.py``; a name no script has falls back to the file's name (the control)."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import render_docs as r; "
        "print(r.named_renderer({'benchmark': 'rl_evidence'}), r.named_renderer({'benchmark': 'nobody'}), "
        "r.named_renderer({'script': 'bench_faults'}), r.named_renderer([]))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["bench_rl_evidence", "None", "bench_faults", "None"], done.stderr


MACHINE_FOLDER = re.compile(r"(?<![\w./-])/(?:tmp|work|home|Users|root|mnt|scratch|check)/[\w.+-]")


def test_no_committed_file_names_a_folder_of_one_machine():
    """Docs, results, recipes and script defaults name paths relative to the checkout (``results/...``,
    ``../outputs/...``, ``../shared/data``; a temporary file under ``tempfile.gettempdir()``): a command copied
    from a doc runs in another clone, and no machine's layout is published. Checked over every file git tracks or
    would add (binary files skipped)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    here = re.compile(r"(?<![\w./-])" + re.escape(str(ROOT.parent) + "/"))
    found = []
    for name in listed:
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 20 * 2**20:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if here.search(line) or MACHINE_FOLDER.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "\n".join(found[:20])
