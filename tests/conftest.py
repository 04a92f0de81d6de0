import json

import pytest
import torch

from gkv_train.data import DATA_DIR
from gkv_train.models import TINY_VOCAB, load_model, tiny_model

torch.set_num_threads(max(1, torch.get_num_threads()))


def random_prompts(lengths, vocab=TINY_VOCAB, seed=0):
    """Token-id prompts of the given lengths (ids >= 3, so never BOS/EOS of the tiny models)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("tiny-llama")


@pytest.fixture(scope="session")
def smollm2():
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def gsm8k_questions():
    with open(DATA_DIR / "gsm8k_test.jsonl") as f:
        return [json.loads(line)["question"] for line in f]
