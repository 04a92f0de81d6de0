"""The built-in procedural tasks: ``arithmetic`` (word problems at difficulty levels 0-4, optionally with
distractor sentences), ``copy_recall`` (copy a story and finish its last sentence with a number from its first:
the decode-time regime) and ``long_recall`` (the same number after a long story the completion begins with,
teacher-forced: the decode-time regime at reasoning lengths). Each is deterministic in its seed, draws train and
test from separate streams that never share a problem (``gkv_train.problems.splits``) and returns a ``datasets.Dataset``
with ``id``, ``problem`` and ``answer``.
"""

from __future__ import annotations

import math
import random

import datasets

from gkv_rewards.extract import EACH_LINE
from gkv_train.problems.splits import check_builtin_request, held_out_split

NAMES = ["Ava", "Ben", "Cleo", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "June", "Kai", "Lena", "Milo", "Nora"]
ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards", "stamps", "cookies"]


# The operations each level draws: one or more patterns, each a list of the operation sets its steps draw from
# (``_pattern`` picks one); "-" with nothing left becomes "+".
LEVEL_PATTERNS = {
    0: [[]],
    1: [["+-"]],
    2: [["*"], ["+-", "+-"]],
    3: [["+-*", "+-", "+-"]],
    4: [["+-*"] * 3 + ["/"], ["+-*"] * 4 + ["/"]],
}
DISTRACTOR_SENTENCES = (len(NAMES) - 1) * 19 * (len(ITEMS) - 1)  # another name, 2-20, another item


def _pattern(rng: random.Random, level: int) -> list[str]:
    """The operation sets of one problem's steps at ``level`` (a pattern of ``LEVEL_PATTERNS``)."""
    patterns = LEVEL_PATTERNS[level]
    if level == 2:
        return patterns[0] if rng.random() < 0.4 else patterns[1]
    if level == 4:
        return patterns[rng.randint(3, 4) - 3]
    return patterns[0]


def _step_options(op: str, total: int, who: str, item: str) -> list[tuple[str, int]]:
    """Every (sentence, new total) one step of operation ``op`` can write when ``who`` holds ``total`` ``item``."""
    if op == "-" and total == 0:
        op = "+"  # nothing left to give away: answers stay non-negative
    if op == "+":
        return [(f"{who} gets {n} more {item}.", total + n) for n in range(1, 21)]
    if op == "-":
        return [(f"{who} gives away {n} {item}.", total - n) for n in range(1, min(total, 20) + 1)]
    if op == "*":
        return [(f"Then the number of {item} {who} has becomes {n} times as large.", total * n) for n in range(2, 6)]
    divisors = [d for d in range(2, 7) if total % d == 0] or [1]
    return [
        (
            f"{who} splits the {item} into {n} equal groups and keeps one group."
            if n > 1
            else f"{who} keeps all the {item}.",
            total // n,
        )
        for n in divisors
    ]


def _problem(rng: random.Random, level: int, distractors: int = 0) -> tuple[str, int]:
    """One word problem of a difficulty level and its integer answer.

    0: no operation (recall the first fact: with ``distractors``, a lookup); 1: one addition or subtraction of two
    numbers up to 20; 2: one multiplication, or two additions/subtractions;
    3: a chain of three operations; 4: four or five operations, with a division that comes out even.
    ``distractors``: that many sentences about other people's other items ("Ben has 12 marbles.") between the
    first fact and the rest, so that the fact the answer needs sits far back in the prompt: a tight KV budget
    that keeps the wrong tokens loses it.
    """
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    total = rng.randint(2, 20)
    text = [f"{who} has {total} {item}."]
    others = [n for n in NAMES if n != who]
    other_items = [i for i in ITEMS if i != item]
    for _ in range(distractors):
        text.append(f"{rng.choice(others)} has {rng.randint(2, 20)} {rng.choice(other_items)}.")
    steps = [ops if len(ops) == 1 else rng.choice(ops) for ops in _pattern(rng, level)]
    for op in steps:
        sentence, total = rng.choice(_step_options(op, total, who, item))  # as randint over the numbers
        text.append(sentence)
    text.append(f"How many {item} does {who} have now?")
    return " ".join(text), total


def problem_count(levels: tuple[int, ...], distractors: int = 0) -> int:
    """How many distinct problems ``_problem`` can write at ``levels`` with ``distractors``: per level and pattern,
    the distinct sentence sequences from every start (2-20), x names x items x distractor sentences."""
    count = 0
    for level in set(levels):
        for pattern in LEVEL_PATTERNS[level]:
            paths = {start: 1 for start in range(2, 21)}  # total -> distinct sentence sequences reaching it
            for ops in pattern:
                after: dict[int, int] = {}
                for total, ways in paths.items():
                    options = {s: t for op in ops for s, t in _step_options(op, total, "W", "I")}  # distinct texts
                    for new_total in options.values():
                        after[new_total] = after.get(new_total, 0) + ways
                paths = after
            count += sum(paths.values())
    return count * len(NAMES) * len(ITEMS) * DISTRACTOR_SENTENCES**distractors


