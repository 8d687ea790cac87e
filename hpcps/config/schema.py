"""The checker of a job file's keys against :data:`hpcps.config.sections.SECTIONS`: types,
ranges, allowed values, unknown keys. It collects every problem (with the line of its key, so
they are reported in the order of the file) instead of stopping at the first. No I/O, no MPI.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from hpcps.config.errors import _HEADER_RE, _KEY_RE, ConfigError, _dotted, key_lines
from hpcps.config.sections import REQUIRED, SECTIONS, TOP, Rule

_INT64_MAX = 2**63 - 1

_TOML_TYPE_NAMES = {
    str: "string",
    int: "integer",
    float: "float",
    bool: "boolean",
    dict: "table",
    list: "array",
}

def toml_error(path: Path, text: str, e: tomllib.TOMLDecodeError) -> ConfigError:
    """The :class:`ConfigError` of a TOML syntax error, with the text of the line it is on
    and, for a key set twice (``Cannot overwrite a value``), the key's dotted name."""
    msg = str(e)
    m = re.search(r"at line (\d+), column (\d+)", msg)
    lines = text.splitlines()
    if m and 1 <= int(m.group(1)) <= len(lines):
        n = int(m.group(1))
        line = lines[n - 1].strip()
        if msg.startswith("Cannot overwrite a value"):
            prefix = ""
            for prev in lines[:n - 1]:
                h = _HEADER_RE.match(prev.strip())
                if h:
                    prefix = _dotted(h.group(1))
            k = _KEY_RE.match(line)
            if k:
                name = _dotted(k.group(1))
                name = f"{prefix}.{name}" if prefix else name
                first = key_lines(text).get(name)
                where = f" (first set at line {first})" if first and first != n else ""
                return ConfigError(path, name, f"invalid TOML: key set twice{where}: line {n}: "
                                               f"{line} ({msg})", line=n)
        if line:
            msg = f"{msg}: {line}"
    return ConfigError(path, None, f"invalid TOML: {msg}", line=0)


def type_name(value: Any) -> str:
    for t in (bool, int, float, str, dict, list):  # bool before int
        if isinstance(value, t):
            return _TOML_TYPE_NAMES[t]
    return type(value).__name__  # datetime, date, time


