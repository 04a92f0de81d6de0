"""RULER-style retrieval tasks, generated here (no download): needles in a haystack and variable tracking.

Each prompt is a haystack of about ``context`` tokens with facts hidden at random depths, then a question. The
haystack (``HAYSTACKS``): ``filler``, RULER's noise haystack ("The grass is green. The sky is blue. ..."), or
``questions``, natural text (the paper's haystack is essays): GSM8K's questions in a random order, the train
problems drawing from the even-numbered ones and the test problems from the odd-numbered ones. The answer is a
number, or for the multi-value and multi-query tasks several: then the ``required`` column lists those before the
last, one per line, and a completion is right when it writes them in that order (``copies_in_order``) and then
the last (its final answer, read after them).
That is RULER's ``string_match_all`` made binary and ordered (the order asked, or the order the needles appear);
a model that lists the numbers any other way is graded wrong. The tasks (``data.name=...``), after RULER (Hsieh et
al., 2024):

* ``niah_single``: one needle "One of the special magic numbers for <key> is: <number>."; asked for the key.
* ``niah_multikey``: four needles with different keys; asked for one of them.
* ``niah_multivalue``: four needles with the same key and different numbers; asked for all of them.
* ``niah_multiquery``: four needles with different keys; asked for two of them (the answer lists both).
* ``vt`` (variable tracking): "VAR A = <number>." then a chain "VAR B = VAR A." ... of ``VT_HOPS`` hops spread
  over the haystack, and a second chain from another number; asked for the last variable of the first chain.

Lengths are approximate: the haystack is counted in words at ``TOKENS_PER_WORD`` (SmolLM2's tokenizer on the
filler). Splits as the other built-in tasks: train and test never share a problem (``gkv_train.problems.splits``).
"""

from __future__ import annotations

import random

import datasets

from gkv_train.problems.splits import check_builtin_request, held_out_split

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
TOKENS_PER_WORD = 1.3
KEY_WORDS = [
    "amber",
    "bold",
    "calm",
    "dusty",
    "eager",
    "frosty",
    "gentle",
    "hollow",
    "icy",
    "jolly",
    "keen",
    "lucky",
    "misty",
    "noble",
    "odd",
    "proud",
    "quiet",
    "rapid",
    "silent",
    "tidy",
]
KEY_NOUNS = [
    "anchor",
    "badger",
    "candle",
    "dragon",
    "falcon",
    "garden",
    "harbor",
    "island",
    "jacket",
    "kettle",
    "lantern",
    "meadow",
    "needle",
    "orchard",
    "pepper",
    "quartz",
    "river",
    "saddle",
    "tunnel",
    "violin",
]
INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards."
)
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_HOPS = 4
NEEDLES = 4
HAYSTACKS = ("filler", "questions")


def haystack(rng: random.Random, context: int, facts: list[str], corpus: list[str] | None = None) -> str:
    """Text of about ``context`` tokens with ``facts`` inserted, in order, at random depths between its pieces:
    the filler's sentences repeated, or with ``corpus`` its texts in a random order (as many as the length
    needs)."""
    words = context / TOKENS_PER_WORD
    if corpus is None:
        sentences = [s.strip() + "." for s in FILLER.split(".") if s.strip()]
        words_per = sum(len(s.split()) for s in sentences) / len(sentences)
        count = max(len(facts) + 1, round(words / words_per))
        text = [sentences[i % len(sentences)] for i in range(count)]
    else:
        text, have = [], 0
        for i in rng.sample(range(len(corpus)), len(corpus)):
            if have >= words and len(text) > len(facts):
                break
            text.append(" ".join(corpus[i].split()))
            have += len(text[-1].split())
        count = len(text)
    depths = sorted(rng.sample(range(count + 1), len(facts)))
    for offset, (depth, fact) in enumerate(zip(depths, facts)):
        text.insert(depth + offset, fact)
    return " ".join(text)


def _key(rng: random.Random, taken: set[str]) -> str:
    while True:
        key = f"{rng.choice(KEY_WORDS)}-{rng.choice(KEY_NOUNS)}"
        if key not in taken:
            taken.add(key)
            return key


def _number(rng: random.Random, taken: set[int]) -> int:
    while True:
        value = rng.randint(100000, 999999)
        if value not in taken:
            taken.add(value)
            return value


