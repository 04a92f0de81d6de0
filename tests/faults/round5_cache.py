"""Round five (issue 64), the model cache, adapters and ``gkv-train check``: the hostile cases of the issue's items
8, 9, 11 and 15 on those paths, written as data in round four's row shape (``tests/faults/round4.py``'s
docstring: ``(name, category, about, entry, changes, expect, patterns, setup)``), read by ``round5_cache_cases``.

Each row runs with its own model cache, ``GKV_TRAIN_CACHE={work}/cache`` (``changes["_env"]``: other variables for
the child, ``{work}`` replaced). Beyond round four's ``expect`` kinds (``refuse``, ``refuse_late``, ``machine``,
``result``), ``same`` is a result whose samples equal those of the evaluation the setup ran into ``{work}/first``
(before it damaged the cache), every pattern found in the child's stderr. A pattern ``!<path>`` of a ``result`` or
``machine`` row is a path of the case's folder (a glob) that must not exist afterwards. A setup that sets
``ctx.notes["read_only"]`` (a folder) has that folder read-only while the row's command runs: a read-only bind
mount where ``mount`` is allowed (root, whom permissions do not stop), else its permissions.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path

from faults.harness import (
    Case,
    Context,
    Verdict,
    failure_message,
    judge_refusal,
    judge_result,
    overrides,
    read_jsonl,
    samples_problem,
)
from faults.round4 import command, judge_found

KIND = "round5"
COPY = "tiny-llama-seed0-v1"  # the tiny model's copy in the model cache
FIRST = {"data.limit": 3, "output_dir": "{work}/first"}


def cache_env(ctx: Context) -> dict:
    return {"GKV_TRAIN_CACHE": str(ctx.work / "cache")}


def evaluated(ctx: Context) -> Path:
    """An evaluation of the tiny model into ``{work}/first`` (its copy made in the case's cache); the copy's folder.
    RuntimeError when it fails (the probe's fault, not the case's)."""
    proc = ctx.run(ctx.entry(*overrides("evaluate", FIRST)), 180, env=cache_env(ctx))
    if proc.rc != 0:
        raise RuntimeError(f"the first evaluation failed: {failure_message(proc.err)[:300]}")
    return ctx.work / "cache" / COPY


def damaged_copy(how: str, read_only: bool = False):
    """Setup: the tiny model's copy made by a first evaluation, then damaged ``how`` (``zeroed``: 256 KiB in the
    middle of model.safetensors, the same size; ``no-weights`` / ``no-tokenizer`` / ``no-manifest``: that file
    removed); ``read_only``: the cache read-only for the row's command."""

    def setup(ctx: Context) -> None:
        copy = evaluated(ctx)
        weights = copy / "model.safetensors"
        if how == "zeroed":
            with open(weights, "r+b") as f:
                f.seek(weights.stat().st_size // 2 - (128 << 10))
                f.write(bytes(256 << 10))
        else:
            name = {"no-weights": "model.safetensors", "no-tokenizer": "tokenizer.json"}.get(how, "manifest.json")
            (copy / name).unlink(missing_ok=True)
        if read_only:
            ctx.notes["read_only"] = str(ctx.work / "cache")

    return setup


def sound_read_only(ctx: Context) -> None:
    """Setup: the tiny model's copy made by a first evaluation, the cache then read-only."""
    evaluated(ctx)
    ctx.notes["read_only"] = str(ctx.work / "cache")


def empty_read_only(ctx: Context) -> None:
    """Setup: an empty model cache, read-only."""
    (ctx.work / "cache").mkdir()
    ctx.notes["read_only"] = str(ctx.work / "cache")


ADAPTER = """
import json, sys
from peft import LoraConfig, get_peft_model
from gkv_train.models import tiny_model
spec = json.loads(sys.argv[1])
model = tiny_model(spec.get("kind", "tiny-llama"), **spec.get("shape", {}))
lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
get_peft_model(model, lora).save_pretrained(sys.argv[2])
path = sys.argv[2] + "/adapter_config.json"
config = json.load(open(path))
config.update(spec.get("config", {}))
json.dump(config, open(path, "w"))
"""


def adapter(**spec):
    """Setup: a rank-4 LoRA adapter of a tiny model in ``{work}/adapter`` (PEFT, in a child of the checkout):
    ``kind`` (tiny-llama), ``shape`` (the tiny model's other sizes), ``config`` (entries written over its
    adapter_config.json; its base is named ``tiny`` unless given)."""
    spec = {**spec, "config": {"base_model_name_or_path": "tiny", **spec.get("config", {})}}

    def setup(ctx: Context) -> None:
        proc = ctx.run([ctx.python, "-c", ADAPTER, json.dumps(spec), str(ctx.work / "adapter")], 120)
        if proc.rc != 0:
            raise RuntimeError(f"making the adapter failed: {failure_message(proc.err)[:300]}")

    return setup


@contextmanager
def read_only(ctx: Context, folder: str | None):
    """``folder`` read-only within the block (nothing when None): a read-only bind mount as root, else its
    permissions; ``ctx.notes["read_only_by"]`` says which."""
    if folder is None:
        yield
        return
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "--bind", "-o", "ro", folder, folder], capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cannot make {folder} read-only as root: {done.stderr.decode()[:200]}")
        ctx.notes["read_only_by"] = "bind mount (EROFS)"
        try:
            yield
        finally:
            subprocess.run(["umount", folder], capture_output=True, check=False)
        return
    paths = [Path(folder), *Path(folder).rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for path in paths:
        path.chmod(modes[path] & ~0o222)
    ctx.notes["read_only_by"] = "permissions"
    try:
        yield
    finally:
        for path, mode in modes.items():
            path.chmod(mode)


def same_samples(ctx: Context, proc, patterns: list[str]) -> str | None:
    """What is wrong with an evaluation into ``{work}/out`` that must equal the first one (``{work}/first``), each
    pattern found in its stderr, or None."""
    problem = samples_problem(ctx, 1, FIRST["data.limit"])
    if problem:
        return problem
    before = [s["completion"] for s in read_jsonl(ctx.work / "first" / "full" / "samples.jsonl")]
    after = [s["completion"] for s in read_jsonl(ctx.work / "out" / "full" / "samples.jsonl")]
    if before != after:
        return f"other completions than before the damage: {after} against {before}"
    missing = [p for p in patterns if not re.search(ctx.path(p), proc.err)]
    return f"stderr does not say {missing[0]!r}" if missing else None


def left(ctx: Context, patterns: list[str]) -> list[str]:
    """The ``!<glob>`` patterns' paths that exist in the case's folder."""
    return [str(p) for pattern in patterns if pattern.startswith("!") for p in ctx.work.glob(pattern[1:])]


def cache_case(row: tuple) -> Case:
    """The case of a row, run with the case's own model cache (see the module's docstring)."""
    name, category, about, entry, changes, expect, patterns, setup = row

    def run(ctx: Context) -> Verdict:
        given = dict(changes)
        env = {**cache_env(ctx), **{k: ctx.path(v) for k, v in given.pop("_env", {}).items()}}
        if setup is not None:
            setup(ctx)
        argv, fsize = command(ctx, entry, given)
        with read_only(ctx, ctx.notes.pop("read_only", None)):
            proc = ctx.run(argv, 300, fsize=fsize, env=env)
        wanted = [p for p in patterns if not p.startswith("!")]
        if expect == "same":
            return judge_result(proc, lambda: same_samples(ctx, proc, wanted))
        if expect == "result":
            verdict = judge_found(ctx, proc, wanted)
            stray = left(ctx, patterns)
            return Verdict("silent_wrong", f"left {stray}") if verdict.outcome == "ok" and stray else verdict
        if expect == "machine":  # a failure of the machine, not of the input: any exit code but 0 (a full disk's 1)
            verdict = judge_refusal(proc, wanted, before_load=False, code=None)
            stray = left(ctx, patterns)
            return Verdict("unclear_error", f"left {stray}: {verdict.detail}") if stray else verdict
        return judge_refusal(proc, wanted, before_load=expect != "refuse_late")

    return Case(name, category, KIND, about, run, 900.0 if setup is not None else 360.0)


CHECK = ["check", "--model", "tiny"]
LM_EVAL_TASK = (
    "task: faults_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {work}/task.jsonl\n"
    'test_split: test\ndoc_to_text: "{{problem}} Answer:"\noutput_type: generate_until\n'
    'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\n  do_sample: false\n'
    "metric_list:\n  - metric: exact_match\n"
)


def lm_eval_with_adapter(ctx: Context) -> None:
    """Setup: an adapter trained on tiny-qwen2 and lm-eval's local one-problem task in the case's folder."""
    adapter(kind="tiny-qwen2", config={"base_model_name_or_path": "tiny-qwen2"})(ctx)
    (ctx.work / "task.yaml").write_text(ctx.path(LM_EVAL_TASK))
    (ctx.work / "task.jsonl").write_text('{"problem": "What is 1 plus 1?", "answer": "2"}\n')


# (name, category, about, entry, changes, expect, patterns, setup)
ROWS = [
    # item 8: the copy's content is never verified; an empty GKV_TRAIN_CACHE
    (
        "state_faults/model-copy-zeroed-same-size",
        "state_faults",
        "256 KiB zeroed inside the tiny model's copy (model.safetensors, the same size): loaded as it was, every "
        "completion changed",
        "evaluate",
        {"data.limit": 3},
        "same",
        [f"{{work}}/cache/{COPY} is damaged", "differs from what was saved"],
        damaged_copy("zeroed"),
    ),
    (
        "configuration/model-cache-empty-variable",
        "configuration",
        "GKV_TRAIN_CACHE= (empty): the copy written into the current folder",
        "evaluate",
        {"_env": {"GKV_TRAIN_CACHE": "", "HOME": "{work}/home"}},
        "result",
        [f"home/.cache/gkv_train/{COPY}/manifest.json:sha256", f"!{COPY}"],
        None,
    ),
    # item 11: damage in a read-only cache, the file-size limit, missing files, TRL's reference model
    (
        "state_faults/model-copy-damaged-read-only-cache",
        "state_faults",
        "a damaged copy in a read-only cache: converted again (38 s for SmolLM2), then the damaged copy loaded",
        "evaluate",
        {"data.limit": 3},
        "refuse",
        [f"{COPY} is damaged", "cannot be removed", "GKV_TRAIN_CACHE"],
        damaged_copy("zeroed", read_only=True),
    ),
    (
        "state_faults/model-copy-file-size-limit",
        "state_faults",
        "the file-size limit (ulimit -f 500 kB) reached while the first load writes its copy: safetensors' 'File "
        "too large' traceback naming no file",
        "evaluate",
        {"_fsize": 500_000},
        "machine",
        ["File too large", COPY, "ulimit -f", "!cache/*"],
        None,
    ),
    *[
        (
            f"state_faults/model-copy-{how}",
            "state_faults",
            f"the tiny model's copy without {what}: not taken for damage, every later load failed",
            "evaluate",
            {"data.limit": 3},
            "same",
            [f"{{work}}/cache/{COPY} is damaged", re.escape(what)],
            damaged_copy(how),
        )
        for how, what in (("no-weights", "model.safetensors"), ("no-tokenizer", "tokenizer.json"))
    ],
    (
        "state_faults/model-copy-without-manifest",
        "state_faults",
        "a copy without manifest.json (made before copies carried one): made again once, with a warning",
        "evaluate",
        {"data.limit": 3},
        "same",
        [f"{{work}}/cache/{COPY} is damaged", "no manifest.json"],
        damaged_copy("no-manifest"),
    ),
    (
        "configuration/model-cache-read-only-beta",
        "configuration",
        "an empty read-only model cache with beta=0.04: TRL built the reference model from the name ''",
        "train",
        {"beta": 0.04},
        "refuse",
        ["beta=0.04", "reference model", "not writable", "GKV_TRAIN_CACHE"],
        empty_read_only,
    ),
    (
        "state_faults/model-copy-sound-read-only-cache",
        "state_faults",
        "control: a sound copy in a read-only cache loads (no warning)",
        "evaluate",
        {"data.limit": 3},
        "same",
        [],
        sound_read_only,
    ),
    # items 9 and 15: adapters that do not fit the model they are applied to
    *[
        ("configuration/adapter-" + name, "configuration", about, "evaluate", {"adapter": "{work}/adapter"}, "refuse")
        + (patterns, setup)
        for name, about, patterns, setup in (
            (
                "other-base",
                "an adapter trained on tiny-qwen2 (its config names it) applied to tiny without a word",
                ["trained on tiny-qwen2", "model=tiny"],
                adapter(kind="tiny-qwen2", config={"base_model_name_or_path": "tiny-qwen2"}),
            ),
            (
                "more-layers",
                "an adapter of a 6-layer model on the 4-layer tiny: its layers 4-5 dropped without a word",
                ["model.layers.4", "model=tiny"],
                adapter(shape={"num_hidden_layers": 6}),
            ),
            (
                "rank",
                "adapter_config.json's r=8 over rank-4 weights: a size-mismatch traceback after the model loaded",
                ["rank 4", "r=8"],
                adapter(config={"r": 8}),
            ),
            (
                "targets",
                "target_modules [c_attn], which tiny has not: PEFT's traceback after the model loaded",
                ["c_attn", "target_modules"],
                adapter(config={"target_modules": ["c_attn"]}),
            ),
            (
                "wider-model",
                "an adapter of a model of hidden size 120 on tiny (96): a size-mismatch traceback after loading",
                ["q_proj", "96"],
                adapter(shape={"hidden_size": 120}),
            ),
        )
    ],
    (
        "configuration/adapter-matching",
        "configuration",
        "control: an adapter trained on tiny applies",
        "evaluate",
        {"adapter": "{work}/adapter"},
        "result",
        ["out/full/summary.json:pass@1"],
        adapter(),
    ),
    (
        "configuration/lm-eval-adapter-other-base",
        "configuration",
        "lm-eval pretrained=tiny,adapter=<trained on tiny-qwen2>: applied without a word",
        "cli",
        {
            "argv": [
                "lm-eval",
                *("--model", "gkv", "--model_args", "pretrained=tiny,adapter={work}/adapter"),
                *("--tasks", "faults_gen", "--include_path", "{work}", "--output_path", "{work}/lm", "--limit", "1"),
            ]
        },
        "refuse",
        ["trained on tiny-qwen2", "model=tiny"],
        lm_eval_with_adapter,
    ),
    # items 9 and 15: gkv-train check's arguments and evaluate's seed, checked before the model loads
    *[
        ("configuration/check-" + name, "configuration", about, "cli", {"argv": [*CHECK, *argv]}, "refuse")
        + (patterns, None)
        for name, about, argv, patterns in (
            (
                "batch-zero",
                "gkv-train check --batch 0: a traceback after the model loaded",
                ["--batch", "0"],
                ["--batch", "at least 1"],
            ),
            (
                "max-new-tokens-zero",
                "gkv-train check --max-new-tokens 0: a traceback after the model loaded",
                ["--max-new-tokens", "0"],
                ["--max-new-tokens", "at least 1"],
            ),
            (
                "max-new-tokens-huge",
                "gkv-train check --max-new-tokens 100000000: a 12.8 GB allocation",
                ["--max-new-tokens", "100000000"],
                ["--max-new-tokens=100000000", "context"],
            ),
            (
                "temperature-negative",
                "gkv-train check --temperature -1: a traceback after the model loaded",
                ["--temperature", "-1"],
                ["--temperature", "-1"],
            ),
            (
                "temperature-nan",
                "gkv-train check --temperature nan: reported an inconsistency instead of refusing",
                ["--temperature", "nan"],
                ["--temperature", "nan"],
            ),
            (
                "batch-past-memory",
                "gkv-train check --batch 300 --max-new-tokens 64: the forward's masks exhaust the memory",
                ["--batch", "300", "--max-new-tokens", "64"],
                ["--batch", "dense mask"],
            ),
        )
    ],
    (
        "configuration/evaluate-seed-huge",
        "configuration",
        "evaluate.py seed=10^23: 'Overflow when unpacking long long' after the model loaded",
        "evaluate",
        {"seed": 10**23},
        "refuse",
        ["seed", "2\\*\\*63"],
        None,
    ),
]


def round5_cache_cases() -> list[Case]:
    return [cache_case(row) for row in ROWS]
