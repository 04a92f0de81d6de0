"""Configuration cases: keys, values and combinations through the real entry points."""

from __future__ import annotations

from pathlib import Path

from faults.harness import (
    Verdict,
    judge_refusal,
    lm_eval_command,
    Case,
    Context,
    either,
    read_jsonl,
    refuse,
)





def config_cases() -> list[Case]:
    L, C, N = "listed", "control", "new"
    K = "configuration"
    gone = ["{work}/out"]
    cases = [
        refuse("configuration/train-max_grad_norm-negative", K, L, "max_grad_norm=-1 accepted", "train",
               {"max_grad_norm": -1}, ["max_grad_norm"]),
        refuse("configuration/train-beta-negative", K, L, "beta=-0.1 (a negative KL weight) accepted", "train",
               {"beta": -0.1}, ["beta"]),
        refuse("configuration/train-epsilon-negative", K, L, "epsilon=-0.2 (a negative clip range) accepted", "train",
               {"epsilon": -0.2}, ["epsilon"]),
        refuse("configuration/train-grad-accum-zero", K, L, "gradient_accumulation_steps=0: ZeroDivisionError",
               "train", {"gradient_accumulation_steps": 0}, ["gradient_accumulation_steps"]),
        refuse("configuration/train-lora-r-zero", K, L, "lora.r=0 fails only after the model loads", "train",
               {"lora.enabled": True, "lora.r": 0}, [r"lora|\br\b"]),
        refuse("configuration/train-learning-rate-negative", K, L, "learning_rate=-1 fails only after the model loads",
               "train", {"learning_rate": -1}, [r"learning.rate"]),
        refuse("configuration/train-max-new-tokens-huge", K, L, "sampling.max_new_tokens=1000000000: a huge allocation after "
               "the model loads", "train", {"sampling.max_new_tokens": 1_000_000_000}, ["max_new_tokens"], before_load=False),
        either("configuration/train-rl_full-s4r", K, L, "recipe=rl_full compression.method=s4r: compressed rollouts "
               "trained without their record", "train", {"recipe": "rl_full", "compression.method": "s4r",
                                                           "max_steps": 2},
               [r"s4r|record|rl_full|compression"], lambda ctx, proc: mismatch_problem(ctx)),
        refuse("configuration/train-eval-limit-zero", K, N, "eval_data.limit=0 (read as 256 held-out problems)",
               "train", {"eval_data.limit": 0}, ["limit"]),
        refuse("configuration/train-eval-samples-zero", K, N, "eval_samples=0", "train", {"eval_samples": 0},
               ["eval_samples"]),
        refuse("configuration/train-warmup-negative", K, N, "warmup_steps=-1", "train", {"warmup_steps": -1},
               ["warmup"]),
        refuse("configuration/train-reward-missing", K, N, "rewards=[no.such.reward] (imported after the model "
               "loads)", "train", {"rewards": ["no.such.reward"]}, ["reward"]),
        refuse("configuration/train-lora-dropout", K, N, "lora.dropout=1.5", "train",
               {"lora.enabled": True, "lora.dropout": 1.5}, ["dropout"]),
        refuse("configuration/train-prompt-template-field", K, N, "data.prompt_template with an unknown field {foo}",
               "train", {"data.prompt_template": "'Q: {foo}'"}, ["template"]),
        refuse("configuration/train-output-dir-is-file", K, N, "output_dir names an existing file", "train",
               {"output_dir": "{work}/afile"}, ["afile"], setup=lambda ctx: (ctx.work / "afile").write_text("x\n")),
        refuse("configuration/train-temperature-zero", K, C, "sampling.temperature=0 in training (validated)", "train",
               {"sampling.temperature": 0}, ["temperature"]),
        refuse("configuration/train-temperature-nan", K, C, "sampling.temperature=nan", "train", {"sampling.temperature": "nan"},
               ["temperature"]),
        refuse("configuration/train-top-p", K, C, "sampling.top_p=1.5", "train", {"sampling.top_p": 1.5}, ["top_p"]),
        refuse("configuration/train-num-generations-one", K, C, "sampling.num_generations=1 under GRPO", "train",
               {"sampling.num_generations": 1}, ["num_generations"]),
        refuse("configuration/train-max-steps-zero", K, C, "max_steps=0", "train", {"max_steps": 0}, ["max_steps"]),
        refuse("configuration/train-save-steps-zero", K, C, "save_steps=0", "train", {"save_steps": 0}, ["save_steps"]),
        refuse("configuration/train-prompts-per-step-zero", K, C, "prompts_per_step=0", "train",
               {"prompts_per_step": 0}, ["prompts_per_step"]),
        refuse("configuration/train-unknown-key", K, C, "a misspelled key num_generation=2 (did you mean)", "train",
               {"num_generation": 2}, ["num_generation", "num_generations"]),
        refuse("configuration/train-wrong-type", K, C, "max_steps=abc", "train", {"max_steps": "abc"}, ["max_steps"]),
        refuse("configuration/train-loss-type", K, C, "loss_type=foo", "train", {"loss_type": "foo"}, ["loss_type"]),
        refuse("configuration/train-precision", K, C, "precision=fp16", "train", {"precision": "fp16"}, ["precision"]),
        refuse("configuration/train-method-unknown", K, C, "compression.method=foo", "train",
               {"compression.method": "foo"}, ["foo"]),
        refuse("configuration/train-budget-below-window", K, C, "compression.budget=4 with window 8", "train",
               {"compression.budget": 4}, ["budget"]),
        refuse("configuration/train-model-missing", K, C, "model=./no/such/model", "train",
               {"model": "./no/such/model"}, ["no/such/model"]),
        refuse("configuration/train-tracker-unknown", K, C, "report_to=[nosuchtracker]", "train",
               {"report_to": ["nosuchtracker"]}, ["nosuchtracker"]),
        refuse("configuration/train-derived-field", K, C, "per_device_train_batch_size=4 (derived here)", "train",
               {"per_device_train_batch_size": 4}, ["prompts_per_step"]),
        refuse("configuration/train-trl-duplicate", K, C, "trl.learning_rate=1 (the old prefix of TRL's fields)",
               "train", {"trl.learning_rate": 1}, ["learning_rate"]),
        refuse("configuration/train-moved-key", K, C, "max_new_tokens=8 (now sampling.max_new_tokens)", "train",
               {"max_new_tokens": 8}, ["sampling.max_new_tokens"]),
        refuse("configuration/train-resume-and-overwrite", K, C, "resume=last overwrite=true", "train",
               {"resume": "last", "overwrite": True}, ["overwrite", "resume"]),
        refuse("configuration/train-levels", K, C, "data.levels=[7]", "train", {"data.levels": [7]}, ["level"]),
        refuse("configuration/train-rollout-is", K, C, "rl.rollout_is=foo", "train", {"rl.rollout_is": "foo"},
               ["rollout_is"]),
        refuse("configuration/train-compile-s4r", K, C, "sampling.compile_decode=true with s4r", "train",
               {"sampling.compile_decode": True, "compression.method": "s4r"}, ["compile_decode"]),
        refuse("configuration/train-reward-weights", K, C, "two reward_weights for one reward", "train",
               {"reward_weights": [1, 2]}, ["reward_weights"]),
        refuse("configuration/eval-budgets-zero", K, L, "budgets=[0] runs at 2048", "evaluate",
               {"methods": ["gkv"], "budgets": [0]}, ["budget"]),
        refuse("configuration/eval-limit-zero", K, L, "data.limit=0 becomes 256 problems", "evaluate",
               {"data.limit": 0}, ["limit"]),
        refuse("configuration/eval-max-new-tokens-huge", K, L, "sampling.max_new_tokens=1000000000: a huge allocation after "
               "the model loads", "evaluate", {"sampling.max_new_tokens": 1_000_000_000}, ["max_new_tokens"],
               before_load=False),
        refuse("configuration/eval-budgets-negative", K, N, "budgets=[-5]", "evaluate",
               {"methods": ["gkv"], "budgets": [-5]}, ["budget"]),
        refuse("configuration/eval-num-generations-zero", K, C, "sampling.num_generations=0", "evaluate",
               {"sampling.num_generations": 0}, ["num_generations"]),
        refuse("configuration/eval-temperature-negative", K, C, "sampling.temperature=-1", "evaluate", {"sampling.temperature": -1},
               ["temperature"]),
        refuse("configuration/eval-method-unknown", K, C, "methods=[nosuch]", "evaluate", {"methods": ["nosuch"]},
               ["nosuch"]),
        refuse("configuration/eval-batch-problems-zero", K, C, "batch_problems=0", "evaluate", {"batch_problems": 0},
               ["batch_problems"]),
        refuse("configuration/eval-precision", K, C, "precision=fp8", "evaluate", {"precision": "fp8"}, ["precision"]),
        refuse("configuration/eval-unknown-key", K, C, "a misspelled key n_sample=2", "evaluate", {"n_sample": 2},
               ["n_sample"]),
        refuse("configuration/eval-adapter-missing", K, C, "adapter=./no/adapter", "evaluate",
               {"adapter": "./no/adapter"}, ["no/adapter"]),
        refuse("configuration/traces-output-is-directory", K, L, "output=<a directory> fails only after the model "
               "loads (and after generating)", "traces", {"output": "{work}/adir"}, ["adir"],
               setup=lambda ctx: (ctx.work / "adir").mkdir()),
        refuse("configuration/traces-max-new-tokens-huge", K, L, "sampling.max_new_tokens=1000000000 in traces", "traces",
               {"sampling.max_new_tokens": 1_000_000_000}, ["max_new_tokens"], before_load=False),
        refuse("configuration/traces-num-generations-zero", K, C, "sampling.num_generations=0", "traces",
               {"sampling.num_generations": 0}, ["num_generations"]),
        refuse("configuration/traces-top-p-zero", K, C, "sampling.top_p=0", "traces", {"sampling.top_p": 0}, ["top_p"]),
        refuse("configuration/train-output-before-validation", K, L, "the output folder is created before validation "
               "(temperature=0)", "train", {"sampling.temperature": 0}, ["temperature"], must_not_exist=gone),
        refuse("configuration/eval-output-before-validation", K, L, "the output folder is created before validation "
               "(num_generations=0)", "evaluate", {"sampling.num_generations": 0}, ["num_generations"], must_not_exist=gone),
    ]
    R = "round3"
    s4r_eval = {"sampling.max_new_tokens": 8, "compression.method": "s4r"}
    cases += [
        refuse("configuration/s4r-refresh-beyond-generation", K, R, "compression.s4r.refresh=1000000 on an 8-token "
               "generation: exit 0 with memory_share 8064.7 reported", "evaluate",
               {**s4r_eval, "compression.s4r.refresh": 1000000}, ["refresh"], must_not_exist=gone),
        refuse("configuration/s4r-refresh-64-on-8", K, R, "compression.s4r.refresh=64 on an 8-token generation: no "
               "refresh happens, the memory triples", "evaluate", {**s4r_eval, "compression.s4r.refresh": 64},
               ["refresh"], must_not_exist=gone),
        refuse("configuration/s4r-refresh-1e8", K, R, "compression.s4r.refresh=1e8: a 51 GB allocation after the "
               "model loads", "evaluate", {**s4r_eval, "compression.s4r.refresh": 100000000}, ["refresh"],
               must_not_exist=gone),
        refuse("configuration/train-num_iterations-0", K, R, "num_iterations=0: 0 steps trained, exit 0, the untrained "
               "model saved as the run", "train", {"num_iterations": 0}, ["num_iterations"], must_not_exist=gone),
        refuse("configuration/train-steps_per_generation-0", K, R, "steps_per_generation=0: a traceback after the "
               "model loads", "train", {"steps_per_generation": 0}, ["steps_per_generation"], must_not_exist=gone),
        refuse("configuration/train-scale_rewards-bogus", K, R, "scale_rewards=bogus: a traceback after the model "
               "loads", "train", {"scale_rewards": "bogus"}, ["scale_rewards"], must_not_exist=gone),
        refuse("configuration/train-push_to_hub-offline", K, R, "push_to_hub=true with HF_HUB_OFFLINE=1: a traceback "
               "after the model loads", "train", {"push_to_hub": True}, ["push_to_hub"], must_not_exist=gone),
        refuse("configuration/evaluate-abstract-method", K, R, "compression.method=gkv_rollout.methods:EvictionMethod "
               "(the abstract base): a bare NotImplementedError after the model loads", "evaluate",
               {"compression.method": "gkv_rollout.methods:EvictionMethod", "compression.budget": 64,
                "sampling.max_new_tokens": 24}, ["score"], must_not_exist=gone),
    ]
    for name, args, names, about in [
        ("typo", "budgte=64", ["budgte"], "a typo budgte=64: dropped, recorded in the results as if applied"),
        ("alpha-with-s4r", "method=s4r,alpha=0.5", ["alpha"], "alpha=0.5 with s4r (an option it does not read): dropped"),
        ("alpha-5", "method=gkv,alpha=5", ["alpha"], "alpha=5 (out of range, and unreachable): dropped"),
        ("dtype", "dtype=bfloat16", ["dtype"], "dtype=bfloat16 (HF's name; here precision): dropped"),
        ("method-foo", "method=foo", ["foo"], "method=foo: a traceback after the model loads"),
        ("budget-0", "method=gkv,budget=0", ["budget"], "budget=0: a traceback after the model loads"),
        ("budget-abc", "method=gkv,budget=abc", ["budget"], "budget=abc: a traceback after the model loads"),
        ("window-over-budget", "method=gkv,budget=16,window=32", ["window|budget"], "window > budget: a traceback "
         "after the model loads"),
        ("interval-0", "method=gkv,interval=0", ["interval"], "interval=0: a traceback after the model loads"),
        ("eta-negative", "method=s4r,eta=-1", ["eta"], "eta=-1: a traceback after the model loads"),
        ("unknown-model", "pretrained=no-such-model", ["no-such-model"], "an unknown model name: a traceback"),
    ]:
        cases.append(Case(f"configuration/lm-eval-{name}", K, R, f"gkv-train lm-eval --model_args {args}: {about}",
                          lm_eval_refusal(f"pretrained=tiny,{args}" if "pretrained" not in args else args, names), 180))
    return cases


def lm_eval_refusal(model_args: str, names: list[str]):
    """``gkv-train lm-eval`` with ``model_args``: a clear refusal naming ``names``, before the model loads, nothing
    written."""

    def run(ctx: Context) -> Verdict:
        proc = ctx.run(lm_eval_command(ctx, model_args), 180, env={"HF_DATASETS_OFFLINE": "1"})
        return judge_refusal(proc, names, before_load=True, must_not_exist=[ctx.work / "out"])

    return run


def mismatch_problem(ctx: Context) -> str | None:
    """None when every training step of ``{work}/out`` logged a rollout-trainer mismatch below 1e-3."""
    records = [r for r in read_jsonl(Path(ctx.path("{work}/out")) / "metrics.jsonl") if "loss" in r]
    values = [r.get("mismatch/mean_abs") for r in records]
    if not records or any(v is None for v in values):
        return "no mismatch logged"
    worst = max(values)
    return f"trained without the rollout's record: mismatch/mean_abs {worst:.3g}" if worst > 1e-3 else None
