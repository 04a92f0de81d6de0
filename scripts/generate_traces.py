"""Teacher traces for offline distillation: full-cache completions, checked, the correct ones written as JSONL
(Hydra, like train.py and evaluate.py; keys: ``gkv_train.run_config.TracesConfig``).

    python scripts/generate_traces.py data.name=gsm8k data.split=test data.limit=200 num_generations=4 \
        output=traces/gsm8k.jsonl
    accelerate launch train.py recipe=distill distill.traces=traces/gsm8k.jsonl

Each line: id, prompt (the problem in the prompt template ``data.prompt_template``), completion (text),
completion_ids (with the stop token), answer (gold), correct. Prints one JSON line with the counts.
"""

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gkv_train.data import load_problems  # noqa: E402
from gkv_train.jsonio import dumps  # noqa: E402
from gkv_train.models import check_model, load_model  # noqa: E402
from gkv_train.run_config import TracesConfig, apply_overrides  # noqa: E402
from gkv_train.traces import generate_traces, write_traces  # noqa: E402
from rollout.config import SamplingConfig  # noqa: E402

ConfigStore.instance().store(name="traces_schema", node=TracesConfig)


@hydra.main(version_base=None, config_path="../recipes", config_name="traces")
def main(cfg: DictConfig) -> None:
    config: TracesConfig = OmegaConf.to_object(cfg)  # validated before any work
    check_model(config.model)
    problems = load_problems(config.data, config.seed)
    model, tokenizer = load_model(config.model)
    sampling = SamplingConfig(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p,
        num_samples=config.num_generations, seed=config.seed,
    )
    rows = generate_traces(
        model, tokenizer, problems, sampling, config.data.prompt_template, keep_incorrect=config.keep_incorrect
    )
    write_traces(rows, Path(config.output))
    print(dumps({"traces": config.output, "problems": len(problems), "samples": len(problems) * config.num_generations,
                 "written": len(rows), "correct": sum(r["correct"] for r in rows)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    apply_overrides(TracesConfig, passthrough=False)  # aliases (n_samples, samples_per_prompt), "did you mean"
    main()
