"""A method's contract with the cache, checked where the cache uses it: ``score(state)`` returns (score float
[B, Hkv, S] finite on the candidate slots, history None or of the same shape), else an error naming the class and
``score`` (``gkv_rollout.scoring.checked_score`` / ``check_finite``); a plug-in module that fails to import, or a
method whose ``__post_init__`` raises, is one ``error:`` line at configuration time naming the method's path; the
shared options a method does not read are checked as the methods that read them check them."""

import re
import sys
from pathlib import Path

import pytest
from entry_points import run_each

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.engine import RolloutEngine
from gkv_rollout.methods import METHODS
from gkv_rollout.registry import PLUG_INS

ROOT = Path(__file__).resolve().parents[1]
# (class, score's body after ``s = state.key_pos.float()``, the error's type, what the message names)
BAD_SCORES = (
    ("NanAll", "return s * float('nan'), None", ValueError, r"gave (\d+) of \1 candidate slots a NaN score"),
    ("NanSome", "s[..., ::2] = float('nan')\n        return s, None", ValueError, "a NaN score"),
    ("Infinite", "s[..., 3] = float('inf')\n        return s, None", ValueError, "an infinite score"),
    (
        "TwoDims",
        "return s[..., 0], None",
        ValueError,
        r"a score of shape \(1, \d+\); it returns one of shape \(1, \d+, 10\)",
    ),
    ("Bare", "return s", TypeError, r"returned a Tensor; it returns a tuple \(score"),
    ("TupleScore", "return (s, None), None", TypeError, "a tuple as its score; it returns a float tensor"),
    ("List", "return s.tolist(), None", TypeError, "a list as its score"),
    ("Short", "return s[..., :-1], None", ValueError, r"a score of shape \(1, \d+, 9\)"),
    ("Integer", "return state.key_pos, None", TypeError, "a torch.int64 score"),
    ("ShortHistory", "return s, s[..., :-1]", ValueError, r"a history of shape \(1, \d+, 9\)"),
    ("HistoryOnLayerZero", "return s, s if state.layer == 0 else None", ValueError, "some layers and None for others"),
    ("Three", "return s, None, None", TypeError, "returned a tuple of 3"),
    ("Raising", "raise KeyError('mine')", ValueError, r"raised KeyError: 'mine'"),
)


def plug_in_module(folder: Path, name: str, classes: dict[str, str]) -> None:
    """``folder/name.py``: an ``EvictionMethod`` dataclass per entry of ``classes`` (class -> score's body)."""
    text = "from dataclasses import dataclass\nfrom gkv_rollout.methods import EvictionMethod\n"
    for cls, body in classes.items():
        text += (
            f"@dataclass\nclass {cls}(EvictionMethod):\n    name = 'contract_{cls.lower()}'\n"
            f"    def score(self, state):\n        s = state.key_pos.float()\n        {body}\n"
        )
    (folder / f"{name}.py").write_text(text)


@pytest.fixture
def plug_ins(tmp_path, monkeypatch):
    """The module ``contract_methods`` of every class of ``BAD_SCORES`` and ``Newest`` (a right one), importable;
    what they register removed afterwards."""
    plug_in_module(tmp_path, "contract_methods", {"Newest": "return s, None", **{c: b for c, b, _, _ in BAD_SCORES}})
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in PLUG_INS if n.startswith("contract_methods:")]:
        METHODS.pop(PLUG_INS.pop(name).name, None)
    sys.modules.pop("contract_methods", None)


def rollout(model, method: str):
    """One rollout of 8 new tokens under ``method`` (budget 8, window 2, interval 2) whose 10-token prompt exceeds
    the budget: the method scores right after the prefill (10 slots, 6 candidates: the window and 2 sinks kept)."""
    compression = CompressionConfig(f"contract_methods:{method}", budget=8, window=2, interval=2, sinks=2)
    engine = RolloutEngine(model, None, compression)
    return engine.generate([list(range(5, 15))], SamplingConfig(max_new_tokens=8))


@pytest.mark.parametrize("cls, body, error, message", BAD_SCORES, ids=[c for c, *_ in BAD_SCORES])
def test_a_score_outside_its_contract_names_the_method_and_score(tiny_llama, plug_ins, cls, body, error, message):
    """Each mistake of a plug-in's score, which failed deep in torch (a shape, a tuple, a list, another length) or
    was kept silently (NaN, infinite or integer scores: top-k keeps NaN first), is an error naming the class, score
    and what is wrong, at the first compression."""
    with pytest.raises(error, match=rf"compression method contract_methods:{cls}: score\(state\) .*{message}"):
        rollout(tiny_llama, cls)


