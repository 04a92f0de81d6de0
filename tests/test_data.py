import pytest

from gkv_train.data import DataConfig, arithmetic_task, load_problems


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
        assert load_problems(DataConfig(path=str(tmp_path / "{split}.jsonl"), name=None, split=split))[0]["answer"] == answer
    from gkv_train import data

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
        ("null.jsonl", '{"question": "a", "answer": 1}\n{"question": "b", "answer": null}\n', "null.jsonl:2: record has no value"),
        ("array.json", '[{"question": "a", "answer": 1},\n {"question": "b" "answer": 2}]', "array.json:2: not valid JSON"),
        ("broken.parquet", "not parquet", "cannot read dataset file"),
        ("nan.jsonl", '{"question": "a", "answer": 1}\n{"question": "b", "answer": NaN}\n',
         "nan.jsonl:2: field 'answer': gold answer nan is not a finite number"),
        ("list.json", '[{"question": "a", "answer": 1},\n {"question": "b", "answer": [2]}]',
         "list.json: record 2: field 'answer': gold answer [2] is a list, not a string or a number"),
        ("none.jsonl", '{"question": "a", "answer": "None"}\n', "none.jsonl:1: field 'answer': gold answer 'None' is empty"),
    ],
)
def test_bad_data_files_name_file_and_line(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as err:
        load_problems(DataConfig(path=str(tmp_path / name), name=None, limit=None))
    assert message in str(err.value)


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
