import dataclasses
import json
import re

import pytest

from gkv_train.config.train_config import DistillTrainConfig, GRPOTrainConfig
from gkv_train.problems.data import DataConfig, load_problems
from gkv_train.problems.tasks import arithmetic_task


@pytest.mark.parametrize(
    "name, rows, first_answer",
    [("gsm8k", 1319, "18"), ("svamp", 1000, "145"), ("amc23", 40, "27"), ("aime24", 30, "204"), ("math500", 500, None)],
)
def test_presets_load_gold_answers(name, rows, first_answer):
    data = load_problems(DataConfig(name=name, split="test", limit=None))
    assert len(data) == rows and set(data.column_names) >= {"id", "problem", "answer"}
    if first_answer is not None:
        assert data[0]["answer"] == first_answer
    assert all(isinstance(a, str) and a for a in data["answer"])


def test_split_and_config_are_honoured_or_refused(monkeypatch):
    """A preset holds one split: asking for another is an error naming the fix (not the test file silently); a
    hub dataset gets its configuration (subset) and split; a configuration for a local file is refused."""
    with pytest.raises(ValueError, match="gsm8k in .* holds only its test split, not 'train': set data.split=test"):
        load_problems(DataConfig(name="gsm8k", split="train", limit=1))
    with pytest.raises(ValueError, match="data.config='main' selects a hub dataset's configuration"):
        load_problems(DataConfig(name="gsm8k", split="test", config="main", limit=1))
    import datasets

    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([{"question": "1+1?", "answer": "#### 2"}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rows = load_problems(DataConfig(name="openai/gsm8k", config="main", split="test", limit=1))
    assert calls == [("openai/gsm8k", "main", "test")] and rows[0]["answer"] == "2"
    assert "config" not in DataConfig(name="svamp").identity()  # unset: earlier run identities stay valid
    assert DataConfig(name="openai/gsm8k", config="main").identity()["config"] == "main"


def test_local_split_by_name_and_data_dir(tmp_path, monkeypatch):
    """{split} in a local path picks the file of the split; the presets' folder comes from GKV_DATA_DIR, and a
    missing preset file names that variable."""
    for split, answer in (("train", "2"), ("test", "3")):
        (tmp_path / f"{split}.jsonl").write_text(f'{{"question": "q", "answer": "{answer}"}}\n')
    for split, answer in (("train", "2"), ("test", "3")):
        assert (
            load_problems(DataConfig(path=str(tmp_path / "{split}.jsonl"), name=None, split=split))[0]["answer"]
            == answer
        )
    from gkv_train.problems import data

    monkeypatch.setenv("GKV_DATA_DIR", str(tmp_path / "elsewhere"))
    assert data.find_data_dir() == tmp_path / "elsewhere"
    monkeypatch.setattr(data, "DATA_DIR", data.find_data_dir())
    with pytest.raises(FileNotFoundError, match="svamp preset's file; set GKV_DATA_DIR"):
        load_problems(DataConfig(name="svamp", split="test"))


def test_svamp_question_joins_body_and_question():
    row = load_problems(DataConfig(name="svamp", split="test", limit=1))[0]
    assert row["problem"].startswith("There are 87 oranges") and row["problem"].endswith("each group of bananas?")


def test_local_file_with_field_mapping(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"q": "1+1?", "a": 2.0}\n{"q": "2+2?", "a": 4}\n')
    data = load_problems(DataConfig(path=str(path), name=None, question_field="q", answer_field="a", limit=None))
    assert data["problem"] == ["1+1?", "2+2?"] and data["answer"] == ["2", "4"]
    with pytest.raises(ValueError, match=r"no field\(s\) \['question', 'answer'\]"):
        load_problems(DataConfig(path=str(path), name=None, limit=None))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_problems(DataConfig(path=str(tmp_path / "none.jsonl"), name=None, limit=None))


def test_arithmetic_task_is_deterministic_and_held_out():
    a = arithmetic_task(64, "train", seed=3, levels=(1, 2, 3, 4))
    assert a["problem"] == arithmetic_task(64, "train", seed=3, levels=(1, 2, 3, 4))["problem"]
    assert a["problem"] != arithmetic_task(64, "train", seed=4, levels=(1, 2, 3, 4))["problem"]
    test = arithmetic_task(512, "test", seed=3, levels=(1, 2, 3, 4))
    assert not set(a["problem"]) & set(test["problem"])
    assert set(a["level"]) == {1, 2, 3, 4}
    for row in a:  # the answer is the integer the story computes
        assert int(row["answer"]) >= 0


def test_level_one_is_one_operation():
    for row in arithmetic_task(20, levels=(1,)):
        assert row["problem"].count(".") == 2 and row["problem"].endswith("now?")


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("empty.jsonl", "", "holds no records"),
        ("bad.jsonl", '{"question": "a", "answer": 1}\n{"question": "b", "answer": \n', "bad.jsonl:2: not valid JSON"),
        ("list.jsonl", '{"question": "a", "answer": 1}\n[1, 2]\n', "list.jsonl:2: a record must be a JSON object"),
        (
            "null.jsonl",
            '{"question": "a", "answer": 1}\n{"question": "b", "answer": null}\n',
            "null.jsonl:2: record has no value",
        ),
        (
            "array.json",
            '[{"question": "a", "answer": 1},\n {"question": "b" "answer": 2}]',
            "array.json:2: not valid JSON",
        ),
        ("broken.parquet", "not parquet", "cannot read dataset file"),
        (
            "nan.jsonl",
            '{"question": "a", "answer": 1}\n{"question": "b", "answer": NaN}\n',
            "nan.jsonl:2: field 'answer': gold answer nan is not a finite number",
        ),
        (
            "list.json",
            '[{"question": "a", "answer": 1},\n {"question": "b", "answer": [2]}]',
            "list.json: record 2: field 'answer': gold answer [2] is a list, not a string or a number",
        ),
        (
            "none.jsonl",
            '{"question": "a", "answer": "None"}\n',
            "none.jsonl:1: field 'answer': gold answer 'None' is empty",
        ),
    ],
)
def test_bad_data_files_name_file_and_line(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as err:
        load_problems(DataConfig(path=str(tmp_path / name), name=None, limit=None))
    assert message in str(err.value)


@pytest.mark.parametrize("name", ["latin1.jsonl", "latin1.json"])
def test_a_line_that_is_not_utf8_is_named_by_file_line_and_column(tmp_path, name):
    """A Latin-1 byte on line 2: once "cannot read dataset file ...: 'utf-8' codec can't decode byte 0xe9 in
    position 49", which named neither line nor column."""
    (tmp_path / name).write_bytes(b'{"question": "a", "answer": 1}\n{"question": "caf\xe9", "answer": 2}\n')
    with pytest.raises(ValueError) as err:
        load_problems(DataConfig(path=str(tmp_path / name), name=None, limit=None))
    assert f"{name}:2: not UTF-8 text (byte 0xe9 at column 18)" in str(err.value)


def test_hub_golds_that_are_no_answer_name_dataset_and_row(monkeypatch):
    import datasets

    rows = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": None}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *_, **__: datasets.Dataset.from_list(rows))
    assert load_problems(DataConfig(name="someone/golds", split="test", limit=1))["answer"] == ["2"]
    with pytest.raises(ValueError, match=r"dataset someone/golds \(test\) row 1: field 'answer': gold answer None"):
        load_problems(DataConfig(name="someone/golds", split="test", limit=None))


def test_local_files_leave_no_datasets_cache(tmp_path, monkeypatch):
    import datasets

    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    path = tmp_path / "mine.jsonl"
    path.write_text('{"question": "1+1?", "answer": 2}\n')
    assert load_problems(DataConfig(path=str(path), name=None, limit=None))["answer"] == ["2"]
    assert not cache.exists()


def test_limit_below_one_is_refused(tmp_path):
    """data.limit=0 and -1 are refused (not read as the default 256, not a loop without end, not a file's last
    record dropped). Control: a file's limit is taken as given."""
    for limit in (0, -1):
        with pytest.raises(ValueError, match=f"data.limit must be at least 1, or null for every problem; got {limit}"):
            load_problems(DataConfig(limit=limit))
        with pytest.raises(ValueError, match=f"^eval_data.limit must be at least 1, .* got {limit}"):
            GRPOTrainConfig(eval_data=DataConfig(split="test", limit=limit))
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(f'{{"question": "{i} + 1?", "answer": {i + 1}}}\n' for i in range(3)))
    for limit, rows in ((None, 3), (1, 1), (2, 2), (9, 3)):
        assert len(load_problems(DataConfig(path=str(path), name=None, limit=limit))) == rows


