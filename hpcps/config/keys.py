"""One key of the job file: its type, default and constraint (:class:`Rule`), written once in
the dataclass field that holds it (:func:`key`) and read back by :func:`rules_of`. No I/O,
no MPI."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["REQUIRED", "Rule", "key", "rules_of"]

REQUIRED = object()
"""Marks a key without a default (the job file must set it)."""


@dataclass(frozen=True)
class Rule:
    """Type, default and constraint of one key of the job file.

    Attributes
    ----------
    kind : type
        The TOML value's Python type: ``str``, ``int``, ``float``, ``bool``, ``list`` or
        ``dict`` (an integer is accepted for ``float``).
    default : object
        The value when the key is absent, or :data:`REQUIRED`.
    lo, hi : float or None
        Bounds; ``lo_open`` / ``hi_open`` make them exclusive.
    choices : tuple or None
        The allowed values.
    """

    kind: type
    default: Any = REQUIRED
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple | None = None


def key(default=REQUIRED, *, kind: type | None = None, factory=None, toml_default=REQUIRED,
        **constraint):
    """A dataclass field that is also a job-file key: its default and its :class:`Rule`.

    Parameters
    ----------
    default : object, optional
        The field's default (and the key's); absent: the key is required.
    kind : type, optional
        The TOML type, when it is not the default's type.
    factory : callable, optional
        A default factory (mutable defaults) instead of ``default``.
    toml_default : object, optional
        The key's default when the field has none (e.g. ``output.dir``, derived later).
    **constraint
        ``lo``, ``hi``, ``lo_open``, ``hi_open``, ``choices`` of :class:`Rule`.
    """
    if kind is None:
        kind = type(default)
    meta = {"kind": kind, "toml_default": toml_default, **constraint}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    if default is REQUIRED:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def rules_of(cls) -> dict[str, Rule]:
    """The :class:`Rule` of every key field of dataclass ``cls``, in field order."""
    out = {}
    for f in dataclasses.fields(cls):
        if "kind" not in f.metadata:
            continue
        m = dict(f.metadata)
        toml_default = m.pop("toml_default")
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = toml_default
        out[f.name] = Rule(default=default, **m)
    return out
