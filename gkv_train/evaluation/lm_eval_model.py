"""An lm-evaluation-harness model (``lm-eval``, the optional extra ``gkv-train[lm-eval]``): any lm-eval task under a
compressed KV cache.

    gkv-train lm-eval --model gkv --model_args pretrained=smollm2-135m,method=gkv,budget=512 --tasks <task>
    python -m gkv_train.evaluation.lm_eval_model --model gkv ...   # the same: lm-eval's own command, ``gkv`` registered

    from gkv_train.evaluation.lm_eval_model import CompressedLM    # from Python
    lm_eval.simple_evaluate(model=CompressedLM(pretrained="smollm2-135m", method="gkv", budget=512), tasks=[...])

``generate_until`` samples with the rollout engine under the compression (greedy unless the task asks for
sampling), cut at the task's ``until`` strings; ``loglikelihood`` teacher-forces each continuation through the
engine after its context (``RolloutEngine.replay``), so it is scored under the cache generation would have had
(the context compressed after its prefill, the continuation compressed as it goes); ``is_greedy`` is read from
the trainer's forward under the replay's record (equal to the rollout's log-probs within 1e-5 in fp32).
``loglikelihood_rolling`` scores a whole text the same way after its first token. Each request's retention,
memory share and compression rounds are kept in ``stats`` (and appended to the JSONL file ``stats=`` names).
Contexts are plain text (lm-eval applies chat templates itself with ``--apply_chat_template``).
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import sys
import types
import typing
from pathlib import Path

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from gkv_rollout.config import CompressionConfig, SamplingConfig, flat_fields
from gkv_rollout.contract.attention import decoder_and_head
from gkv_rollout.engine import RolloutEngine
from gkv_rollout.methods import ModelShape
from gkv_rollout.registry import method_class
from gkv_train.config.preflight import check_ranks
from gkv_train.exits import REFUSED, Refused, refusing
from gkv_train.logprobs import hidden_states
from gkv_train.models import check_adapter, check_model, load_config_and_tokenizer, load_model

OWN = (
    "pretrained",
    "adapter",
    "method",
    "batch_size",
    "max_batch_size",
    "max_gen_toks",
    "precision",
    "seed",
    "stats",
    "device",
)  # the model's own arguments; every other one is a compression option (CompressionConfig's flat names)
LM_EVAL_OPTIONS = ("batch_size", "max_batch_size", "device")  # lm-eval passes its own --batch_size, ... as these


# a task's generation_kwargs the model honours (``CompressedLM._generate``), and those it has not at the values that
# change nothing
GENERATION_HONOURED = ("until", "max_gen_toks", "do_sample", "temperature", "top_p")
GENERATION_NO_OP = {"top_k": (None, 0), "repetition_penalty": (None, 1.0), "min_p": (None, 0.0), "num_beams": (None, 1)}


@register_model("gkv")
class CompressedLM(LM):
    """lm-eval's model ``gkv``: ``pretrained`` (a built-in model, hub name or local folder), ``adapter`` (a LoRA run),
    ``method`` and any compression option by its flat name (``budget``, ``window``, ``interval``, ``sinks``,
    ``alpha``, ``lambda``, ``form``, ``eta``, ``refresh``, ...: ``CompressionConfig.of``; the method's defaults
    otherwise), ``batch_size`` (lm-eval's ``--batch_size``; ``auto``: 8), ``max_gen_toks`` (when a task gives none),
    ``precision`` (fp32 / bf16), ``seed`` (sampling tasks), ``stats`` (a JSONL file for the per-request statistics),
    ``device`` (lm-eval's ``--device``: cpu, cuda, cuda:N). Every argument is checked before the model loads: an
    unknown one (a typo, HF's ``dtype``) or a bad value is refused with ``Refused``, naming it. The weights load at
    the first request, once its requests are checked (``generate_until``: each task's ``max_gen_toks`` within
    [1, the model's context])."""

    def __init__(
        self,
        pretrained: str = "smollm2-135m",
        adapter: str | None = None,
        method: str = "full",
        batch_size: int | str = 8,
        max_batch_size: int | None = None,
        max_gen_toks: int = 256,
        precision: str = "fp32",
        seed: int = 0,
        stats: str | None = None,
        device: str | None = None,
        **compression,
    ):
        super().__init__()
        with refusing():
            self.compression = model_args_compression(method, compression)
            self.batch_size = checked_batch_size(batch_size)
            self.seed = checked_int("seed", seed, 0)
            if precision not in ("fp32", "bf16"):
                raise ValueError(f"precision={precision}: choose fp32 or bf16")
            self._device = checked_device(device)
            self.stats_path = checked_stats(stats)
            check_model(pretrained)
            shape = ModelShape.of(pretrained, load_config_and_tokenizer(pretrained)[0])
            check_ranks(shape, [self.compression])
            if adapter:
                check_adapter(adapter, pretrained)
            self.context = shape.context
            self.max_gen_toks = self.checked_gen_toks(max_gen_toks, "max_gen_toks")
        self._weights = (pretrained, torch.bfloat16 if precision == "bf16" else torch.float32, adapter or None)
        self.stats: list[dict] = []

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> CompressedLM:
        """lm-eval's way to build the model from ``--model_args`` (``arg_dict``) and its own options
        (``additional_config``: ``--batch_size``, ``--max_batch_size``, ``--device``, always passed, defaults
        included); ``Refused`` naming the option set in both places, rather than Python's "got multiple values"."""
        own = {k: v for k, v in (additional_config or {}).items() if v is not None}
        for key in LM_EVAL_OPTIONS:
            if key in arg_dict and key in own:
                raise Refused(
                    f"{key}={arg_dict[key]} in --model_args: lm-eval sets {key} itself (--{key}, now {own[key]}): "
                    f"give it as --{key} instead"
                )
        return cls(**arg_dict, **own)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> CompressedLM:
        """``create_from_arg_obj`` of ``--model_args`` as lm-eval's command line gives it (``k=v,k=v``)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    def checked_gen_toks(self, value, key: str) -> int:
        """``value`` of the new-token count ``key`` (the model argument, or a task's generation_kwargs), an integer
        in [1, the model's context (max_position_embeddings)], and one the method can run within (S4R's
        refresh); ValueError naming the key and the bound."""
        high = self.context or sys.maxsize
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            bound = f"1 to the model's context of {high} tokens (max_position_embeddings)" if self.context else "1"
            raise ValueError(f"{key}={value}: expected an integer from {bound}")
        self.compression.check_generation(value, key)
        return value

    @functools.cached_property
    def engine(self) -> RolloutEngine:
        """The rollout engine over the model, which loads here (the first request's, after its checks)."""
        pretrained, dtype, adapter = self._weights
        model, tokenizer = load_model(pretrained, dtype=dtype, adapter=adapter)
        return RolloutEngine(model.to(self._device), tokenizer, self.compression, chat=False)

    @property
    def model(self):
        return self.engine.model

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    # ---- lm-eval's interface -------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = {}  # requests with the same generation settings, batched together
        for i, r in enumerate(requests):
            groups.setdefault(json.dumps(r.args[1], sort_keys=True, default=str), []).append(i)
        with refusing():  # every task's settings and new tokens, before the first generation (and the model's load)
            for indices in groups.values():
                settings, task = requests[indices[0]].args[1], requests[indices[0]].task_name
                check_generation_kwargs(settings, task)
                if settings.get("max_gen_toks") is not None:
                    self.checked_gen_toks(settings["max_gen_toks"], "max_gen_toks (the task's generation_kwargs)")
        results: list[str | None] = [None] * len(requests)
        for indices in groups.values():
            kwargs = dict(requests[indices[0]].args[1])
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                for i, text in zip(batch, self._generate([requests[i].args[0] for i in batch], kwargs)):
                    results[i] = text
        return results

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = []
        for r in requests:
            context, continuation = r.args
            whole = self._encode(context + continuation)
            head = self._encode(context)
            if not head or whole[: len(head)] != head:  # a merge across the boundary: split the text, not the ids
                head, tail = self._encode(context), self._encode(continuation, special=False)
            else:
                tail = whole[len(head) :]
            pairs.append((head, tail))
        return self._score(pairs)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs = []
        for r in requests:
            ids = self._encode(r.args[0])
            pairs.append((ids[:1], ids[1:]))
        return [logprob for logprob, _ in self._score(pairs)]

    # ---- the work --------------------------------------------------------------------------------------------
    def _encode(self, text: str, special: bool = True) -> list[int]:
        return self.tokenizer(text, add_special_tokens=special)["input_ids"]

    def _generate(self, contexts: list[str], kwargs: dict) -> list[str]:
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        sample = bool(kwargs.get("do_sample", False)) and float(kwargs.get("temperature", 1.0)) > 0
        sampling = SamplingConfig(
            max_new_tokens=int(kwargs.get("max_gen_toks", self.max_gen_toks)),
            temperature=float(kwargs.get("temperature", 1.0)) if sample else 0.0,
            top_p=float(kwargs.get("top_p", 1.0)) if sample else 1.0,
            seed=self.seed,
        )
        out = self.engine.generate([self._encode(c) for c in contexts], sampling)
        texts = []
        for i, ids in enumerate(out.completions()):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            for stop in until:
                text = text.split(stop)[0]
            texts.append(text)
        self._keep_stats("generate_until", out)
        return texts

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log-probs, every token the argmax) of each continuation after its context, under the cache."""
        results = []
        _, head = decoder_and_head(self.model)
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            empty = [i for i, (_, tail) in enumerate(chunk) if not tail]
            live = [p for i, p in enumerate(chunk) if i not in empty]
            scored = iter([])
            if live:
                out = self.engine.replay([c for c, _ in live], [t for _, t in live], SamplingConfig(temperature=1.0))
                C, real = out.num_completion_tokens, out.completion_mask.bool()
                with torch.no_grad():
                    hidden = hidden_states(self.model, out.sequences, out.attention_mask, out.record)[:, -C - 1 : -1]
                    greedy = head(hidden).argmax(-1) == out.sequences[:, -C:]
                sums = (out.logprobs * real).sum(-1).tolist()
                flags = (greedy | ~real).all(-1).tolist()
                scored = iter(zip(sums, flags))
                self._keep_stats("loglikelihood", out)
            results += [(0.0, True) if i in empty else next(scored) for i in range(len(chunk))]
        return results

    def _keep_stats(self, kind: str, out) -> None:
        rows = [
            {
                "request": kind,
                "method": self.compression.method,
                "prompt_tokens": int(p),
                "new_tokens": int(c),
                "retention": float(r),
                "memory_share": float(m),
                "batch_compressions": out.stats.get("compressions", 0),
            }
            for p, c, r, m in zip(out.prompt_lengths, out.completion_lengths, out.retention, out.memory_share)
        ]
        self.stats += rows
        if self.stats_path is not None:
            with open(self.stats_path, "a") as f:
                f.write("".join(json.dumps(row) + "\n" for row in rows))


def check_generation_kwargs(kwargs: dict, task: str | None) -> None:
    """A task's ``generation_kwargs`` as this model honours them (``GENERATION_HONOURED``; a setting the rollout
    engine does not have only at the value that changes nothing, ``GENERATION_NO_OP``), as train.py refuses TRL's
    ``top_k`` / ``repetition_penalty``; ValueError naming the task, the key and what is honoured."""
    for key, value in kwargs.items():
        if key in GENERATION_HONOURED or value in GENERATION_NO_OP.get(key, ()):
            continue
        raise ValueError(
            f"task {task}: generation_kwargs {key}: {value} is not honoured by the gkv model, which samples with "
            f"{', '.join(GENERATION_HONOURED)} only (the rollout engine's sampling): remove it from the task's "
            "generation_kwargs, or evaluate the task with a model that has it (lm-eval's hf)"
        )


def model_args_compression(method: str, options: dict) -> CompressionConfig:
    """The ``CompressionConfig`` of lm-eval model arguments: ``method`` and compression options by their flat
    names (``lambda`` for ``lambda_``), each converted to its field's type. ValueError for an unknown argument
    ("did you mean"), a value of the wrong type, or an option the method does not read."""
    method_class(method)  # a plug-in (package.module:Class) imported and registered: its own options are known
    kinds = {name: kind for name, kind, _ in flat_fields() if name != "method"}
    converted = {}
    for key, value in options.items():
        name = "lambda_" if key == "lambda" else key
        if name not in kinds:
            known = sorted({*OWN, *(k.rstrip("_") for k in kinds)})
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            if key in ("dtype", "torch_dtype"):
                hint = "; write precision=fp32 or precision=bf16"
            raise ValueError(
                f"unknown gkv model argument {key}={value}{hint} (the model's own: {', '.join(OWN)}; "
                "compression options by their flat names: budget, window, interval, alpha, eta, ...)"
            )
        converted[name] = convert(key, value, kinds[name])
    return CompressionConfig.of(method, **converted)


def convert(key: str, value, kind):
    """An lm-eval argument (already an int, float or bool where it reads as one) as ``kind``; ValueError naming it."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
        if value is None or str(value).lower() in ("none", "null"):
            return None
        kind = next(t for t in typing.get_args(kind) if t is not type(None))
    if typing.get_origin(kind) is list:  # a single value: lm-eval's arguments are comma-separated
        return [convert(key, value, typing.get_args(kind)[0])]
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        return str(value)
    raise ValueError(f"{key}={value}: expected {getattr(kind, '__name__', kind)}")


def checked_int(key: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key}={value}: expected an integer >= {low}")
    return value


def checked_batch_size(value) -> int:
    """lm-eval's batch size: a number (its command line passes ``--batch_size 4`` as the text "4"), or ``auto``
    (``auto:N``), which this model reads as 8."""
    if isinstance(value, str) and value.startswith("auto"):
        return 8
    if isinstance(value, str) and value.strip().isdecimal():
        value = int(value)
    return checked_int("batch_size", value, 1)


def checked_device(device: str | None) -> torch.device:
    """lm-eval's ``--device`` (None: cuda when there is one, else cpu). A CUDA device on a machine without one
    (lm-eval's default is cuda:0) is the CPU, with a note, as lm-eval's own models do; ValueError for anything else
    that is not a device here."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device}: not a device (cpu, cuda, cuda:N)") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        print(f"note: device={device}, but this machine has no CUDA device: running on the CPU", file=sys.stderr)
        return torch.device("cpu")
    if found.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device}: choose cpu or cuda")
    return found


def checked_stats(stats: str | None) -> Path | None:
    """The statistics file: its folder must exist and be writable (checked before any work, not after it)."""
    if not stats:
        return None
    path = Path(stats)
    if path.is_dir():
        raise ValueError(f"stats={stats} is a folder: name a file")
    if not path.parent.is_dir():
        raise ValueError(f"stats={stats}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"stats={stats}: the folder {path.parent} is not writable")
    return path


def main() -> None:
    """lm-eval's own command line, with the model ``gkv`` registered."""
    from lm_eval.__main__ import cli_evaluate

    try:
        cli_evaluate()
    except Refused as err:  # a model argument refused before any work: one line, exit 2
        print(f"error: {err}", file=sys.stderr)
        sys.exit(REFUSED)


if __name__ == "__main__":
    main()
