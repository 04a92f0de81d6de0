"""Each training algorithm as one job object (``ALGORITHMS[config.algorithm](config)``): the models it loads, its
training data and their checks, the rollouts it makes (for ``check_generations``) and its trainer. The launcher
(``gkv_train.training.launch``) runs any of them the same way, with no branch on the algorithm.

    GRPO: RL-Sparse / RL-Full / Sparse-RL (``CompressedGRPOTrainer``; TRL's ``GRPOTrainer`` with ``use_vllm``)
    Distillation: offline (replayed or generated teacher traces) or on-policy (``CompressedDistillationTrainer``)
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

from trl import GRPOTrainer

from gkv_rollout.config import CompressionConfig
from gkv_train.config.options import rollout_sampling
from gkv_train.config.preflight import Generation
from gkv_train.config.train_config import DistillTrainConfig, GRPOTrainConfig
from gkv_train.evaluation.traces import TRACE_BATCH, generate_traces, load_traces, write_traces
from gkv_train.models import load_model, reload_problem
from gkv_train.problems.data import GIVEN, DataConfig, load_problems
from gkv_train.runs.checkpoints import AtomicCheckpoints
from gkv_train.training.distill import CompressedDistillationTrainer
from gkv_train.training.grpo import CompressedGRPOTrainer
from gkv_train.training.rewards import check_reward, import_callable


def prompt_dataset(data: DataConfig, seed: int, key: str = "data") -> "datasets.Dataset":  # noqa: F821
    """The problems of ``data`` (shuffled with ``seed``) -> rows with ``prompt`` (the problem in the prompt template)
    and ``answer``; errors name the configuration group ``key``."""
    problems = load_problems(data, seed, key)
    return problems.map(lambda row: {"prompt": data.prompt_template.format(problem=row["problem"])})


@cache
def atomic(trainer_class: type) -> type:
    """``trainer_class`` with crash-safe checkpoints (``AtomicCheckpoints``)."""
    return type(trainer_class.__name__, (AtomicCheckpoints, trainer_class), {})


def lora_config(config):
    """PEFT's ``LoraConfig`` of ``config.lora`` (None without LoRA)."""
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


