"""``gkv-train train --help`` (and ``evaluate``, ``traces``): every configuration key with its type, default and
help, read from the configuration dataclasses themselves (one source: their docstrings' ``name: text`` entries,
else the comment on the field's line), nested groups as dotted keys."""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
import typing

ENTRY = re.compile(r"^(\w+(?:, \w+)*): (.*)$")  # "name: text" or "name, other: text" in a docstring
FIELD_COMMENT = re.compile(r"^    (\w+): [^#]*#\s*(.*)$")  # "    name: type = default  # text" in a class body


def field_help(cls: type) -> dict[str, str]:
    """Help text per field of the dataclass ``cls``: a field's ``metadata["help"]`` (TRL's way), else the entries
    of the docstrings of ``cls`` and its bases (an entry's indented lines continue it), else the comment on the
    field's line. A field whose default this project changes (``metadata["why"]``) has the help of the base that
    declares it, and then its default here and why."""
    text: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if base is not object:
            text.update(own_help(base))
    for f in dataclasses.fields(cls):
        if "why" in f.metadata:
            base = library_field(cls, f.name)
            theirs = base.metadata.get("help", "") if base is not None else ""
            own = f"{theirs or f.metadata.get('help', '')} [Default here {f.default!r}: {f.metadata['why']}.]"
            text[f.name] = " ".join(own.split())
        elif f.metadata.get("help"):
            text[f.name] = " ".join(f.metadata["help"].split())
    return text


def library_field(cls: type, name: str):
    """The field ``name`` as the library that declares it has it (TRL's, transformers'), for a field of ``cls`` whose
    default this project changes; None where no base of ``cls`` has it (distillation's sampling fields)."""
    declared = [getattr(b, "__dataclass_fields__", {}).get(name) for b in cls.__mro__]
    return next((d for d in declared if d is not None and "why" not in d.metadata), None)


def project_key(cls: type, name: str) -> bool:
    """Whether the field ``name`` of ``cls`` is one of this project's keys: declared by a class of this project
    (the first in ``cls``'s MRO that annotates it), not a field of TRL's or transformers' whose default it
    changes."""
    declaring = next(b for b in cls.__mro__ if name in b.__dict__.get("__annotations__", {}))
    changed = "why" in cls.__dataclass_fields__[name].metadata
    return declaring.__module__.startswith("gkv_") and not changed


def own_help(cls: type) -> dict[str, str]:
    """Help text per field from ``cls``'s own docstring entries and field comments."""
    found: dict[str, str] = {}
    current: list[str] | None = None
    for line in textwrap.dedent("\n".join((cls.__doc__ or "").splitlines()[1:])).splitlines():
        match = ENTRY.match(line)
        if match:
            current = [match.group(2)]
            for name in match.group(1).split(", "):
                found[name] = current  # names sharing an entry share its text
        elif current is not None and line.startswith(" ") and line.strip():
            current.append(line.strip())
        else:
            current = None
    text = {name: " ".join(parts) for name, parts in found.items()}
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        source = ""
    for line in source.splitlines():
        match = FIELD_COMMENT.match(line)
        if match and match.group(1) not in text:
            text[match.group(1)] = match.group(2)
    return text


def type_name(annotation) -> str:
    if isinstance(annotation, str):
        return annotation
    if typing.get_origin(annotation) is not None or isinstance(annotation, type(int | None)):
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))


def rows(cls: type, prefix: str = "", defaults=None, derived=()) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) of every field of ``cls`` but the ``derived`` and private ones, nested
    dataclasses flattened into dotted keys (with the defaults of the group's default instance: ``defaults``, e.g.
    training's ``compression.budget`` 64)."""
    import enum

    hints = typing.get_type_hints(cls)
    helps = field_help(cls)
    found = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_") or f.name in derived:
            continue
        if defaults is not None:
            default = getattr(defaults, f.name)
        else:
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            )
        if dataclasses.is_dataclass(default):
            found += rows(type(default), f"{prefix}{f.name}.", default)
            continue
        if f.metadata.get("other_keys") and is_compression(cls):  # a method's own options, keys beside the shared
            found += method_option_rows(prefix)
            continue
        default = default.value if isinstance(default, enum.Enum) else default
        shown = shared_default(f.name) if default is None and is_compression(cls) else repr(default)
        found.append((prefix + f.name, type_name(hints.get(f.name, f.type)), shown, helps.get(f.name, "")))
    return found