def test_a_score_within_its_contract_rolls_out(tiny_llama, plug_ins):
    """The control: a right plug-in compresses (its candidates' scores finite; the NaN a built-in's history holds
    outside the candidates is not checked, as select_keep never reads it)."""
    out = rollout(tiny_llama, "Newest")
    assert out.stats["compressions"] >= 1 and out.sequences.shape[1] > 10


def test_a_plug_in_failing_at_import_or_in_post_init_is_one_error_line(tmp_path, monkeypatch):
    """A module that raises while imported (any exception, a syntax error among them) and a method whose
    ``__post_init__`` raises TypeError: ValueError naming the method's path and the error when the configuration is
    built; through evaluate.py one ``error:`` line, exit 2, no traceback, before the model loads. A plug-in's own
    ValueError stays as it is (its message is already one line)."""
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('the module is broken')\n")
    (tmp_path / "broken_syntax.py").write_text("def broken(:\n")
    (tmp_path / "broken_post_init.py").write_text(
        "from dataclasses import dataclass\nfrom gkv_rollout.methods import EvictionMethod\n"
        "@dataclass\nclass Typed(EvictionMethod):\n    name = 'typed'\n    p: int = 1\n"
        "    def __post_init__(self):\n        super().__post_init__()\n        self.p + 'x'\n"
        "    def score(self, state):\n        return state.key_pos.float(), None\n"
        "@dataclass\nclass Checked(Typed):\n    name = 'checked'\n"
        "    def __post_init__(self):\n        raise ValueError('p must be odd')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "broken_at_import:X": r"compression method 'broken_at_import:X': cannot import X from broken_at_import "
        r"\(RuntimeError: the module is broken\)",
        "broken_syntax:X": r"'broken_syntax:X': cannot import X from broken_syntax \(SyntaxError: ",
        "broken_post_init:Typed": r"compression.method=broken_post_init:Typed: building it raised TypeError in its "
        r"__post_init__ \(unsupported operand",
        "broken_post_init:Checked": r"^p must be odd$",
    }
    try:
        for method, message in cases.items():
            with pytest.raises(ValueError, match=message):
                CompressionConfig(method, budget=16, window=4)
        monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}:{ROOT / 'rollout'}:{ROOT / 'rewards'}")
        base = ["model=tiny", "data.limit=1", "max_completion_length=8", "num_generations=1", "plots=false"]
        argvs = [[*base, f"compression.method={m}", f"output_dir={tmp_path / 'out'}"] for m in cases]
        for result, message in zip(run_each(ROOT / "scripts" / "evaluate.py", argvs, tmp_path), cases.values()):
            assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
            line = result.stderr.strip().splitlines()[-1]
            assert line.startswith("error: ") and re.search(message.lstrip("^"), line), line
        assert not (tmp_path / "out").exists()
    finally:
        for name in ("typed", "checked"):
            METHODS.pop(name, None)
        PLUG_INS.pop("broken_post_init:Typed", None)
        PLUG_INS.pop("broken_post_init:Checked", None)


def test_the_shared_options_a_method_does_not_read_are_checked_as_those_that_do():
    """``full`` reads no shared option and S4R neither budget nor interval: they are kept for a sweep's runs, so a
    value no method could take is refused whatever the method (``compression.budget=-5`` with ``full`` was
    accepted); values some method takes stay accepted (a budget of 1, unused without compression)."""
    for method, options, message in (
        ("full", dict(budget=-5), r"compression.budget=-5 must be a number of tokens, at least 1, whatever the method"),
        ("full", dict(budget=0), "compression.budget=0"),
        ("full", dict(window=0), "compression.window=0"),
        ("full", dict(sinks=-1), r"compression.sinks=-1 must be a number of tokens, at least 0"),
        ("full", dict(pool_kernel=2), "compression.pool_kernel=2 must be a positive odd number"),
        ("full", dict(pool="mean"), "unknown compression.pool 'mean'"),
        ("full", dict(group_agg="min"), "unknown compression.group_agg 'min'"),
        ("s4r", dict(budget=-5), r"compression.budget=-5 .*compression.method=s4r does not read it"),
        ("s4r", dict(interval=0), "compression.interval=0"),
    ):
        with pytest.raises(ValueError, match=message):
            CompressionConfig(method, **options)
    assert CompressionConfig("full", budget=1, window=16, sinks=0, pool_kernel=3).budget == 1
    assert CompressionConfig("s4r", budget=64, interval=16).resolved.name == "s4r"
