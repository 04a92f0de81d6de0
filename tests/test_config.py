import dataclasses
from dataclasses import dataclass

import pytest

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_train.models import load_model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="quest"), "unknown compression method 'quest'"),
        (dict(method="gkv", budget=16, window=16), "budget (16) must be larger than window (16)"),
        (dict(method="snapkv", interval=0), "interval must be a positive"),
        (dict(method="gkv", alpha=1.5), "alpha must lie in [0, 1]"),
        (dict(method="gkv", alpha=-0.1), "alpha must lie in [0, 1]"),
        (dict(method="rkv", lambda_=2.0), "lambda must lie in [0, 1]"),
        (dict(method="gkv", form="median"), "unknown gkv form 'median'"),
        (dict(method="snapkv", pool_kernel=4), "pool_kernel must be a positive odd number"),
        (dict(method="gkv", similarity="dot"), "unknown similarity 'dot'"),
        (
            dict(method="rkv", redundancy=False),
            "compression.redundancy does not apply to compression.method=rkv",
        ),
        (dict(method="h2o", lambda_=0.3), "compression.lambda_ does not apply to compression.method=h2o"),
        (dict(method="streaming", budget=20, window=16, sinks=8), "sinks (8) + window (16) must fit"),
    ],
)
def test_bad_compression_config_names_the_problem(kwargs, message):
    with pytest.raises(ValueError) as err:
        CompressionConfig.of(**kwargs)
    assert message in str(err.value)


def test_each_method_takes_only_the_options_it_reads():
    """A method declares its own options (``compression.*``, its dataclass's fields); it refuses one
    it does not have, naming those it has; ``of`` puts flat names among the shared options or the method's own; a
    sweep gives each run the options it has and refuses one that no run has."""
    from gkv_train.config.eval_config import EvalConfig

    assert CompressionConfig.of("gkv", alpha=0.5, budget=64).resolved.alpha == 0.5
    assert CompressionConfig.of("s4r", eta=0.3, window=8).resolved.eta == 0.3
    assert CompressionConfig.of("rkv", lambda_=0.2).resolved.lambda_ == 0.2  # control: rkv has lambda_
    assert CompressionConfig("gkv", options={"alpha": 1}).resolved.alpha == 1.0  # an int where a float is asked
    for method, options, message in [
        (
            "snapkv",
            dict(alpha=0.5),
            "compression.alpha does not apply to compression.method=snapkv, whose options are: none",
        ),
        ("rkv", dict(alpha=0.5), "whose options are: lambda_, similarity"),
        ("gkv", dict(eta=0.3), "compression.eta does not apply to compression.method=gkv"),
        ("s4r", dict(form="mean"), "compression.form does not apply to compression.method=s4r"),
    ]:
        with pytest.raises(ValueError) as err:
            CompressionConfig.of(method, **options)
        assert message in str(err.value)
    with pytest.raises(ValueError, match="unknown compression option 'etta'"):
        CompressionConfig.of("s4r", etta=0.3)
    with pytest.raises(ValueError, match=r"compression.etta does not apply .* \(did you mean eta\?\)"):
        CompressionConfig("s4r", options={"etta": 0.3})
    with pytest.raises(ValueError, match="compression.alpha='high': expected float"):
        CompressionConfig("gkv", options={"alpha": "high"})
    sweep = EvalConfig(
        methods=["full", "snapkv", "gkv", "s4r"],
        budgets=[64],
        compression=CompressionConfig.template("full", alpha=0.5, eta=0.3),
    )
    runs = {run.method: run for run in sweep.compressions()}
    assert (runs["gkv"].resolved.alpha, runs["s4r"].resolved.eta) == (0.5, 0.3)
    assert runs["snapkv"].option_names() == () and runs["h2o" if "h2o" in runs else "gkv"].resolved.form == "max"
    with pytest.raises(ValueError, match="compression.eta applies to none of the runs \\(full, gkv\\)"):
        EvalConfig(methods=["full", "gkv"], compression=CompressionConfig.template("full", eta=0.3))
    with pytest.raises(ValueError, match="compression.eta does not apply to compression.method=full"):
        CompressionConfig.of("full", eta=0.3)  # a single run of full reads none (gkv-train check, lm-eval)
    # the benches' flags (argparse): a sweep gives each method its options, as evaluate.py does
    import argparse

    from gkv_rollout.config import add_compression_args, compression_from_args

    parser = argparse.ArgumentParser()
    add_compression_args(parser, method="gkv", budget=128)
    flags = parser.parse_args(["--similarity", "mean_cosine", "--eta", "0.3"])
    runs = compression_from_args(flags, ["streaming", "rkv", "s4r"])
    assert runs[1].resolved.similarity == "mean_cosine" and runs[2].resolved.eta == 0.3
    assert runs[1].resolved.lambda_ == 0.1  # not given: rkv's own default
    with pytest.raises(ValueError, match="compression.eta applies to none of the methods"):
        compression_from_args(flags, ["rkv"])


