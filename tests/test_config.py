import pytest

from gkv_train.models import load_model
from rollout.config import CompressionConfig, SamplingConfig


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
        (dict(method="streaming", budget=20, window=16, sinks=8), "sinks (8) + window (16) must fit"),
    ],
)
def test_bad_compression_config_names_the_problem(kwargs, message):
    with pytest.raises(ValueError) as err:
        CompressionConfig(**kwargs)
    assert message in str(err.value)


def test_method_defaults():
    assert CompressionConfig(method="streaming").num_sinks == 4
    assert CompressionConfig(method="gkv").num_sinks == 0
    gkv = CompressionConfig(method="gkv")
    assert (gkv.num_window, gkv.interval, gkv.alpha, gkv.lambda_, gkv.form) == (16, 128, 0.8, 0.5, "max")
    assert CompressionConfig(method="full", budget=1, window=16).budget == 1  # budget unused without compression


def test_bad_sampling_config():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)


@pytest.mark.parametrize("path", ["/nonexistent/model", "./missing-dir", "/tmp/none.gguf"])
def test_missing_model_path(path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(path)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature must be a finite number > 0 in training"),
        (dict(temperature=float("nan")), "temperature must be a finite number > 0"),
        (dict(temperature=-1.0), "temperature must be a finite number > 0"),
        (dict(top_p=0.0), "top_p must lie in (0, 1]"),
        (dict(top_p=1.5), "top_p must lie in (0, 1]"),
    ],
)
def test_bad_sampling_settings_fail_before_training(kwargs, message):
    from gkv_train.config import EvalConfig, TrainConfig

    with pytest.raises(ValueError) as err:
        TrainConfig(**kwargs)
    assert message in str(err.value)
    if kwargs.get("temperature") == 0.0:
        EvalConfig(temperature=0.0)  # greedy decoding is an evaluation setting
    else:
        with pytest.raises(ValueError):
            EvalConfig(**kwargs)
