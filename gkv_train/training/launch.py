"""Build and run a training job (GRPO: RL-Sparse / RL-Full; distillation) from its validated configuration
(``GRPOTrainConfig`` / ``DistillTrainConfig``: the trainer's arguments themselves)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from gkv_rewards.functions import verifier_stats
from gkv_train.config.options import rollout_sampling
from gkv_train.config.preflight import (
    Generation,
    WeightlessModel,
    check_generations,
    check_lora_targets,
    check_task_contexts,
)
from gkv_train.config.train_config import TrainConfig
from gkv_train.console import log_console_to
from gkv_train.evaluation.evaluate import final_evaluation
from gkv_train.exits import refusing
from gkv_train.jsonio import dumps, read_state, write_atomically
from gkv_train.models import (
    base_model_name,
    base_weights_note,
    card_model_name,
    check_model,
    load_model,
)
from gkv_train.problems.data import GIVEN
from gkv_train.runs.checkpoints import (
    EVAL,
    METRICS,
    TRAIN_LOG,
    StopOnSignal,
    checkpoint_step,
)
from gkv_train.runs.output_dir import (
    RunFolder,
    check_run_folder,
    finished_whole,
    lock_output_dir,
    prepare_output_dir,
    resume_checkpoint,
)
from gkv_train.storage import naming_full_disk
from gkv_train.training.algorithms import ALGORITHMS, prompt_dataset
from gkv_train.training.distributed import generation_model

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is how TRL takes a custom generator


class JsonlLogger(TrainerCallback):
    """Appends every log record (step, metrics, wall time) as one JSON line to ``<output_dir>/metrics.jsonl``."""

    def __init__(self, path: Path):
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            extra = {"verifier_" + k: v for k, v in verifier_stats().items()}
            with naming_full_disk(self.path, "the metrics log"), open(self.path, "a") as f:
                record = {"step": state.global_step, "time": time.time(), "processes": args.world_size}
                f.write(dumps({**record, **logs, **extra}) + "\n")


def run_folder(config: TrainConfig) -> RunFolder:
    """The run folder's part of ``config``: what it may hold, and the models and input it must not replace."""
    job = ALGORITHMS[config.algorithm](config)
    return RunFolder(
        output_dir=config.output_dir,
        resume=config.resume,
        resume_other_run=config.resume_other_run,
        overwrite=config.overwrite,
        keep=job.kept_input(),
        resume_model_only=config.resume_model_only,
        models=tuple(job.models().items()),
    )


def finish(trainer, tokenizer, config: TrainConfig, held_out, is_main_process: bool) -> dict:
    """Save the final model, evaluate it on the held-out problems, print and write the evaluation line."""
    with naming_full_disk(Path(config.output_dir), "the final model", trainer.checkpoint_bytes()):
        trainer.save_final(config.output_dir)
    with generation_model(trainer) as model:  # every process enters (ZeRO-3 gathers); the main one evaluates
        if not is_main_process:
            return {}
        sampling = rollout_sampling(config, config.seed, num_samples=config.eval_samples)
        result = final_evaluation(model, tokenizer, config.compression, sampling, held_out)
    result["recipe"] = config.recipe
    result["steps"] = trainer.state.global_step
    write_atomically(Path(config.output_dir) / EVAL, dumps(result, indent=2))
    print(dumps(result), flush=True)
    return result


def generations(config: TrainConfig, job, data, held_out, num_processes: int) -> list[Generation]:
    """The kinds of rollouts a training run makes (each process: its share of a step's rows), for
    ``check_generations``: the held-out evaluation and the algorithm's own (``job.training_rollouts``: the training
    rollouts, the replayed traces or the teacher's traces generated at start)."""
    held_out_rollouts = Generation(
        "held-out evaluation",
        list(held_out["prompt"]),
        held_out["id"],
        len(held_out) * config.eval_samples,
        config.max_completion_length,
        [config.compression],
        given=list(held_out[GIVEN]) if GIVEN in held_out.column_names else None,
        given_key="eval_data",
    )
    return [held_out_rollouts, job.training_rollouts(data, num_processes)]


