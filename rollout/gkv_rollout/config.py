"""Configuration of the compressed cache and of sampling, validated when built."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field

from gkv_rollout.methods import EvictionMethod, method_class

GKV_FORMS = ("max", "mean", "sum")
SIMILARITIES = ("rkv", "mean_cosine")
POOLINGS = ("max", "avg")
GROUP_AGGREGATIONS = ("max", "mean")
# Options of ``s4r`` left at None (``rho`` follows ``eta``); the eviction methods' are their classes' ``defaults``.
S4R_DEFAULTS = dict(window=32, sinks=4, pool_kernel=7, group_agg="mean")


@dataclass
class EvictionOptions:
    """The scoring options of the G-KV family (``compression.eviction.*``); None takes the method's default
    (``EvictionMethod.defaults``). A method reads only those it names in ``EvictionMethod.options``; setting one
    it does not read is refused.

    alpha: history weight (``gkv`` forms max/mean/sum: ``max(alpha*old, new)``, ``alpha*old + (1-alpha)*new``,
        ``alpha*old + new``; ``h2o``: decay of the accumulated score). 0.8.
    lambda_: weight of the attention score against key redundancy: ``lambda*score - (1-lambda)*redundancy``
        (0.5 for ``gkv``, 0.1 for ``rkv``).
    form: ``gkv`` history form, one of max/mean/sum (``h2o`` is the sum form without redundancy).
    redundancy: subtract the key-redundancy term (on for ``gkv`` and ``rkv``).
    similarity: how redundancy sums key similarities: ``rkv`` (the reference's kernel: each key's latest
        near-duplicate, cosine > 0.5, is not counted; O(S^2 D)) or ``mean_cosine`` (every other key; O(S D)).
    """

    alpha: float | None = None
    lambda_: float | None = None
    form: str | None = None
    redundancy: bool | None = None
    similarity: str | None = None


@dataclass
class S4ROptions:
    """The options of ``s4r`` (``compression.s4r.*``; see ``gkv_rollout.s4r_cache``).

    eta: persistent-memory share: the rank is solved so that the stored state (exact sinks, the coefficients of
        every token, the query window, the bases) is a share ``eta`` of the full KV cache when the sequence reaches
        ``expected_length`` tokens; ``eta`` also sets the share of prompt tokens sampled for the bases and ``rho``
        by default. The achieved share of each sample is reported (``memory_share``).
    expected_length: sequence length (prompt + completion) at which ``eta`` holds; None: each prompt's length +
        ``max_new_tokens`` (the end of the longest generation); 0: the prompt's length (the paper's setting, for
        prompt-only workloads; over a long generation the share then falls, e.g. 0.2 asked, ~0.08 after 1024 tokens
        on a 146-token prompt).
    rank, rank_v: key / value ranks (None: from ``eta``; ``rank_v`` defaults to ``rank``).
    refresh: bases that follow the generation (an extension beyond the paper; 0, the default: off, the paper's
        bases from the prompt alone): every ``refresh`` generated tokens each layer's key and value bases gain the
        ``refresh_rank`` leading directions of what they miss of the last ``refresh`` tokens' states (the
        residual's SVD). The rank budget is kept: the prompt's bases start that many columns short of the rank
        ``eta`` gives; a token keeps the columns that existed when it was written (the record says which).
    refresh_rank: directions each refresh adds to the key and to the value bases (2).
    rho: share of the cache reconstructed each step (window included); None: ``eta``.
    recent_ratio: share of the sampled prompt tokens taken from the most recent ones (7:3 = 0.7).
    normalize: normalise sampled key/value vectors to unit length before the SVD.
    full_layers: layers that reconstruct every token instead of a top-k selection.
    """

    eta: float = 0.2
    expected_length: int | None = None
    rank: int | None = None
    rank_v: int | None = None
    refresh: int = 0
    refresh_rank: int = 2
    rho: float | None = None
    recent_ratio: float = 0.7
    normalize: bool = True
    full_layers: list[int] = field(default_factory=list)

    def validate(self) -> None:
        """ValueError naming the first option out of its range."""
        if not 0.0 < self.eta <= 1.0:
            raise ValueError(f"eta must lie in (0, 1], got {self.eta}")
        if self.rho is not None and not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must lie in (0, 1], got {self.rho}")
        if self.expected_length is not None and self.expected_length < 0:
            raise ValueError(f"expected_length must be >= 0 (0: the prompt's length), got {self.expected_length}")
        if self.refresh < 0 or self.refresh_rank < 1:
            raise ValueError(
                f"refresh must be >= 0 (0: off) and refresh_rank >= 1, got {self.refresh}, {self.refresh_rank}"
            )
        if 0 < self.refresh < self.refresh_rank:
            raise ValueError(
                f"refresh ({self.refresh} tokens) must be at least refresh_rank ({self.refresh_rank}): "
                "each refresh takes its directions from that many tokens"
            )
        for name in ("rank", "rank_v"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0.0 <= self.recent_ratio <= 1.0:
            raise ValueError(f"recent_ratio must lie in [0, 1], got {self.recent_ratio}")
        if any(layer < 0 for layer in self.full_layers):
            raise ValueError(f"full_layers must be layer indices, got {self.full_layers}")


GROUPS = {"eviction": EvictionOptions, "s4r": S4ROptions}  # CompressionConfig's option groups


@dataclass
class CompressionConfig:
    """How the KV cache is compressed during decoding; every method works per layer and per KV head.

    method: ``full`` (no compression); an eviction method of the G-KV family (``gkv_rollout.methods``: compress
        every ``interval`` tokens, keeping ``budget`` tokens): ``streaming`` (sinks + most recent), ``snapkv``
        (window attention, pooled), ``h2o`` (newest query's attention, normalised and accumulated),
        ``rkv`` (attention minus key redundancy), ``gkv`` (normalised attention blended with its history,
        minus key redundancy), ``random`` (a fresh uniform draw per token at each compression: the control);
        ``tova`` (the newest query's attention, every step); or ``s4r`` (low-rank cache with sparse
        reconstruction, scored every step: see ``gkv_rollout.s4r_cache``). A method from outside the package:
        ``package.module:Class`` (an ``EvictionMethod`` subclass; the module is imported, its code run, and the
        class registered under that name when the configuration is validated: like a trust-remote-code choice, a
        configuration naming one names code to run).
    budget: tokens each (layer, KV head) keeps after a compression, the window included (eviction methods).
    window: the last ``window`` queries score the cache, and the last ``window`` keys are always kept and never
        scored (16; 1 for ``h2o``; 32 for ``s4r``, its W).
    interval: compress after every ``interval`` generated tokens (and right after prefill when a prompt
        exceeds the budget), so attention never sees more than ``budget + interval`` keys (128, the
        reference's ``divide_length``; 1 for ``tova``, which evicts at every step).
    pool_kernel, pool: pooling of scores along the sequence (odd kernel; 1 disables it; 5 for ``snapkv`` and
        ``rkv``, 7 for ``s4r``, off for the others), ``max`` or ``avg``.
    group_agg: how the query heads of a GQA group are combined, per window query (max; mean for ``s4r``).
    sinks: the first ``sinks`` tokens are always kept (4 for ``streaming`` and ``s4r``, 0 for the others).
    eviction: the G-KV family's scoring options (``EvictionOptions``: alpha, lambda_, form, redundancy,
        similarity).
    s4r: the options of ``s4r`` (``S4ROptions``: eta, rank, refresh, ...).
    Options left at None take the method's default; ``resolved()`` fills them in. They are resolved on use, so
    that changing ``method`` (say, from a command line) never keeps another method's defaults. ``of(method,
    **options)`` builds one from flat option names (``CompressionConfig.of("s4r", eta=0.3)``).
    """

    method: str = "full"
    budget: int = 2048
    window: int | None = None
    interval: int | None = None
    pool_kernel: int | None = None
    pool: str = "max"
    group_agg: str | None = None
    sinks: int | None = None
    eviction: EvictionOptions = field(default_factory=EvictionOptions)
    s4r: S4ROptions = field(default_factory=S4ROptions)

    def __post_init__(self):
        for name, group in GROUPS.items():  # a mapping (a results file, Hydra's dict) becomes the group
            if isinstance(getattr(self, name), dict):
                setattr(self, name, group(**getattr(self, name)))
        if self.method not in ("full", "s4r"):
            method_class(self.method)  # an unknown name: an error naming the registered ones
        if self.method == "full":  # reads no option (a sweep's template may hold its runs' options: EvalConfig)
            return
        unread = self.unread()
        if unread:
            reads = ", ".join(self.reads()) or "none of the eviction options"
            raise ValueError(
                f"compression.{unread[0]} does not apply to compression.method={self.method}, which reads {reads}"
            )
        r = self.resolved()
        if r.window <= 0:
            raise ValueError(f"window must be positive, got {r.window}")
        if r.sinks < 0:
            raise ValueError(f"sinks must be >= 0, got {r.sinks}")
        if r.pool not in POOLINGS:
            raise ValueError(f"unknown pooling {r.pool!r}; choose one of {', '.join(POOLINGS)}")
        if r.pool_kernel < 1 or r.pool_kernel % 2 == 0:
            raise ValueError(f"pool_kernel must be a positive odd number, got {r.pool_kernel}")
        if r.group_agg not in GROUP_AGGREGATIONS:
            raise ValueError(
                f"unknown group aggregation {r.group_agg!r}; choose one of {', '.join(GROUP_AGGREGATIONS)}"
            )
        if self.method == "s4r":
            r.s4r.validate()
        else:
            r._validate_eviction()

    def _validate_eviction(self):
        W, options = self.window, self.eviction
        if self.budget <= W:
            raise ValueError(f"budget ({self.budget}) must be larger than window ({W}): the budget counts the window")
        if self.sinks + W > self.budget:
            raise ValueError(f"sinks ({self.sinks}) + window ({W}) must fit in the budget ({self.budget})")
        if self.interval <= 0:
            raise ValueError(f"interval must be a positive number of tokens, got {self.interval}")
        if not 0.0 <= options.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {options.alpha}")
        if not 0.0 <= options.lambda_ <= 1.0:
            raise ValueError(f"lambda must lie in [0, 1], got {options.lambda_}")
        if options.form not in GKV_FORMS:
            raise ValueError(f"unknown gkv form {options.form!r}; choose one of {', '.join(GKV_FORMS)}")
        if options.similarity not in SIMILARITIES:
            raise ValueError(f"unknown similarity {options.similarity!r}; choose one of {', '.join(SIMILARITIES)}")
        if self.method == "rkv" and not options.redundancy:
            raise ValueError("rkv always uses the redundancy term; use snapkv for attention scores alone")

    def check_generation(self, max_new_tokens: int, key: str = "sampling.max_new_tokens") -> None:
        """Options that only make sense within a generation of ``max_new_tokens`` (the setting ``key``): s4r's
        ``refresh`` below it (a refresh every that many generated tokens; at or beyond the generation's end none
        ever happens, and its buffers would only take memory). ValueError naming both."""
        if self.method == "s4r" and self.s4r.refresh >= max_new_tokens:
            raise ValueError(
                f"compression.s4r.refresh={self.s4r.refresh} refreshes nothing in a generation of {max_new_tokens} "
                f"tokens ({key}): set it below {max_new_tokens}, or 0 for no refresh"
            )

    def reads(self) -> tuple[str, ...]:
        """The group options this method reads (``eviction.*`` of ``EvictionMethod.options``, every ``s4r.*``)."""
        if self.method == "s4r":
            return tuple(f"s4r.{f.name}" for f in dataclasses.fields(S4ROptions))
        if self.method == "full":
            return ()
        return tuple(f"eviction.{name}" for name in method_class(self.method).options)

    def unread(self) -> list[str]:
        """The group options set away from their defaults that this method does not read (``eviction.alpha``)."""
        reads = self.reads()
        return [
            f"{name}.{key}" for name in GROUPS for key in changed(getattr(self, name)) if f"{name}.{key}" not in reads
        ]

    def for_method(self, method: str, budget: int | None) -> CompressionConfig:
        """This configuration as a template for a run of ``method`` at ``budget``: the shared options kept, the group
        options kept where ``method`` reads them (validated)."""
        run = dataclasses.replace(self, method=method, budget=budget, eviction=EvictionOptions(), s4r=S4ROptions())
        reads = set(run.reads()) if method != "full" else set()
        groups = {
            name: {
                key: getattr(getattr(self, name), key)
                for key in changed(getattr(self, name))
                if f"{name}.{key}" in reads
            }
            for name in GROUPS
        }
        return dataclasses.replace(
            run, **{name: dataclasses.replace(getattr(run, name), **values) for name, values in groups.items()}
        )

    @classmethod
    def of(cls, method: str, **options) -> CompressionConfig:
        """A validated configuration from flat option names: each option goes to its group by its name
        (``eta`` to ``s4r``, ``alpha`` to ``eviction``; the others are shared). The form of command-line flags
        and lm-eval's ``model_args``. ``full`` with a group option is refused (it reads none)."""
        config = cls.template(method, **options)
        if method == "full" and config.unread():
            raise ValueError(f"compression.{config.unread()[0]} does not apply to compression.method=full")
        return config

    @classmethod
    def template(cls, method: str, **options) -> CompressionConfig:
        """``of`` without the refusal for ``full``: a sweep's template, whose group options its runs read
        (``for_method``)."""
        groups: dict[str, dict] = {name: {} for name in GROUPS}
        shared = {}
        for key, value in options.items():
            group = next((name for name, g in GROUPS.items() if key in {f.name for f in dataclasses.fields(g)}), None)
            if group is not None:
                groups[group][key] = value
            elif key in {f.name for f in dataclasses.fields(cls)} and key not in GROUPS:
                shared[key] = value
            else:
                raise ValueError(f"unknown compression option {key!r}")
        return cls(method, **shared, **{name: GROUPS[name](**values) for name, values in groups.items()})

    def flat(self) -> dict:
        """Every option by its own name, the groups flattened (the form of results files and run identities)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in GROUPS}
        for name in GROUPS:
            values.update(dataclasses.asdict(getattr(self, name)))
        return values

    @property
    def compresses(self) -> bool:
        return self.method != "full"

    def defaults(self) -> dict:
        """The values this method gives to options left at None (by their flat names)."""
        if self.method == "s4r":
            return {**EvictionMethod.defaults, **S4R_DEFAULTS, "rho": self.s4r.eta}
        return dict(method_class(self.method).defaults if self.method != "full" else EvictionMethod.defaults)

    def resolved(self) -> CompressionConfig:
        """A copy with every option left at None set to this method's default (what the caches read)."""
        defaults = self.defaults()
        values = self.flat()
        for name, value in defaults.items():
            if values.get(name) is None:
                values[name] = value
        resolved = object.__new__(CompressionConfig)  # already validated: skip __post_init__, which calls this
        for name, group in GROUPS.items():
            own = {f.name for f in dataclasses.fields(group)}
            resolved.__dict__[name] = group(**{k: v for k, v in values.items() if k in own})
        resolved.__dict__.update({f.name: values[f.name] for f in dataclasses.fields(self) if f.name not in GROUPS})
        return resolved


