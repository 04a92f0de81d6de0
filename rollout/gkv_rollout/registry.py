"""Every compression method by name: the package's own (``gkv_rollout.methods``: ``full`` and the eviction family;
``gkv_rollout.s4r``: S4R, a kind of its own), each registered by ``@register`` where it is defined, and a
user's method named ``package.module:Class`` (its module imported, its class registered by the same
``register``, so it passes the same checks)."""

from __future__ import annotations

import importlib

import gkv_rollout.s4r  # noqa: F401  (registers S4R)
from gkv_rollout.methods import METHODS, EvictionMethod, Method, register

PLUG_INS: dict[str, type[Method]] = {}  # methods from the user's modules, by ``package.module:Class``


def registered() -> dict[str, type[Method]]:
    """Every registered method by name (the package's own first, in the order they are defined)."""
    return METHODS


def eviction_methods() -> list[str]:
    """The names of the registered methods of the G-KV family (``EvictionMethod`` subclasses), in registry order."""
    return [name for name, kind in METHODS.items() if issubclass(kind, EvictionMethod)]


def method_class(name: str) -> type[Method]:
    """The registered method ``name``; ``package.module:Class`` imports the module (running its code) and
    registers the class under its own ``name`` (its identity) and keeps it under that path (what the
    configuration names, so that every process of a run imports it the same way). A user's method is of the
    eviction family (an ``EvictionMethod`` subclass: its rollouts' record is the one the trainer replays) and passes
    the checks of every method (``gkv_rollout.methods.check_method``)."""
    if name in METHODS or name in PLUG_INS:
        return METHODS.get(name) or PLUG_INS[name]
    if ":" not in name:
        known = ", ".join(METHODS)
        raise ValueError(f"unknown compression method {name!r}; choose one of {known}, or package.module:Class")
    module, _, attribute = name.partition(":")
    if not module or module.startswith(".") or not attribute:
        raise ValueError(f"compression method {name!r}: give package.module:Class, an absolute module path")
    try:  # the user's module runs here: whatever it raises, the message names the method
        cls = getattr(importlib.import_module(module), attribute)
    except Exception as error:
        raise ValueError(
            f"compression method {name!r}: cannot import {attribute} from {module} ({type(error).__name__}: {error})"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, EvictionMethod)):
        raise ValueError(f"compression method {name!r} is not an EvictionMethod subclass")
    PLUG_INS[name] = register(cls, repr(name))
    return cls