def test_builtin_task_size_is_known_and_never_exceeded():
    """The generator's space is finite (level 0: 14 names x 10 items x 19 numbers): asking for more than the train
    split can give (the space less the held-out test problems) is an error that says how many it can, not a loop
    without end; the count is exact (the generator reaches every problem it counts)."""
    import random

    from gkv_train.problems.tasks import _problem, problem_count

    assert problem_count((0,)) == 2660 and problem_count((1,)) == 82460
    assert problem_count((0, 1)) == 2660 + 82460 and problem_count((0,), distractors=1) == 2660 * 13 * 19 * 9
    rng = random.Random(0)
    assert len({_problem(rng, 0)[0] for _ in range(40000)}) == 2660  # saturated: all of them, no more
    test = arithmetic_task(None, "test", levels=(0,))
    assert 800 < len(test) < 1024  # the distinct problems of the 1024 test draws
    with pytest.raises(
        ValueError,
        match=f"2660 distinct problems, {len(test)} of them held out for the test split, so "
        f"the train split can give at most {2660 - len(test)}: data.limit=3000",
    ):
        arithmetic_task(3000, "train", levels=(0,))
    train = arithmetic_task(2660 - len(test), "train", levels=(0,))  # every one of them
    assert not set(train["problem"]) & set(test["problem"])
    with pytest.raises(ValueError, match=f"holds {len(test)} distinct problems, data.limit=1000 asks for more"):
        arithmetic_task(1000, "test", levels=(0,))
    with pytest.raises(ValueError, match="data.limit=null asks for all of them"):
        arithmetic_task(None, "train")


