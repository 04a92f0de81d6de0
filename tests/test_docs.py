"""The docs' measured tables are the results files' (scripts/render_docs.py): a newer result committed without
its table regenerated fails here."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_results_table_matches_its_results_file():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "render_docs.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
