"""pass@k of a model on a math dataset under one or more KV-cache compressions (Hydra, like train.py).

    python scripts/evaluate.py                                    # embedded model, built-in task, full cache
    python scripts/evaluate.py data.name=gsm8k data.limit=64 methods=[full,gkv,rkv] budgets=[64,128]
    python scripts/evaluate.py model=outputs/rl_sparse compression.method=gkv compression.budget=64

Writes, under ``output_dir`` (default ``outputs/eval/<model>_<data>``): ``<run>/samples.jsonl`` (one line per
sample), ``<run>/summary.json``, ``<run>/run.json`` (the settings that produced them), ``summary.json`` (all
runs with the full configuration, the model's identity and the software versions), ``results.json`` (the same in
lm-evaluation-harness's layout), ``pass_at_1_vs_budget.png`` and ``retained_density.png``; prints a method x
budget table (stderr) and one JSON line (stdout). An interrupted call
continues where it stopped when run again with the same settings; a folder holding results made with other
settings (model weights, data, sampling, compression, ...) is refused unless ``overwrite=true``.
"""

from gkv_train.cli import evaluate

if __name__ == "__main__":
    evaluate()  # the same as `gkv-train evaluate ...`
