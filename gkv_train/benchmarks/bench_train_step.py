"""One training step, side by side: plain TRL ``GRPOTrainer``, ``rl_full``, ``rl_sparse`` and on-policy
distillation at identical settings, each step split into generation, log-prob forwards, backward, optimizer
and the rest; one JSON line.

Every trainer is built the way ``train.py`` builds it (the recipe's configuration with the overrides below),
on the same model, prompts, rows per step (``--rows``: GRPO 1 prompt x that many samples; distillation that many
prompts x 1; 8 by default), new tokens, loss, learning rate and activation checkpointing
(``--gradient-checkpointing``; off by default); plain TRL gets the same ``GRPOConfig`` and prompts
(as chat messages, so the same chat template applies) and generates with ``transformers``' ``generate`` (full
cache). Every completion runs to ``--max-new-tokens`` (stop tokens are never sampled: TRL's ``min_new_tokens``,
the engine's ``ignore_eos``), so every trainer does the same work. ``--steps`` steps are timed after
``--warmup`` untimed ones. Each trainer runs in a process of its own, so none inherits the heap another left:
on CPU the log-prob forward and the backward spend much of their time faulting in fresh memory (TRL's LM head
writes [rows x length, vocab] float32 logits, hundreds of MB per temporary), and how much depends on what the
process allocated and freed before (here the first trainer of a shared process took 1.6-1.9x the page faults of
the second in its log-prob forward, whichever trainer it was). ``minor_faults`` gives each phase's page faults per
step, a count that does not depend on the machine's load.

    python scripts/bench_train_step.py                       # SmolLM2-135M, 1 x 8 x 128, 2 timed steps
    python scripts/bench_train_step.py --model tiny --max-new-tokens 16 --steps 1 --warmup 0   # quick
    python scripts/bench_train_step.py --trainers trl rl_sparse rl_sparse+compile   # compile_decode=true too

A trainer name ending in ``+compile`` runs with ``compile_decode=true``; its warm-up step pays the compile
(``warmup_total``, reported for every trainer).

Phases: ``generation`` (TRL's ``_generate``, which calls the rollout engine for the project's trainers; the
distillation rollout), ``logprob_forward`` (every log-prob forward: old / reference ones without gradients and
the loss's with them; for distillation the teacher's and the student's forward with its KL), ``backward``
(``accelerator.backward``), ``optimizer`` (clipping excluded: from the optimizer step's start to its end) and
``other`` (the rest of the step: rewards, advantages, data).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import resource
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from transformers import TrainerCallback

from gkv_train.argument_types import count, natural, output_file
from gkv_train.config.preflight import status_bytes
from gkv_train.jsonio import dumps, print_json
from gkv_train.provenance import origin, provenance

PHASES = ("generation", "logprob_forward", "backward", "optimizer", "other")


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step and of its phases (phase timers add into ``current``), the minor page
    faults of each timed phase (``faults``), and which phase raised the process's peak resident memory to what
    (``raised``: phase -> the peak in bytes when one of its calls ended above the peak before it; Linux's
    ``VmHWM``, never reset, so the process's own peak stays whole)."""

    def __init__(self):
        self.steps: list[dict] = []
        self.current: dict = defaultdict(float)
        self.faults: dict = defaultdict(int)
        self.raised: dict = {}
        self._step_start = self._opt_start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.current, self.faults = defaultdict(float), defaultdict(int)
        self._step_start = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._opt_start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.current["optimizer"] += time.perf_counter() - self._opt_start

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self._step_start
        step = {phase: self.current[phase] for phase in PHASES[:-1]}
        step["other"] = total - sum(step.values())
        step["total"] = total
        step["minor_faults"] = dict(self.faults)
        self.steps.append(step)

    def timed(self, phase: str, function):
        """``function`` with its time added to ``phase`` (timed functions must not call one another)."""

        def wrapper(*args, **kwargs):
            start, peak, faults = time.perf_counter(), status_bytes("VmHWM"), minor_faults()
            try:
                return function(*args, **kwargs)
            finally:
                self.current[phase] += time.perf_counter() - start
                self.faults[phase] += minor_faults() - faults
                now = status_bytes("VmHWM")
                if now is not None and peak is not None and now > peak:
                    self.raised[phase] = max(self.raised.get(phase, 0), now)

        return wrapper