def test_a_folder_named_like_a_data_file_and_empty_questions_are_named(tmp_path):
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(IsADirectoryError, match="folder.jsonl is a folder, not a file"):
        load_problems(DataConfig(path=str(tmp_path / "folder.jsonl"), name=None, limit=None))
    path = tmp_path / "blank.jsonl"
    path.write_text('{"question": "1 + 1?", "answer": 2}\n{"question": "  ", "answer": 3}\n')
    with pytest.raises(ValueError, match=r"blank.jsonl:2: the question \(question\) is empty"):
        load_problems(DataConfig(path=str(path), name=None, limit=None))


@pytest.mark.parametrize(
    "template, message",
    [
        ("Q: {foo}", "has the field(s) {foo}: its one field is {problem}"),
        ("{problem} and {0}", "has the field(s) {0}"),
        ("{problem.real}", "has the field(s) {problem.real}"),
        ("Q: {problem} {", "is not a format string (Single '{' encountered"),
        ("Q: {problem!z}", "formats its field ({problem!z})"),
        ("{problem:>99999999999}", "formats its field ({problem:>99999999999}): write {problem} alone"),  # ~100 GB
        ("Solve this.", "has no {problem} field: every prompt would be the same text"),
    ],
)
def test_prompt_templates_that_cannot_format_a_problem_are_refused(template, message):
    """A template is checked with its configuration (not a KeyError at the first prompt; not, without {problem}, the
    same prompt for every problem); the shipped one and escaped braces pass."""
    with pytest.raises(ValueError, match=re.escape(f"data.prompt_template={template!r} {message}")):
        DataConfig(prompt_template=template).check()
    with pytest.raises(ValueError, match=re.escape(f"eval_data.prompt_template={template!r} {message}")):
        GRPOTrainConfig(eval_data=DataConfig(split="test", prompt_template=template))
    DataConfig().check()
    DataConfig(prompt_template="Problem: {problem}\nAnswer in \\boxed{{}}, as {{x}}.").check()