def arithmetic_task(
    n: int | None, split: str = "train", seed: int = 0, levels: tuple[int, ...] = (1, 2), distractors: int = 0
) -> datasets.Dataset:
    """The built-in task: ``n`` procedural arithmetic word problems with exact integer answers, deterministic in
    ``seed`` (``distractors``: see ``_problem``). ``train`` and ``test`` come from separate random streams and
    never share a problem: the test split is the distinct problems of the first ``TEST_POOL`` draws of its stream
    (n None: all of them), and train draws from the rest of the space (``problem_count``). ValueError when ``n``
    exceeds what the split can hold."""
    check_builtin_request("the built-in task", split, n)
    bad = [lv for lv in levels if lv not in (0, 1, 2, 3, 4)]
    if bad or not levels:
        raise ValueError(f"built-in task levels are 0-4, got {list(levels)}")
    if distractors < 0:
        raise ValueError(f"distractors must be >= 0, got {distractors}")

    def stream(which: str):
        rng = random.Random(f"{seed}:{which}")
        while True:
            level = levels[rng.randrange(len(levels))]
            yield (*_problem(rng, level, distractors), level)

    task = f"the built-in task at levels {sorted(set(levels))} with {distractors} distractors"
    chosen = held_out_split(stream, n, split, task, problem_count(levels, distractors), "add levels / distractors")
    rows = [
        {"id": i, "problem": text, "answer": str(answer), "level": level}
        for i, (text, answer, level) in enumerate(chosen)
    ]
    return datasets.Dataset.from_list(rows)


PLACES = [
    "the park",
    "the library",
    "the beach",
    "the market",
    "the zoo",
    "the museum",
    "the garden",
    "the lake",
    "the school",
    "the farm",
    "the shop",
    "the pool",
]
ACTIVITIES = [
    "reads a book",
    "eats a sandwich",
    "watches the birds",
    "talks to a friend",
    "draws a picture",
    "plays a game",
    "drinks some water",
    "takes a short nap",
    "sings a song",
    "looks at the clouds",
    "writes a letter",
    "feeds the ducks",
]
COPY_REQUIRED = ("last", "places")  # what a copy_recall completion must copy besides the number
COPY_INSTRUCTION = "Repeat this text word for word, and finish the last sentence with the right number:"


def _copy_recall_problem(rng: random.Random, sentences: int) -> tuple[str, int, str, list[str]]:
    """One copy_recall problem, its answer, its last sentence and its middle sentences' places: a number (10-99)
    in the first sentence, ``sentences`` middle sentences, and a last sentence that ends where the number belongs."""
    who, item, number = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(10, 99)
    text, places = [f"{who} has {number} {item}."], []
    for place, act in zip(rng.sample(PLACES, sentences), rng.sample(ACTIVITIES, sentences)):
        text.append(f"Then {who} goes to {place} and {act}.")
        places.append(f"goes to {place}")
    text.append(f"At the end of the day, {who} counts the {item} and still has")
    return f"{COPY_INSTRUCTION}\n\n{' '.join(text)}", number, text[-1], places


def copy_places(share: float, places: int) -> int:
    """How many of ``places`` middle sentences a copy_recall completion with ``copy_required=places`` must copy: a
    ``share`` of them, rounded up."""
    return math.ceil(share * places - 1e-9)


def copy_recall_space(sentences: int) -> int:
    """How many distinct problems ``_copy_recall_problem`` can write with ``sentences`` middle sentences."""
    return len(NAMES) * len(ITEMS) * 90 * (math.perm(len(PLACES), sentences) * math.perm(len(ACTIVITIES), sentences))