def minor_faults() -> int:
    """Minor page faults of this process so far (each a page of fresh memory first written)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def configuration(recipe: str, args, output_dir: Path, compile_decode: bool = False):
    """The recipe's configuration (the trainer's arguments) as ``train.py`` resolves it, with the benchmark's
    settings."""
    from gkv_train.config.compose import configure

    distill = recipe.startswith("distill")
    rows = f"prompts_per_step={args.rows if distill else 1}"
    samples = [] if distill else [f"num_generations={args.rows}"]  # a GRPO option: distillation samples one
    overrides = [
        f"recipe={recipe}",
        f"model={args.model}",
        rows,
        *samples,
        f"max_completion_length={args.max_new_tokens}",
        f"max_steps={args.warmup + args.steps}",
        f"gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        "save_steps=100000",
        "eval_steps=null",
        f"output_dir={output_dir}",
        "report_to=[]",
        f"compression.budget={args.budget}",
        f"compression.window={args.window}",
        f"compression.interval={args.interval}",
        "data.limit=64",
    ]
    if recipe.startswith("distill"):
        overrides.append("distill.mode=onpolicy")
    if compile_decode:
        overrides.append("compile_decode=true")
    return configure("train", overrides)[0]


def time_trainer(name: str, args, workdir: Path) -> dict:
    from accelerate import PartialState
    from trl import GRPOTrainer

    from gkv_rollout.config import SamplingConfig
    from gkv_train.config import options
    from gkv_train.models import load_model
    from gkv_train.training import grpo
    from gkv_train.training.algorithms import ALGORITHMS

    base, _, variant = name.partition("+")
    if variant not in ("", "compile") or (variant and base == "trl"):
        raise ValueError(f"unknown trainer {name!r}: trl, rl_full, rl_sparse or distill, the last three with +compile")
    recipe = {"trl": "rl_full", "distill": "distill_onpolicy"}.get(base, base)
    config = configuration(recipe, args, workdir / name.replace("+", "_"), compile_decode=variant == "compile")
    name = base
    state = PartialState(cpu=not torch.cuda.is_available())
    job = ALGORITHMS[config.algorithm](config)
    data = job.training_data()
    model, tokenizer = load_model(config.model, dtype=torch.float32)
    timer = StepTimer()
    rewards = job.rewards()
    # Every completion runs to max_new_tokens (stop tokens are never sampled), so all trainers do the same work.
    if name == "trl":
        if tokenizer.chat_template:  # the chat template, as the engine applies it
            data = data.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=rewards,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.generation_config.min_new_tokens = args.max_new_tokens
        trainer._generate = timer.timed("generation", trainer._generate)
    elif name == "distill":
        trainer = job.trainer(model, tokenizer, state, [timer], torch.float32, data, None, rewards)
        options.SamplingConfig = functools.partial(SamplingConfig, ignore_eos=True)  # what its rollout samples with
        trainer._rollout = timer.timed("generation", trainer._rollout)
        trainer._student_loss = timer.timed("logprob_forward", trainer._student_loss)
    else:
        trainer = job.trainer(model, tokenizer, state, [timer], torch.float32, data, None, rewards)
        grpo.SamplingConfig = functools.partial(SamplingConfig, ignore_eos=True)  # what its rollout samples with
        trainer._generate = timer.timed("generation", trainer._generate)
    if name != "distill":
        forward = trainer._get_per_token_logps_and_entropies
        trainer._get_per_token_logps_and_entropies = timer.timed("logprob_forward", forward)
    trainer.accelerator.backward = timer.timed("backward", trainer.accelerator.backward)
    try:
        trainer.train()
    finally:
        grpo.SamplingConfig = options.SamplingConfig = SamplingConfig
    timed = timer.steps[args.warmup :]
    result = {k: round(sum(s[k] for s in timed) / len(timed), 3) for k in (*PHASES, "total")}
    lengths = [r["completions/mean_length"] for r in trainer.state.log_history if "completions/mean_length" in r]
    phases = dict.fromkeys(p for s in timed for p in s["minor_faults"])
    return result | {
        "steps": len(timed),
        "minor_faults": {p: round(sum(s["minor_faults"].get(p, 0) for s in timed) / len(timed)) for p in phases},
        "mean_completion_length": sum(lengths) / max(len(lengths), 1),
        "warmup_total": round(sum(s["total"] for s in timer.steps[: args.warmup]), 3),
        "peak_raised_by": timer.raised,
    }


def seeded_trainer(name: str, args, workdir: Path) -> dict:
    torch.manual_seed(0)
    return time_trainer(name, args, workdir)


def in_own_process(name: str, args, workdir: Path) -> dict:
    """``time_trainer`` in a fresh (spawned) process: no trainer inherits another's heap."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(seeded_trainer, name, args, workdir).result()