def test_copy_recall_task_is_deterministic_held_out_and_reachable_by_name():
    from gkv_train.problems.tasks import copy_recall_task

    train = copy_recall_task(40, "train", seed=1)
    assert train["problem"] == copy_recall_task(40, "train", seed=1)["problem"]
    assert train["problem"] != copy_recall_task(40, "train", seed=2)["problem"]
    test = copy_recall_task(200, "test", seed=1)
    assert not set(train["problem"]) & set(test["problem"])
    for row in train:
        story = row["problem"].split("\n\n", 1)[1]
        first, *middle, last = story.split(". ")
        assert first.split()[2] == row["answer"] and 10 <= int(row["answer"]) <= 99  # "<who> has <n> <item>"
        assert len(middle) == 10 and last.endswith("and still has") and row["answer"] not in " ".join(middle + [last])
        assert row["required"] == last  # what the completion must copy before the number
    short = load_problems(DataConfig(name="copy_recall", sentences=3, limit=4))
    assert [p.count("Then") for p in short["problem"]] == [3] * 4
    assert DataConfig(name="copy_recall", sentences=3).identity() != DataConfig(name="copy_recall").identity()
    assert "sentences" not in DataConfig().identity()  # arithmetic identities are unchanged
    with pytest.raises(ValueError, match="sentences must be 1-12"):
        load_problems(DataConfig(name="copy_recall", sentences=13))
    with pytest.raises(ValueError, match="splits train and test"):
        copy_recall_task(3, "validation")
    # the training variant: at least a share of the places, in order, the number after them; the same problems
    places = copy_recall_task(40, "train", seed=1, required="places", share=0.5)
    assert places["problem"] == train["problem"]
    for row in places:
        head, *middle = row["required"].split("\n")
        assert head == "at least 5 of:" and len(middle) == 10 and all(p.startswith("goes to the ") for p in middle)
    from gkv_rewards.extract import copied, copies_in_order
    from gkv_rewards.functions import copy_score

    story, answer = train[0]["problem"].split("\n\n", 1)[1], train[0]["answer"]
    sentences = story.split(". ")
    assert copies_in_order(f"{story} {answer}", places[0]["required"])  # the whole copy passes
    skipped = f"{sentences[0]}. {train[0]['required']} {answer}"  # the middle left out
    assert copies_in_order(skipped, train[0]["required"]) and not copies_in_order(skipped, places[0]["required"])
    from gkv_rewards.functions import accuracy

    assert accuracy(
        completions=[f"{story} no more.", f"{story} {answer}."],
        answer=[answer] * 2,
        required=[train[0]["required"]] * 2,
    ) == [0.0, 1.0]  # the number is read after the last sentence, never from the first
    half = ". ".join([*sentences[:6], sentences[-1]]) + f" {answer}"  # the first 5 places, then the number
    assert copied(half, places[0]["required"]).share == 0.5 and copies_in_order(half, places[0]["required"])
    assert not copies_in_order(". ".join(sentences[:5]) + f". {answer}", places[0]["required"])  # 4 of 10
    assert accuracy(
        completions=[f"{answer} {story}", f"{story} {answer}"],
        answer=[answer] * 2,
        required=[places[0]["required"]] * 2,
    ) == [0.0, 1.0]  # the number must follow the places
    assert copy_score(
        completions=[half, f"{story} {answer}", f"{story} 1", skipped],
        answer=[answer] * 4,
        required=[places[0]["required"]] * 4,
    ) == [0.5, 1.0, 0.0, 0.0]  # every place counts
    assert copy_score(completions=[f"so {answer}"], answer=[answer]) == [1.0]  # nothing required: accuracy
    every = copy_recall_task(2, "train", seed=1, required="places")["required"][0]
    assert every.split("\n")[0] == "at least 10 of:"
    with pytest.raises(ValueError, match="copy_share must lie in"):
        DataConfig(name="copy_recall", copy_required="places", copy_share=0).check()
    with pytest.raises(ValueError, match="copy_share applies to"):
        DataConfig(name="copy_recall", copy_share=0.5).check()
    with pytest.raises(ValueError, match=r"copy_share=1e-12 asks for none of the 10 places: at least 1/10 = 0.1"):
        DataConfig(name="copy_recall", copy_required="places", copy_share=1e-12).check()
    assert "copy_required" not in DataConfig(name="copy_recall").identity()
    assert (
        DataConfig(name="copy_recall", copy_required="places").identity() != DataConfig(name="copy_recall").identity()
    )
    half_identity = DataConfig(name="copy_recall", copy_required="places", copy_share=0.5).identity()
    assert half_identity["copy_share"] == 0.5 and "copy_share" not in DataConfig(name="copy_recall").identity()


