"""Build and run a training job (GRPO: RL-Sparse / RL-Full; distillation) from its validated configuration
(``GRPOTrainConfig`` / ``DistillTrainConfig``: the trainer's arguments themselves)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from functools import cache
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from gkv_rewards.functions import verifier_stats
from gkv_rollout.config import CompressionConfig
from gkv_train.config.options import rollout_sampling
from gkv_train.config.preflight import Generation, check_generations, check_lora_targets, check_task_contexts
from gkv_train.config.train_config import DistillTrainConfig, GRPOTrainConfig, TrainConfig
from gkv_train.console import log_console_to
from gkv_train.evaluation.evaluate import final_evaluation
from gkv_train.evaluation.traces import TRACE_BATCH, generate_traces, load_traces, write_traces
from gkv_train.exits import refusing
from gkv_train.jsonio import dumps, read_state, write_atomically
from gkv_train.models import (
    base_model_name,
    base_weights_note,
    card_model_name,
    check_model,
    load_model,
    reload_problem,
)
from gkv_train.problems.data import GIVEN, DataConfig, load_problems
from gkv_train.runs.checkpoints import (
    EVAL,
    METRICS,
    TRAIN_LOG,
    AtomicCheckpoints,
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
from gkv_train.training.distill import CompressedDistillationTrainer
from gkv_train.training.distributed import generation_model
from gkv_train.training.grpo import CompressedGRPOTrainer
from gkv_train.training.rewards import check_reward, import_callable

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


def prompt_dataset(data: DataConfig, seed: int, key: str = "data") -> "datasets.Dataset":  # noqa: F821
    """The problems of ``data`` (shuffled with ``seed``) -> rows with ``prompt`` (the problem in the prompt template)
    and ``answer``; errors name the configuration group ``key``."""
    problems = load_problems(data, seed, key)
    return problems.map(lambda row: {"prompt": data.prompt_template.format(problem=row["problem"])})


def run_folder(config: TrainConfig) -> RunFolder:
    """The run folder's part of ``config``."""
    traces = config.distill.traces if isinstance(config, DistillTrainConfig) else None
    return RunFolder(
        output_dir=config.output_dir,
        resume=config.resume,
        resume_other_run=config.resume_other_run,
        overwrite=config.overwrite,
        keep=traces,
        resume_model_only=config.resume_model_only,
        models=tuple(models(config).items()),
    )


def check_fills_a_generation_batch(config: TrainConfig, data) -> None:
    """GRPO's sampler (TRL's ``RepeatSampler``) draws whole generation batches of prompts and drops an incomplete one:
    fewer training prompts than one generation batch takes would train 0 steps and save the untrained model.
    ValueError naming the numbers and what to change."""
    if config.algorithm != "grpo":
        return  # distillation's batches are plain rows: a short last batch still trains
    needed = config.generation_batch_size // config.num_generations
    if len(data) < needed:
        raise ValueError(
            f"data: {len(data)} training prompts, fewer than one generation batch takes ({needed}: "
            f"prompts_per_step={config.prompts_per_step} x steps_per_generation={config.steps_per_generation} / "
            f"gradient_accumulation_steps={config.gradient_accumulation_steps}): training would run 0 steps; give "
            "more problems (data.limit) or lower prompts_per_step / steps_per_generation"
        )


@cache
def atomic(trainer_class: type) -> type:
    """``trainer_class`` with crash-safe checkpoints (``AtomicCheckpoints``)."""
    return type(trainer_class.__name__, (AtomicCheckpoints, trainer_class), {})


def lora_config(config: TrainConfig):
    if not config.lora.enabled:
        return None
    from peft import LoraConfig

    lora = config.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
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