def job_rows(job: str) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str, str, str]]]:
    """(this project's keys, TRL's and transformers' fields) of ``job``'s configuration as ``rows``: every key of
    each of its classes once (training: GRPO's, then those only distillation has)."""
    from gkv_train.config.compose import job_classes, job_derived, job_unhonoured

    seen, own, trl = set(), [], []
    for cls in job_classes(job).values():
        # this project's keys in the order its classes declare them (a field of a base keeps the base's place)
        order = [
            n
            for b in reversed(cls.__mro__)
            if b.__module__.startswith("gkv_")
            for n in b.__dict__.get("__annotations__", {})
        ]
        mine = []
        for row in rows(cls, derived={**job_derived(job), **job_unhonoured(job)}):
            top = row[0].split(".")[0]
            if row[0] not in seen:
                seen.add(row[0])
                (mine if project_key(cls, top) else trl).append(row)
        own += sorted(mine, key=lambda row: order.index(row[0].split(".")[0]))
    return own, trl


def is_compression(cls: type) -> bool:
    return getattr(cls, "__name__", "") == "CompressionConfig"


def shared_default(name: str) -> str:
    """What a shared compression key not given (None) stands for: the default of ``name`` in each registered method
    that has it, read from the methods' fields: the most common one, then the methods whose own differs
    (``the method's: 16 (h2o, tova: 1; s4r: 32)``); ``None`` for a key no method has."""
    from gkv_rollout.methods import field_default
    from gkv_rollout.registry import registered

    found: dict[str, list[str]] = {}
    for kind in registered().values():
        for f in dataclasses.fields(kind):
            if f.name == name:
                found.setdefault(repr(field_default(f)), []).append(kind.name)
    if not found:
        return "None"
    common, *rest = sorted(found, key=lambda value: -len(found[value]))
    others = "; ".join(f"{', '.join(found[value])}: {value}" for value in rest)
    return f"the method's: {common}" + (f" ({others})" if others else "")


def method_option_rows(prefix: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) of every registered method's own options (``compression.<name>``): each name
    once, with the methods that have it and, where they differ, each one's default."""
    from gkv_rollout.methods import field_default, own_fields
    from gkv_rollout.registry import registered

    by_name: dict[str, list] = {}
    for kind in registered().values():
        hints = typing.get_type_hints(kind)
        helps = field_help(kind)
        for f in own_fields(kind):
            default = field_default(f)
            by_name.setdefault(f.name, []).append((kind.name, type_name(hints[f.name]), default, helps.get(f.name, "")))
    found = []
    for name, entries in by_name.items():
        methods = ", ".join(method for method, *_ in entries)
        defaults = {repr(default) for _, _, default, _ in entries}
        default = entries[0][2] if len(defaults) == 1 else ", ".join(f"{m}: {d!r}" for m, _, d, _ in entries)
        text = f"[{methods}] {entries[0][3]}"
        found.append((prefix + name, entries[0][1], repr(default) if len(defaults) == 1 else default, text))
    return found


def changed_defaults(job: str) -> list[tuple[str, str, str, str]]:
    """(key, default here, the declaring library's default, why) of every field of ``job``'s classes whose default
    this project changes (``metadata["why"]``), each once."""
    from gkv_train.config.compose import job_classes

    found = {}
    for cls in job_classes(job).values():
        for f in dataclasses.fields(cls):
            if "why" not in f.metadata or f.name in found:
                continue
            base = library_field(cls, f.name)
            theirs = "-" if base is None else repr(base.default)
            found[f.name] = (f.name, repr(f.default), theirs, f.metadata["why"])
    return list(found.values())


def help_text(job: str, recipes: list[str] | None = None) -> str:
    """The listing ``gkv-train JOB --help`` prints."""
    lines = [f"usage: gkv-train {job} [key=value ...]   (Hydra overrides; the same as the repository's script)", ""]
    if recipes:
        lines += [f"recipe=NAME sets a recipe's values first: {', '.join(recipes)} (recipes/recipe/*.yaml)", ""]
    lines += ["defaults are the dataclasses' (a recipe may set others); types as Python writes them", ""]
    own, trl = job_rows(job)
    for heading, found in (
        (None, own),
        (
            "TRL's GRPOConfig fields, their help TRL's (distillation takes those of transformers' TrainingArguments):",
            trl,
        ),
    ):
        if heading and found:
            lines += ["", heading, ""]
        for key, kind, default, text in found:
            lines.append(f"  {key}  ({kind}, default {default})")
            for part in textwrap.wrap(text or "-", 100):
                lines.append(f"      {part}")
    return "\n".join(lines) + "\n"