def test_a_method_with_an_option_of_its_own_is_one_class_in_one_file(tmp_path, monkeypatch):
    """A plug-in method from the user's module (``package.module:Class``), one dataclass with an option field: its
    option is a key (``compression.<name>``) through train.py's configuration, checked as the built-in ones are,
    listed in the generated methods table once registered, and trained under by the registry-driven path (a
    rollout whose record the trainer reproduces)."""
    from gkv_rollout.engine import RolloutEngine
    from gkv_rollout.methods import METHODS
    from gkv_rollout.registry import PLUG_INS
    from gkv_train.config.compose import check_overrides
    from gkv_train.logprobs import token_logprobs

    (tmp_path / "my_methods.py").write_text(
        "from dataclasses import dataclass\n"
        "from gkv_rollout.methods import EvictionMethod\n"
        "@dataclass\n"
        "class Recent(EvictionMethod):\n"
        '    """The most recent tokens, an offset apart.\n\n'
        "    offset: positions added to each score.\n"
        '    """\n'
        "    name = 'recent'\n"
        "    summary = 'the most recent tokens, an offset apart'\n"
        "    offset: int = 0\n"
        "    def __post_init__(self):\n"
        "        super().__post_init__()\n"
        "        if self.offset < 0:\n"
        "            raise ValueError(f'offset must be >= 0, got {self.offset}')\n"
        "    def score(self, state):\n"
        "        return state.key_pos.float() + self.offset, None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        argv = check_overrides(["compression.method=my_methods:Recent", "compression.offset=3"], "train")
        assert argv[1] == "++compression.offset=3"  # Hydra's way to a key its defaults do not list
        # set flat through the composition, as a built-in method's option is
        from gkv_train.config.compose import configure

        flat = ["compression.method=my_methods:Recent", "compression.budget=16", "compression.window=4"]
        composed, _, files = configure("evaluate", [*flat, "compression.interval=4", "compression.offset=3"])
        assert composed.compression.resolved.offset == 3 and "  offset: 3\n" in files["config.yaml"]
        cfg = CompressionConfig("my_methods:Recent", budget=16, window=4, interval=4, options={"offset": 3})
        assert cfg.resolved.offset == 3 and cfg.identity()["offset"] == 3 and "alpha" not in cfg.identity()
        with pytest.raises(ValueError, match="offset must be >= 0"):
            CompressionConfig("my_methods:Recent", budget=16, window=4, options={"offset": -1})
        with pytest.raises(ValueError, match=r"compression.ofset does not apply .* \(did you mean offset\?\)"):
            CompressionConfig("my_methods:Recent", budget=16, window=4, options={"ofset": 1})
        model, tokenizer = load_model("tiny")
        out = RolloutEngine(model, tokenizer, cfg).generate(["a prompt to compress"], SamplingConfig(max_new_tokens=24))
        lp = token_logprobs(model, out.sequences, out.attention_mask, out.num_completion_tokens, out.record, 1.0)
        real = out.completion_mask.bool()
        assert (lp - out.logprobs)[real].abs().max() < 1e-4 and out.stats["compressions"] >= 2
    finally:
        METHODS.pop("recent", None)
        PLUG_INS.pop("my_methods:Recent", None)


def test_run_identities_are_pinned():
    """The fingerprints keying evaluation folders, pinned: a change that re-keys earlier results folders shows here
    (last re-keyed when a method became one dataclass and its identity its own fields, CHANGELOG 2026-12-06)."""
    from gkv_train.config.eval_config import EvalConfig
    from gkv_train.runs.run_folder import fingerprint

    config = EvalConfig(model="tiny")
    expected = [
        ("full", {}, "ab839a67eb7f4f5b"),
        ("gkv", dict(budget=64, window=8, interval=16), "b82b224fd3cb1025"),
        ("gkv", dict(budget=64, form="mean", alpha=0.5), "f8f675fbce3729fe"),
        ("rkv", dict(budget=64, lambda_=0.2), "4803b32d458f28c7"),
        ("snapkv", dict(budget=32), "c60061aa2db2a736"),
        ("h2o", dict(budget=64), "ec8d138dfc394a59"),
        ("tova", dict(budget=64), "155cb8624e8f1544"),
        ("s4r", dict(eta=0.3), "308af25ab1b914ed"),
        ("s4r", dict(eta=0.3, refresh=8), "e944506563eda2eb"),
        ("s4r", dict(rank=4, full_layers=[0]), "8f65a95a9cf61816"),
    ]
    for method, options, digest in expected:
        assert fingerprint(config.run_settings(CompressionConfig.of(method, **options))) == digest, (method, options)
    for other in (dict(basis="prompt"), dict(rank_ratio=2.0), dict(exact="both")):  # another option, another key
        assert fingerprint(config.run_settings(CompressionConfig.of("s4r", eta=0.3, **other))) != "308af25ab1b914ed"


def test_method_defaults_are_the_reference_recipes():
    # microsoft/G-KV scripts/inference.sh: window 16, divide_length 128; SnapKV and R-KV pool with kernel 5,
    # R-KV lambda 0.1; G-KV alpha 0.8, lambda 0.5, redundancy, no pooling; H2O sum form, window 1;
    # StreamingLLM 4 sinks.
    r = {m: CompressionConfig(method=m) for m in ("streaming", "snapkv", "rkv", "gkv", "h2o", "s4r")}
    r = {m: c.resolved for m, c in r.items()}
    assert (r["streaming"].sinks, r["gkv"].sinks, r["s4r"].sinks) == (4, 0, 4)
    assert (r["snapkv"].pool_kernel, r["rkv"].pool_kernel, r["gkv"].pool_kernel, r["h2o"].pool_kernel) == (5, 5, 1, 1)
    assert r["rkv"].lambda_ == 0.1 and "redundancy" not in r["rkv"].identity()  # always on: not an option
    gkv = r["gkv"]
    assert (gkv.window, gkv.interval, gkv.alpha, gkv.lambda_, gkv.form, gkv.redundancy) == (
        16,
        128,
        0.8,
        0.5,
        "max",
        True,
    )
    assert (gkv.group_agg, gkv.similarity) == ("max", "rkv")
    h2o = r["h2o"]
    assert (h2o.window, h2o.form, h2o.alpha) == (1, "sum", 0.8) and "redundancy" not in h2o.identity()
    assert (r["s4r"].window, r["s4r"].group_agg, r["s4r"].rho) == (32, "mean", 0.2)
    # an explicit value wins; a sweep's run of another method never keeps the template method's defaults
    assert CompressionConfig(method="gkv", pool_kernel=3).resolved.pool_kernel == 3
    assert CompressionConfig(method="snapkv", window=8).resolved.pool_kernel == 5
    assert CompressionConfig(method="gkv", window=8).for_method("h2o", 64).resolved.window == 8  # given: kept
    assert CompressionConfig(method="gkv").for_method("h2o", 64).resolved.window == 1  # not given: h2o's own
    assert CompressionConfig(method="full", budget=1, window=16).budget == 1  # budget unused without compression


def test_a_method_from_the_users_own_module(tmp_path, monkeypatch):
    """``package.module:Class``: looked up when the configuration is validated, registered under that path and its
    own name (selectable by either afterwards), its own defaults (interval among them) taken, its identity its own
    fields; a wrong name, a class of another kind or one taking another method's name is refused by name."""
    from gkv_rollout.methods import METHODS
    from gkv_rollout.registry import PLUG_INS

    (tmp_path / "user_methods.py").write_text(
        "from dataclasses import dataclass\n"
        "from gkv_rollout.methods import EvictionMethod\n"
        "@dataclass\n"
        "class Oldest(EvictionMethod):\n"
        "    name = 'oldest'\n"
        "    interval: int = 4\n"
        "    def score(self, state):\n"
        "        return -state.key_pos.float(), None\n"
        "@dataclass\n"
        "class Impostor(Oldest):\n"
        "    name = 'gkv'\n"
        "@dataclass\n"
        "class Unnamed(Oldest):\n"
        "    pass\n"
        "class Undecorated(Oldest):\n"
        "    name = 'undecorated'\n"
        "    window: int = 3\n"
        "@dataclass\n"
        "class Annotated(Oldest):\n"
        "    name: str = 'annotated'\n"
        "class NotAMethod:\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = CompressionConfig("user_methods:Oldest", budget=16, window=4)
        assert cfg.resolved.interval == 4 and PLUG_INS["user_methods:Oldest"] is METHODS["oldest"]
        assert list(METHODS).count("oldest") == 1 and "user_methods:Oldest" not in METHODS  # listed once
        assert CompressionConfig("oldest", budget=16, window=4).identity() == cfg.identity()  # one identity
        assert cfg.identity()["method"] == "oldest"
        assert set(cfg.identity()) == {
            "method",
            "budget",
            "window",
            "interval",
            "sinks",
            "pool_kernel",
            "pool",
            "group_agg",
        }
        for name, message in (
            ("user_methods:Missing", "cannot import Missing"),
            ("no_such_module:X", "cannot import X"),
            ("user_methods:NotAMethod", "not an EvictionMethod subclass"),
            ("user_methods:Impostor", "is named 'gkv', the name of another method"),
            ("user_methods:Unnamed", "does not name itself"),
            ("user_methods:Undecorated", "is not decorated @dataclass"),
            ("user_methods:Annotated", "declares name as a field"),
        ):
            with pytest.raises(ValueError, match=message):
                CompressionConfig(name, budget=16, window=4)
    finally:
        METHODS.pop("oldest", None)
        PLUG_INS.pop("user_methods:Oldest", None)


TRAP = (
    "from dataclasses import dataclass\n"
    "from gkv_rollout.methods import EvictionMethod\n"
    "@dataclass\n"
    "class Trap(EvictionMethod):\n"
    "    name = 'trap'\n"
    "    budget: int = 77\n"
    "    window: int = 3\n"
    "    pool: str = 'avg'\n"
    "    pool_kernel: int = 3\n"
    "    def score(self, state):\n"
    "        return self.pool_scores(self.attention(state), state), None\n"
)
TRAP_DEFAULTS = {"budget": 77, "window": 3, "pool": "avg", "pool_kernel": 3}


def test_a_method_runs_with_its_own_defaults_of_the_shared_options(tmp_path, monkeypatch):
    """The pool trap: a method whose shared options' defaults differ from its base's (budget 77, pool avg, ...)
    runs with them wherever the configuration does not set them, whether registered with ``@register`` or named
    ``package.module:Class``; a value given still wins."""
    from gkv_rollout.methods import METHODS, EvictionMethod, register
    from gkv_rollout.registry import PLUG_INS

    (tmp_path / "trap_methods.py").write_text(TRAP)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        resolved = CompressionConfig("trap_methods:Trap").resolved
        assert {k: getattr(resolved, k) for k in TRAP_DEFAULTS} == TRAP_DEFAULTS
        assert CompressionConfig.of("trap").identity() == {"method": "trap", **resolved.identity()}
        assert CompressionConfig.of("trap", budget=90, pool="max").resolved.budget == 90
        assert CompressionConfig.of("trap", pool="max").resolved.pool == "max"
        template = CompressionConfig.template("full", window=5)  # a sweep's run: its method's own defaults
        assert template.for_method("trap", None).resolved.budget == 77
        assert template.for_method("trap", None).resolved.window == 5

        @register
        @dataclass
        class Registered(EvictionMethod):
            name = "trap_registered"
            budget: int = 50
            pool: str = "avg"

            def score(self, state):
                return state.key_pos.float(), None

        assert (
            CompressionConfig("trap_registered").resolved.budget,
            CompressionConfig.of("trap_registered").resolved.pool,
        ) == (50, "avg")
    finally:
        METHODS.pop("trap", None)
        METHODS.pop("trap_registered", None)
        PLUG_INS.pop("trap_methods:Trap", None)


def test_register_and_the_plug_in_path_run_the_same_checks(tmp_path, monkeypatch):
    """``@register`` refuses what ``package.module:Class`` refuses, by the same check (``check_method``): a class
    not decorated ``@dataclass`` (or decorated above ``@register``), one that does not name itself or takes another
    method's name, an option without a default (a key not given takes the method's default), a hook of its kind
    not implemented (an eviction method's ``score``; another kind's cache); control: a well-formed one registers."""
    from gkv_rollout.methods import METHODS, EvictionMethod, Method, register
    from gkv_rollout.registry import PLUG_INS

    class Undecorated(EvictionMethod):
        name = "undecorated"

        def score(self, state):
            return state.key_pos.float(), None

    @dataclass
    class Unnamed(Undecorated):
        name = None

    @dataclass
    class Impostor(Undecorated):
        name = "gkv"

    @dataclass
    class Required(Undecorated):
        name = "required"
        depth: int = dataclasses.field(default_factory=lambda: 1)
        width: int = dataclasses.field(kw_only=True)

    @dataclass
    class Unscored(EvictionMethod):
        name = "unscored"

    @dataclass
    class Cacheless(Method):
        name = "cacheless"

    cases = [
        (Undecorated, "is not decorated @dataclass"),
        (Unnamed, "does not name itself"),
        (Impostor, "is named 'gkv', the name of another method"),
        (Required, "option width has no default"),
        (Unscored, "does not implement score"),
        (Cacheless, "does not implement make_cache"),
    ]
    for cls, message in cases:
        with pytest.raises(ValueError, match=message):
            register(cls)
        assert cls.name not in METHODS or cls.name == "gkv"
    holder = tmp_path / "checked_methods.py"  # the plug-in path: the same classes, the same messages
    holder.write_text("".join(f"{cls.__name__} = None\n" for cls, _ in cases))
    monkeypatch.syspath_prepend(str(tmp_path))
    import checked_methods

    for cls, message in cases[:5]:  # (a Method of another kind is no plug-in: an EvictionMethod subclass is)
        monkeypatch.setattr(checked_methods, cls.__name__, cls)
        with pytest.raises(ValueError, match=message):
            CompressionConfig(f"checked_methods:{cls.__name__}")
        assert f"checked_methods:{cls.__name__}" not in PLUG_INS

    @dataclass
    class WellFormed(Undecorated):
        name = "well_formed"

    try:
        assert register(WellFormed) is WellFormed and CompressionConfig("well_formed").resolved.budget == 2048
    finally:
        METHODS.pop("well_formed", None)


def test_a_method_runs_with_its_own_defaults_through_evaluate_py(tmp_path):
    """The pool trap through a real entry point: ``scripts/evaluate.py compression.method=module:Class`` with no
    shared option given evaluates the method at its own defaults (the results' configuration, what ran)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "trap_methods.py").write_text(TRAP)
    root = Path(__file__).resolve().parents[1]
    args = ["model=tiny", "data.limit=1", "num_generations=1", "max_completion_length=8"]
    proc = subprocess.run(
        [sys.executable, str(root / "scripts" / "evaluate.py"), *args, "compression.method=trap_methods:Trap"]
        + [f"output_dir={tmp_path / 'out'}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (ran,) = json.loads((tmp_path / "out" / "results.json").read_text())["configs"].values()
    assert {k: ran["compression"][k] for k in TRAP_DEFAULTS} == TRAP_DEFAULTS, ran["compression"]


def test_keep_prompt_is_an_option_of_every_eviction_method():
    """``compression.keep_prompt`` (shared, default false; true for ``random_attention``, Random Attention at its
    authors' window and interval of 64): a value that is not a boolean is refused, ``s4r`` (whose exact part is its
    sinks) refuses it, ``full`` keeps every prompt anyway; a prompt that with the window fills the budget is refused
    naming its length, the window and the budget, one token less is accepted (the check the job runs before any
    work, ``check_prompts``, and the cache's own after the prefill)."""
    from gkv_rollout.registry import eviction_methods

    for name in eviction_methods():
        assert CompressionConfig(name, keep_prompt=True).resolved.keep_prompt is True
        default = CompressionConfig(name).resolved.keep_prompt
        assert default is (name == "random_attention")
    ra = CompressionConfig("random_attention").resolved
    assert (ra.window, ra.interval, ra.sinks, ra.budget) == (64, 64, 0, 2048)
    for bad in ("yes", 1, "true"):
        with pytest.raises(ValueError, match="keep_prompt must be true or false"):
            CompressionConfig("gkv", keep_prompt=bad)
    with pytest.raises(ValueError, match="keep_prompt=true does not apply to compression.method=s4r"):
        CompressionConfig("s4r", keep_prompt=True)
    with pytest.raises(ValueError, match="keep_prompt=true does not apply to compression.method=s4r"):
        CompressionConfig("gkv", keep_prompt=True).for_method("s4r", None)  # a sweep's run
    assert CompressionConfig("s4r", keep_prompt=False).method == "s4r"
    assert CompressionConfig("full", keep_prompt=True).identity() == {"method": "full"}
    assert CompressionConfig.of("snapkv", keep_prompt=True, budget=64).resolved.keep_prompt is True

    method = CompressionConfig("gkv", budget=64, window=16, keep_prompt=True).resolved
    names = lambda i: f"the prompt of problem {i}"  # noqa: E731
    method.check_prompts([10, 47, 3], names)  # 47 + 16 < 64: one slot left for the completion
    with pytest.raises(
        ValueError,
        match=r"compression.keep_prompt: the prompt of problem 1 has 48 tokens; with the window \(16\) it fills "
        r"the budget \(64\).* above 64",
    ):
        method.check_prompts([10, 48, 3], names)
    CompressionConfig("gkv", budget=64, window=16).resolved.check_prompts([10, 480, 3], names)  # control: not kept
    assert method.prompt_limit() == 48 and CompressionConfig("gkv").resolved.prompt_limit() is None


def test_a_prompt_that_fills_the_budget_is_refused_by_the_engine(tiny_llama):
    """A library call of the engine with a kept prompt that fills the budget: ValueError naming both numbers before
    any token is generated; one token shorter runs, its prompt kept."""
    from gkv_rollout.contract.eviction import NEVER
    from gkv_rollout.engine import RolloutEngine
    from gkv_train.models import random_prompts

    cfg = CompressionConfig("gkv", budget=16, window=4, interval=4, keep_prompt=True)
    engine = RolloutEngine(tiny_llama, compression=cfg)
    sampling = SamplingConfig(max_new_tokens=20, stop_token_ids=())
    with pytest.raises(
        ValueError, match=r"the prompt of row 1 has 12 tokens; .* window \(4\) it fills the budget \(16\)"
    ):
        engine.generate(random_prompts([5, 12]), sampling)
    out = engine.generate(random_prompts([5, 11]), sampling)
    assert (out.record.evict_at[1, ..., :11] == NEVER).all() and (out.record.evict_at[1] < NEVER).any()


def test_tova_evicts_every_step():
    r = CompressionConfig("tova", budget=16)
    assert (r.resolved.window, r.resolved.interval, r.resolved.pool_kernel, r.option_names()) == (1, 1, 1, ())


def test_unknown_method_lists_the_registered_ones():
    from gkv_rollout.methods import METHODS
    from gkv_rollout.registry import method_class

    with pytest.raises(ValueError, match=", ".join(METHODS)):
        method_class("quest")
    assert {"streaming", "snapkv", "rkv", "gkv", "h2o", "random"} <= set(METHODS)


def test_bad_sampling_config():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)


@pytest.mark.parametrize("path", ["/nonexistent/model", "./missing-dir", "/nonexistent/none.gguf"])
def test_missing_model_path(path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(path)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature must be a finite number > 0 in training"),
        (dict(temperature=float("nan")), "temperature must be a finite number > 0 in training"),
        (dict(temperature=-1.0), "temperature must be a finite number > 0 in training"),
        (dict(top_p=0.0), "top_p must lie in (0, 1]"),
        (dict(top_p=1.5), "top_p must lie in (0, 1]"),
    ],
)
def test_bad_sampling_settings_fail_before_training(kwargs, message):
    from gkv_train.config.eval_config import EvalConfig
    from gkv_train.config.train_config import GRPOTrainConfig

    with pytest.raises(ValueError) as err:
        GRPOTrainConfig(**kwargs)
    assert message in str(err.value)
    if kwargs.get("temperature") == 0.0:
        EvalConfig(temperature=0.0)  # greedy decoding is an evaluation setting
    else:
        with pytest.raises(ValueError):
            EvalConfig(**kwargs)


def test_evaluation_warns_when_the_interval_outlasts_the_completion():
    from gkv_train.config.eval_config import EvalConfig

    trap = EvalConfig(methods=["full", "gkv", "s4r"], budgets=[64], max_completion_length=96)  # reference: 128
    assert len(trap.warnings()) == 1
    assert "compression.interval=128 exceeds max_completion_length=96" in trap.warnings()[0]
    short = dict(methods=["gkv"], budgets=[64], max_completion_length=96)
    assert EvalConfig(**short, compression=CompressionConfig("full", interval=16)).warnings() == []
    assert EvalConfig(methods=["gkv"], budgets=[64], max_completion_length=256).warnings() == []


def test_a_tracker_that_is_not_installed_is_refused_with_the_fix(monkeypatch):
    import importlib.util

    from gkv_train.config.train_config import GRPOTrainConfig

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"report_to=wandb needs the wandb package.*gkv-train\[tracking\]"):
        GRPOTrainConfig(report_to=["wandb"])
    GRPOTrainConfig(report_to=[])  # control: no tracker, nothing to check