def test_long_recall_gives_the_story_the_completion_begins_with():
    """long_recall: a short prompt with the number; the continuation restates it, writes the middle sentences and
    stops where it belongs; the splits never share a prompt; the number must follow the last sentence. Refused by
    distillation, accepted by GRPO and as evaluation data."""
    from gkv_rewards.functions import accuracy
    from gkv_train.config.train_config import GRPOTrainConfig
    from gkv_train.problems.tasks import long_recall_task

    train, test = (
        long_recall_task(30, "train", seed=1, sentences=50),
        long_recall_task(100, "test", seed=1, sentences=50),
    )
    assert train["continuation"] == long_recall_task(30, "train", seed=1, sentences=50)["continuation"]
    assert not set(train["problem"]) & set(test["problem"])
    for row in train:
        first, *middle, last = row["continuation"].split(". ")
        assert first.split()[2] == row["answer"] and first in row["problem"]  # "<who> has <n> <item>", as asked
        assert len(middle) == 50 and all(m.startswith("Then ") for m in middle) and row["required"] == last
        assert last.endswith("and still has") and row["answer"] not in " ".join(middle + [last])
    story, answer = train[0]["continuation"], train[0]["answer"]
    assert accuracy(
        completions=[f"{story} {answer} {train[0]['answer'][::-1]}x", f"{story} {answer} apples.", f"{answer} {story}"],
        answer=[answer] * 3,
        required=[train[0]["required"]] * 3,
    ) == [float(answer == answer[::-1]), 1.0, 0.0]  # the last number after the story counts
    long = load_problems(DataConfig(name="long_recall", sentences=200, limit=2, split="test"))
    assert [c.count("Then") for c in long["continuation"]] == [200, 200]
    assert DataConfig(name="long_recall", sentences=200).identity() != DataConfig(name="long_recall").identity()
    with pytest.raises(ValueError, match="sentences must be 1-4096 \\(long_recall"):
        DataConfig(name="long_recall", sentences=5000).check()
    with pytest.raises(ValueError, match="data.name=long_recall with algorithm=distill"):
        DistillTrainConfig(data=DataConfig(name="long_recall"))
    GRPOTrainConfig(data=DataConfig(name="long_recall"))  # GRPO trains on the sampled answer after the story
    GRPOTrainConfig(eval_data=DataConfig(name="long_recall", split="test"))


@pytest.mark.parametrize("name", ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt"])
def test_retrieval_tasks_hide_what_they_ask_and_hold_out_their_test_split(name):
    """Each problem's answer is written in its haystack by the facts the question names (a control: the other
    needles' numbers are there too, so finding a number is not enough); train and test share no problem; the
    prompt grows with data.context; the identity names the context only for these tasks."""
    import re

    from gkv_train.problems.retrieval import retrieval_task

    train, test = (
        retrieval_task(name, 30, "train", seed=1, context=256),
        retrieval_task(name, 60, "test", seed=1, context=256),
    )
    assert not set(train["problem"]) & set(test["problem"])
    assert train["problem"] == retrieval_task(name, 30, "train", seed=1, context=256)["problem"]
    for row in train:
        text, question = row["problem"].rsplit("\n\n", 1)
        answers = [*row["required"].split("\n"), row["answer"]] if row["required"] else [row["answer"]]
        if row["required"]:  # the numbers listed as asked, with the last one the final answer, after the others
            from gkv_rewards.functions import accuracy

            listed, boxed = ", ".join(answers), ", ".join(f"\\boxed{{{a}}}" for a in answers)
            wrong_order = ", ".join(answers[::-1])
            assert accuracy(
                completions=[f"The numbers are {listed}.", boxed, f"The numbers are {wrong_order}."],
                answer=[row["answer"]] * 3,
                required=[row["required"]] * 3,
            ) == [1.0, 1.0, 0.0]
        if name == "vt":
            target = re.search(r"VAR (\w+)\?", question).group(1)
            values = dict(re.findall(r"VAR (\w+) = (\d+|VAR \w+)\.", text))
            while values[target].startswith("VAR "):  # follow the chain back to its number
                target = values[target][4:]
            assert answers == [values[target]] and len(re.findall(r"VAR \w+ = \d+\.", text)) == 2  # a second chain
        else:
            asked = re.findall(r"\b([a-z]+-[a-z]+)\b", question)
            found = (
                dict(re.findall(r"numbers for ([a-z]+-[a-z]+) is: (\d+)", text)) if name != "niah_multivalue" else None
            )
            if name == "niah_multivalue":
                assert answers == re.findall(rf"numbers for {asked[0]} is: (\d+)", text) and len(answers) == 4
            else:
                assert answers == [found[k] for k in asked]
                assert len(found) == (1 if name == "niah_single" else 4)
    longer = load_problems(DataConfig(name=name, context=1024, limit=2))
    assert len(longer["problem"][0]) > 2.5 * len(train["problem"][0])
    assert DataConfig(name=name, context=512).identity() != DataConfig(name=name).identity()
    assert "context" not in DataConfig().identity()


def test_natural_haystack_draws_train_and_test_from_disjoint_questions(gsm8k_questions):
    """data.haystack=questions: the needle sits in GSM8K questions (whole, in a random order) instead of the
    filler, about as long; train prompts use only even-numbered questions and test prompts only odd-numbered
    ones; the filler's identity is unchanged, and the option is refused for other tasks."""
    corpus = [" ".join(q.split()) for q in gsm8k_questions]
    data = DataConfig(name="niah_single", context=512, limit=8, haystack="questions")
    train = load_problems(data)
    test = load_problems(dataclasses.replace(data, split="test"))
    for rows, parity in ((train, 0), (test, 1)):
        for problem in rows["problem"]:
            used = [i for i, q in enumerate(corpus) if q in problem]
            assert len(used) >= 5 and {i % 2 for i in used} == {parity}
            assert "The grass is green" not in problem and "special magic number" in problem
    filler = load_problems(dataclasses.replace(data, haystack="filler"))["problem"][0]
    assert 0.7 < len(train["problem"][0].split()) / len(filler.split()) < 1.5
    assert "haystack" not in DataConfig(name="niah_single").identity() and "haystack" in data.identity()
    assert data.identity()["haystack_file"][0] == "gsm8k_test.jsonl"  # the natural text is a file: its content counts
    with pytest.raises(ValueError, match="data.haystack applies to the retrieval tasks"):
        DataConfig(name="arithmetic", haystack="questions").check()
    with pytest.raises(ValueError, match="data.haystack must be one of filler, questions"):
        DataConfig(name="niah_single", haystack="essays").check()


def test_natural_haystack_without_its_file_is_refused_naming_it(monkeypatch, tmp_path):
    from gkv_train.problems import data

    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="data.haystack=questions reads .*gsm8k_test.jsonl"):
        DataConfig(name="niah_single", haystack="questions").check()
    DataConfig(name="niah_single").check()  # the filler needs no file


