"""The configurations of ``scripts/evaluate.py`` (``EvalConfig``) and ``scripts/generate_traces.py``
(``TracesConfig``), validated when built, before any work; a run's compression identity. No TRL import."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gkv_rollout.config import CompressionConfig, close_option
from gkv_train.config.options import (
    PRECISIONS,
    Sampling,
    check_compile_decode,
    check_sampling_keys,
    check_seed,
    group,
)
from gkv_train.problems.data import DataConfig

TRACE_SOURCES = ("model", "solution")  # where traces come from: the teacher's samples, or the problems' solutions


@dataclass
class TracesConfig(Sampling):
    """One call of ``scripts/generate_traces.py``: full-cache completions of a teacher, checked; the correct ones
    (``keep_incorrect``: all) written as JSONL for offline distillation (``distill.traces``). The sampling keys are
    ``Sampling``'s. With ``source=solution`` the traces are the problems' own solutions instead (a task with a
    ``solution`` column: count_recall), checked, each with the number of its given tokens (``given``).

    model: the teacher: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    data: the problems.
    seed: seeds the sampling.
    keep_incorrect: write wrong completions too.
    source: ``model`` (the teacher's sampled completions) or ``solution`` (the problems' solutions, tokenised with
        the model's tokenizer and ended by its stop token: SFT data for a skill the model lacks).
    output: the traces file (JSONL; a leading ~ is the home folder); refused when another job writes it, and when it
        exists (unless overwrite).
    overwrite: replace an existing output file (a call generates every trace again; traces are not resumed).
    """

    model: str = "smollm2-135m"
    data: DataConfig = group(DataConfig, limit=64)
    seed: int = 0
    keep_incorrect: bool = False
    source: str = "model"
    output: str = "outputs/traces.jsonl"
    overwrite: bool = False

    def __post_init__(self):
        self.output = os.path.expanduser(self.output)  # once, here: every reader sees one path (as training's)
        check_sampling_keys(self, greedy=True)
        check_seed("seed", self.seed)
        self.data.check("data")
        if self.source not in TRACE_SOURCES:
            raise ValueError(f"source must be one of {', '.join(TRACE_SOURCES)}, got {self.source!r}")
        if self.source == "solution" and self.keep_incorrect:
            raise ValueError("keep_incorrect applies to source=model: a solution that fails its check is refused")


# the entries of a run's settings (``EvalConfig.run_settings``) named otherwise than their configuration keys
SETTINGS_KEYS = {
    "sampling.n_samples": "num_generations",
    "sampling.max_new_tokens": "max_completion_length",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.seed": "seed",
}


@dataclass
class EvalConfig(Sampling):
    """One evaluation call of ``scripts/evaluate.py``: a model, a dataset, and one or more compressions, sampled
    as ``Sampling``'s keys say.

    ``methods`` x ``budgets`` (when given) sweep ``compression.method`` and ``compression.budget``; the other
    ``compression.*`` keys apply to every run.

    model: a built-in model (smollm2-135m, tiny), a hub name or a local folder / GGUF file.
    adapter: a LoRA adapter directory (e.g. a train.py output with lora.enabled=true).
    data: the problems.
    compression: the compression (with ``methods`` / ``budgets``: the options every run shares).
    methods: compression methods to sweep (full included as a run); None: compression.method alone.
    budgets: budgets to sweep for every compressing method; None: compression.budget alone.
    batch_problems: problems per rollout batch (x num_generations sequences).
    precision: fp32 or bf16 (forwards under autocast).
    seed: seeds the sampling (each batch's seed follows from it and the batch's index).
    output_dir: the results' folder (evaluate.yaml: outputs/eval/<model>_<data>; a leading ~ is the home folder): a
        new or empty folder, or an evaluation's (its results kept where the settings are the same); never a training
        run's, nor one inside it.
    overwrite: replace earlier results in output_dir made with other settings, or write into a folder holding
        other files (those of the names an evaluation writes replaced).
    plots: write pass_at_1_vs_budget.png and retained_density.png.
    """

    model: str = "smollm2-135m"
    adapter: str | None = None
    data: DataConfig = group(DataConfig, split="test", limit=32)
    compression: CompressionConfig = group(CompressionConfig, method="full")
    methods: list[str] | None = None
    budgets: list[int] | None = None
    batch_problems: int = 4
    precision: str = "fp32"
    seed: int = 0
    output_dir: str = "outputs/eval"
    overwrite: bool = False
    plots: bool = True

    def __post_init__(self):
        # a leading ~ made the home folder once, here, as TrainingArguments does training's output_dir: the output
        # check and the job read one path (`./~/x` stays a folder named ~)
        self.output_dir = os.path.expanduser(self.output_dir)
        check_sampling_keys(self, greedy=True)
        check_seed("seed", self.seed)
        self.data.check("data")
        if self.batch_problems < 1:
            raise ValueError(f"batch_problems must be at least 1, got {self.batch_problems}")
        for key in ("methods", "budgets"):
            given = getattr(self, key)
            if given is not None and not given:
                raise ValueError(f"{key}=[] names no run: give at least one, or leave {key} unset (null)")
            twice = [value for i, value in enumerate(given or []) if value in list(given)[:i]]
            if twice:
                raise ValueError(
                    f"{key}={list(given)} names {twice[0]} twice: each run is evaluated and reported once, give it once"
                )
        if self.budgets is not None and any(b < 1 for b in self.budgets):
            raise ValueError(f"budgets are token counts: each must be at least 1, got {list(self.budgets)}")
        check_compile_decode(self.compile_decode, self.compressions())
        for compression in self.compressions():
            compression.check_generation(self.max_completion_length)
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {PRECISIONS}")

    def run_settings(self, compression: CompressionConfig) -> dict:
        """Everything that determines one run's results: the model's and adapter's weights (``model_identity``),
        the data, the compression, sampling, batching (per-batch seeds), precision. Its fingerprint keys the run's
        folder."""
        from gkv_train.models import model_identity

        return {
            "model": model_identity(self.model),
            "adapter": None if self.adapter is None else model_identity(self.adapter),
            "data": self.data.identity(),
            "compression": compression.identity(),
            # under the names of earlier identities (n_samples, max_new_tokens), so that their results stay valid
            "sampling": dict(
                n_samples=self.num_generations,
                max_new_tokens=self.max_completion_length,
                temperature=self.temperature,
                top_p=self.top_p,
                seed=self.seed,
            ),
            "batch_problems": self.batch_problems,
            "precision": self.precision,
        }

    def warnings(self) -> list[str]:
        """Settings that run but measure less than they seem to: an eviction interval longer than the
        completion, so the budget applies at most once (after the prompt) and never while generating."""
        found = []
        for run in self.compressions():
            if run.kind.rounds and run.resolved.interval > self.max_completion_length:
                found.append(
                    f"{run.method} budget {run.resolved.budget}: compression.interval={run.resolved.interval} exceeds "
                    f"max_completion_length={self.max_completion_length}, so it compresses only after the "
                    "prompt, never while "
                    "generating (the training recipes use interval 16); set compression.interval to compare"
                )
        return found

    def compressions(self) -> list[CompressionConfig]:
        """Every compression to evaluate (validated)."""
        methods = self.methods or [self.compression.method]
        budgets = self.budgets or [self.compression.budget]
        runs = []
        for method in methods:
            for budget in [None] if method == "full" else budgets:
                runs.append(self.compression.for_method(method, budget))
        read = {key for run in runs for key in run.option_names()}
        unread = (
            [key for key in self.compression.unread() if key not in read] if self.compression.method == "full" else []
        )  # (another method's own configuration was checked when it was built)
        if unread:
            hint = close_option(unread[0])
            raise ValueError(f"compression.{unread[0]} applies to none of the runs ({', '.join(methods)}){hint}")
        return runs