def test_trl_fields_are_keys_and_moved_keys_are_named_with_their_new_key():
    """GRPOConfig's own fields are keys as they are (no translation); a moved key, a derived TRL field and the
    old ``trl.`` prefix are refused naming the key to write; a typo gets "did you mean"."""
    from gkv_train.config.compose import check_overrides

    argv = [
        "recipe=rl_full",
        "compression.budget=64",
        "max_completion_length=32",
        "num_generations=4",
        "temperature=0.7",
        "precision=bf16",
        "weight_decay=0.01",
        "num_iterations=2",
        "log_completions=true",
        "push_to_hub=false",
        "+x=1",
    ]
    assert check_overrides(argv, "train") == argv
    refusals = {
        "max_new_tokens=32": "max_new_tokens is now max_completion_length: write max_completion_length=32",
        "sampling.max_new_tokens=32": "sampling.max_new_tokens is now max_completion_length: write "
        "max_completion_length=32",
        "sampling.num_generations=4": "sampling.num_generations is now num_generations: write num_generations=4",
        "sampling.top_p=0.9": "sampling.top_p is now top_p: write top_p=0.9",
        "sampling.compile_decode=true": "sampling.compile_decode is now compile_decode: write compile_decode=true",
        "compression.eviction.alpha=0.5": "compression.eviction.alpha is now compression.alpha: write "
        "compression.alpha=0.5",
        "compression.options.eta=0.3": "compression.options.eta is now compression.eta: write compression.eta=0.3",
        "++compression.options.alpha=0.5": "compression.options.alpha is now compression.alpha: write "
        "compression.alpha=0.5",
        "compression.s4r.eta=0.3": "compression.s4r.eta is now compression.eta",
        "compression.options.offset=3": "compression.options.offset is now compression.offset",  # a plug-in's
        "n_samples=2": "n_samples is now num_generations",
        "bf16=true": "bf16 (TRL's) is not a key here: it is set from precision=bf16",
        "per_device_train_batch_size=8": "set from prompts_per_step",
        "trl.weight_decay=0.01": "trl.weight_decay: TRL's fields are keys of their own: write weight_decay=0.01",
        "num_generation=4": "unknown configuration key 'num_generation'; did you mean num_generations",
        "compression.bugdet.x=4": "'compression.bugdet.x'",
    }
    for arg, message in refusals.items():
        with pytest.raises(ValueError) as err:
            check_overrides([arg], "train")
        assert message in str(err.value), (arg, str(err.value))
    assert check_overrides(["num_generations=2"], "evaluate") == ["num_generations=2"]
    for old in ("n_samples=2", "sampling.num_generations=2"):
        with pytest.raises(ValueError, match=f"{old.split('=')[0]} is now num_generations"):
            check_overrides([old], "evaluate")
    with pytest.raises(ValueError, match="unknown configuration key 'weight_decay'"):  # TRL's fields: training only
        check_overrides(["weight_decay=0.1"], "evaluate")


