"""The hostile-input and fault probe's cases and harness (``scripts/bench_faults.py`` runs them)."""