def show(value: Any) -> str:
    """Render a value the way it would be written in TOML (roughly)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "{...}"
    return repr(value) if isinstance(value, float) else str(value)


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


class Checker:
    """Checks bound to one job file; collects every problem (:attr:`errors`).

    Parameters
    ----------
    path : pathlib.Path
        The job file (for messages; relative data paths resolve against its directory).
    text : str
        Its text, for the line of each key (the order problems are reported in).
    """

    def __init__(self, path: Path, text: str = ""):
        self.path = path
        self.job_dir = path.resolve().parent
        self.lines = key_lines(text)
        self.errors: list[tuple[float, int, ConfigError]] = []
        self.bad: set[str] = set()

    def error(self, key: str | None, message: str) -> ConfigError:
        return ConfigError(self.path, key, message, line=self.lines.get(key or "", 0))

    def fail(self, key: str | None, message: str) -> None:
        """Record a problem with ``key`` (and mark the key bad: rules that need its value
        skip it)."""
        self.errors.append((self._line(key), len(self.errors), self.error(key, message)))
        if key is not None:
            self.bad.add(key)

    def good(self, *keys: str) -> bool:
        """No problem was recorded for any of ``keys`` (dotted)."""
        return not any(k in self.bad for k in keys)

    def _line(self, key: str | None) -> float:
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key.rpartition(".")[0]
        return math.inf

    def found(self) -> list[ConfigError]:
        """The problems recorded, in the order of the file (those of absent keys last)."""
        return [e for _, _, e in sorted(self.errors, key=lambda t: t[:2])]

    # -- keys ----------------------------------------------------------------------

    def unknown_keys(self, table: dict, valid: dict, prefix: str) -> None:
        for k in table:
            if k in valid:
                continue
            dotted = f"{prefix}{k}"
            close = difflib.get_close_matches(k, list(valid), n=1, cutoff=0.6)
            if close:
                hint = f"did you mean '{close[0]}'?"
            elif prefix and k in TOP:
                hint = (f"'{k}' is a top-level key; move it above the first [section] "
                        "header")
            else:
                homes = [s for s, keys in SECTIONS.items() if k in keys and f"{s}." != prefix]
                if homes:
                    hint = f"'{k}' belongs in [{homes[0]}]"
                else:
                    hint = "valid keys: " + ", ".join(sorted(valid))
            self.fail(dotted, f"unknown key ({hint})")

    def value(self, table: dict, key: str, rule: Rule, dotted: str) -> Any:
        """Type- and range-check ``table[key]`` (or return the default); on a problem,
        record it and return the default."""
        try:
            return self._value(table, key, rule, dotted)
        except ConfigError as e:
            self.fail(e.key, e.message)
            return None if rule.default is REQUIRED else rule.default

    def _value(self, table: dict, key: str, rule: Rule, dotted: str) -> Any:
        if key not in table:
            if rule.default is REQUIRED:
                raise self.error(dotted, "required key missing")
            return rule.default
        v = table[key]
        kind = rule.kind
        ok = isinstance(v, kind) and not (kind is not bool and isinstance(v, bool))
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            try:
                v, ok = float(v), True
            except OverflowError:
                raise self.error(dotted, f"number too large, got {v}") from None
        if not ok:
            raise self.error(dotted, f"expected {_TOML_TYPE_NAMES[kind]}, "
                                     f"got {type_name(v)} {show(v)}")
        if kind is float and not math.isfinite(v):
            raise self.error(dotted, f"must be a finite number, got {show(v)}")
        if rule.choices is not None and v not in rule.choices:
            allowed = ", ".join(show(c) for c in rule.choices)
            msg = f"must be one of {allowed}, got {show(v)}"
            if isinstance(v, str):
                close = difflib.get_close_matches(v, [str(c) for c in rule.choices], n=1)
                if close:
                    msg += f" (did you mean '{close[0]}'?)"
            raise self.error(dotted, msg)
        if kind is int and v > _INT64_MAX:
            raise self.error(dotted, f"must be <= {_INT64_MAX}, got {v}")
        self._range(v, rule, dotted)
        return v

    def _range(self, v: float, rule: Rule, dotted: str) -> None:
        lo, hi = rule.lo, rule.hi
        if lo is not None and hi is not None:
            bad = (v <= lo if rule.lo_open else v < lo) or (v >= hi if rule.hi_open else v > hi)
            if bad:
                lb = "(" if rule.lo_open else "["
                rb = ")" if rule.hi_open else "]"
                raise self.error(dotted, f"must be in {lb}{_fmt_num(lo)}, {_fmt_num(hi)}{rb}, "
                                         f"got {show(v)}")
        elif lo is not None:
            if v <= lo if rule.lo_open else v < lo:
                op = ">" if rule.lo_open else ">="
                raise self.error(dotted, f"must be {op} {_fmt_num(lo)}, got {show(v)}")
        elif hi is not None:
            if v >= hi if rule.hi_open else v > hi:
                op = "<" if rule.hi_open else "<="
                raise self.error(dotted, f"must be {op} {_fmt_num(hi)}, got {show(v)}")

    # -- sections ------------------------------------------------------------------

    def section(self, doc: dict, name: str) -> dict:
        """The ``[name]`` table of ``doc`` (``{}`` when absent or not a table, which is
        recorded), its unknown keys recorded."""
        table = doc.get(name, {})
        if not isinstance(table, dict):
            self.fail(name, f"expected a table ([{name}]), got {type_name(table)} "
                            f"{show(table)}")
            return {}
        self.unknown_keys(table, SECTIONS[name], f"{name}.")
        return table

    def values(self, table: dict, name: str, keys=None) -> dict[str, Any]:
        """Every key of section ``name`` (or only ``keys``) checked, defaults filled in."""
        rules = SECTIONS[name]
        return {k: self.value(table, k, rules[k], f"{name}.{k}")
                for k in (rules if keys is None else keys)}
