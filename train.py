"""Train a reasoning model under the compressed KV cache it will run with.

    accelerate launch train.py recipe=rl_sparse            # RL-Sparse on the embedded default (CPU: minutes)
    accelerate launch train.py recipe=rl_full              # the RL-Full baseline
    accelerate launch train.py recipe=distill              # full-cache teacher traces -> compressed student
    accelerate launch train.py recipe=distill_onpolicy     # the student samples, the teacher scores
    accelerate launch train.py recipe=rl_sparse resume=last
    accelerate launch --num_processes 2 train.py recipe=rl_sparse

Any key of ``gkv_train.run_config.TrainConfig`` can be overridden: ``compression.budget=64``, ``data.name=gsm8k``,
``max_steps=50``, ``lora.enabled=true``, ... TRL's names work too: ``max_completion_length`` and ``bf16`` are
read as ``max_new_tokens`` and ``precision``; a GRPOConfig field without a key here (``weight_decay=0.01``,
``num_iterations=2``, ``log_completions=true``, ``push_to_hub=true``, ...) is handed to the trainer as
``trl.<field>``.
"""

from gkv_train.process import die_with_parent, launched_by_agent

if __name__ == "__main__" and launched_by_agent():  # first of all: a killed launcher / agent takes its workers along
    die_with_parent()

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from gkv_train.distributed import relaunch_cpu_processes  # noqa: E402
from gkv_train.run_config import TrainConfig, apply_overrides  # noqa: E402

ConfigStore.instance().store(name="train_schema", node=TrainConfig)


@hydra.main(version_base=None, config_path="recipes", config_name="train")
def main(cfg: DictConfig) -> None:
    config: TrainConfig = OmegaConf.to_object(cfg)  # validated: bad values fail here, before any work
    from gkv_train.launch import run  # trl, transformers, peft: imported once the configuration holds

    run(config)


if __name__ == "__main__":
    apply_overrides(TrainConfig, passthrough=True)  # TRL's names, "did you mean"
    relaunch_cpu_processes()
    main()