def run(config: TrainConfig, config_files: dict[str, str] | None = None) -> dict:
    """Train as configured (``config.algorithm``: grpo or distill, its job object ``ALGORITHMS``: the launcher has no
    branch on it), checkpointing as it goes; returns the final
    evaluation. Everything is checked before any work (``refusing``): models, data, trainer arguments, the
    context and memory the rollouts need, enough prompts for a generation batch, ``output_dir`` (the rule of every
    job's output, ``check_run_folder``: empty, this run's, or overwrite=true, never a model it loads; locked for this
    run, so a second run into it is refused while this one lives). Then
    ``config_files`` (name -> text: the resolved configuration) are written under ``output_dir/hydra``.
    SIGTERM / SIGINT stop training at the next step boundary with a complete checkpoint (``StopOnSignal``),
    raising ``Preempted``."""
    from accelerate import PartialState

    out = Path(config.output_dir)
    job = ALGORITHMS[config.algorithm](config)
    with refusing():
        state = PartialState(cpu=not torch.cuda.is_available())  # several CPU processes talk through gloo
        for name in dict.fromkeys(job.models().values()):
            check_model(name)
        weightless = {name: WeightlessModel(name) for name in dict.fromkeys(job.models().values())}
        job.check_reference_model()
        folder = run_folder(config)
        check_run_folder(folder, held=not state.is_main_process)  # the main process takes the lock
        check_task_contexts(weightless[config.model], {"data": config.data, "eval_data": config.eval_data})
        rewards = job.rewards()
        data = job.training_data()
        if config.lora.enabled:
            check_lora_targets(weightless[config.model], config.lora)
        job.check_data(data, rewards)
        held_out = prompt_dataset(config.eval_data, config.seed, "eval_data")
        # before the folder is made: a refused resume leaves nothing
        checkpoint = resume_checkpoint(folder, config, config.model, config.lora.settings())
        device = "cuda" if torch.cuda.is_available() else "cpu"
        local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        rollouts = generations(config, job, data, held_out, state.num_processes)
        for model in weightless.values():
            check_generations(model, rollouts, dtype_bytes=4, device=device, processes=local)  # weights stay fp32
        lock = lock_output_dir(out, state)
    with lock or contextlib.nullcontext():
        with refusing():
            prepare_output_dir(folder, state, checkpoint)
        if state.is_main_process:
            for name, text in (config_files or {}).items():
                (out / "hydra").mkdir(exist_ok=True)
                write_atomically(out / "hydra" / name, text)
        with StopOnSignal() as stop:
            return train_and_evaluate(config, job, state, rewards, data, held_out, checkpoint, stop)


def train_and_evaluate(
    config: TrainConfig, job, state, rewards: list, data, held_out, checkpoint: str | None, stop: StopOnSignal
) -> dict:
    """The work of ``run`` once everything is checked and the output folder is locked and prepared (``job``: the
    algorithm's job object; ``rewards``: its reward functions, imported among the checks)."""
    out = Path(config.output_dir)
    if state.is_main_process:
        log_console_to(out / TRAIN_LOG)
    finished = checkpoint is not None and checkpoint_step(checkpoint) >= config.max_steps
    if finished and finished_whole(out, state.is_main_process):
        result = read_state(out / EVAL)
        if state.is_main_process:
            print(
                f"{out} holds a finished run ({checkpoint_step(checkpoint)} steps, max_steps={config.max_steps}): "
                "nothing to do. Raise max_steps to train on, or pass overwrite=true to start again.",
                file=sys.stderr,
            )
            print(dumps(result), flush=True)
        return result
    # The trained model keeps fp32 weights (the optimizer's master copy: a bf16 weight would drop updates below
    # 2^-8 of its size, i.e. all of them at RL learning rates); precision=bf16 runs its forwards under bf16
    # autocast (TrainingArguments.bf16), the rollout's included. A frozen teacher is held in the compute dtype.
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    model, tokenizer = load_model(config.model, dtype=torch.float32)
    callbacks = [JsonlLogger(out / METRICS), stop]
    trainer = job.trainer(model, tokenizer, state, callbacks, dtype, data, held_out, rewards)
    trainer.base_model_name, trainer.card_base_model = base_model_name(config.model), card_model_name(config.model)
    trainer.base_weights_note = base_weights_note(config.model)
    if finished:  # trained to the end, but stopped before the final save and evaluation
        trainer._load_from_checkpoint(checkpoint)
        trainer.state.global_step = checkpoint_step(checkpoint)
    else:
        if checkpoint is not None and state.is_main_process:
            print(f"resuming from {checkpoint}", file=sys.stderr)
        trainer.train(resume_from_checkpoint=checkpoint)
        preempted = stop.preempted(out, trainer.state.global_step, trainer.args.device)
        if preempted is not None:
            raise preempted
    return finish(trainer, tokenizer, config, held_out, state.is_main_process)
