"""Train a reasoning model under the compressed KV cache it will run with.

    accelerate launch train.py recipe=rl_sparse            # RL-Sparse on the embedded default (CPU: minutes)
    accelerate launch train.py recipe=rl_full              # the RL-Full baseline
    accelerate launch train.py recipe=distill              # full-cache teacher traces -> compressed student
    accelerate launch train.py recipe=distill_onpolicy     # the student samples, the teacher scores
    accelerate launch train.py recipe=rl_sparse resume=last
    accelerate launch --num_processes 2 train.py recipe=rl_sparse

Any key of the run's configuration (``gkv_train.config.train_config.GRPOTrainConfig``, TRL's ``GRPOConfig`` with
the project's keys; ``DistillTrainConfig`` for distillation) can be overridden: ``compression.budget=64``,
``data.name=gsm8k``, ``max_steps=50``, ``lora.enabled=true``, ``max_completion_length=256``, ...; every field of
TRL's ``GRPOConfig`` is a key under its own name (``weight_decay=0.01``, ``num_iterations=2``,
``log_completions=true``, ...), except those set from the project's keys (``bf16`` from ``precision``,
``per_device_train_batch_size`` from ``prompts_per_step``: refused, naming the key to write). ``train.py --help``
lists every key. The installed command ``gkv-train train ...`` runs the same.
"""

import signal

from gkv_rewards.process import die_with_parent, started_by_launcher

if (
    __name__ == "__main__" and started_by_launcher()
):  # first of all: a killed launcher (torchrun's agent) stops its workers
    die_with_parent(signum=signal.SIGTERM)  # which stop at the end of their step, with a checkpoint

from gkv_train.cli import train  # noqa: E402

if __name__ == "__main__":
    train([__file__])  # the same as `gkv-train train ...`
