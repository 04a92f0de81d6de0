import dataclasses
import os

import pytest
import torch

from gkv_rollout.config import CompressionConfig
from gkv_rollout.registry import eviction_methods, method_class
from gkv_train.models import load_model, random_prompts, tiny_model  # noqa: F401 (random_prompts: the tests')

# pytest -n N (make test): the cores shared out among the workers, here and in the processes the tests start
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
else:
    torch.set_num_threads(max(1, torch.get_num_threads()))


def tiny_methods(budget, window, interval, longest):
    """Every registered eviction method at its defaults (a method whose own window or interval is smaller keeps
    it: TOVA evicts every step; one that keeps the prompt gets a budget that holds the longest prompt, ``longest``
    tokens: ``method_budget``), and G-KV's other history forms."""
    common = dict(budget=budget, window=window, interval=interval)
    names = eviction_methods()
    defaults = {name: {f.name: f.default for f in dataclasses.fields(method_class(name))} for name in names}
    own = {
        name: {k: min(v, defaults[name][k]) for k, v in common.items() if k != "budget"} for name in eviction_methods()
    }
    return [
        CompressionConfig(name, budget=method_budget(name, budget, own[name]["window"], longest), **own[name])
        for name in eviction_methods()
    ] + [
        CompressionConfig.of("gkv", form="mean", **common),
        CompressionConfig.of("gkv", form="sum", redundancy=False, **common),
    ]


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("tiny-llama")


@pytest.fixture(scope="session")
def tiny_llama_fp64():
    """tiny-llama's weights in fp64: where equality of kept sets is tested (the logic, not the rounding), since
    fp32 rounding that differs between two ways of computing the same forward may cross a top-k boundary."""
    return tiny_model("tiny-llama", dtype=torch.float64)


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def gsm8k_questions():
    from gkv_train.problems.data import gsm8k_questions

    return gsm8k_questions(10**6)


@pytest.fixture(scope="session")
def weightless_model(tmp_path_factory):
    """A model folder with the tiny model's configuration and tokenizer but no weights: checks that read only the
    configuration pass, and anything that loads the model fails (so a check that fails with its own message ran
    before the model loaded)."""
    from gkv_train.models import tiny_config, tiny_tokenizer

    folder = tmp_path_factory.mktemp("weightless")
    tiny_config().save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def method_budget(name: str, budget: int, window: int, longest: int) -> int:
    """The budget a test gives the method ``name`` at its defaults: ``budget``, or for a method that keeps each
    prompt (``random_attention``), one that holds the longest prompt (``longest`` tokens) and the window with room
    to spare (half of ``budget``): a prompt that fills the budget is refused."""
    keeps = getattr(method_class(name), "keep_prompt", False)
    return longest + window + budget // 2 if keeps else budget
