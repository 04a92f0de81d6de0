"""Keys of earlier versions of the configuration (``MOVED``): refused on a command line or in a recipe file with the
key to write now (``compose.check_overrides``), and read under today's names where a configuration an earlier
version wrote is compared with one composed now (``current_keys``: a results file's resolved settings)."""

from __future__ import annotations

import dataclasses

from gkv_rollout.config import CompressionConfig, flat_fields

# Keys of earlier versions: key -> where it is now (named in the error that refuses them)
MOVED = {
    # the sampling group, re-keyed under TRL's names (CHANGELOG 2026-12-06)
    **{f"sampling.{key}": key for key in ("num_generations", "temperature", "top_p", "compile_decode")},
    "sampling.max_new_tokens": "max_completion_length",
    "max_new_tokens": "max_completion_length",
    "n_samples": "num_generations",
    "samples_per_prompt": "num_generations",
    # a method's own options, once grouped (compression.eviction.alpha, compression.s4r.eta, then
    # compression.options.alpha), are keys beside the shared ones (compression.alpha, as kvpress's fields are its
    # options; CHANGELOG 2026-12-07): refused with their new key for one release (0.1.x), then dropped
    **{
        f"compression.{group}.{name}": f"compression.{name}"
        for group in ("eviction", "s4r", "options")
        for name, _, _ in flat_fields()
        if name not in {f.name for f in dataclasses.fields(CompressionConfig)}
    },
}


# Keys added since, with the value an earlier version's runs had where it differs from today's default: a
# configuration written before a key existed ran so (given tokens one per forward before ``chunk_given``)
EARLIER = {"chunk_given": False}


def moved_to(key: str) -> str | None:
    """Where the key ``key`` of an earlier version is now (``MOVED``; ``compression.options.<name>``, a plug-in's
    option too, is ``compression.<name>``), or None for a key that did not move."""
    if key.startswith("compression.options.") and key.count(".") == 2:
        return "compression." + key.split(".")[2]
    return MOVED.get(key)


def current_keys(found: dict) -> dict:
    """Dotted keys of a configuration an earlier version wrote (a run's ``hydra/config.yaml``, a results file's
    resolved settings) under their names today (``moved_to``: ``compression.options.alpha`` is ``compression.alpha``),
    without the group of a method's own options those wrote when empty (``compression.options: {}``)."""
    return {moved_to(k) or k: v for k, v in found.items() if not (k == "compression.options" and v == {})}