def copy_recall_task(
    n: int | None,
    split: str = "train",
    seed: int = 0,
    sentences: int = 10,
    required: str = "last",
    share: float = 1.0,
) -> datasets.Dataset:
    """The built-in task of the decode-time regime: ``n`` problems that ask the model to copy a short story whose
    first sentence holds a number and whose last sentence stops where that number belongs ("... and still has");
    the answer is the number. Copying writes the story into the completion (SmolLM2-135M: about 120 tokens at
    10 sentences), so a compressed cache is compressed many times while it is written, and the number, from the
    prompt and the completion's first sentence, is needed again only at the very end, far outside the recent
    window: a cache that drops it guesses.

    What a completion must copy besides the number (the ``required`` column, ``gkv_rewards.extract.copied``):
    ``required="last"``: the story's last sentence verbatim, so the number comes where it belongs, at the end of
    the copy. Without that a model that no longer sees the story writes the number straight away (SmolLM2 under
    G-KV at budget 64: 44 tokens instead of 128, 47 % of numbers right but none after the last sentence), and the
    task would measure prompt compression again. ``required="places"`` (the training variant): at least a
    ``share`` of the middle sentences' "goes to <place>", in order, with the number read after them. A model
    trained under a compressed cache can then no longer shorten the copy to keep the number in its cache (RL-Sparse
    learned that on the base task): the copy itself is the work the cache must support, and the graded reward
    ``gkv_rewards.functions.copy_score`` (the share copied when the number is right) pays for every place.
    Splits as ``arithmetic_task``: train and test never share a problem."""
    check_builtin_request("the built-in task copy_recall", split, n)
    if not 1 <= sentences <= len(PLACES):
        raise ValueError(f"data.sentences must be 1-{len(PLACES)} for copy_recall, got {sentences}")
    if required not in COPY_REQUIRED:
        raise ValueError(f"data.copy_required must be one of {', '.join(COPY_REQUIRED)}, got {required!r}")

    def stream(which: str):
        rng = random.Random(f"{seed}:copy_recall:{which}")
        while True:
            yield _copy_recall_problem(rng, sentences)

    def needed(last: str, places: list[str]) -> str:
        if required == "last":
            return last
        return "\n".join([f"at least {copy_places(share, len(places))} of:", *places])

    task = f"the built-in task copy_recall with {sentences} sentences"
    chosen = held_out_split(stream, n, split, task, copy_recall_space(sentences), "add sentences")
    rows = [
        {"id": i, "problem": text, "answer": str(answer), "required": needed(last, places)}
        for i, (text, answer, last, places) in enumerate(chosen)
    ]
    return datasets.Dataset.from_list(rows)


LONG_RECALL_SENTENCES = 4096  # long_recall's most middle sentences (about 13 tokens each on SmolLM2)


def _long_recall_problem(rng: random.Random, sentences: int, number_in_prompt: bool) -> tuple[str, int, str, str]:
    """One long_recall problem, its answer, its last sentence and the completion's given beginning: a short prompt
    that states a number (10-99; ``number_in_prompt=False``: that asks for the story without stating it), and a
    story that states it in its first sentence, goes on for ``sentences`` middle sentences (places and activities
    drawn with replacement) and stops where the number belongs."""
    who, item, number = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(10, 99)
    ask = f"Tell the story of {who}'s day, then say how many {item} {who} still has."
    prompt = f"{who} has {number} {item}. {ask}" if number_in_prompt else ask
    story = [f"{who} has {number} {item}."]
    story += [f"Then {who} goes to {rng.choice(PLACES)} and {rng.choice(ACTIVITIES)}." for _ in range(sentences)]
    story.append(f"At the end of the day, {who} counts the {item} and still has")
    return prompt, number, story[-1], " ".join(story)


def long_recall_task(
    n: int | None, split: str = "train", seed: int = 0, sentences: int = 80, number_in_prompt: bool = True
) -> datasets.Dataset:
    """The decode-time regime at reasoning lengths: ``n`` problems whose completion begins with a
    given story (the ``continuation`` column: the rollout engine feeds it as if sampled, compressing the cache every
    interval as it goes, ``RolloutEngine.generate(prefixes=...)``) and ends with the number the model samples.

    The prompt states a number (``number_in_prompt=False``: it does not, so that a cache that keeps the prompt
    cannot hold it); the story states it in its first sentence, then ``sentences`` middle sentences
    (SmolLM2-135M: about 13 tokens each, so 80 make a completion of about 1,050 tokens) and a last sentence that
    stops where the number belongs ("... and still has"). A cache compressed while the story is written must still
    hold the number at the end, some thousand tokens and dozens of compression rounds later. The story is given
    because a small model cannot write a thousand faithful tokens (SmolLM2-135M loops within a hundred): what is
    measured is the cache, not the model's writing. The ``required`` column is the last sentence
    (``gkv_rewards.extract.copied``: the number must follow it). The GRPO trainer trains on the sampled tokens
    after the story only (``CompressedGRPOTrainer``: TRL's ``env_mask``); distillation refuses it. Splits as
    ``arithmetic_task``."""
    check_builtin_request("the built-in task long_recall", split, n)
    if not 1 <= sentences <= LONG_RECALL_SENTENCES:
        raise ValueError(f"data.sentences must be 1-{LONG_RECALL_SENTENCES} for long_recall, got {sentences}")

    def stream(which: str):
        rng = random.Random(f"{seed}:long_recall:{sentences}:{which}")
        while True:  # distinct by the prompt and the story's first sentence (which states the number)
            prompt, answer, last, story = _long_recall_problem(rng, sentences, number_in_prompt)
            yield (prompt, story[: story.index(".")]), answer, last, story

    space = len(NAMES) * len(ITEMS) * 90  # distinct (who, item, number): the splits never share one
    task = f"the built-in task long_recall with {sentences} sentences"
    chosen = held_out_split(stream, n, split, task, space, "add sentences")
    rows = [
        {"id": i, "problem": prompt, "answer": str(answer), "required": last, "continuation": story}
        for i, ((prompt, _), answer, last, story) in enumerate(chosen)
    ]
    return datasets.Dataset.from_list(rows)