def changed(options) -> list[str]:
    """The fields of an option group that differ from the group's defaults."""
    default = type(options)()
    return [f.name for f in dataclasses.fields(options) if getattr(options, f.name) != getattr(default, f.name)]


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


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def flat_fields() -> list[tuple[dataclasses.Field, object]]:
    """(field, type) of every option of ``CompressionConfig`` by its flat name: the shared ones, then each group's."""
    found = [
        (f, typing.get_type_hints(CompressionConfig)[f.name])
        for f in dataclasses.fields(CompressionConfig)
        if f.name not in GROUPS
    ]
    for group in GROUPS.values():
        found += [(f, typing.get_type_hints(group)[f.name]) for f in dataclasses.fields(group)]
    return found


def add_compression_args(parser, **defaults) -> None:
    """Add one ``--option`` per option of ``CompressionConfig`` (flat names, the groups' included) to an argparse
    parser (``--lambda`` for ``lambda_``)."""
    for f, kind in flat_fields():
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None -> X
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        flag = "--" + f.name.rstrip("_").replace("_", "-")
        if typing.get_origin(kind) is list:
            parser.add_argument(flag, dest=f.name, default=defaults.get(f.name, []), type=int, nargs="*")
            continue
        parser.add_argument(
            flag, dest=f.name, default=defaults.get(f.name, f.default), type=_parse_bool if kind is bool else kind
        )


def compression_from_args(args, methods: list[str] | None = None) -> list[CompressionConfig] | CompressionConfig:
    """The validated ``CompressionConfig`` of options added by ``add_compression_args``; with ``methods`` (a
    sweep), one per method, each with the options it reads (``for_method``; one that no run reads is refused)."""
    options = {f.name: getattr(args, f.name) for f, _ in flat_fields() if f.name != "method"}
    if methods is None:
        return CompressionConfig.of(args.method, **options)
    template = CompressionConfig.template("full", **options)
    runs = [template.for_method(method, template.budget) for method in methods]
    unread = [key for key in template.unread() if key not in {k for run in runs for k in run.reads()}]
    if unread:
        raise ValueError(f"compression.{unread[0]} applies to none of the methods ({', '.join(methods)})")
    return runs
