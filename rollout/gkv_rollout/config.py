"""Configuration of the compressed cache and of sampling, validated when built."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from gkv_rollout.methods import GROUP_AGGREGATIONS, POOLINGS, SHARED, Method, check_choice, field_default, own_fields
from gkv_rollout.registry import method_class, registered


@dataclass
class CompressionConfig:
    """How the KV cache is compressed during decoding, as composed (recipes, overrides): a method's name, the
    options its kind shares and its own options (``options``), each as given. ``resolved`` is the method at its
    settings (a ``gkv_rollout.methods.Method`` dataclass built from what was given), built and validated with the
    configuration. This class holds none of a method's defaults: a shared option not given (None) takes the
    method's own, its dataclass field's (the base's, ``EvictionMethod``, or the method's where it sets its own: the
    methods table of docs/methods.md lists them, "Shared options set"), as an own option not given does.

    method: a registered method (``full``: no compression; the eviction methods of the G-KV family, which compress
        every ``interval`` tokens keeping ``budget`` tokens; ``s4r``, a low-rank cache with sparse reconstruction;
        the README's methods table lists them), or a method from outside the package: ``package.module:Class``
        (an ``EvictionMethod`` dataclass; the module is imported, its code run, and the class registered under
        that name and its own when the configuration is validated: like a trust-remote-code choice, a
        configuration naming one names code to run).
    budget: tokens each (layer, KV head) keeps after a compression, the window (and a kept prompt) included
        (eviction methods; None: the method's).
    window: the last ``window`` queries score the cache, and the last ``window`` keys are always kept and never
        scored (None: the method's).
    interval: compress after every ``interval`` generated tokens (and right after prefill when a prompt exceeds
        the budget), so attention never sees more than ``budget + interval`` keys (None: the method's).
    sinks: the first ``sinks`` tokens are always kept (None: the method's).
    keep_prompt: each sequence's whole prompt is always kept, inside the budget (eviction methods; None: the
        method's); a prompt that with the window fills the budget is refused. ``full`` keeps it anyway; ``s4r``
        refuses it (its exact part is its ``sinks``).
    pool_kernel: pooling of scores along the sequence (odd; 1: none; None: the method's).
    pool: how scores are pooled: max or avg (None: the method's).
    group_agg: how the query heads of a GQA group are combined, per window query: max or mean (None: the
        method's).
    options: the method's own options by name, each a key beside the shared ones (``compression.alpha=0.5``: the
        configuration's ``compression`` keys that are not fields here land in it; the method's fields say which
        and their defaults). An option the method does not have is refused.

    A shared option the method does not read (``s4r``'s budget and interval, every one for ``full``) is kept here
    and ignored, so that a sweep's template holds one set for all its runs; its value is checked as the methods that
    read it check it (``check_unread_shared``). ``of(method, **options)`` builds one from flat option names
    (``CompressionConfig.of("s4r", eta=0.3)``).
    """

    method: str = "full"
    budget: int | None = None
    window: int | None = None
    interval: int | None = None
    sinks: int | None = None
    keep_prompt: bool | None = None
    pool_kernel: int | None = None
    pool: str | None = None
    group_agg: str | None = None
    options: dict[str, Any] = field(default_factory=dict, metadata={"other_keys": True})

    def __post_init__(self):
        kind = method_class(self.method)  # an unknown name: an error naming the registered ones
        self.options = dict(self.options or {})
        # full keeps what it is given unchecked: a sweep's template holds its runs' options (EvalConfig)
        own = method_options(self.method, kind, self.options) if kind.compresses else {}
        names = {f.name for f in dataclasses.fields(kind)}
        if self.keep_prompt and kind.compresses and "keep_prompt" not in names:
            raise ValueError(
                f"compression.keep_prompt=true does not apply to compression.method={self.method}, which keeps "
                "exactly only its sinks (compression.sinks): use an eviction method, or keep_prompt=false"
            )
        check_unread_shared(self, names)
        shared = {name: getattr(self, name) for name in SHARED if name in names and getattr(self, name) is not None}
        try:
            self.resolved: Method = kind(**shared, **own)
        except Exception as err:  # a plug-in's own __post_init__: its mistake, named with its path
            if ":" not in self.method or isinstance(err, ValueError):
                raise
            raise ValueError(
                f"compression.method={self.method}: building it raised {type(err).__name__} in its __post_init__ "
                f"({err})"
            ) from err

    @property
    def kind(self) -> type[Method]:
        """The method's class."""
        return type(self.resolved)

    @property
    def compresses(self) -> bool:
        return self.kind.compresses

    def check_generation(self, max_new_tokens: int, key: str = "max_completion_length") -> None:
        """Options that only make sense within a generation of ``max_new_tokens`` (the setting ``key``); ValueError
        naming both (``Method.check_generation``)."""
        self.resolved.check_generation(max_new_tokens, key)

    def option_names(self) -> tuple[str, ...]:
        """The names of the method's own options."""
        return option_names(self.kind)

    def unread(self) -> list[str]:
        """Options given that the method does not have (``full``'s: a sweep template's options for its runs)."""
        return [name for name in self.options if name not in self.option_names()]

    def for_method(self, method: str, budget: int | None) -> CompressionConfig:
        """This configuration as a template for a run of ``method`` at ``budget``: the shared options kept (those
        not given take ``method``'s values), the options ``method`` has kept (validated)."""
        names = option_names(method_class(method))
        return dataclasses.replace(
            self,
            method=method,
            budget=self.budget if budget is None else budget,
            options={k: v for k, v in self.options.items() if k in names},
        )

    @classmethod
    def of(cls, method: str, **options) -> CompressionConfig:
        """A validated configuration from flat option names (each goes to the shared options or the method's own:
        ``of("gkv", budget=64, alpha=0.5)``). The form of command-line flags and lm-eval's ``model_args``.
        ``full`` with an option of a method is refused (it reads none)."""
        config = cls.template(method, **options)
        if not config.compresses and config.unread():
            name = config.unread()[0]
            raise ValueError(f"compression.{name} does not apply to compression.method={method}{close_option(name)}")
        return config

    @classmethod
    def template(cls, method: str, **options) -> CompressionConfig:
        """``of`` without the refusal for ``full``: a sweep's template, whose method options its runs read
        (``for_method``). ValueError for a name that is neither shared nor any registered method's option."""
        shared_names = {f.name for f in dataclasses.fields(cls)} - {"method", "options"}
        known = {name for kind in registered().values() for name in option_names(kind)}
        known |= set(option_names(method_class(method)))
        shared, own = {}, {}
        for key, value in options.items():
            if key in shared_names:
                shared[key] = value
            elif key in known:
                own[key] = value
            else:
                raise ValueError(f"unknown compression option {key!r}")
        return cls(method, **shared, options=own)

    def identity(self) -> dict:
        """What determines a run's results: the method's name and every field of the method."""
        return self.resolved.identity()


# what a shared option must be for every method that reads it (the values the methods' own checks allow)
SHARED_RULES = {
    "budget": ("a number of tokens, at least 1", lambda v: v >= 1),
    "window": ("a number of tokens, at least 1", lambda v: v >= 1),
    "interval": ("a number of tokens, at least 1", lambda v: v >= 1),
    "sinks": ("a number of tokens, at least 0", lambda v: v >= 0),
    "pool_kernel": ("a positive odd number", lambda v: v >= 1 and v % 2 == 1),
}


def check_unread_shared(config: CompressionConfig, read: set[str]) -> None:
    """The shared options that ``config``'s method does not read (``full``'s, S4R's budget and interval) are kept
    for the runs of a sweep that do (``for_method``), so they are checked as those methods check them: ValueError
    for a value no method could take (``compression.budget=-5`` with ``full``). ``read``: the method's fields."""
    for name in SHARED:
        value = getattr(config, name)
        if name in read or value is None:
            continue
        if name in SHARED_RULES:
            rule, holds = SHARED_RULES[name]
            if isinstance(value, bool) or not isinstance(value, int) or not holds(value):
                raise ValueError(
                    f"compression.{name}={value!r} must be {rule}, whatever the method (compression.method="
                    f"{config.method} does not read it; a run of a method that does, evaluate.py's methods=[...], "
                    "would)"
                )
        elif name in ("pool", "group_agg"):
            check_choice(f"compression.{name}", value, POOLINGS if name == "pool" else GROUP_AGGREGATIONS)


def option_names(kind: type[Method]) -> tuple[str, ...]:
    """The names of the method's own options (keys ``compression.<name>`` beside the shared ones)."""
    return tuple(f.name for f in own_fields(kind))


def close_option(name: str, names=None) -> str:
    """`` (did you mean X?)`` naming the option closest to ``name``, a key ``compression.<name>`` that is no option
    here (misspelt: a shared option's too lands among a method's own), among ``names`` (None: every registered
    method's own) and the shared ones; "" when none is close."""
    names = [n for kind in registered().values() for n in option_names(kind)] if names is None else list(names)
    close = difflib.get_close_matches(name, [*names, *SHARED], n=1, cutoff=0.7)
    return f" (did you mean {close[0]}?)" if close else ""


def method_options(method: str, kind: type[Method], given: dict) -> dict:
    """The own options of ``kind`` (the method named ``method``) from a mapping of option names, each as its
    field's type; ValueError for an option the method does not have, naming the ones it has, or a value of another
    type."""
    names = option_names(kind)
    unknown = [name for name in given if name not in names]
    if unknown:
        raise ValueError(
            f"compression.{unknown[0]} does not apply to compression.method={method}, whose options are: "
            f"{', '.join(names) or 'none'}{close_option(unknown[0], names)}"
        )
    hints = typing.get_type_hints(kind)
    return {name: typed(name, value, hints[name]) for name, value in given.items()}


def typed(name: str, value, kind):
    """``value`` of the option ``name`` as its field's type ``kind`` (OmegaConf's lists as lists, an int where a
    float is asked as a float); ValueError naming it for a value of another type."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
        if value is None:
            return None
        kind = next(t for t in typing.get_args(kind) if t is not type(None))
    if typing.get_origin(kind) is list:
        if not isinstance(value, (list, tuple)) and type(value).__name__ != "ListConfig":
            raise ValueError(f"compression.{name}={value!r}: expected a list")
        return [typed(name, v, typing.get_args(kind)[0]) for v in value]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (bool, int, float, str) and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ValueError(f"compression.{name}={value!r}: expected {kind.__name__}")
    return value


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled.

    temperature: 0 means greedy (log-probs are then those of the unscaled distribution).
    top_p: nucleus sampling; log-probs are always those of softmax(logits / temperature) without the nucleus
        cut, the distribution the trainer recomputes.
    stop_token_ids: tokens that end a completion (the model's EOS when None); the stop token is kept.
    ignore_eos: never sample a stop token (forces ``max_new_tokens``, for benchmarks).
    drop_finished_at: finished sequences leave the batch (the cache of the others is copied without them) once
        they are at least this share of it; 1 keeps every sequence to the end. Only speed and the cache's peak
        size depend on it: each sequence's tokens, log-probs and record are the same up to floating-point
        differences of the smaller batch's kernels (its random draw is taken from a full-batch draw;
        compressions run at the same steps); on CPU in fp32 the same tokens and records, log-probs within 1e-5.
    compile_decode: run each decode step's forward and sampling as compiled graphs (``torch.compile``; CUDA
        graphs on a GPU). The step has static shapes: attention runs over a fixed-width prefix of the cache's
        slots under a mask, and the new token is written at a slot held in a tensor; prefill and compression
        stay eager. The first rollout pays the compile (tens of seconds on CPU, a few more for each new batch
        width); later rollouts in the process reuse the graphs. The method is the same; log-probs differ from
        the eager step by float rounding (masked slots, fused kernels), which may rarely flip a sampled token
        near a tie or the top-p cut (the trainer still reproduces whatever was sampled). The full cache and the
        G-KV family only (s4r scores and reconstructs at every step, outside any graph).
    chunk_given: feed given tokens (``RolloutEngine.generate``'s prefixes, ``replay``'s completions) through the
        model several at a time: while every unfinished sequence has given tokens left, one forward takes them up
        to the next compression point (causal among them, over the cache; the full cache: at most 128), and their
        log-probs come from that forward's logits at every position. False: one forward per token, as if sampled
        (the reference this path is tested and timed against). Both compress at the same points, over the same
        tokens and window positions. The kept sets are the same for methods whose scores do not depend on the
        model's numbers (full, streaming, random, random_attention) and for caches that take one token per
        forward either way (s4r, tova: ``KVCache.forward_span``). For attention- or key-scored methods the larger
        forward's rounding (about 1e-7 in fp32 on CPU, far more in bf16 and on a GPU) can cross a top-k boundary
        or R-KV's 0.5 cosine test: that row's kept set, and everything after it, then differ (as with
        ``compile_decode``; seen in one of 8 SmolLM2-135M rows). Each rollout is consistent with itself: its
        record is written with its log-probs, and the trainer reproduces them (1e-4). Tested: the same tokens
        and records for every method in fp64; log-probs within 1e-5 in fp32 on the tiny test models.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    num_samples: int = 1
    seed: int = 0
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    drop_finished_at: float = 0.25
    compile_decode: bool = False
    chunk_given: bool = True

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")
        if not 0.0 < self.drop_finished_at <= 1.0:
            raise ValueError(f"drop_finished_at must lie in (0, 1], got {self.drop_finished_at}")
        if not isinstance(self.chunk_given, bool):
            raise ValueError(f"chunk_given must be True or False, got {self.chunk_given!r}")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def flat_fields() -> list[tuple[str, type, object]]:
    """(name, type, default) of every option by its flat name: the shared ones, then each registered method's own
    (a name several methods have once, at the first's default)."""
    hints = typing.get_type_hints(CompressionConfig)
    found = {
        f.name: (f.name, hints[f.name], f.default) for f in dataclasses.fields(CompressionConfig) if f.name != "options"
    }
    for kind in registered().values():
        option_hints = typing.get_type_hints(kind)
        for f in own_fields(kind):
            found.setdefault(f.name, (f.name, option_hints[f.name], field_default(f)))
    return list(found.values())


def add_compression_args(parser, **defaults) -> None:
    """Add one ``--option`` per compression option (flat names: the shared ones and every registered method's) to
    an argparse parser (``--lambda`` for ``lambda_``). A method option's flag defaults to None (not given: the
    method's own default)."""
    method_names = {name for kind in registered().values() for name in option_names(kind)}
    for name, kind, default in flat_fields():
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None -> X
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        flag = "--" + name.rstrip("_").replace("_", "-")
        value = defaults.get(name, None if name in method_names else default)
        if typing.get_origin(kind) is list:
            parser.add_argument(flag, dest=name, default=value, type=int, nargs="*")
            continue
        parser.add_argument(flag, dest=name, default=value, type=_parse_bool if kind is bool else kind)


def compression_from_args(args, methods: list[str] | None = None) -> list[CompressionConfig] | CompressionConfig:
    """The validated ``CompressionConfig`` of options added by ``add_compression_args`` (method options left unset
    take the method's defaults); with ``methods`` (a sweep), one per method, each with the options it has
    (``for_method``; one that no run has is refused)."""
    method_names = {name for kind in registered().values() for name in option_names(kind)}
    options = {name: getattr(args, name) for name, _, _ in flat_fields() if name != "method"}
    options = {k: v for k, v in options.items() if k not in method_names or v is not None}
    if methods is None:
        return CompressionConfig.of(args.method, **options)
    template = CompressionConfig.template("full", **options)
    runs = [template.for_method(method, None) for method in methods]
    unread = [key for key in template.unread() if key not in {k for run in runs for k in run.option_names()}]
    if unread:
        hint = close_option(unread[0])
        raise ValueError(f"compression.{unread[0]} applies to none of the methods ({', '.join(methods)}){hint}")
    return runs