def test_a_natural_haystack_too_short_or_malformed_is_refused_naming_the_file(monkeypatch, tmp_path):
    """A corpus that cannot fill the asked context is refused (not a shorter prompt than asked); a line that is not
    JSON, or has no question, is named by file and line."""
    from gkv_train.problems import data

    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text("".join(json.dumps({"question": f"Question {i} has five words."}) + "\n" for i in range(20)))
    config = DataConfig(name="niah_single", haystack="questions", context=512, limit=1)
    with pytest.raises(ValueError, match=r"the train half of .*gsm8k_test.jsonl holds 50 words, fewer than the about"):
        load_problems(config)
    with pytest.raises(ValueError, match=r"^eval_data.haystack=questions: .* a eval_data.context=512 prompt"):
        load_problems(config, key="eval_data")  # the held-out set's group, named as the user wrote it
    assert load_problems(dataclasses.replace(config, context=64))["problem"]
    for line, message in (("{not json", "2: not a JSON object"), ('{"q": 1}', "2: no question")):
        path.write_text(json.dumps({"question": "One."}) + "\n" + line + "\n")
        with pytest.raises(ValueError, match=f"gsm8k_test.jsonl:{message}"):
            load_problems(config)


def test_count_recall_gives_a_note_and_asks_for_a_count_then_its_code():
    """count_recall: one prompt for every problem (never the code); the given note holds the code; the solution
    counts to count_to and writes the code, and scores 1 under its reward; the splits never share a code; the
    settings are checked; distillation takes it only from traces that mark the note as given."""
    from gkv_rewards.functions import staged_score
    from gkv_train.config.options import DistillOptions
    from gkv_train.config.train_config import GRPOTrainConfig

    train = load_problems(DataConfig(name="count_recall", count_to=12, limit=50))
    test = load_problems(DataConfig(name="count_recall", count_to=12, limit=64, split="test"))
    assert len(set(train["problem"])) == 1 and "count from 1 to 12" in train[0]["problem"]
    assert not set(train["answer"]) & set(test["answer"]) and len(set(train["answer"])) == 50
    for row in train:
        assert row["continuation"] == f"Note: the code is {row['answer']}.\n" and row["answer"] not in row["problem"]
        assert row["solution"].split("\n") == [*map(str, range(1, 13)), f"Code: \\boxed{{{row['answer']}}}"]
    row = train[0]
    completions = [row["continuation"] + row["solution"], row["continuation"] + "1\n2\nCode: " + row["answer"]]
    assert staged_score(completions=completions, answer=[row["answer"]] * 2, required=[row["required"]] * 2) == [
        1.0,
        0.5 * 2 / 12,
    ]
    assert DataConfig(name="count_recall", count_to=12).identity() != DataConfig(name="count_recall").identity()
    assert "count_to" not in DataConfig(name="long_recall").identity() | DataConfig(name="count_recall").identity()
    with pytest.raises(ValueError, match="count_to must be 1-4096"):
        DataConfig(name="count_recall", count_to=0).check()
    with pytest.raises(ValueError, match="data.count_to=12 applies to data.name=count_recall only"):
        DataConfig(name="long_recall", count_to=12).check()
    with pytest.raises(ValueError, match="data.name=count_recall with algorithm=distill"):
        DistillTrainConfig(data=DataConfig(name="count_recall"))
    DistillTrainConfig(data=DataConfig(name="count_recall"), distill=DistillOptions(traces="traces.jsonl"))
    GRPOTrainConfig(data=DataConfig(name="count_recall"))