OLD_CONFIG_YAML = """\
recipe: rl_sparse
compression:
  method: s4r
  budget: 64
  window: 8
  interval: 16
  sinks: null
  keep_prompt: null
  pool_kernel: null
  pool: null
  group_agg: null
  options:
    eta: 0.3
    refresh: 64
"""


def test_every_option_of_a_method_is_a_key_of_compression():
    """One namespace per method (issue 65): a method's own option is ``compression.<name>`` beside the shared ones
    (``compression.alpha=0.5`` reaches the method), the resolved configuration and ``--help`` list it so, the earlier
    ``compression.options.<name>`` is refused naming the new key, a misspelt option is named by the method with the
    closest one, and a configuration an earlier version wrote (``compression.options: {eta: 0.3}``) reads as the
    same settings and identity as one written now."""
    import yaml

    from gkv_train.config.compose import build, configure, dotted_keys
    from gkv_train.config.keyhelp import job_rows
    from gkv_train.config.moved import current_keys

    config, _, files = configure("train", ["compression.alpha=0.5"])
    assert config.compression.resolved.alpha == 0.5 and config.compression.options == {"alpha": 0.5}
    written = yaml.safe_load(files["config.yaml"])["compression"]
    assert written["alpha"] == 0.5 and "options" not in written  # the resolved configuration is flat too
    keys = [key for key, *_ in job_rows("train")[0]]
    assert {"compression.alpha", "compression.eta", "compression.budget"} <= set(keys)
    assert not [key for key in keys if key.startswith("compression.options")]
    for argv, message in [
        (["compression.options.alpha=0.5"], "compression.options.alpha is now compression.alpha: write "),
        (["compression.bugdet=4"], r"compression.bugdet does not apply .* \(did you mean budget\?\)"),
        (["compression.method=s4r", "compression.etta=0.3"], r"\(did you mean eta\?\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            configure("train", argv)
    # a run written before: its keys under today's names, the same settings and identity as one composed now
    s4r = ["compression.method=s4r", "compression.eta=0.3", "compression.refresh=64", "recipe=rl_sparse"]
    now = dotted_keys(yaml.safe_load(configure("train", s4r)[2]["config.yaml"]))
    before = current_keys(dotted_keys(yaml.safe_load(OLD_CONFIG_YAML)))
    assert {k: v for k, v in now.items() if k.startswith("compression.")} == {
        k: v for k, v in before.items() if k.startswith("compression.")
    }
    old = build(CompressionConfig, {k[12:]: v for k, v in before.items() if k.startswith("compression.")})
    assert old.identity() == configure("train", s4r)[0].compression.identity()
    assert (
        old.identity() == CompressionConfig.of("s4r", budget=64, window=8, interval=16, eta=0.3, refresh=64).identity()
    )
    control = current_keys(dotted_keys(yaml.safe_load(OLD_CONFIG_YAML.replace("eta: 0.3", "eta: 0.4"))))
    assert build(
        CompressionConfig, {k[12:]: v for k, v in control.items() if k.startswith("compression.")}
    ).identity() != (old.identity())


def test_overrides_rough_edges():
    """Dashes refused with the fix; report_to as a string; a data path drops the default task name."""
    from gkv_train.config.compose import check_overrides
    from gkv_train.config.train_config import GRPOTrainConfig

    for argv, fix in (
        (["--max_steps=5"], "max_steps=5"),
        (["--max_steps", "5"], "max_steps=5"),
        (["--lr"], "lr=VALUE"),
    ):
        with pytest.raises(ValueError, match=f"drop the dashes, overrides are key=value \\(write {fix}\\)"):
            check_overrides(argv, "train")
    assert check_overrides(["--help"], "train") == ["--help"]  # Hydra's own flag
    assert GRPOTrainConfig(report_to="tensorboard").report_to == ["tensorboard"]  # TRL takes a string too
    assert check_overrides(["data.path=a.jsonl"], "evaluate") == ["data.path=a.jsonl", "data.name=null"]
    both = ["data.path=a.jsonl", "data.name=gsm8k"]  # control: an explicit name stays (and is refused later)
    assert check_overrides(both, "evaluate") == both
    # through the entry points: one line, exit 2, before any work (evaluate.py's two command lines in one
    # interpreter: entry_points.run_each); a moved key through both, naming the new key
    from pathlib import Path

    from entry_points import run_each

    root = Path(__file__).resolve().parents[1]
    dashes, moved = run_each(
        root / "scripts" / "evaluate.py",
        [["--data.limit", "2"], ["compression.options.eta=0.3"]],
        cwd=root,
        timeout=300,
    )
    assert dashes.returncode == 2 and dashes.stderr.strip() == (
        "error: --data.limit: drop the dashes, overrides are key=value (write data.limit=2)"
    ), dashes.stderr
    assert moved.returncode == 2 and moved.stderr.strip().endswith("write compression.eta=0.3"), moved.stderr
    (moved,) = run_each(root / "train.py", [["max_new_tokens=8"]], cwd=root, timeout=300)
    assert moved.returncode == 2 and moved.stderr.strip().endswith("write max_completion_length=8"), moved.stderr


def test_the_configuration_is_the_trainers_arguments():
    """GRPO: ``GRPOTrainConfig`` is TRL's ``GRPOConfig`` with the project's keys, every TRL key as given and the
    fields set from the project's keys derived; distillation: ``DistillTrainConfig`` is ``TrainingArguments`` with
    the distillation options and sampling; through the composition a key of the other algorithm is refused, not
    dropped (a control: at its default it passes)."""
    import json

    from transformers import TrainingArguments
    from trl import GRPOConfig

    from gkv_train.config.compose import configure
    from gkv_train.config.train_config import DistillTrainConfig, GRPOTrainConfig

    config = GRPOTrainConfig(weight_decay=0.01, num_iterations=2, num_generations=4, top_p=0.9, compile_decode=True)
    assert isinstance(config, GRPOConfig)
    assert (config.weight_decay, config.num_iterations, config.num_generations, config.top_p) == (0.01, 2, 4, 0.9)
    assert (config.per_device_train_batch_size, config.max_completion_length, config.learning_rate) == (8, 96, 2e-6)
    assert (config.temperature, config.compile_decode, config.generation_batch_size) == (0.6, True, 8)
    assert json.loads(config.to_json_string())["compression"]["budget"] == 64  # option groups serialise
    assert GRPOTrainConfig(precision="bf16").bf16  # derived: precision sets bf16
    given = dict(recipe="distill", weight_decay=0.01, temperature=0.8, max_completion_length=20, prompts_per_step=3)
    distill = DistillTrainConfig(**given)
    assert isinstance(distill, TrainingArguments) and not isinstance(distill, GRPOConfig)
    assert (distill.weight_decay, distill.per_device_train_batch_size) == (0.01, 3)
    assert (distill.temperature, distill.max_completion_length, distill.top_p) == (0.8, 20, 0.95)
    assert not distill.remove_unused_columns
    for key in ("num_generations=4", "num_iterations=2", "rewards=[a.b]"):
        with pytest.raises(ValueError, match=f"{key.split('=')[0]}: GRPO options .* algorithm=distill"):
            configure("train", ["recipe=distill", "model=tiny", key])
    with pytest.raises(ValueError, match="distill.mode: distillation options, but algorithm=grpo"):
        configure("train", ["model=tiny", "distill.mode=onpolicy"])
    assert type(configure("train", ["recipe=distill", "model=tiny", "num_generations=8"])[0]) is DistillTrainConfig
    with pytest.raises(ValueError, match="max_steps='abc': expected an integer"):
        configure("train", ["model=tiny", "max_steps=abc"])
    with pytest.raises(ValueError, match="lora.r=True: expected an integer"):  # a bool is no number
        configure("train", ["model=tiny", "lora.r=true"])
    with pytest.raises(ValueError, match="unknown mask_backend 'triton'; choose one of"):  # before any rollout
        GRPOTrainConfig(mask_backend="triton")
    assert GRPOTrainConfig(mask_backend="sdpa").mask_backend == "sdpa"
    for key in ("max_steps", "lora.r", "temperature", "compression.method"):  # null where no None is allowed
        with pytest.raises(ValueError, match=f"{key}=null: expected"):
            configure("train", ["model=tiny", f"{key}=null"])
    assert configure("train", ["model=tiny", "save_total_limit=null"])[0].save_total_limit is None  # Optional
    # numbers and bools written as text convert as OmegaConf converts them (a quoted value, ${oc.env:...})
    text = configure("train", ["model=tiny", "max_steps='5'", "learning_rate='1e-5'", "lora.enabled=yes"])[0]
    assert (text.max_steps, text.learning_rate, text.lora.enabled) == (5, 1e-5, True)
    for added, message in (
        ("+lora.foo=1", "unknown configuration key 'lora.foo'"),
        ("+foo=1", "unknown configuration key 'foo'"),
        ("++per_device_train_batch_size=3", "'per_device_train_batch_size' (TRL's; set from prompts_per_step"),
    ):
        with pytest.raises(ValueError) as err:
            configure("train", ["model=tiny", added])
        assert message in str(err.value), (added, str(err.value))
    with pytest.raises(ValueError, match="6 rows per step must be divisible by processes x gradient_accumulation"):
        GRPOTrainConfig(prompts_per_step=3, num_generations=2, gradient_accumulation_steps=4)


def test_trl_generation_options_the_engine_lacks_are_refused(monkeypatch):
    """top_k, repetition_penalty, ... are GRPOConfig fields that only TRL's own generation reads: refused with the
    rollout engine (not passed through to be ignored), accepted with use_vllm (where vLLM is installed: here a
    stand-in says so); report_to of a wrong kind is a refusal, not a traceback; evaluation's schema does not import
    TRL."""
    import subprocess
    import sys

    from trl import import_utils

    from gkv_train.config.train_config import GRPOTrainConfig

    for key, value in (("top_k", 1), ("repetition_penalty", 2.0), ("min_p", 0.5)):
        with pytest.raises(ValueError, match=f"{key}={value} is not honoured here: an option of TRL's own generation"):
            GRPOTrainConfig(**{key: value})
    with pytest.raises(ValueError, match="use_vllm=true generates through vLLM, which is not installed here"):
        GRPOTrainConfig(top_k=1, use_vllm=True, recipe="rl_full", compression=CompressionConfig("full"))
    monkeypatch.setattr(import_utils, "is_vllm_available", lambda *args, **kwargs: True)
    GRPOTrainConfig(top_k=1, use_vllm=True, recipe="rl_full", compression=CompressionConfig("full"))  # control
    with pytest.raises(ValueError, match="report_to must be a tracker name or a list of them, got 5"):
        GRPOTrainConfig(report_to=5)
    probe = (
        "import sys; from gkv_train.config.compose import configure; configure('evaluate', ['model=tiny']); "
        "configure('traces', ['model=tiny']); print('trl' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "False\n"


def test_compile_decode_with_s4r_is_refused_before_work():
    from gkv_train.config.eval_config import EvalConfig
    from gkv_train.config.train_config import GRPOTrainConfig

    with pytest.raises(ValueError, match="compile_decode=true does not apply to s4r"):
        GRPOTrainConfig(compile_decode=True, compression=CompressionConfig("s4r"))
    with pytest.raises(ValueError, match="compile_decode=true does not apply to s4r"):
        EvalConfig(compile_decode=True, methods=["gkv", "s4r"])
    assert EvalConfig(compile_decode=True, methods=["full", "gkv"]).compile_decode


def test_chunk_given_is_a_sampling_key_of_every_job():
    """chunk_given (the engine's ``SamplingConfig.chunk_given``) is a key of train, evaluate and traces, passed to
    the engine by ``rollout_sampling`` (and GRPO's rollouts); a value that is not a bool is refused before any work,
    as is chunk_given=false with use_vllm (vLLM generates: the engine's option would do nothing)."""
    from gkv_train.config.compose import configure
    from gkv_train.config.eval_config import EvalConfig, TracesConfig
    from gkv_train.config.options import rollout_sampling
    from gkv_train.config.train_config import DistillTrainConfig, GRPOTrainConfig

    for job in ("train", "evaluate", "traces"):
        assert configure(job, ["model=tiny"])[0].chunk_given is True
        config = configure(job, ["model=tiny", "chunk_given=false"])[0]
        assert config.chunk_given is False and rollout_sampling(config, 0, 1).chunk_given is False
        with pytest.raises(ValueError, match="chunk_given='maybe': expected true or false"):
            configure(job, ["model=tiny", "chunk_given=maybe"])
    for make in (GRPOTrainConfig, DistillTrainConfig, EvalConfig, TracesConfig):
        for value in ("no", 0, None):
            with pytest.raises(ValueError, match=f"chunk_given must be true or false, got {value!r}"):
                make(chunk_given=value)
    with pytest.raises(ValueError, match="use_vllm generates through vLLM: chunk_given=false"):
        GRPOTrainConfig(use_vllm=True, chunk_given=False, recipe="rl_full", compression=CompressionConfig("full"))
    try:  # the control: chunk_given's default is not refused (without vLLM installed, its install check is)
        GRPOTrainConfig(use_vllm=True, recipe="rl_full", compression=CompressionConfig("full"))
    except ValueError as err:
        assert "vLLM, which is not installed here" in str(err), err


def test_a_model_that_changes_its_logits_after_the_head_is_refused_before_it_loads(tmp_path):
    """A model folder whose configuration softcaps the logits after the LM head (Gemma 2) is refused by the job's
    checks from its configuration (the rollout's and the trainer's log-probs come from the bare head); the
    control: the same folder with the softcapping off."""
    from transformers import Gemma2Config

    from gkv_train.config.preflight import WeightlessModel, check_generations
    from gkv_train.models import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path)
    shape = dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8, hidden_size=16)
    Gemma2Config(vocab_size=128, final_logit_softcapping=30.0, **shape).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"model={tmp_path} changes its logits after the LM head"):
        check_generations(WeightlessModel(str(tmp_path)), [], 4, "cpu")
    Gemma2Config(vocab_size=128, final_logit_softcapping=None, **shape).save_pretrained(tmp_path)
    check_generations(WeightlessModel(str(tmp_path)), [], 4, "cpu")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps must be at least 1, got 0"),
        (dict(max_grad_norm=-1.0), "max_grad_norm must be a finite number >= 0 (0 turns gradient clipping off)"),
        (dict(beta=-0.1), "beta must be a finite number >= 0"),
        (dict(epsilon=0.0), "epsilon must be a finite number > 0"),
        (dict(epsilon_high=-0.2), "epsilon_high must be a finite number > 0"),
        (dict(learning_rate=-1.0), "learning_rate must be a finite number > 0, got -1.0"),
        (dict(learning_rate=float("inf")), "learning_rate must be a finite number > 0"),
        (dict(warmup_steps=-1), "warmup_steps must be a finite number >= 0"),
        (dict(save_total_limit=0), "save_total_limit must be at least 1 or null"),
        (dict(eval_steps=0), "eval_steps must be at least 1 or null"),
        (dict(logging_steps=0), "logging_steps must be at least 1"),
        (dict(eval_samples=0), "eval_samples must be at least 1"),
        (dict(reward_weights=[float("nan")]), "reward_weights must be a finite number"),
        (dict(num_iterations=0), "num_iterations must be at least 1, got 0"),
        (dict(steps_per_generation=0), "steps_per_generation must be at least 1, got 0"),
        (dict(scale_rewards="bogus"), "unknown scale_rewards 'bogus'; choose one of group, batch, none"),
    ],
)
def test_numeric_options_outside_their_range_are_refused(kwargs, message):
    from gkv_train.config.train_config import GRPOTrainConfig

    with pytest.raises(ValueError) as err:
        GRPOTrainConfig(**kwargs)
    assert message in str(err.value)


