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

import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gkv_train.console import log_console_to  # noqa: E402
from gkv_train.data import load_problems  # noqa: E402
from gkv_train.evaluation import (  # noqa: E402
    claim_run_dir,
    evaluate_compression,
    lm_eval_results,
    plot_summaries,
    results_table,
    run_name,
    software_versions,
)
from gkv_train.jsonio import dumps, write_atomically  # noqa: E402
from gkv_train.models import check_model, load_model, model_identity  # noqa: E402
from gkv_train.run_config import EvalConfig, apply_overrides  # noqa: E402
from rollout.config import SamplingConfig  # noqa: E402

ConfigStore.instance().store(name="eval_schema", node=EvalConfig)


@hydra.main(version_base=None, config_path="../recipes", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    config: EvalConfig = OmegaConf.to_object(cfg)
    runs = config.compressions()  # everything is checked before the model loads
    for name in (config.model, config.adapter):
        if name is not None:
            check_model(name)
    data = config.data
    problems = load_problems(data, config.seed)
    out_dir = Path(config.output_dir)
    for compression in runs:
        claim_run_dir(out_dir / run_name(compression), config.run_settings(compression), config.overwrite)
    log_console_to(out_dir / "evaluate.log")
    for warning in config.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    model, tokenizer = load_model(config.model, dtype=torch.bfloat16 if config.precision == "bf16" else torch.float32)
    if config.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, config.adapter).merge_and_unload()
    sampling = SamplingConfig(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
        num_samples=config.num_generations, seed=config.seed,
    )
    summaries = [
        evaluate_compression(
            model, tokenizer, problems, compression, sampling, out_dir / run_name(compression),
            config.batch_problems, data.prompt_template,
        )
        for compression in runs
    ]
    settings = OmegaConf.to_container(cfg, resolve=True)
    versions = software_versions()
    identity = {"model": model_identity(config.model),
                "adapter": None if config.adapter is None else model_identity(config.adapter)}  # fmt: skip
    data_name = data.name or Path(data.path).stem
    write_atomically(out_dir / "summary.json", dumps(
        {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": settings, **identity, "data": data.identity(),
         "versions": versions, "runs": summaries}, indent=2,
    ))  # fmt: skip
    results = lm_eval_results(summaries, data_name, settings, versions)
    write_atomically(out_dir / "results.json", dumps({**results, "date": time.time()}, indent=2))
    title = f"{config.model}{' + ' + config.adapter if config.adapter else ''} · {data_name} · " \
            f"{summaries[0]['problems']} problems x {config.num_generations} samples"
    if config.plots:
        plot_summaries(summaries, out_dir, title)
    print(title + "\n" + results_table(summaries), file=sys.stderr, flush=True)
    hidden = ("retained_density", "retention_by_position", "compression")
    compact = [{k: v for k, v in s.items() if k not in hidden} for s in summaries]
    result = {"evaluation": data_name, "model": config.model, "output_dir": str(out_dir), "runs": compact}
    print(dumps(result), flush=True)


if __name__ == "__main__":
    apply_overrides(EvalConfig, passthrough=False)  # aliases (n_samples), "did you mean"
    main()
