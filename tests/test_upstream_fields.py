"""Issue 64's configuration cases: TRL's, transformers' and PEFT's own fields, the recipe a run records, Hydra's flags
and keys, checked when the configuration is built, before any model loads (``gkv_train.config.upstream``,
``options.check_recipe``, ``compose``, ``preflight.check_lora_targets``), through train.py; and the controls: the
values these libraries honour still run."""

import inspect
import json
import os
from pathlib import Path

import pytest
import torch
from entry_points import run_each

ROOT = Path(__file__).resolve().parents[1]
# command line -> what its one `error:` line says ({tmp}: the cases' folder)
REFUSED = [
    # issue 64, 7: accepted and ignored, or out of range and accepted
    ("num_train_epochs=2", "num_train_epochs=2 is not honoured here: a run's length is max_steps"),
    ("resume_from_checkpoint={tmp}/x", "is not honoured here: transformers leaves it to training scripts (its Trainer"),
    ("hydra.run.dir={tmp}/h", "hydra.run.dir: Hydra's job settings do not apply here"),
    ("trust_remote_code=true", "trust_remote_code=true is not honoured here: the model is loaded by this project"),
    ("model_init_kwargs={dtype:float32}", "model_init_kwargs={dtype:float32} is not honoured here"),
    ("lr_scheduler_kwargs=5", "lr_scheduler_kwargs=5: expected a mapping of the schedule's arguments"),
    ("lr_scheduler_kwargs={num_cycles:2}", "lr_scheduler_kwargs.num_cycles is not an argument of lr_scheduler_type=co"),
    ("lr_scheduler_type=cosine lr_scheduler_kwargs={cycles:2}", "(its arguments: num_cycles, last_epoch)"),
    ("warmup_steps=2", "warmup_steps=2: lr_scheduler_type=constant has no warmup"),
    ("do_train=false", "do_train=false is not honoured here: transformers leaves it to training scripts"),
    ("lora.r=8", "lora.r=8 applies to LoRA adapters, which are off: add lora.enabled=true"),
    ("delta=-1", "delta must be a finite number > 1 (a cap on the probability ratio, 1 on-policy), got -1.0"),
    ("weight_decay=-1", "weight_decay must be a finite number >= 0, got -1.0"),
    ("top_entropy_quantile=2", "top_entropy_quantile must be a finite number in [0, 1], got 2.0"),
    (
        "--config {tmp}/plain.yaml recipe=rl_full",
        "and recipe=rl_full both name the run's recipe (one would be dropped)",
    ),
    ("recipe=rl_sparse algorithm=distill", "recipe=rl_sparse trains with algorithm=grpo, but algorithm=distill"),
    ("--config {tmp}/named.yaml", "sets recipe: mine: a recipe file's recipe names the built-in recipe"),
    ("--config {tmp}/distill.yaml algorithm=grpo", "recipe=distill trains with algorithm=distill, but algorithm=grpo"),
    ("recipe=rl_sparse compression.method=full", "compresses nothing: that run is recipe=rl_full"),
    ("recipe=sparse_rl compression.method=full", "compresses nothing: that run is recipe=rl_full"),
    ("recipe=distill distill.mode=onpolicy", "recipe=distill distils offline, but distill.mode=onpolicy: that run is"),
    # issue 64, 10: refused only when the trainer was built, after the model loaded (or after the first rollout)
    ("recipe=rl_full use_vllm=true", "use_vllm=true generates through vLLM, which is not installed here"),
    ("use_liger_kernel=true", "use_liger_kernel=true needs liger-kernel >= 0.3.0"),
    ("optim=adamw_bnb_8bit", "optim=adamw_bnb_8bit needs a package that is not installed here: You need to install"),
    ("fsdp=full_shard", "fsdp=full_shard is not honoured here: the rollout engine decodes a different number of"),
    ("report_to=wandb", "report_to=wandb needs a Weights & Biases login, and none is found"),
    ("importance_sampling_level=bogus", "unknown importance_sampling_level 'bogus'; choose one of token, sequence"),
    ("multi_objective_aggregation=bogus", "unknown multi_objective_aggregation 'bogus'; choose one of sum_then_norm"),
    ("sync_ref_model=true", "sync_ref_model=true synchronises the reference model, which beta=0 does not load"),
    ("seed=-1", "seed must be an integer in [0, 2**32 - 1]"),
    ("seed=100000000000000000000000", "seed must be an integer in [0, 2**32 - 1]"),
    ("adam_beta1=2", "adam_beta1 must be a finite number in [0, 1), got 2.0"),
    ("adam_epsilon=-1", "adam_epsilon must be a finite number >= 0, got -1.0"),
    ("rewards=[]", "rewards=[]: GRPO needs at least one reward function"),
    ("rewards=[os.getcwd]", "reward function 'os.getcwd' cannot take TRL's reward arguments"),
    ("lora.enabled=true lora.target_modules=[nope]", "lora.target_modules=['nope'] does not fit"),
    ("lora.enabled=true lora.target_modules=[input_layernorm]", "its linear layers: down_proj, gate_proj, k_proj"),
    ("lora.enabled=true lora.target_modules=[lm_head]", "puts an adapter on the LM head"),
    ("mask_backend=flex", "mask_backend=flex: torch's FlexAttention has no backward pass on the CPU"),
    # issue 64, the unclear messages of the configuration
    ("deepspeed={tmp}/bad.json", "deepspeed={tmp}/bad.json: the file is not JSON"),
    ("pad_to_multiple_of=bogus", "pad_to_multiple_of='bogus': expected an integer of at least 1, auto or null"),
    ("reward_weights=[nan]", "reward_weights must be a finite number, got nan"),
    ("recipe=null", "recipe=null: a training run has a recipe (rl_sparse, sparse_rl, rl_full, distill, distill_onp"),
    ("data.question_field=5", "data.question_field=5: expected a field name, or a list of them"),
    ("data.question_field=body", "data.question_field='body' applies to a data file (data.path) or a hub dataset"),
    ("--hydra-help", "--hydra-help: Hydra's command-line flags do not apply here"),
    ("--cfg job", "--cfg: Hydra's command-line flags do not apply here"),
    ("--config {tmp}", "recipe file {tmp} is a folder"),
    ("--config /dev/null", "recipe file /dev/null is not a regular file"),
    ("data.name=no_such_set", "data.name='no_such_set' is not a preset (aime24, amc23, math500, gsm8k, svamp), a bu"),
]