def test_push_to_hub_without_the_hub_is_refused_before_work(monkeypatch):
    from huggingface_hub import constants

    from gkv_train.config.train_config import GRPOTrainConfig

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="push_to_hub=true needs the Hugging Face Hub, which HF_HUB_OFFLINE=1"):
        GRPOTrainConfig(push_to_hub=True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with pytest.raises(ValueError, match="push_to_hub=true needs a Hugging Face token"):
        GRPOTrainConfig(push_to_hub=True)


def test_s4r_refresh_within_the_generation_and_counted_in_memory():
    """A refresh at or past the generation's end refreshes nothing and only takes memory: refused by every job and
    the engine; the memory estimate counts the refresh buffers."""
    from gkv_train.config.eval_config import EvalConfig
    from gkv_train.config.preflight import ModelShape, rollout_bytes
    from gkv_train.config.train_config import GRPOTrainConfig

    refresh = CompressionConfig.of("s4r", refresh=64)
    for build in (
        lambda: EvalConfig(compression=refresh, max_completion_length=8),
        lambda: GRPOTrainConfig(compression=refresh, max_completion_length=64, num_generations=2),
    ):
        with pytest.raises(ValueError, match="compression.refresh=64 refreshes nothing in a generation of"):
            build()
    EvalConfig(compression=refresh, max_completion_length=65)  # control
    model, tokenizer = load_model("tiny")
    from gkv_rollout.engine import RolloutEngine

    with pytest.raises(ValueError, match="refreshes nothing in a generation of 8 tokens"):
        RolloutEngine(model, tokenizer, refresh).generate(["a prompt"], SamplingConfig(max_new_tokens=8))
    shape = ModelShape("m", 4096, 4, 6, 2, 16)
    grows = [rollout_bytes(shape, CompressionConfig.of("s4r", refresh=r), 1, 100, 200, 4) for r in (0, 64, 128)]
    assert grows[0] < grows[1] < grows[2] and grows[2] - grows[1] == 2 * 4 * 64 * 2 * 16 * 4


def test_lora_options_are_checked_and_range_edges_accepted():
    """lora.r=0 is refused with the configuration, before the model loads. Controls: the edges of each range run
    (max_grad_norm=0 is transformers' "no clipping")."""
    from gkv_train.config.options import LoraOptions
    from gkv_train.config.train_config import GRPOTrainConfig

    for kwargs, message in [
        (dict(r=0), "lora.r must be a finite number >= 1, got 0"),
        (dict(alpha=0), "lora.alpha must be a finite number > 0"),
        (dict(dropout=1.0), "lora.dropout must be a finite number in [0, 1)"),
    ]:
        with pytest.raises(ValueError) as err:
            LoraOptions(**kwargs)
        assert message in str(err.value)
    GRPOTrainConfig(max_grad_norm=0.0, beta=0.0, warmup_steps=0, save_total_limit=None, eval_steps=None)
    LoraOptions(enabled=True, r=1, alpha=1, dropout=0.0)


def test_rl_full_with_a_compressing_method_is_refused_unless_the_dense_learner_is_asked_for():
    """recipe=rl_full compression.method=s4r would roll out compressed and train without the record, silently:
    it runs only with rl.train_with_record=false given (the dense-learner baseline)."""
    from gkv_train.config.options import SparseRLOptions
    from gkv_train.config.train_config import GRPOTrainConfig

    s4r = CompressionConfig("s4r")
    with pytest.raises(ValueError, match="recipe=rl_full trains on full-cache rollouts, but compression.method=s4r"):
        GRPOTrainConfig(recipe="rl_full", compression=s4r)
    GRPOTrainConfig(recipe="rl_full", compression=s4r, rl=SparseRLOptions(train_with_record=False))
    GRPOTrainConfig(recipe="rl_full", compression=CompressionConfig("full"))  # the recipe as shipped
    GRPOTrainConfig(recipe="rl_sparse", compression=s4r)


def test_recipes_compose_to_what_they_say():
    """rl_full sets no record option (a full cache writes none); with a compressing method on the command line it
    is refused, with rl.train_with_record=false accepted."""
    from gkv_train.config.compose import configure

    full = configure("train", ["recipe=rl_full"])[0]
    assert (full.compression.method, full.rl.train_with_record) == ("full", True)
    with pytest.raises(ValueError, match="recipe=rl_full trains on full-cache rollouts"):
        configure("train", ["recipe=rl_full", "compression.method=gkv"])
    dense = configure("train", ["recipe=rl_full", "compression.method=gkv", "rl.train_with_record=false"])[0]
    assert dense.rl.train_with_record is False


def test_a_recipe_file_is_the_users_whatever_its_name_and_bounded(tmp_path, monkeypatch):
    """A recipe file named like a built-in recipe is the user's (not replaced by the built-in); a file that sets
    Hydra's own keys, uses YAML aliases (a few lines that expand to gigabytes, or to themselves), is too large or
    is named like Hydra's sweep syntax is refused or read as it is, never silently changed."""
    from gkv_train.config.compose import configure

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "rl_sparse.yaml").write_text("learning_rate: 0.5\n")
    assert configure("train", [f"recipe={tmp_path / 'rl_sparse.yaml'}"])[0].learning_rate == 0.5
    (tmp_path / "x,y.yaml").write_text("learning_rate: 0.25\n")
    assert configure("train", [f"recipe={tmp_path / 'x,y.yaml'}"])[0].learning_rate == 0.25
    refused = {
        "hydra.yaml": ("hydra: {run: {dir: /nonexistent/elsewhere}}\n", "sets hydra .*output_dir="),
        "bomb.yaml": ('a: &a ["x", "x"]\nb: &b [*a, *a]\nc: [*b, *b]\n', r"uses YAML aliases \(\*a\)"),
        "self.yaml": ("a: &a [*a]\n", "is not YAML|uses YAML aliases"),
        "big.yaml": ("learning_rate: 1e-5\n" + "# x\n" * 400_000, "has 1600020 bytes: a recipe holds at most"),
    }
    for name, (text, message) in refused.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=f"recipe file {tmp_path / name} (?:{message})"):
            configure("train", [f"recipe={tmp_path / name}"])


