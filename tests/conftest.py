import pytest
import torch

from gkv_train.models import load_model, random_prompts, tiny_model  # noqa: F401 (random_prompts: the tests')

torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def gsm8k_questions():
    from gkv_train.data import gsm8k_questions

    return gsm8k_questions(10**6)
