"""Round four (issue 54): the hostile cases of the newest input paths (damaged runs, long_recall's story, recipe
files, manifests, the natural haystack, keys that cannot apply, adapter folders, unbounded inputs, library calls),
written as data: one row per case, read by ``round4_cases``.

A row is ``(name, category, about, entry, changes, expect, patterns, setup)``:

* ``entry``: ``train`` / ``evaluate`` / ``traces`` (the scripts, their base overrides updated with ``changes``),
  ``cli`` (``python -m gkv_train.cli`` with the words of ``changes["argv"]``), ``script`` (``changes["argv"]`` under
  the checkout) or ``python`` (``changes["code"]``, a snippet run in a child that prints ``BENCH_RESULT`` and its
  value or what it raised);
* ``expect``: ``refuse`` (a clear error matching every pattern, before the model loads), ``refuse_late`` (the same,
  a model may have loaded), ``refuse_whole`` (a refusal that leaves the run folder byte for byte: else data lost;
  another folder where the setup names it, ``row_case``),
  ``result`` (exit 0, and ``patterns`` found in its output or, as ``file:pattern``, in that file of the case's
  folder) or ``raise`` (the snippet raises ValueError / TypeError matching every pattern);
* ``setup``: a function of the case's context run first (a finished run to damage, files to read), or None.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from faults.harness import (
    SCRIPTS,
    Case,
    Context,
    Verdict,
    failure_message,
    judge_refusal,
    overrides,
)

RUN = {"max_steps": 2, "save_steps": 1}  # a finished run with two checkpoints


def folder_digest(folder: Path) -> str:
    """One hash of every file under ``folder`` (names and bytes; not the probe's own marks files): equal before and
    after means untouched."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".marks")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def trained(ctx: Context, changes: dict | None = None) -> Path:
    """A finished two-step run in ``{work}/out`` (or ``changes``' output_dir), its folder returned; RuntimeError
    when it fails (the probe's fault, not the case's)."""
    changes = {**RUN, **(changes or {})}
    proc = ctx.run(ctx.entry(*overrides("train", changes)), 240)
    if proc.rc != 0:
        raise RuntimeError(f"the first run failed: {failure_message(proc.err)[:300]}")
    return Path(ctx.path(changes.get("output_dir", "{work}/out")))


def damaged(how: str):
    """Setup: a finished run whose every checkpoint is damaged ``how``: weights truncated, one byte flipped in the
    weights, the trainer state overwritten, a manifest entry that is a number, a manifest that lists nothing."""

    def setup(ctx: Context) -> None:
        out = trained(ctx)
        for checkpoint in sorted(out.glob("checkpoint-*")):
            weights = checkpoint / "model.safetensors"
            data = bytearray(weights.read_bytes())
            if how == "truncated":
                weights.write_bytes(bytes(data[:1000]))
            elif how == "flipped":
                data[len(data) // 2] ^= 0x01
                weights.write_bytes(bytes(data))
            elif how == "state":
                (checkpoint / "trainer_state.json").write_text('{"global_step": 0}')
            elif how == "entry":
                (checkpoint / "manifest.json").write_text('{"files": {"optimizer.pt": 5}}')
            else:
                (checkpoint / "manifest.json").write_text('{"files": {}}')
        ctx.notes["digest"] = folder_digest(out)

    return setup


def without_manifests(truncate: str | None):
    """Setup: a finished run with every manifest removed; ``truncate``: a file cut in half (checkpoint-2's model,
    or the final model)."""

    def setup(ctx: Context) -> None:
        out = trained(ctx)
        for manifest in out.rglob("manifest.json"):
            manifest.unlink()
        if truncate is not None:
            path = out / truncate
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return setup


def copied_checkpoint(ctx: Context) -> None:
    """Setup: another run's checkpoint (learning rate 2e-06) copied without its manifest into a new folder."""
    import shutil

    out = trained(ctx, {"output_dir": "{work}/first", "learning_rate": 2e-6})
    shutil.copytree(out / "checkpoint-1", ctx.work / "out" / "checkpoint-1")
    (ctx.work / "out" / "checkpoint-1" / "manifest.json").unlink()


def write(files: dict):
    """Setup: files of the case's folder (name -> text; {work} replaced)."""

    def setup(ctx: Context) -> None:
        for name, text in files.items():
            path = ctx.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(ctx.path(text))

    return setup


def full_model_folder(ctx: Context) -> None:
    """Setup: a full fine-tune's folder (a run without LoRA) in {work}/full, to be given as an adapter."""
    trained(ctx, {"max_steps": 1, "output_dir": "{work}/full"})


QUESTIONS = "".join(json.dumps({"question": f"Question {i} has five words."}) + "\n" for i in range(20))
BOMB = 'a: &a ["x", "x", "x", "x", "x", "x", "x", "x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 8)}]\n" for i in range(8)
)
LM_EVAL_TASK = (
    "task: faults_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {work}/task.jsonl\n"
    'test_split: test\ndoc_to_text: "{{problem}} Answer:"\noutput_type: generate_until\n'
    'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 4\n  do_sample: false\n'
    "metric_list:\n  - metric: exact_match\n"
)
LM_EVAL_DATA = '{"problem": "What is 1 plus 1?", "answer": "2"}\n'
REWARDS = "from gkv_rewards.functions import accuracy, copy_score\n"
ENGINE = (
    "from gkv_rollout.engine import RolloutEngine\nfrom gkv_rollout.config import SamplingConfig\n"
    "from gkv_train.models import load_model\nmodel, tok = load_model('tiny')\n"
    "engine = RolloutEngine(model, tok)\nsampling = SamplingConfig(max_new_tokens=8)\n"
)
LONG = {"data.name": "long_recall", "data.limit": 1}


def plug_in(source: str, use: str) -> str:
    """A snippet that writes ``source`` as the module ``user_plugin`` in a fresh folder on ``sys.path``, then runs
    ``use`` (which sets ``value``)."""
    head = "from dataclasses import dataclass\nfrom gkv_rollout.methods import EvictionMethod, register\n"
    return (
        "import pathlib, sys, tempfile\nfolder = pathlib.Path(tempfile.mkdtemp())\n"
        f"(folder / 'user_plugin.py').write_text({head + source!r})\nsys.path.insert(0, str(folder))\n"
        "from gkv_rollout.config import CompressionConfig\n" + use
    )


SCORE = "    def score(self, state):\n        return state.key_pos.float(), None\n"
T_LONG = {"eval_data.name": "long_recall", "eval_data.limit": 1}

# (name, category, about, entry, changes, expect, patterns, setup)
ROWS = [
    # 1. data lost: a finished run whose checkpoints are all damaged is never replaced by resume=last
    *[
        (
            f"state_faults/resume-every-checkpoint-{how}",
            "state_faults",
            f"a finished run, every checkpoint {about}, then resume=last max_steps=3: it started from scratch, "
            "cut metrics.jsonl and overwrote the final model",
            "train",
            {**RUN, "max_steps": 3, "resume": "last"},
            "refuse_whole",
            ["checkpoint-1", "checkpoint-2", "overwrite=true"],
            damaged(how),
        )
        for how, about in (
            ("truncated", "with its weights truncated"),
            ("flipped", "with one byte of its weights flipped"),
            ("state", "with trainer_state.json overwritten"),
            ("entry", 'with a manifest entry "optimizer.pt": 5 (a TypeError)'),
            ("empty", 'with the manifest {"files": {}} (passed the check)'),
        )
    ],
    # 2. long_recall's story checked against max_completion_length before the work
    (
        "data/long-recall-default-sentences",
        "data",
        "evaluate data.name=long_recall with 4 new tokens (the 10-sentence story is longer): a traceback after the "
        "model loaded",
        "evaluate",
        LONG,
        "refuse",
        ["given beginning", "max_completion_length=4", "sentences"],
        None,
    ),
    (
        "data/long-recall-two-sentences",
        "data",
        "data.name=long_recall data.sentences=2 max_completion_length=64: a traceback after the model loaded",
        "evaluate",
        {**LONG, "data.sentences": 2, "max_completion_length": 64},
        "refuse",
        ["given beginning", "max_completion_length=64"],
        None,
    ),
    (
        "data/long-recall-4096-sentences",
        "data",
        "data.sentences=4096 max_completion_length=3000: a traceback after the model loaded",
        "evaluate",
        {**LONG, "data.sentences": 4096, "max_completion_length": 3000},
        "refuse",
        ["given beginning", "max_completion_length=3000"],
        None,
    ),
    (
        "data/long-recall-held-out-in-training",
        "data",
        "train.py eval_data.name=long_recall eval_data.sentences=2 max_completion_length=64: trained, saved, then "
        "crashed in the final evaluation",
        "train",
        {**T_LONG, "eval_data.sentences": 2, "max_completion_length": 64},
        "refuse",
        ["held-out evaluation", "given beginning", "eval_data.sentences"],
        None,
    ),
    (
        "data/long-recall-training-story-too-long",
        "data",
        "train.py data.name=long_recall (trainable with GRPO) with 8 new tokens: the story does not fit",
        "train",
        {"data.name": "long_recall"},
        "refuse",
        ["training rollouts", "given beginning", "max_completion_length=8"],
        None,
    ),
    (
        "configuration/long-recall-distill",
        "configuration",
        "recipe=distill data.name=long_recall: distillation would take the story for the model's own tokens",
        "train",
        {"recipe": "distill", "data.name": "long_recall", "max_completion_length": 600, "num_generations": ...},
        "refuse",
        ["long_recall", "algorithm=distill"],
        None,
    ),
    # 3. recipe files
    (
        "configuration/recipe-file-named-like-a-built-in",
        "configuration",
        "recipe=<dir>/rl_sparse.yaml holding learning_rate: 0.5: the built-in recipe was used (2e-06)",
        "train",
        {"recipe": "{work}/rl_sparse.yaml"},
        "result",
        ["out/hydra/config.yaml:learning_rate: 0.5"],
        write({"rl_sparse.yaml": "learning_rate: 0.5\n"}),
    ),
    (
        "configuration/recipe-file-hydra-run-dir",
        "configuration",
        "a recipe file setting hydra: {run: {dir: ...}}: silently ignored",
        "train",
        {"recipe": "{work}/mine.yaml"},
        "refuse",
        ["mine.yaml", "hydra", "output_dir"],
        write({"mine.yaml": "hydra:\n  run:\n    dir: {work}/elsewhere\n"}),
    ),
    (
        "configuration/recipe-file-alias-bomb",
        "configuration",
        "a 2 KB recipe of nested YAML aliases: 96 s and 8 GB, then MemoryError",
        "train",
        {"recipe": "{work}/bomb.yaml"},
        "refuse",
        ["bomb.yaml", "aliases"],
        write({"bomb.yaml": BOMB}),
    ),
    (
        "configuration/recipe-file-self-alias",
        "configuration",
        "a recipe whose alias refers to itself: RecursionError",
        "train",
        {"recipe": "{work}/self.yaml"},
        "refuse",
        ["self.yaml"],
        write({"self.yaml": "a: &a [*a]\n"}),
    ),
    (
        "configuration/recipe-file-comma-name",
        "configuration",
        "a recipe file named x,y.yaml: Hydra read the name as a sweep",
        "train",
        {"recipe": "{work}/x,y.yaml"},
        "result",
        ["out/hydra/config.yaml:learning_rate: 0.25"],
        write({"x,y.yaml": "learning_rate: 0.25\n"}),
    ),
    (
        "configuration/recipe-file-sampling-group",
        "configuration",
        "a recipe file of the sampling group's time (sampling: {max_new_tokens: 64}), re-keyed under TRL's names",
        "train",
        {"recipe": "{work}/old.yaml"},
        "refuse",
        ["old.yaml", "sampling.max_new_tokens is now max_completion_length"],
        write({"old.yaml": "sampling:\n  max_new_tokens: 64\n"}),
    ),
    (
        "configuration/prompt-template-huge-width",
        "configuration",
        'data.prompt_template="{problem:>99999999999}": a ~100 GB allocation in the template check',
        "evaluate",
        {"data.prompt_template": "'{problem:>99999999999}'"},
        "refuse",
        ["prompt_template", "problem"],
        None,
    ),
    # 4. checkpoints without a manifest are checked by content
    (
        "state_faults/no-manifest-truncated-checkpoint",
        "state_faults",
        "manifests removed, checkpoint-2's weights truncated, resume=last: SafetensorError naming no file",
        "train",
        {**RUN, "max_steps": 3, "resume": "last"},
        "result",
        ["err:checkpoint-2 is damaged", "err:model.safetensors"],
        without_manifests("checkpoint-2/model.safetensors"),
    ),
    (
        "output/no-manifest-truncated-export",
        "output",
        "gkv-train export of a run without manifests whose final model is truncated: SafetensorError naming no file",
        "cli",
        {"argv": ["export", "{work}/out", "{work}/merged"]},
        "refuse_late",
        ["model.safetensors"],
        without_manifests("model.safetensors"),
    ),
    (
        "state_faults/no-manifest-other-learning-rate",
        "state_faults",
        "another run's checkpoint (2e-06) copied without its manifest, resume=last learning_rate=1e-3: trained at "
        "2e-06",
        "train",
        {**RUN, "max_steps": 3, "resume": "last", "learning_rate": 1e-3},
        "refuse",
        ["learning_rate=2e-06 there"],
        copied_checkpoint,
    ),
    (
        "state_faults/resume-other-method",
        "state_faults",
        "resume=last compression.method=snapkv on a G-KV run: two methods' rollouts mixed silently",
        "train",
        {**RUN, "max_steps": 3, "resume": "last", "compression.method": "snapkv"},
        "refuse",
        ["compression.method='gkv' there, 'snapkv' here"],
        lambda ctx: trained(ctx),
    ),
    # 5. the natural haystack's corpus
    *[
        (
            f"data/haystack-corpus-{name}",
            "data",
            about,
            "evaluate",
            {"data.name": "niah_single", "data.haystack": "questions", "data.context": 512, "data.limit": 1},
            "refuse",
            patterns,
            write({"corpus/gsm8k_test.jsonl": text}),
        )
        for name, about, patterns, text in (
            ("short", "a 100-word corpus: the haystack silently dropped", ["gsm8k_test.jsonl", "words"], QUESTIONS),
            (
                "no-question",
                "a line without question: KeyError",
                ["gsm8k_test.jsonl:2"],
                '{"question": "One two."}\n{"q": 1}\n',
            ),
            ("not-json", "a line that is not JSON: names no file", ["gsm8k_test.jsonl:1"], "{not json\n"),
        )
    ],
    # 6. keys that cannot apply
    *[
        ("configuration/" + name, "configuration", about, entry, changes, "refuse", patterns, None)
        for name, about, entry, changes, patterns in (
            (
                "copy-required-on-arithmetic",
                "data.copy_required=places on arithmetic: ignored",
                "evaluate",
                {"data.copy_required": "places"},
                ["copy_required", "copy_recall"],
            ),
            (
                "copy-required-on-long-recall",
                "data.copy_required=places on long_recall: ignored",
                "evaluate",
                {**LONG, "data.copy_required": "places", "max_completion_length": 600},
                ["copy_required", "copy_recall"],
            ),
            (
                "sentences-on-arithmetic",
                "data.sentences=5 on arithmetic: ignored (13: copy_recall's message)",
                "evaluate",
                {"data.sentences": 13},
                ["data.sentences=13 applies to"],
            ),
            (
                "context-on-arithmetic",
                "data.context=2048 on arithmetic: ignored",
                "evaluate",
                {"data.context": 2048},
                ["data.context", "niah_single"],
            ),
            (
                "distractors-on-copy-recall",
                "data.distractors=2 on copy_recall: ignored",
                "evaluate",
                {"data.name": "copy_recall", "data.distractors": 2},
                ["data.distractors", "arithmetic"],
            ),
            (
                "copy-share-asking-for-nothing",
                "data.copy_share=1e-12: 'at least 0' places, a bare number scored 1.0 by accuracy",
                "evaluate",
                {"data.name": "copy_recall", "data.copy_required": "places", "data.copy_share": 1e-12},
                ["copy_share", "none of the 10 places"],
            ),
            (
                "s4r-eta-below-its-state",
                "S4R eta=1e-9: ran with the rank raised to 1, no warning",
                "evaluate",
                {"methods": ["s4r"], "compression.eta": 1e-9},
                ["eta=1e-09", "smallest state"],
            ),
        )
    ],
    # 7. adapter folders
    *[
        (
            f"configuration/adapter-{name}",
            "configuration",
            about,
            "evaluate",
            {"adapter": "{work}/adapter"},
            "refuse",
            patterns,
            write({"adapter/adapter_config.json": text}),
        )
        for name, about, patterns, text in (
            ("empty-config", "adapter=<dir> with {}: a traceback", ["adapter_config.json", "peft_type"], "{}"),
            ("garbage-config", "adapter=<dir> with garbage JSON: a traceback", ["is not JSON"], "{garbage"),
        )
    ],
    (
        "configuration/adapter-full-model",
        "configuration",
        "adapter=<a full fine-tune's folder>: a traceback",
        "evaluate",
        {"adapter": "{work}/full"},
        "refuse",
        ["full model", "model="],
        full_model_folder,
    ),
    (
        "configuration/bench-decode-regime-bad-adapter",
        "configuration",
        "bench_decode_regime.py --adapters x=<garbage adapter>: only a file's existence checked, failed after the "
        "methods stage",
        "script",
        {"argv": ["scripts/bench_decode_regime.py", "--quick", "--adapters", "x={work}/adapter"]},
        "refuse",
        ["--adapters", "is not JSON"],
        write({"adapter/adapter_config.json": "{garbage"}),
    ),
    # 9. tracebacks and misleading messages
    (
        "output/export-into-a-file",
        "output",
        "gkv-train export <run> <an existing file>: a traceback",
        "cli",
        {"argv": ["export", "{work}/out", "{work}/a_file"]},
        "refuse",
        ["a_file is a file"],
        lambda ctx: (trained(ctx, {"max_steps": 1}), (ctx.work / "a_file").write_text("x")),
    ),
    (
        "output/save-over-the-file-size-limit",
        "output",
        "a checkpoint save over the file-size limit (EFBIG): [Errno 27] naming no file",
        "train",
        {"max_steps": 1, "_fsize": 200_000},
        "machine",
        ["File too large", "checkpoint-1", "ulimit -f"],
        None,
    ),
    (
        "configuration/lm-eval-s4r-refresh",
        "configuration",
        "lm-eval method=s4r,refresh=1000000: refused only after the model loaded",
        "cli",
        {
            "argv": [
                "lm-eval",
                "--model",
                "gkv",
                "--model_args",
                "pretrained=tiny,method=s4r,refresh=1000000",
                "--tasks",
                "faults_gen",
                "--include_path",
                "{work}",
                "--output_path",
                "{work}/lm",
                "--limit",
                "1",
            ]
        },
        "refuse",
        ["refresh=1000000", "max_gen_toks"],
        write({"task.yaml": LM_EVAL_TASK, "task.jsonl": LM_EVAL_DATA}),
    ),
    (
        "configuration/evaluate-dash-config",
        "configuration",
        "evaluate.py --config x.yaml: advised config=x.yaml, which is refused",
        "script",
        {"argv": ["scripts/evaluate.py", "--config", "x.yaml"]},
        "refuse",
        ["--config", "train.py"],
        None,
    ),
    (
        "configuration/train-version",
        "configuration",
        "train.py --version: Hydra's lexer error",
        "script",
        {"argv": ["train.py", "--version"]},
        "result",
        ["out:gkv-train \\d"],
        None,
    ),
    (
        "configuration/gkv-train-train-version",
        "configuration",
        "gkv-train train --version: Hydra's lexer error",
        "cli",
        {"argv": ["train", "--version"]},
        "result",
        ["out:gkv-train \\d"],
        None,
    ),
    (
        "configuration/relative-method-module",
        "configuration",
        "compression.method=.methods:GKV: a message naming no key",
        "evaluate",
        {"compression.method": ".methods:GKV"},
        "refuse",
        ["compression method", "package.module:Class"],
        None,
    ),
    (
        "configuration/check-unknown-model",
        "configuration",
        "gkv-train check --model nomodel-xyz: 51 s of hub retries, two tracebacks",
        "cli",
        {"argv": ["check", "--model", "nomodel-xyz"]},
        "refuse",
        ["nomodel-xyz"],
        None,
    ),
    # 10. silent results in the libraries
    *[
        ("rewards/" + name, "rewards", about, "python", {"code": code}, "raise", patterns, None)
        for name, about, code, patterns in (
            (
                "accuracy-two-completions-one-answer",
                "accuracy with 2 completions and 1 answer: 1 reward (zip truncates)",
                REWARDS + "value = accuracy(completions=['42', '42'], answer=['42'])",
                ["2 completions, 1 answers"],
            ),
            (
                "copy-score-two-completions-one-answer",
                "copy_score with 2 completions and 1 answer: 1 reward",
                REWARDS + "value = copy_score(completions=['42', '42'], answer=['42'])",
                ["2 completions, 1 answers"],
            ),
            (
                "required-not-text",
                "required=[5]: AttributeError",
                REWARDS + "value = accuracy(completions=['42'], answer=['42'], required=[5])",
                ["required is 5"],
            ),
        )
    ],
    *[
        (
            "data/engine-prefixes-" + name,
            "data",
            f"RolloutEngine.generate(prefixes={given}): checked for count and length only",
            "python",
            {"code": ENGINE + f"value = engine.generate([[5, 6, 7]], sampling, prefixes={given})"},
            "raise",
            patterns,
            None,
        )
        for name, given, patterns in (
            ("string", "['some text']", ["prefixes"]),
            ("float", "[[1.5]]", ["prefixes", "integers"]),
            ("none", "[[None]]", ["prefixes", "integers"]),
            ("negative", "[[-1]]", ["prefixes", "vocabulary"]),
            ("out-of-vocabulary", "[[10**9]]", ["prefixes", "vocabulary"]),
        )
    ],
    *[
        (
            "configuration/sampling-chunk-given-" + name,
            "configuration",
            f"SamplingConfig(chunk_given={given}): not a bool (a string is true whatever it says)",
            "python",
            {"code": f"from gkv_rollout.config import SamplingConfig\nvalue = SamplingConfig(chunk_given={given})"},
            "raise",
            ["chunk_given", given],
            None,
        )
        for name, given in (("string", "'no'"), ("integer", "0"))
    ],
    # 11. a method of the user's own module (a method is one dataclass, 2026-12-06)
    *[
        ("configuration/plug-in-" + name, "configuration", about, "python", {"code": code}, expect, patterns, None)
        for name, about, code, expect, patterns in (
            (
                "undecorated",
                "a plug-in subclass without @dataclass, window: int = 3: ran with its base's window 16",
                plug_in(
                    "class Late(EvictionMethod):\n    name = 'late'\n    window: int = 3\n" + SCORE,
                    "value = CompressionConfig('user_plugin:Late', budget=32).resolved.window",
                ),
                "raise",
                ["user_plugin:Late", "@dataclass"],
            ),
            (
                "registered-over-a-built-in",
                "@register on a user's class named 'gkv': it replaced G-KV for every later run in the process",
                plug_in(
                    "@register\n@dataclass\nclass Mine(EvictionMethod):\n    name = 'gkv'\n" + SCORE,
                    "import user_plugin\nvalue = CompressionConfig('gkv').kind",
                ),
                "raise",
                ["'gkv'", "name of its own"],
            ),
            (
                "name-as-a-field",
                "a plug-in whose name is annotated (name: str = 'x'): the name became an option",
                plug_in(
                    "@dataclass\nclass Named(EvictionMethod):\n    name: str = 'named'\n" + SCORE,
                    "value = CompressionConfig('user_plugin:Named', budget=32).identity()",
                ),
                "raise",
                ["user_plugin:Named", "name as a field"],
            ),
            (
                "identity-its-own-fields",
                "a plug-in's identity recorded G-KV's and S4R's options beside its own",
                plug_in(
                    "@dataclass\nclass Norm(EvictionMethod):\n    name = 'norm'\n    p: float = 2.0\n" + SCORE,
                    "value = CompressionConfig('user_plugin:Norm', budget=32).identity()",
                ),
                "result",
                [r"out:BENCH_RESULT (?!.*alpha)(?!.*eta).*'method': 'norm'.*'p': 2\.0"],
            ),
        )
    ],
]

SNIPPET = """
import json, sys
try:
    exec(open(sys.argv[1]).read())
    print("BENCH_RESULT " + json.dumps({"value": repr(value)[:200]}), flush=True)
except Exception as err:
    print("BENCH_RESULT " + json.dumps({"raised": type(err).__name__, "message": str(err)[:500]}), flush=True)
"""


def command(ctx: Context, entry: str, changes: dict) -> tuple[list[str], int | None]:
    """The child's command line for a row, and its file-size limit (``_fsize`` among ``changes``)."""
    changes = dict(changes)
    fsize = changes.pop("_fsize", None)
    if entry in SCRIPTS:
        return ctx.entry(*overrides(entry, changes)), fsize
    argv = [ctx.path(a) for a in changes.get("argv", [])]
    if entry == "cli":
        return [ctx.python, "-m", "gkv_train.cli", *argv], fsize
    if entry == "script":
        return [ctx.python, str(ctx.repo / argv[0]), *argv[1:]], fsize
    (ctx.work / "snippet.py").write_text(changes["code"])
    return [ctx.python, "-c", SNIPPET, str(ctx.work / "snippet.py")], fsize


def judge_raise(proc, patterns: list[str]) -> Verdict:
    """A library call that must raise ValueError / TypeError naming the problem."""
    found = [line for line in proc.out.splitlines() if line.startswith("BENCH_RESULT ")]
    if proc.timed_out:
        return Verdict("hang", f"no answer within {proc.seconds:.0f} s")
    if not found:
        return Verdict("crash", f"exit {proc.rc}: {failure_message(proc.err)[:300]}")
    got = json.loads(found[-1].split(" ", 1)[1])
    if "raised" not in got:
        return Verdict("silent_wrong", f"returned {got['value']}")
    raised = f"{got['raised']}: {got['message'][:250]}"
    named = all(re.search(p, got["message"], re.I) for p in patterns)
    if got["raised"] in ("ValueError", "TypeError") and named:
        return Verdict("clear_error", raised)
    return Verdict("unclear_error" if named else "crash", raised)


def judge_found(ctx: Context, proc, patterns: list[str]) -> Verdict:
    """A case that expects a result: exit 0 and each pattern in its place (``out:``, ``err:`` or a file)."""
    if proc.timed_out:
        return Verdict("hang", f"no result within {proc.seconds:.0f} s")
    if proc.rc != 0:
        return Verdict("crash", f"exit {proc.rc} on a valid input: {failure_message(proc.err)[:300]}")
    for pattern in patterns:
        where, _, wanted = pattern.partition(":")
        text = {"out": proc.out, "err": proc.err}.get(where)
        if text is None:
            path = ctx.work / where
            text = path.read_text(errors="replace") if path.is_file() else ""
        if not re.search(wanted, text):
            return Verdict("silent_wrong", f"{wanted!r} not in {where}")
    return Verdict("ok", "right result")


def row_case(row: tuple, kind: str = "round4") -> Case:
    """The case of a row (of ``kind``); ``_env`` among its changes: variables of the child's environment ({work}:
    the case's folder; an empty value clears one the probe sets). A setup may name, in ``ctx.notes``, the folder a
    ``refuse_whole`` row keeps (``digest_folder``, default ``{work}/out``; ``digest``: its digest before) and paths
    a refusal must not leave (``absent``)."""
    name, category, about, entry, changes, expect, patterns, setup = row

    def run(ctx: Context) -> Verdict:
        if setup is not None:
            setup(ctx)
        given = dict(changes)
        env = {key: ctx.path(value) for key, value in given.pop("_env", {}).items()}
        argv, fsize = command(ctx, entry, given)
        corpus = ctx.work / "corpus"
        env |= {"GKV_DATA_DIR": str(corpus)} if corpus.is_dir() else {}
        proc = ctx.run(argv, 300, fsize=fsize, env=env or None)
        if expect == "raise":
            return judge_raise(proc, patterns)
        if expect == "result":
            return judge_found(ctx, proc, patterns)
        kept = Path(ctx.notes.pop("digest_folder", ctx.work / "out"))
        if expect == "refuse_whole" and folder_digest(kept) != ctx.notes.pop("digest"):
            return Verdict("data_lost", f"exit {proc.rc}: {kept} changed: {failure_message(proc.err)[:200]}")
        if expect == "machine":  # a failure of the machine, not of the input: any exit code but 0 (a full disk's 1)
            return judge_refusal(proc, patterns, before_load=False, code=None)
        absent = [Path(ctx.path(p)) for p in ctx.notes.pop("absent", [])]
        return judge_refusal(proc, patterns, before_load=expect != "refuse_late", must_not_exist=absent)

    quick = setup is None and expect in ("refuse", "refuse_late", "raise")  # one child refused, nothing run first
    return Case(name, category, kind, about, run, 900.0 if setup is not None else 360.0, quick)


def round4_cases() -> list[Case]:
    return [row_case(row) for row in ROWS]