def test_evaluation_budgets_and_methods_are_never_replaced():
    """budgets=[0] used to run at the default budget (2048): refused, as is an empty list."""
    from gkv_train.config.eval_config import EvalConfig

    with pytest.raises(ValueError, match=r"budgets are token counts: each must be at least 1, got \[0\]"):
        EvalConfig(methods=["gkv"], budgets=[0])
    for key in ("methods", "budgets"):
        with pytest.raises(ValueError, match=f"{key}=\\[\\] names no run"):
            EvalConfig(**{key: []})
    assert [c.budget for c in EvalConfig(methods=["gkv"], budgets=[64, 128]).compressions()] == [64, 128]


def test_the_checks_before_work_read_the_model_once(monkeypatch, weightless_model):
    """A job reads its model's configuration and tokenizer once (``WeightlessModel``, on first use) and every check
    before work takes what was read: with the reader broken after that one read, the context, LoRA and generation
    checks still run; the control: another model object reads again, and fails."""
    from gkv_rollout.config import CompressionConfig
    from gkv_train import models
    from gkv_train.config.options import LoraOptions
    from gkv_train.config.preflight import (
        Generation,
        WeightlessModel,
        check_generations,
        check_lora_targets,
        check_task_contexts,
    )
    from gkv_train.problems.data import DataConfig

    read = WeightlessModel(weightless_model)
    assert read.config.num_hidden_layers and read.tokenizer is not None  # read here, once

    def broken(name):
        raise AssertionError(f"{name} read again")

    monkeypatch.setattr(models, "load_config_and_tokenizer", broken)
    check_task_contexts(read, {"data": DataConfig(name="niah_single", context=256)})
    check_lora_targets(read, LoraOptions(enabled=True))
    check_generations(
        read, [Generation("evaluation", ["a question"], [0], 1, 8, [CompressionConfig("full")])], 4, "cpu"
    )
    with pytest.raises(AssertionError, match="read again"):
        WeightlessModel(weightless_model).config