@pytest.fixture(scope="module")
def refused_runs(tmp_path_factory, weightless_model):
    """train.py once per ``REFUSED`` command line, all in one interpreter (``entry_points.run_each``), on a model
    without weights (loading it fails: a refusal with its own message came first), with no W&B login and the hub
    off: per command line, its result and its output folder."""
    tmp = tmp_path_factory.mktemp("upstream")
    (tmp / "bad.json").write_text("not json {")
    (tmp / "plain.yaml").write_text("learning_rate: 1e-5\n")
    (tmp / "named.yaml").write_text("recipe: mine\n")
    (tmp / "distill.yaml").write_text("recipe: distill\n")
    argvs, outs = [], []
    for i, (line, _) in enumerate(REFUSED):
        outs.append(tmp / f"out{i}")
        base = [f"model={weightless_model}", f"output_dir={outs[-1]}", "max_steps=1", "max_completion_length=24"]
        argvs.append([*base, *line.replace("{tmp}", str(tmp)).split()])
    with pytest.MonkeyPatch.context() as patch:
        for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
            patch.delenv(name, raising=False)
        patch.setenv("NETRC", str(tmp / "no-netrc"))
        patch.setenv("WANDB_CONFIG_DIR", str(tmp / "no-wandb"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        results = run_each(ROOT / "train.py", argvs, cwd=tmp)
    return tmp, {line: (result, out) for (line, _), result, out in zip(REFUSED, results, outs)}


@pytest.mark.xdist_group("upstream_refusals")
@pytest.mark.parametrize("line, message", REFUSED)
def test_a_field_is_checked_when_the_configuration_is_built(refused_runs, line, message):
    """Each case through train.py: one line ``error: ...`` naming the key (and what to use), exit code 2, no
    traceback, no output folder, before the model loads (the model has no weights: loading it would fail with
    another message). How fast is the fault bench's to say (seconds to refusal), not a timed test's."""
    if line == "mask_backend=flex" and torch.cuda.is_available():
        pytest.skip("flex trains on CUDA")
    tmp, runs = refused_runs
    result, out = runs[line]
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message.replace("{tmp}", str(tmp)) in last, last
    assert not out.exists()


def test_honoured_values_still_run(tmp_path):
    """The controls: the values TRL, transformers and PEFT honour run (a schedule with its own argument and warmup,
    weight decay, the largest seed numpy takes, GRPO's two-sided clip, the entropy mask, sequence-level ratios, LoRA
    on the attention projections), and a recipe file that names rl_full runs and is recorded as rl_full."""
    (tmp_path / "full.yaml").write_text("recipe: rl_full\nlearning_rate: 1.0e-3\n")
    tiny = ["model=tiny", "max_steps=1", "data.limit=2", "eval_data.limit=1", "max_completion_length=8"]
    tiny += ["prompts_per_step=1", "num_generations=2"]
    honoured = [
        "lr_scheduler_type=cosine",
        "lr_scheduler_kwargs={num_cycles:0.25}",
        "warmup_steps=1",
        "weight_decay=0.01",
        "seed=4294967295",
        "adam_beta1=0.8",
        "delta=1.5",
        "top_entropy_quantile=0.9",
        "importance_sampling_level=sequence",
        "lora.enabled=true",
        "lora.r=4",
        "lora.target_modules=[q_proj,v_proj]",
    ]
    runs = run_each(
        ROOT / "train.py",
        [
            [*tiny, *honoured, f"output_dir={tmp_path / 'honoured'}"],
            [*tiny, "--config", str(tmp_path / "full.yaml"), f"output_dir={tmp_path / 'file'}"],
        ],
        cwd=tmp_path,
    )
    for result in runs:
        assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "honoured" / "eval.json").read_text())["steps"] == 1
    assert (tmp_path / "honoured" / "adapter_config.json").is_file()
    recorded = json.loads((tmp_path / "file" / "eval.json").read_text())
    assert recorded["recipe"] == "rl_full"
    assert "method: full" in (tmp_path / "file" / "hydra" / "config.yaml").read_text()


