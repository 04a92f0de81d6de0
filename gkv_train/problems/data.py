"""Problem sets: local JSONL/JSON/Parquet files, hub datasets, presets for ../shared/data, and the built-in tasks
(``gkv_train.problems.tasks``, ``gkv_train.problems.retrieval``).

Every loader returns a ``datasets.Dataset`` with the columns ``id``, ``problem`` (the question text) and
``answer`` (the gold answer as a string), whatever the source's field names.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import datasets

from gkv_train.jsonio import file_identity
from gkv_train.problems.files import check_fields, checked_gold, read_records
from gkv_train.problems.retrieval import HAYSTACKS, RETRIEVAL_TASKS, TOKENS_PER_WORD, retrieval_task
from gkv_train.problems.tasks import (
    COPY_REQUIRED,
    COUNT_TO,
    COUNT_TO_MOST,
    LONG_RECALL_SENTENCES,
    PLACES,
    arithmetic_task,
    copy_places,
    copy_recall_task,
    count_recall_task,
    long_recall_task,
)


def find_data_dir() -> Path:
    """The folder of the presets' files: ``$GKV_DATA_DIR`` when set; else the first ``shared/data`` found beside
    the source checkout (``../shared/data`` from the repository) or from the working folder (``./shared/data``,
    ``../shared/data``); else the first of those (a missing preset file then names it and the variable)."""
    if os.environ.get("GKV_DATA_DIR"):
        return Path(os.environ["GKV_DATA_DIR"])
    candidates = [Path(__file__).resolve().parents[3] / "shared" / "data"]  # an installed package has none there
    candidates += [Path.cwd() / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    return next((c for c in candidates if c.is_dir()), candidates[0])


DATA_DIR = find_data_dir()


@dataclass(frozen=True)
class Preset:
    file: str
    question_field: tuple[str, ...]
    answer_field: str
    split: str = "test"  # the one split the file holds


PRESETS = {
    "aime24": Preset("aime24_test.jsonl", ("problem",), "answer"),
    "amc23": Preset("amc23_test.jsonl", ("problem",), "answer"),
    "math500": Preset("math500_test.jsonl", ("problem",), "answer"),
    "gsm8k": Preset("gsm8k_test.jsonl", ("question",), "answer"),
    "svamp": Preset("svamp_test.jsonl", ("Body", "Question"), "Answer"),
}
BUILTIN = "arithmetic"
COPY_RECALL = "copy_recall"  # the built-in task of the decode-time regime: see copy_recall_task
LONG_RECALL = "long_recall"  # the decode-time regime at reasoning lengths, a given story: see long_recall_task
COUNT_RECALL = "count_recall"  # a given note's code after a long count the model writes: see count_recall_task
GIVEN_TASKS = (LONG_RECALL, COUNT_RECALL)  # the built-in tasks whose completions begin with given text
PROMPT_TEMPLATE = "{problem}\nPut your final answer in \\boxed{{}}."


@dataclass
class DataConfig:
    """Where problems come from: ``path`` (local JSONL/JSON/Parquet) or ``name`` (preset: aime24, amc23,
    math500, gsm8k, svamp; ``arithmetic``, ``copy_recall``, ``long_recall`` or ``count_recall``, the built-in tasks;
    or a hub dataset).

    ``copy_recall`` is the built-in task of the decode-time regime (see ``copy_recall_task``); ``long_recall`` the
    same regime at reasoning lengths, a task whose completions begin with a given story
    (``long_recall_task``); ``count_recall`` the fact given mid-completion and the long part written by the model
    (``count_recall_task``).

    ``split`` picks a hub dataset's split or the built-in task's (train/test); a preset's file holds only its
    test split (another is refused); a local file is split by its name: ``path=data/{split}.jsonl`` (on a
    command line quoted for Hydra: ``"data.path='data/{split}.jsonl'"``) reads ``data/test.jsonl`` for
    ``split=test``, and a path without ``{split}`` is read whole.

    path: a local JSONL / JSON / Parquet file of problems (``{split}`` in it: the split's file); implies name=null.
    name: a preset (aime24, amc23, math500, gsm8k, svamp), a built-in task (arithmetic, copy_recall, long_recall,
        count_recall; the
        RULER-style retrieval tasks niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt:
        ``gkv_train.problems.retrieval``) or a hub dataset; None with ``path``.
    context: the retrieval tasks' prompt length, about this many tokens.
    haystack: the retrieval tasks' text around the needles: ``filler`` (RULER's repeated noise sentences) or
        ``questions`` (natural text: the GSM8K questions of the preset's file, shuffled; the train and test
        problems draw from disjoint halves of them).
    copy_required: what a copy_recall completion must copy before the number: ``last`` (the last sentence) or
        ``places`` (the middle sentences' "goes to <place>", in order, at least a ``copy_share`` of them, the
        number after them: the training variant).
    number_in_prompt: long_recall's prompt states the number (False: only the story's first sentence does).
    count_to: count_recall's last number.
    copy_share: with ``copy_required=places``, the share of the middle sentences' places a completion must copy
        in order (1.0: every one).
    answer_field: the field holding the gold answer.
    limit: the first N problems (None: all).
    prompt_template: the prompt around a problem (``{problem}`` is replaced by it).
    """

    path: str | None = None
    name: str | None = "arithmetic"
    question_field: Any = "question"  # a field, or a list of fields joined with a space
    answer_field: str = "answer"
    split: str = "train"  # a hub dataset's or the built-in task's; a preset holds only test; {split} in a path
    limit: int | None = 256
    levels: list[int] = field(default_factory=lambda: [1])  # built-in task difficulty levels (0-4)
    distractors: int = 0  # built-in task: facts about others placed between a problem's first fact and the rest
    sentences: int = 10  # copy_recall (1-12), long_recall (1-4096; 80: its ~1k-token story): the middle sentences
    copy_required: str = "last"
    copy_share: float = 1.0
    number_in_prompt: bool = True
    count_to: int = COUNT_TO
    context: int = 1024
    haystack: str = "filler"
    prompt_template: str = PROMPT_TEMPLATE
    config: str | None = None  # a hub dataset's configuration (subset), e.g. "main" for openai/gsm8k

    def check(self, key: str = "data") -> None:
        """Settings that are wrong before any file is read: ``limit`` >= 1 or None, a ``prompt_template`` that
        formats a problem; ValueError naming ``key`` (the configuration group: ``data``, ``eval_data``). Called by
        the job configurations that hold the group and by ``load_problems``."""
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"{key}.limit must be at least 1, or null for every problem; got {self.limit}")
        fields = [self.question_field] if isinstance(self.question_field, str) else self.question_field
        if not (isinstance(fields, (list, tuple)) and fields and all(isinstance(f, str) and f for f in fields)):
            raise ValueError(
                f"{key}.question_field={self.question_field!r}: expected a field name, or a list of them (a name that "
                "is a number is written quoted: '5')"
            )
        self.check_applies(key)
        most, task = (LONG_RECALL_SENTENCES, LONG_RECALL) if self.name == LONG_RECALL else (len(PLACES), COPY_RECALL)
        if not 1 <= self.sentences <= most:
            raise ValueError(f"{key}.sentences must be 1-{most} ({task}'s middle sentences), got {self.sentences}")
        if not 1 <= self.count_to <= COUNT_TO_MOST:
            raise ValueError(
                f"{key}.count_to must be 1-{COUNT_TO_MOST} (count_recall's last number), got {self.count_to}"
            )
        if self.copy_required not in COPY_REQUIRED:
            raise ValueError(
                f"{key}.copy_required must be one of {', '.join(COPY_REQUIRED)}, got {self.copy_required!r}"
            )
        if not (math.isfinite(self.copy_share) and 0 < self.copy_share <= 1):
            raise ValueError(f"{key}.copy_share must lie in (0, 1], got {self.copy_share}")
        if self.copy_share != 1 and (self.name != COPY_RECALL or self.copy_required != "places"):
            raise ValueError(f"{key}.copy_share applies to {key}.name=copy_recall with {key}.copy_required=places only")
        if (
            self.name == COPY_RECALL
            and self.copy_required == "places"
            and copy_places(self.copy_share, self.sentences) < 1
        ):
            raise ValueError(
                f"{key}.copy_share={self.copy_share} asks for none of the {self.sentences} places: at least "
                f"1/{self.sentences} = {1 / self.sentences:.3g}, so that a completion copies one"
            )
        if self.haystack not in HAYSTACKS:
            raise ValueError(f"{key}.haystack must be one of {', '.join(HAYSTACKS)}, got {self.haystack!r}")
        if self.haystack != "filler" and self.name not in RETRIEVAL_TASKS:
            raise ValueError(f"{key}.haystack applies to the retrieval tasks ({', '.join(RETRIEVAL_TASKS)}) only")
        if self.haystack == "questions" and not (DATA_DIR / PRESETS["gsm8k"].file).is_file():
            raise FileNotFoundError(
                f"{key}.haystack=questions reads {DATA_DIR / PRESETS['gsm8k'].file}, which does not exist: set "
                "GKV_DATA_DIR to the folder of the benchmark files"
            )
        check_prompt_template(self.prompt_template, key)

    def check_applies(self, key: str) -> None:
        """A task's own setting given for a task that does not read it (``TASK_KEYS``: its value differs from the
        default while ``name`` is none of the tasks that read it): ValueError naming the key and the tasks it applies
        to, so that a setting is never silently ignored."""
        defaults = DataConfig()
        for name, tasks in TASK_KEYS.items():
            if getattr(self, name) != getattr(defaults, name) and self.name not in tasks:
                task = f"{key}.name={self.name}" if self.name is not None else f"{key}.path (a data file)"
                raise ValueError(
                    f"{key}.{name}={getattr(self, name)!r} applies to {key}.name={' / '.join(tasks)} only, not to "
                    f"{task}, which does not read it: leave it out"
                )
        for name in ("question_field", "answer_field"):  # a file's or a hub dataset's fields
            if getattr(self, name) != getattr(defaults, name) and (self.name in BUILTIN_TASKS or self.name in PRESETS):
                raise ValueError(
                    f"{key}.{name}={getattr(self, name)!r} applies to a data file ({key}.path) or a hub dataset, not "
                    f"to {key}.name={self.name}, whose fields are its own: leave it out"
                )

    def identity(self) -> dict:
        """Everything that determines the problems and prompts: these settings and, for a local file (or a
        preset's), the file's identity (name, size, content hash)."""
        file = local_file(self.path, self.name, self.split)
        settings = asdict(self)
        for key in ("distractors", "config"):  # added later: at their defaults they leave earlier identities valid
            if not settings[key]:
                del settings[key]
        for key in ("number_in_prompt", "count_to"):  # added later: at their defaults earlier identities stay valid
            if settings[key] == getattr(DataConfig, key):
                del settings[key]
        if self.name not in (COPY_RECALL, LONG_RECALL):
            del settings["sentences"]  # only copy_recall and long_recall read it
        if self.name != COPY_RECALL or self.copy_required == "last":
            del settings["copy_required"]  # added later: at its default earlier identities stay valid
        if self.copy_share == 1:
            del settings["copy_share"]
        if self.name not in RETRIEVAL_TASKS:
            del settings["context"]  # only the retrieval tasks read it
        if self.haystack == "filler":
            del settings["haystack"]  # added later: at its default earlier identities stay valid
        else:  # the natural haystack's text is the GSM8K preset's file
            settings["haystack_file"] = file_identity(DATA_DIR / PRESETS["gsm8k"].file)
        return {**settings, "file": file_identity(file) if file is not None and file.is_file() else None}


def _retrieval(name: str) -> Callable[[DataConfig, int, str], datasets.Dataset]:
    """The built-in task of the retrieval task ``name`` (``TASKS``). The natural haystack's texts (the GSM8K
    preset's questions; each split draws from its half) must fill a prompt of ``context`` tokens in each half:
    ValueError naming the file and how much is missing, as a haystack cut short would make shorter prompts."""

    def problems(data: DataConfig, seed: int, key: str) -> datasets.Dataset:
        corpus = gsm8k_questions(None) if data.haystack == "questions" else None
        for half, which in () if corpus is None else ((corpus[0::2], "train"), (corpus[1::2], "test")):
            have, words = sum(len(text.split()) for text in half), data.context / TOKENS_PER_WORD
            if have < words:
                raise ValueError(
                    f"{key}.haystack=questions: the {which} half of {DATA_DIR / PRESETS['gsm8k'].file} holds {have} "
                    f"words, fewer than the about {words:.0f} a {key}.context={data.context} prompt needs: a longer "
                    f"file, or a shorter {key}.context"
                )
        return retrieval_task(name, data.limit, data.split, seed, data.context, corpus)

    return problems


# The built-in tasks: name -> the problems of ``data`` (its limit, split and the task's own settings) drawn at
# ``seed``, errors naming the configuration group ``key``; a new task is one entry here (and its keys in TASK_KEYS)
TASKS: dict[str, Callable[[DataConfig, int, str], datasets.Dataset]] = {
    BUILTIN: lambda d, seed, key: arithmetic_task(d.limit, d.split, seed, tuple(d.levels), d.distractors),
    COPY_RECALL: lambda d, seed, key: copy_recall_task(
        d.limit, d.split, seed, d.sentences, d.copy_required, d.copy_share
    ),
    LONG_RECALL: lambda d, seed, key: long_recall_task(d.limit, d.split, seed, d.sentences, d.number_in_prompt),
    COUNT_RECALL: lambda d, seed, key: count_recall_task(d.limit, d.split, seed, d.count_to),
    **{name: _retrieval(name) for name in RETRIEVAL_TASKS},
}
BUILTIN_TASKS = tuple(TASKS)

# The settings that only some built-in tasks read: name -> those tasks (``DataConfig.check_applies``)
TASK_KEYS = {
    "levels": (BUILTIN,),
    "distractors": (BUILTIN,),
    "sentences": (COPY_RECALL, LONG_RECALL),
    "copy_required": (COPY_RECALL,),
    "number_in_prompt": (LONG_RECALL,),
    "count_to": (COUNT_RECALL,),
    "context": RETRIEVAL_TASKS,
}

GIVEN = "continuation"  # a problem set's column of text that its completions begin with (long_recall's story)


def check_sampled_only(problems, key: str, who: str) -> None:
    """Refuse ``problems`` (the configuration group ``key``'s) when their completions begin with given text (a
    ``continuation`` column: ``long_recall``'s; a local file's columns other than the question and answer are not
    read) for ``who``, a consumer that would take that text for the model's own tokens (teacher traces; a
    distillation configuration refuses long_recall itself)."""
    if GIVEN in problems.column_names:
        raise ValueError(
            f"{key}: the problems have a {GIVEN!r} column (text every completion begins with, fed as given: "
            f"long_recall's story), which {who} would take for the model's own tokens or leave out; "
            "evaluate them (scripts/evaluate.py, or eval_data at the end of a training run) or train on them with a "
            "GRPO recipe"
        )


def check_prompt_template(template: str, key: str = "data") -> None:
    """``template`` (the configuration key ``<key>.prompt_template``) formats a prompt from a problem: its one field
    is ``{problem}``, which it holds (without it every prompt would be the same text); ValueError naming the
    problem otherwise."""
    what = f"{key}.prompt_template={template!r}"
    fix = "its one field is {problem} (a literal brace is written {{ or }})"
    try:
        parsed = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)]
    except ValueError as err:  # a lone brace
        raise ValueError(f"{what} is not a format string ({err}): {fix}") from None
    fields = {name for name, _, _ in parsed if name is not None}
    styled = [f"{{{name}{'!' + c if c else ''}{':' + spec if spec else ''}}}" for name, spec, c in parsed if spec or c]
    if styled:  # a width or conversion pads or rewrites the problem: never needed, and a width can be gigabytes
        raise ValueError(f"{what} formats its field ({styled[0][:40]}): write {{problem}} alone; {fix}")
    other = sorted(fields - {"problem"})
    if other:
        raise ValueError(f"{what} has the field(s) {', '.join('{' + f + '}' for f in other)}: {fix}")
    if "problem" not in fields:
        raise ValueError(f"{what} has no {{problem}} field: every prompt would be the same text")


def load_problems(data: DataConfig, seed: int = 0, key: str = "data") -> datasets.Dataset:
    """The problems ``data`` names: a local file (``data.path``) or a preset, the built-in task or a hub dataset
    (``data.name``), the first ``data.limit`` of them (the built-in task draws its problems with ``seed``); errors
    name the configuration group ``key`` (``data``, ``eval_data``)."""
    data.check(key)
    path, name, question_field, answer_field = data.path, data.name, data.question_field, data.answer_field
    split, limit = data.split, data.limit
    if (path is None) == (name is None):
        raise ValueError(f"give exactly one of {key}.path (a local file) or {key}.name (a preset or hub dataset)")
    if name in TASKS:
        return TASKS[name](data, seed, key)
    if data.config is not None and (path is not None or name in PRESETS):
        raise ValueError(
            f"data.config={data.config!r} selects a hub dataset's configuration; {path or name} is a local file"
        )
    if name in PRESETS:
        preset = PRESETS[name]
        if split != preset.split:
            raise ValueError(
                f"{name} in {DATA_DIR} holds only its {preset.split} split, not {split!r}: set "
                f"data.split={preset.split} "
                "(or data.path to your own file)"
            )
        question_field, answer_field = list(preset.question_field), preset.answer_field
    fields = [question_field] if isinstance(question_field, str) else list(question_field)
    path = local_file(path, name, split)
    if path is not None:
        if Path(path).is_dir():
            raise IsADirectoryError(f"dataset file {path} is a folder, not a file")
        if not Path(path).is_file():
            hint = f" (the {name} preset's file; set GKV_DATA_DIR to the folder holding it)" if name in PRESETS else ""
            raise FileNotFoundError(f"dataset file {path} does not exist{hint}")
        records = read_records(Path(path))
        check_fields(records, [*fields, answer_field], path)
        locations = [where for where, _ in records]
        raw = [row for _, row in records]
    else:
        try:
            raw = datasets.load_dataset(name, data.config, split=split)
        except Exception as err:  # whichever error the hub or its client raises: named with what else name can be
            raise ValueError(
                f"{key}.name={name!r} is not a preset ({', '.join(PRESETS)}), a built-in task "
                f"({', '.join(BUILTIN_TASKS)}) or a hub dataset that loads here ({type(err).__name__}: "
                f"{' '.join(str(err).split())[:300]})"
            ) from None
        missing = [f for f in [*fields, answer_field] if f not in raw.column_names]
        if missing:
            raise ValueError(
                f"dataset {name} has no field(s) {missing}; its fields are {raw.column_names} "
                "(set data.question_field / data.answer_field)"
            )
        locations = None
    if limit is not None:
        raw = raw[:limit] if isinstance(raw, list) else raw.select(range(min(limit, len(raw))))
    rows = [
        {
            "id": i,
            "problem": " ".join(str(row[f]).strip() for f in fields),
            "answer": checked_gold(
                row, answer_field, locations[i] if locations else f"dataset {name} ({split}) row {i}"
            ),
        }
        for i, row in enumerate(raw)
    ]
    for i, row in enumerate(rows):
        if not row["problem"].strip():
            where = records[i][0] if path is not None else f"dataset {name} ({split}) row {i}"
            raise ValueError(f"{where}: the question ({', '.join(fields)}) is empty")
    return datasets.Dataset.from_list(rows)


def local_file(path: str | None, name: str | None, split: str) -> Path | None:
    """The local file problems are read from: ``path`` (with ``{split}`` replaced by the split), or a preset's
    file under ``DATA_DIR``; None for the built-in task and hub datasets."""
    if name in PRESETS:
        return DATA_DIR / PRESETS[name].file
    return None if path is None else Path(path.replace("{split}", split))


def gsm8k_questions(n: int | None) -> list[str]:
    """The first ``n`` GSM8K test questions (the preset's file; None: all), for benchmarks, checks and the
    retrieval tasks' natural haystack."""
    path = DATA_DIR / PRESETS["gsm8k"].file
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: set GKV_DATA_DIR to the folder of the benchmark files")
    found = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(itertools.islice(f, n), 1):
            try:
                question = json.loads(line).get("question")
            except (ValueError, AttributeError) as err:
                raise ValueError(f"{path}:{number}: not a JSON object ({err})") from None
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"{path}:{number}: no question (a non-empty text under 'question')")
            found.append(question)
    return found