def test_limits_are_checked_from_the_configuration(monkeypatch, weightless_model):
    """Prompt + new tokens against the context, an S4R rank against D', and the rollout's KV memory against what the
    machine has, from the model's configuration only (a model folder without weights)."""
    from gkv_train.config import preflight
    from gkv_train.config.preflight import Generation, WeightlessModel, check_generations

    prompts, ids = ["short question", "x" * 5000], [7, 8]
    full = [CompressionConfig("full")]

    def check(prompts=prompts, new=24, compressions=full, rows=4):
        check_generations(
            WeightlessModel(weightless_model),
            [Generation("evaluation", prompts, ids, rows, new, compressions)],
            4,
            "cpu",
        )

    with pytest.raises(ValueError, match="the prompt of problem 8 \\(5000 tokens\\) plus 24 new tokens"):
        check()
    check(prompts=prompts[:1])  # control
    with pytest.raises(
        ValueError, match="max_completion_length=5000 does not fit .* at most 4082 does after the longest"
    ):
        check(prompts=prompts[:1], new=5000)
    with pytest.raises(ValueError, match="compression.rank_v=33 exceeds"):
        check(prompts=prompts[:1], compressions=[CompressionConfig.of("s4r", rank_v=33)])
    check(prompts=prompts[:1], compressions=[CompressionConfig.of("s4r", rank_v=32)])
    with pytest.raises(ValueError, match=r"compression.full_layers=\[1, 4\]: .* has layers 0-3"):
        check(prompts=prompts[:1], compressions=[CompressionConfig.of("s4r", full_layers=[1, 4])])
    # 2 x 4 layers x 2 KV heads x 16 x 4 bytes = 1 kB per token and row (full cache)
    one = preflight.rollout_bytes(preflight.ModelShape("m", 4096, 4, 6, 2, 16), full[0], 1, 10, 90, 4)
    assert one == 100 * 1024 + 90 * 12
    monkeypatch.setattr(preflight, "available_memory", lambda device: (20 * 10**6, "test memory"))
    with pytest.raises(
        ValueError,
        match=r"the evaluation \(64 sequences, full cache, max_completion_length=900\) needs about "
        r"60.\d MB .* more than the 20.0 MB of test memory",
    ):
        check(prompts=["q" * 5], new=900, rows=64)
    check(prompts=["q" * 5], new=900, rows=16)  # controls: fewer rows; a compressed cache (budget + interval slots)
    check(prompts=["q" * 5], new=900, rows=64, compressions=[CompressionConfig("gkv", budget=64, interval=16)])


