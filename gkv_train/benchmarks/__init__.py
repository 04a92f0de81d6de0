"""The benchmarks: one module per ``scripts/bench_*.py`` entry point, each its ``main`` (one JSON line, a results
file under ``results/`` where it keeps one) and, where the docs show its figures, its ``tables(view, result)``
(``scripts/render_docs.py``). Run from the repository's root: their default paths (``results/``, ``outputs/``,
``scripts/evaluate.py``) are relative to it; the jobs they start are the installed command's
(``gkv_train.evidence.regime.COMMAND``)."""