NAMES = {
    "trl": "plain TRL `GRPOTrainer` (HF `generate`)",
    "distill": "on-policy distillation (forwards: teacher + student)",
}


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s view ``steps``: seconds per step of every trainer by phase, the ratio to
    TRL's step and the warm-up, with where the figures came from."""
    if view != "steps":
        raise SystemExit(f"error: bench_train_step has the view steps, not {view!r}")
    phases = ("generation", "logprob_forward", "backward", "optimizer", "other", "total")
    lines = [
        f"| seconds per step | generation | log-prob forwards | backward | optimizer | other | total | vs TRL | "
        f"warm-up ({result.get('warmup', '?')} steps) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, t in result["trainers"].items():
        label = NAMES.get(name) or f"`{name.removesuffix('+compile')}`" + (
            ", compiled decode" if name.endswith("+compile") else ""
        )
        ratio = result.get("step_time_vs_trl", {}).get(name)
        lines.append(
            f"| {label} | "
            + " | ".join(f"{t[p]:.2f}" if t[p] < 0.1 else f"{t[p]:.1f}" for p in phases)
            + f" | {'-' if ratio is None else f'{ratio:.2f}x'} | {t['warmup_total']:.1f} |"
        )
    return "\n".join(lines) + f"\n\n{provenance(result)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=count, default=128)
    parser.add_argument("--budget", type=count, default=64, help="rl_sparse / distillation: gkv budget")
    parser.add_argument("--window", type=count, default=8)
    parser.add_argument("--interval", type=count, default=16)
    parser.add_argument("--steps", type=count, default=2, help="timed steps")
    parser.add_argument("--warmup", type=natural, default=1, help="untimed steps first")
    parser.add_argument("--trainers", nargs="+", default=["trl", "rl_full", "rl_sparse", "distill"])
    parser.add_argument("--rows", type=count, default=8, help="rows per step (GRPO: samples of one prompt)")
    parser.add_argument(
        "--gradient-checkpointing", action="store_true", help="recompute each layer in the backward (memory for time)"
    )
    parser.add_argument("--output", type=output_file, default=None, help="also write the JSON line here")
    args = parser.parse_args()

    result = {
        "benchmark": "train_step",
        "model": args.model,
        "rows": args.rows,
        "gradient_checkpointing": args.gradient_checkpointing,
        "max_new_tokens": args.max_new_tokens,
        "compression": f"gkv budget {args.budget} window {args.window} interval {args.interval}",
        "threads": torch.get_num_threads(),
        "warmup": args.warmup,
        "trainers": {},
        **origin(),
    }
    with tempfile.TemporaryDirectory(dir="outputs" if Path("outputs").is_dir() else None) as workdir:
        for name in args.trainers:
            result["trainers"][name] = in_own_process(name, args, Path(workdir))
    if "trl" in result["trainers"]:
        base = result["trainers"]["trl"]["total"]
        result["step_time_vs_trl"] = {n: round(t["total"] / base, 3) for n, t in result["trainers"].items()}
    if args.output is not None:
        args.output.write_text(dumps(result) + "\n")
    print_json(result)


if __name__ == "__main__":
    main()