def rollouts(name: str, data, config, samples: int, num_processes: int, key: str = "data") -> Generation:
    """The rollouts a run samples from the prompts of ``data`` (each process: its share of a step's
    ``prompts_per_step`` x ``samples`` rows) under the run's compression."""
    return Generation(
        name,
        list(data["prompt"]),
        data["id"],
        -(-config.prompts_per_step * samples // num_processes),
        config.max_completion_length,
        [config.compression],
        given=list(data[GIVEN]) if GIVEN in data.column_names else None,
        given_key=key,
    )


@dataclasses.dataclass
class GRPO:
    """A GRPO run (``GRPOTrainConfig``): prompts, the reward functions, ``num_generations`` rollouts per prompt."""

    config: GRPOTrainConfig

    def models(self) -> dict[str, str]:
        """The models the run loads, by key."""
        return {"model": self.config.model}

    def kept_input(self) -> str | None:
        """A file inside ``output_dir`` the run reads (none)."""
        return None

    def rewards(self) -> list:
        """The reward functions, imported (an error names the one that fails)."""
        return [import_callable(path) for path in self.config.rewards]

    def training_data(self):
        return prompt_dataset(self.config.data, self.config.seed)

    def check_data(self, data, rewards: list) -> None:
        """Every reward function against the training data's columns, and enough prompts for a generation batch:
        TRL's ``RepeatSampler`` draws whole generation batches of prompts and drops an incomplete one, so fewer
        would train 0 steps and save the untrained model. ValueError naming the numbers and what to change."""
        config = self.config
        columns = [c for c in data.column_names if c not in ("prompt", "completion", "completion_ids")]
        for path, reward in zip(config.rewards, rewards):
            check_reward(path, reward, columns)
        needed = config.generation_batch_size // config.num_generations
        if len(data) < needed:
            raise ValueError(
                f"data: {len(data)} training prompts, fewer than one generation batch takes ({needed}: "
                f"prompts_per_step={config.prompts_per_step} x steps_per_generation={config.steps_per_generation} / "
                f"gradient_accumulation_steps={config.gradient_accumulation_steps}): training would run 0 steps; "
                "give more problems (data.limit) or lower prompts_per_step / steps_per_generation"
            )

    def check_reference_model(self) -> None:
        """TRL builds the reference model (``beta`` > 0, no LoRA) by reloading the policy from its ``name_or_path``;
        ValueError when that is no folder to reload (``reload_problem``: a read-only model cache)."""
        config = self.config
        if config.beta == 0 or config.lora.enabled:
            return
        problem = reload_problem(config.model)
        if problem is not None:
            raise ValueError(
                f"beta={config.beta} needs TRL's reference model, which it loads from the folder of "
                f"model={config.model}, but {problem}: set GKV_TRAIN_CACHE to a writable folder (or train with "
                "beta=0 or lora.enabled=true)"
            )

    def training_rollouts(self, data, num_processes: int) -> Generation:
        return rollouts("training rollouts", data, self.config, self.config.num_generations, num_processes)

    def trainer(self, model, tokenizer, state, callbacks, dtype, data, held_out, rewards: list):
        """The trainer (``rewards``: the reward functions, ``rewards()``); RL-Full through TRL's own vLLM
        generation (validated: full cache only) takes the same arguments."""
        config = self.config
        return atomic(GRPOTrainer if config.use_vllm else CompressedGRPOTrainer)(
            model=model,
            reward_funcs=rewards,
            args=config,
            train_dataset=data,
            eval_dataset=None if config.eval_steps is None else held_out,
            processing_class=tokenizer,
            peft_config=lora_config(config),
            callbacks=callbacks,
        )


@dataclasses.dataclass
class Distillation:
    """A distillation run (``DistillTrainConfig``): offline from teacher traces (a file, or generated at start
    into ``output_dir``) or on-policy (the student samples, the teacher scores)."""

    config: DistillTrainConfig

    @property
    def offline(self) -> bool:
        return self.config.distill.mode == "offline"

    def models(self) -> dict[str, str]:
        """The models the run loads, by key: the student, and the teacher where the run names one."""
        found = {"model": self.config.model, "distill.teacher": self.config.distill.teacher}
        return {key: name for key, name in found.items() if name is not None}

    def kept_input(self) -> str | None:
        """The traces file, which may lie inside ``output_dir``."""
        return self.config.distill.traces

    def rewards(self) -> list:
        return []

    def training_data(self):
        """Prompts (on-policy); offline, the traces file, or the problems to generate teacher traces for."""
        config = self.config
        if not self.offline:
            return prompt_dataset(config.data, config.seed)
        if config.distill.traces is not None:
            return load_traces(config.distill.traces)
        return load_problems(dataclasses.replace(config.data, limit=config.distill.trace_problems), config.seed)

    def check_data(self, data, rewards: list) -> None:
        """Nothing beyond loading: distillation's batches are plain rows, a short last batch still trains."""

    def check_reference_model(self) -> None:
        """No reference model: the teacher is loaded as named (``models``)."""

    def training_rollouts(self, data, num_processes: int) -> Generation:
        """On-policy: the student's rollouts, one per prompt; offline: the replayed traces, or the teacher's traces
        generated at start (full cache)."""
        config = self.config
        if not self.offline:
            return rollouts("training rollouts", data, config, 1, num_processes)
        if config.distill.traces is not None:
            return Generation(
                "replayed traces",
                list(data["prompt"]),
                list(range(len(data))),
                -(-config.prompts_per_step // num_processes),
                [len(c) for c in data["completion_ids"]],
                [config.compression],
                key="the traces' completion lengths",
            )
        return Generation(
            "teacher traces",
            [config.data.prompt_template.format(problem=p) for p in data["problem"]],
            data["id"],
            TRACE_BATCH * config.distill.trace_samples,
            config.max_completion_length,
            [CompressionConfig("full")],
        )

    def trainer(self, model, tokenizer, state, callbacks, dtype, data, held_out, rewards: list):
        """The trainer, its teacher frozen (by default a copy of the initial student) and held in ``dtype``;
        offline without a traces file, the teacher's traces generated first (``offline_traces``)."""
        config = self.config
        teacher = load_model(config.distill.teacher or config.model, dtype=dtype)[0]
        if self.offline and config.distill.traces is None:
            data = self.offline_traces(teacher, tokenizer, state, data)
        peft = lora_config(config)
        if peft is not None:
            from peft import get_peft_model

            model = get_peft_model(model, peft)
        return atomic(CompressedDistillationTrainer)(
            model=model, teacher=teacher, tokenizer=tokenizer, args=config, train_dataset=data, callbacks=callbacks
        )

    def offline_traces(self, teacher, tokenizer, state, problems):
        """Teacher traces of ``problems`` (full cache, correct ones kept), generated into
        ``<output_dir>/traces.jsonl`` (reused on resume)."""
        config = self.config
        path = Path(config.output_dir) / "traces.jsonl"
        if state.is_main_process and not path.is_file():
            sampling = rollout_sampling(config, config.seed, num_samples=config.distill.trace_samples)
            rows = generate_traces(teacher, tokenizer, problems, sampling, config.data.prompt_template)
            if not rows:
                raise RuntimeError(
                    f"the teacher solved none of {len(problems)} problems x {config.distill.trace_samples} samples: "
                    "raise distill.trace_problems / distill.trace_samples, use easier data, or pass "
                    "distill.traces=<file>"
                )
            write_traces(rows, path)
            print(f"wrote {len(rows)} correct teacher traces to {path}", flush=True)
        state.wait_for_everyone()
        return load_traces(str(path))


ALGORITHMS = {"grpo": GRPO, "distill": Distillation}  # config.algorithm -> its job object