def generations(config: TrainConfig, data, held_out, num_processes: int) -> list[Generation]:
    """The kinds of rollouts a training run makes (each process: its share of a step's rows), for
    ``check_generations``: the training rollouts (GRPO, on-policy distillation), the replayed traces (offline
    distillation) or the teacher's traces generated at start, and the held-out evaluation."""
    found = [
        Generation(
            "held-out evaluation",
            list(held_out["prompt"]),
            held_out["id"],
            len(held_out) * config.eval_samples,
            config.max_completion_length,
            [config.compression],
            given=list(held_out[GIVEN]) if GIVEN in held_out.column_names else None,
            given_key="eval_data",
        )
    ]
    per_process = -(-config.prompts_per_step // num_processes)
    if config.algorithm == "grpo" or config.distill.mode == "onpolicy":
        samples = config.num_generations if config.algorithm == "grpo" else 1
        rows = -(-config.prompts_per_step * samples // num_processes)
        found.append(
            Generation(
                "training rollouts",
                list(data["prompt"]),
                data["id"],
                rows,
                config.max_completion_length,
                [config.compression],
                given=list(data[GIVEN]) if GIVEN in data.column_names else None,
            )
        )
    elif config.distill.traces is not None:
        found.append(
            Generation(
                "replayed traces",
                list(data["prompt"]),
                list(range(len(data))),
                per_process,
                [len(c) for c in data["completion_ids"]],
                [config.compression],
                key="the traces' completion lengths",
            )
        )
    else:
        prompts = [config.data.prompt_template.format(problem=p) for p in data["problem"]]
        found.append(
            Generation(
                "teacher traces",
                prompts,
                data["id"],
                TRACE_BATCH * config.distill.trace_samples,
                config.max_completion_length,
                [CompressionConfig("full")],
            )
        )
    return found


def models(config: TrainConfig) -> dict[str, str]:
    """The models a run loads, by key: the trained one (``model``), and a distillation's teacher where it names one
    (``distill.teacher``)."""
    teacher = config.distill.teacher if isinstance(config, DistillTrainConfig) else None
    return {key: name for key, name in (("model", config.model), ("distill.teacher", teacher)) if name is not None}


def check_reference_model(config: TrainConfig) -> None:
    """TRL builds a GRPO run's reference model (``beta`` > 0, no LoRA) by reloading the policy from its
    ``name_or_path``; ValueError when that is no folder to reload (``reload_problem``: a read-only model cache)."""
    if config.algorithm != "grpo" or config.beta == 0 or config.lora.enabled:
        return
    problem = reload_problem(config.model)
    if problem is not None:
        raise ValueError(
            f"beta={config.beta} needs TRL's reference model, which it loads from the folder of model={config.model}, "
            f"but {problem}: set GKV_TRAIN_CACHE to a writable folder (or train with beta=0 or lora.enabled=true)"
        )


def run(config: TrainConfig, config_files: dict[str, str] | None = None) -> dict:
    """Train as configured (``config.algorithm``: grpo or distill), checkpointing as it goes; returns the final
    evaluation. Everything is checked before any work (``refusing``): models, data, trainer arguments, the
    context and memory the rollouts need, enough prompts for a generation batch, ``output_dir`` (the rule of every
    job's output, ``check_run_folder``: empty, this run's, or overwrite=true, never a model it loads; locked for this
    run, so a second run into it is refused while this one lives). Then
    ``config_files`` (name -> text: the resolved configuration) are written under ``output_dir/hydra``.
    SIGTERM / SIGINT stop training at the next step boundary with a complete checkpoint (``StopOnSignal``),
    raising ``Preempted``."""
    from accelerate import PartialState

    out = Path(config.output_dir)
    with refusing():
        state = PartialState(cpu=not torch.cuda.is_available())  # several CPU processes talk through gloo
        for name in dict.fromkeys(models(config).values()):
            check_model(name)
        check_reference_model(config)
        folder = run_folder(config)
        check_run_folder(folder, held=not state.is_main_process)  # the main process takes the lock
        check_task_contexts(config.model, {"data": config.data, "eval_data": config.eval_data})
        rewards = [import_callable(path) for path in config.rewards] if config.algorithm == "grpo" else []
        data = training_data(config)
        columns = [c for c in data.column_names if c not in ("prompt", "completion", "completion_ids")]
        for path, reward in zip(config.rewards if rewards else [], rewards):
            check_reward(path, reward, columns)
        if config.lora.enabled:
            check_lora_targets(config.model, config.lora)
        check_fills_a_generation_batch(config, data)
        held_out = prompt_dataset(config.eval_data, config.seed, "eval_data")
        # before the folder is made: a refused resume leaves nothing
        checkpoint = resume_checkpoint(folder, config, config.model, config.lora.settings())
        device = "cuda" if torch.cuda.is_available() else "cpu"
        local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        rollouts = generations(config, data, held_out, state.num_processes)
        for name in dict.fromkeys(models(config).values()):
            check_generations(name, rollouts, dtype_bytes=4, device=device, processes=local)  # weights stay fp32
        lock = lock_output_dir(out, state)
    with lock or contextlib.nullcontext():
        with refusing():
            prepare_output_dir(folder, state, checkpoint)
        if state.is_main_process:
            for name, text in (config_files or {}).items():
                (out / "hydra").mkdir(exist_ok=True)
                write_atomically(out / "hydra" / name, text)
        with StopOnSignal() as stop:
            return train_and_evaluate(config, state, rewards, data, held_out, checkpoint, stop)


def train_and_evaluate(
    config: TrainConfig, state, rewards: list, data, held_out, checkpoint: str | None, stop: StopOnSignal
) -> dict:
    """The work of ``run`` once everything is checked and the output folder is locked and prepared (``rewards``:
    the reward functions of a GRPO run, imported among the checks)."""
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
    if config.algorithm == "distill":
        trainer = distill_trainer(config, model, tokenizer, state, callbacks, dtype, data)
    else:
        trainer = grpo_trainer(config, model, tokenizer, rewards, callbacks, data, held_out)
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


def training_data(config: TrainConfig):
    """What the trainer learns from, loaded (and so checked) before any work: prompts; for offline distillation
    the traces file, or the problems to generate teacher traces for."""
    if config.algorithm == "distill" and config.distill.mode == "offline":
        if config.distill.traces is not None:
            return load_traces(config.distill.traces)
        return load_problems(dataclasses.replace(config.data, limit=config.distill.trace_problems), config.seed)
    return prompt_dataset(config.data, config.seed)


def grpo_trainer(config: GRPOTrainConfig, model, tokenizer, rewards: list, callbacks, data, held_out):
    """The GRPO trainer of ``config``, its arguments (``rewards``: the reward functions, ``import_callable`` of
    ``config.rewards``)."""
    common = dict(
        model=model,
        reward_funcs=rewards,
        args=config,
        train_dataset=data,
        eval_dataset=None if config.eval_steps is None else held_out,
        processing_class=tokenizer,
        peft_config=lora_config(config),
        callbacks=callbacks,
    )
    # RL-Full through TRL's own vLLM generation (validated: full cache only) takes the same arguments
    return atomic(GRPOTrainer if config.use_vllm else CompressedGRPOTrainer)(**common)


def distill_trainer(config: DistillTrainConfig, model, tokenizer, state, callbacks, dtype, data):
    """The distillation trainer of ``config``, its arguments."""
    # the teacher is frozen; by default a copy of the initial student
    teacher = load_model(config.distill.teacher or config.model, dtype=dtype)[0]
    if config.distill.mode == "offline" and config.distill.traces is None:
        data = offline_traces(config, teacher, tokenizer, state, data)
    peft = lora_config(config)
    if peft is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft)
    return atomic(CompressedDistillationTrainer)(
        model=model,
        teacher=teacher,
        tokenizer=tokenizer,
        args=config,
        train_dataset=data,
        callbacks=callbacks,
    )


def offline_traces(config: TrainConfig, teacher, tokenizer, state, problems):
    """Teacher traces of ``problems`` (full cache, correct ones kept), generated into
    ``<output_dir>/traces.jsonl`` (reused on resume)."""
    path = Path(config.output_dir) / "traces.jsonl"
    if state.is_main_process and not path.is_file():
        sampling = rollout_sampling(config, config.seed, num_samples=config.distill.trace_samples)
        rows = generate_traces(teacher, tokenizer, problems, sampling, config.data.prompt_template)
        if not rows:
            raise RuntimeError(
                f"the teacher solved none of {len(problems)} problems x {config.distill.trace_samples} samples: "
                "raise distill.trace_problems / distill.trace_samples, use easier data, or pass distill.traces=<file>"
            )
        write_traces(rows, path)
        print(f"wrote {len(rows)} correct teacher traces to {path}", flush=True)
    state.wait_for_everyone()
    return load_traces(str(path))