def needle(key: str, value: int) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def _niah(rng: random.Random, task: str, context: int, corpus: list[str] | None) -> tuple[str, str]:
    keys, values = set(), set()
    if task == "niah_multivalue":
        key = _key(rng, keys)
        pairs = [(key, _number(rng, values)) for _ in range(NEEDLES)]
        asked = [key]
    else:
        pairs = [(_key(rng, keys), _number(rng, values)) for _ in range(1 if task == "niah_single" else NEEDLES)]
        asked = [k for k, _ in rng.sample(pairs, 2 if task == "niah_multiquery" else 1)]
    order = rng.sample(pairs, len(pairs))  # where each needle lies is independent of which is asked
    text = haystack(rng, context, [needle(k, v) for k, v in order], corpus)
    if task == "niah_multivalue":
        question = f"What are all the special magic numbers for {asked[0]} mentioned in the provided text?"
        answer = [v for k, v in order]  # in the order they appear
    elif task == "niah_multiquery":
        question = f"What are the special magic numbers for {asked[0]} and {asked[1]} mentioned in the provided text?"
        answer = [dict(pairs)[k] for k in asked]
    else:
        question = f"What is the special magic number for {asked[0]} mentioned in the provided text?"
        answer = [dict(pairs)[asked[0]]]
    return f"{INTRO}\n\n{text}\n\n{question}", [str(v) for v in answer]


def _vt(rng: random.Random, context: int, corpus: list[str] | None) -> tuple[str, str]:
    names = rng.sample([f"{a}{b}{c}" for a in "ABCDEFGHJK" for b in "LMNPQRSTUV" for c in "WXYZ"], 2 * (VT_HOPS + 1))
    values: set[int] = set()
    chains = []
    for c in range(2):
        chain = names[c * (VT_HOPS + 1) : (c + 1) * (VT_HOPS + 1)]
        facts = [f"VAR {chain[0]} = {_number(rng, values)}."] + [
            f"VAR {chain[i]} = VAR {chain[i - 1]}." for i in range(1, len(chain))
        ]
        chains.append((chain, facts))
    # the two chains interleaved, each in its own order
    facts, left = [], [list(f) for _, f in chains]
    while any(left):
        pick = rng.choice([i for i, f in enumerate(left) if f])
        facts.append(left[pick].pop(0))
    text = haystack(rng, context, facts, corpus)
    chain = chains[0][0]
    value = chains[0][1][0].split("= ")[1].rstrip(".")
    return f"{VT_INTRO}\n\n{text}\n\nWhat is the value of VAR {chain[-1]}?", [value]


RETRIEVAL_TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt")


def retrieval_task(
    name: str,
    n: int | None,
    split: str = "train",
    seed: int = 0,
    context: int = 1024,
    corpus: list[str] | None = None,
) -> datasets.Dataset:
    """``n`` problems of the retrieval task ``name`` (``RETRIEVAL_TASKS``) with prompts of about ``context``
    tokens; columns ``id``, ``problem``, ``answer`` (the number, or the last of several) and ``required`` (the
    numbers before the last, one per line, when there are several; else None). ``corpus``: the natural haystack's
    texts (None: the filler); train problems use its even-numbered texts, test problems its odd-numbered ones."""
    if name not in RETRIEVAL_TASKS:
        raise ValueError(f"unknown retrieval task {name!r}; choose one of {', '.join(RETRIEVAL_TASKS)}")
    check_builtin_request(f"the built-in task {name}", split, n)
    if context < 64:
        raise ValueError(f"data.context must be at least 64 tokens for {name}, got {context}")

    def stream(which: str):
        tag = f"{seed}:{name}:{context}:{which}" if corpus is None else f"{seed}:{name}:{context}:questions:{which}"
        rng = random.Random(tag)
        texts = None if corpus is None else corpus[0 if which == "train" else 1 :: 2]
        while True:
            yield _vt(rng, context, texts) if name == "vt" else _niah(rng, name, context, texts)

    chosen = held_out_split(stream, n, split, f"the built-in task {name}", 10**9, "")
    rows = [
        {"id": i, "problem": p, "answer": values[-1], "required": "\n".join(values[:-1]) if len(values) > 1 else None}
        for i, (p, values) in enumerate(chosen)
    ]
    return datasets.Dataset.from_list(rows)