COUNT_TO = 160  # count_recall's last number by default (SmolLM2: about 530 tokens of counting)
COUNT_TO_MOST = 4096
COUNT_NOTE = "Note: the code is {code}.\n"  # the given beginning of every count_recall completion
COUNT_INSTRUCTION = (
    "Read the note. Then count from 1 to {count_to}, one number a line. After {count_to}, give the note's code."
)


def count_recall_restated(completion: str, code: str, count_to: int) -> float | None:
    """How far a ``count_recall`` completion (its given note, ``COUNT_NOTE``, first) had counted when its own text
    first restated the note's ``code`` before the count's end (the first line ``count_to``, else its last number
    line): the highest number 1-``count_to`` written as a whole line before that, as a share of ``count_to`` (0.0:
    before counting); None when the code is not restated before the count's end (given after the count, never, or
    no count written). A line counts as the count's when it is a number 1-``count_to`` alone on it; any other line
    holding the code restates it."""
    own = completion.split("\n")
    if own and own[0].strip() == COUNT_NOTE.format(code=code).strip():
        own = own[1:]
    short = {i: line.strip() for i, line in enumerate(own) if len(line.strip()) <= 5}  # int() of any length: slow
    numbers = {i: int(text) for i, text in short.items() if text.isdecimal() and 1 <= int(text) <= count_to}
    first = next((i for i, line in enumerate(own) if code in line and i not in numbers), None)
    end = next((i for i, n in numbers.items() if n == count_to), max(numbers, default=None))
    if first is None or end is None or first > end:
        return None
    return max((n for i, n in numbers.items() if i < first), default=0) / count_to


def _count_recall_problem(rng: random.Random, count_to: int) -> tuple[str, int, str, str, str]:
    """One count_recall problem: its note (the given beginning of its completions, with the code), the code (a
    four-digit number, the answer), the prompt, the required lines and the completion that solves it."""
    code = rng.randint(1000, 9999)
    numbers = [str(i) for i in range(1, count_to + 1)]
    solution = "\n".join([*numbers, f"Code: \\boxed{{{code}}}"])
    return COUNT_NOTE.format(code=code), code, COUNT_INSTRUCTION.format(count_to=count_to), numbers, solution


def count_recall_task(n: int | None, split: str = "train", seed: int = 0, count_to: int = COUNT_TO) -> datasets.Dataset:
    """The decode-time regime where the fact arrives during decoding and the model writes the long part itself:
    ``n`` problems whose completion begins with a given note holding a code (the ``continuation`` column, fed
    through the compressed cache like ``long_recall``'s story: a tool output's shape, no loss on it), after which
    the model counts from 1 to ``count_to``, one number a line, and then writes the code. The prompt is the same
    for every problem and never holds the code, so a cache that keeps the prompt cannot help; counting needs
    only the last line, so the code is the one fact the end needs from far back (SmolLM2-135M: about 530 tokens
    of counting at 160, 33 compressions at interval 16).

    ``required``: ``each line:`` and the numbers 1 to ``count_to`` (``gkv_rewards.extract.copied``: each a whole
    line, in order; other lines, such as the code restated, may come between), the answer read after the last;
    reward ``gkv_rewards.functions.staged_score`` (half for the share counted, half for the right code after
    the whole count). ``solution``: the completion after the note that solves it (``gkv-train traces
    source=solution`` writes it as a trace, to teach a base model the skill). Splits as ``arithmetic_task``,
    distinct by the code (9,000 problems)."""
    check_builtin_request("the built-in task count_recall", split, n)
    if not 1 <= count_to <= COUNT_TO_MOST:
        raise ValueError(f"data.count_to must be 1-{COUNT_TO_MOST} for count_recall, got {count_to}")

    def stream(which: str):
        rng = random.Random(f"{seed}:count_recall:{which}")
        while True:
            yield _count_recall_problem(rng, count_to)

    task = f"the built-in task count_recall to {count_to}"
    chosen = held_out_split(stream, n, split, task, 9000, "fewer problems")
    rows = [
        {
            "id": i,
            "problem": prompt,
            "answer": str(code),
            "required": "\n".join([EACH_LINE, *numbers]),
            "continuation": note,
            "solution": solution,
        }
        for i, (note, code, prompt, numbers, solution) in enumerate(chosen)
    ]
    return datasets.Dataset.from_list(rows)