def test_long_recall_with_the_number_only_in_the_story():
    """number_in_prompt=false: the same problems (stories, answers), prompts without the number; a setting of
    long_recall's only."""
    stated = load_problems(DataConfig(name="long_recall", sentences=5, limit=20, split="test"))
    hidden = load_problems(DataConfig(name="long_recall", sentences=5, limit=20, split="test", number_in_prompt=False))
    assert stated["continuation"] == hidden["continuation"] and stated["answer"] == hidden["answer"]
    for with_number, without in zip(stated["problem"], hidden["problem"]):
        assert with_number.endswith(without) and not any(c.isdigit() for c in without)
    identity = DataConfig(name="long_recall", number_in_prompt=False).identity()
    assert identity["number_in_prompt"] is False and "number_in_prompt" not in DataConfig(name="long_recall").identity()
    with pytest.raises(ValueError, match="data.number_in_prompt=False applies to data.name=long_recall only"):
        DataConfig(name="copy_recall", number_in_prompt=False).check()


def test_count_recall_restated_says_how_far_the_count_had_got_when_the_code_came_back():
    """A count_recall completion (its given note first) restating the code before its count ends: the share of the
    count written by then; the code given after the whole count, never, or with no count: None. Lines of other
    digits (a superscript, thousands of digits) are not numbers of the count and raise nothing; a count line that
    equals the code (a count past 1,000) is the count, not a restatement."""
    from gkv_train.problems.tasks import count_recall_restated

    note = "Note: the code is 2162.\n"
    count = [str(i) for i in range(1, 161)]
    assert count_recall_restated(note + "\n".join([*count, "Code: \\boxed{2162}"]), "2162", 160) is None
    halfway = note + "\n".join([*count[:80], "The code is 2162.", *count[80:], "Code: 2162"])
    assert count_recall_restated(halfway, "2162", 160) == 0.5
    assert count_recall_restated(note + "2162\n1\n2", "2162", 160) == 0.0  # before counting
    assert count_recall_restated(note + "1\n2", "2162", 160) is None  # never
    assert count_recall_restated("", "2162", 160) is None
    slipped = note + "\n".join([*count[:18], *count[19:], "Code: 2162"])  # 19 left out, the code after 160
    assert count_recall_restated(slipped, "2162", 160) is None
    odd = note + "\u00b2\n" + "9" * 6000 + "\n1\n 2162 \n2"
    assert count_recall_restated(odd, "2162", 160) == 1 / 160
    after = note + "\n".join([*count, "Code: \\boxed{2162}", "1", "2", "160"])  # counting on after the answer
    assert count_recall_restated(after, "2162", 160) is None
    spaced = " Note: the code is 2162.\r\n" + "\n".join([*count, "Code: 2162"])  # the note's line, not a restatement
    assert count_recall_restated(spaced, "2162", 160) is None
    past = note + "\n".join(str(i) for i in range(2160, 2165))
    assert count_recall_restated(past, "2162", 4096) is None  # the line 2162 is the count's