def test_help_lists_every_key_with_type_default_and_help():
    """train.py / evaluate.py / generate_traces.py --help: every configuration key (nested groups dotted) with its
    type, default and a help text taken from the dataclasses; none without help."""
    import subprocess
    import sys
    from pathlib import Path

    from gkv_train.config.keyhelp import job_rows

    root = Path(__file__).resolve().parents[1]
    scripts = {"train": "train.py", "evaluate": "scripts/evaluate.py", "traces": "scripts/generate_traces.py"}
    shown = {}
    for job, script in scripts.items():
        own, trl = job_rows(job)
        keys = own + trl
        assert all(text for _, _, _, text in keys), [key for key, _, _, text in keys if not text]
        flag = "-h" if script == "train.py" else "--help"  # both spellings
        shown[script] = subprocess.run(
            [sys.executable, str(root / script), flag], capture_output=True, text=True, check=True
        ).stdout
        for key, kind, default, _ in keys:
            assert f"  {key}  ({kind}, default {default})" in shown[script], key
    train = shown["train.py"]
    assert "rl.rollout_veto  (float | None, default None)" in train and "recipe=NAME" in train
    assert "  max_completion_length  (int | None, default 96)" in train and "\n  max_new_tokens " not in train
    assert "  compile_decode  (bool, default False)" in train and "\n  sampling." not in train
    # TRL's own fields, with TRL's types and help; the project's defaults say why they differ
    assert "  weight_decay  (float, default 0.0)\n      Weight decay coefficient" in train
    assert "  learning_rate  (float, default 2e-06)" in train and "[Default here 2e-06: " in train


def test_a_run_identity_is_its_methods_fields():
    """A run's identity (the fingerprint keying its folder) records the method's name and every field of the
    method, none of another method's; a changed option changes it."""
    import dataclasses

    from gkv_rollout.config import CompressionConfig
    from gkv_train.config.eval_config import EvalConfig

    config = EvalConfig(model="tiny")
    for method in ("full", "gkv", "h2o", "s4r", "random_attention"):
        resolved = CompressionConfig(method).resolved
        identity = config.run_settings(CompressionConfig(method))["compression"]
        fields = dataclasses.asdict(resolved)
        if fields.get("keep_prompt") is False:  # an option added later: in the identity only when set
            del fields["keep_prompt"]
        assert identity == {"method": method, **fields}
    assert config.run_settings(CompressionConfig("random_attention"))["compression"]["keep_prompt"] is True
    kept = config.run_settings(CompressionConfig("gkv", keep_prompt=True))["compression"]
    assert kept["keep_prompt"] is True and kept != config.run_settings(CompressionConfig("gkv"))["compression"]
    assert "redundancy" not in config.run_settings(CompressionConfig("h2o"))["compression"]  # h2o does not read it
    plain = config.run_settings(CompressionConfig("s4r"))["compression"]
    refreshed = config.run_settings(CompressionConfig.of("s4r", refresh=8))["compression"]
    assert (plain["refresh"], refreshed["refresh"]) == (0, 8) and plain != refreshed
