"""The docs' measured tables are the results files' (scripts/render_docs.py): a newer result committed without
its table regenerated fails here."""

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
    """A run-tagged file renders by its benchmark's script; several files are one view's list; a block whose file
    no script renders is an error naming it (the control)."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import render_docs as r; "
        "print(r.renderer('bench_faults_after.json'), r.renderer('bench_decode_regime.json')); "
        "r.renderer('nobody_writes_this.json')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["bench_faults", "bench_decode_regime"]
    assert done.returncode != 0 and "results/nobody_writes_this.json" in done.stderr