def test_a_recipe_file_runs_on_top_of_the_recipe_it_names(tmp_path, monkeypatch):
    """A recipe file's ``recipe:`` names the built-in recipe its keys apply on top of (its algorithm, its mode, its
    compression), so the recorded recipe is the one that runs; without one it is rl_sparse's."""
    from gkv_train.config.compose import configure

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "onpolicy.yaml").write_text("recipe: distill_onpolicy\nlearning_rate: 3.0e-5\n")
    config = configure("train", [f"recipe={tmp_path / 'onpolicy.yaml'}", "model=tiny"])[0]
    assert (type(config).__name__, config.recipe, config.distill.mode) == (
        "DistillTrainConfig",
        "distill_onpolicy",
        "onpolicy",
    )
    assert config.learning_rate == 3e-5
    (tmp_path / "plain.yaml").write_text("learning_rate: 3.0e-5\n")
    config = configure("train", [f"--config={tmp_path / 'plain.yaml'}", "model=tiny"])[0]
    assert (config.recipe, config.compression.method, config.rl.train_with_record) == ("rl_sparse", "gkv", True)
    with pytest.raises(ValueError, match="two recipe files"):
        configure("train", ["--config", str(tmp_path / "plain.yaml"), f"recipe={tmp_path / 'onpolicy.yaml'}"])


def test_the_fields_come_from_the_libraries(tmp_path, monkeypatch):
    """What is derived from TRL and transformers, derived: the fields transformers' help leaves to training scripts
    are not keys (neither in --help nor on the command line); every choice of ``GRPO_CHOICES`` / ``VLLM_CHOICES`` is
    a value TRL's trainer reads; the recipes listed are the recipe files; W&B's login found where wandb finds it."""
    from trl.trainer import grpo_trainer

    from gkv_train.config import upstream
    from gkv_train.config.compose import check_overrides, job_keys
    from gkv_train.config.options import RECIPE_ALGORITHMS, wandb_login
    from gkv_train.config.recipe_file import RECIPES

    scripts = {"do_train", "do_eval", "do_predict", "resume_from_checkpoint"}
    assert scripts <= set(upstream.never_honoured()) and not scripts & job_keys("train")
    with pytest.raises(ValueError, match="do_eval=true is not honoured here: .* eval_steps=N"):
        check_overrides(["do_eval=true"], "train")
    source = inspect.getsource(grpo_trainer)
    for name, choices in {**upstream.GRPO_CHOICES, **upstream.VLLM_CHOICES}.items():
        assert all(f"'{c}'" in source or f'"{c}"' in source for c in choices), name
    assert set(RECIPE_ALGORITHMS) == {p.stem for p in (Path(RECIPES) / "recipe").glob("*.yaml")}
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert wandb_login() is None
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    os.chmod(tmp_path / "netrc", 0o600)
    assert wandb_login() == str(tmp_path / "netrc")
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_login() == "WANDB_MODE=offline"
