"""Errors of job files: :class:`ConfigError` (one problem, naming the file and the key) and
:class:`ConfigErrors` (every problem the checker found in one file, in file order). No MPI."""

from __future__ import annotations

import os
import re
from pathlib import Path


_HEADER_RE = re.compile(r"^\[\[?\s*([^\]]+?)\s*\]\]?")
_KEY_RE = re.compile(r"""^((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")


def _dotted(raw: str) -> str:
    return ".".join(p.strip().strip("\"'") for p in raw.split("."))


def key_lines(text: str) -> dict[str, int]:
    """The line (1-based) where each dotted key and each ``[table]`` header first appears,
    read line by line (approximate inside multi-line strings, exact for job files). The
    tables a header or a dotted key opens count too: ``[tabels.weights]`` gives the line of
    ``tabels`` as well as of ``tabels.weights``."""
    out: dict[str, int] = {}
    prefix = ""

    def note(dotted: str, n: int) -> None:
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            out.setdefault(".".join(parts[:i]), n)

    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        m = _HEADER_RE.match(s)
        if m:
            prefix = _dotted(m.group(1))
            note(prefix, n)
            continue
        m = _KEY_RE.match(s)
        if m:
            k = _dotted(m.group(1))
            note(f"{prefix}.{k}" if prefix else k, n)
    return out


def line_of(path: Path | None, key: str | None) -> int:
    """The line (1-based) of ``key`` in the job file ``path`` (:func:`key_lines`), 0 when the
    key is not written in it or the file cannot be read (a job given as text)."""
    if path is None or not key:
        return 0
    try:
        if path.stat().st_size > (1 << 20):
            return 0
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return 0
    return key_lines(text).get(key, 0)


def file_and_line(shown, path: Path | None, key: str | None) -> str:
    """``"<shown>:<line>"`` with the line of ``key`` in the job file ``path``
    (:func:`line_of`), or ``"<shown>"`` when it has none: how a message names where a key is
    (``shown``: the path as the message shows it)."""
    return _at(shown, line_of(Path(path) if path is not None else None, key))


def _at(shown, line: int) -> str:
    """``"<shown>:<line>"``, or ``"<shown>"`` for line 0 (none)."""
    return f"{shown}:{line}" if line else str(shown)


class ConfigError(ValueError):
    """An invalid job file or job configuration.

    Parameters
    ----------
    path : str or os.PathLike or None
        The job file the error refers to (``None`` if unknown).
    key : str or None
        Dotted key, e.g. ``"optimizer.learning_rate"``; ``None`` for errors about the
        file as a whole (not found, TOML syntax error).
    message : str
        What is wrong, e.g. ``"must be > 0, got -0.1"``.
    line : int or None
        The line (1-based) of ``key`` in the file, 0 for none (a key not written in it);
        None: looked up in the file (:func:`line_of`).

    Attributes
    ----------
    path : pathlib.Path or None
        The job file, as given by the caller.
    key : str or None
        The dotted key.
    message : str
        The bare message, without file and key.
    line : int
        The line of the key in the file (0: unknown, not shown).
    errors : list of ConfigError
        The problems this error stands for: ``[self]`` here, every one for
        :class:`ConfigErrors`.

    Notes
    -----
    ``str(err)`` is ``"<path>:<line>: <key>: <message>"`` (the compilers' form, which editors
    follow to the line; parts that are unknown are left out).
    """

    def __init__(self, path: str | os.PathLike | None, key: str | None, message: str,
                 line: int | None = None):
        self.path = Path(path) if path is not None else None
        self.key = key
        self.message = message
        self.line = line_of(self.path, key) if line is None else int(line)
        where = None if self.path is None else _at(self.path, self.line)
        parts = [p for p in (where, key) if p is not None]
        super().__init__(": ".join(parts + [message]))

    @property
    def errors(self) -> list:
        return [self]

    def __reduce__(self):
        return (type(self), (self.path, self.key, self.message, self.line))


class ConfigErrors(ConfigError):
    """Several problems in one job file, in the order of the file (each on its own line).

    ``path``, ``key`` and ``message`` are the first problem's, so code that handles one
    :class:`ConfigError` handles this one too; ``str(err)`` has one line per problem.

    Parameters
    ----------
    errors : list of ConfigError
        At least one.
    """

    def __init__(self, errors):
        errors = list(errors)
        if not errors:
            raise ValueError("ConfigErrors needs at least one error")
        first = errors[0]
        super().__init__(first.path, first.key, first.message, first.line)
        self._errors = errors
        self.args = ("\n".join(str(e) for e in errors),)

    @property
    def errors(self) -> list:
        return list(self._errors)

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self._errors,))


def raise_all(errors) -> None:
    """Raise the one error of ``errors`` as it is, several as :class:`ConfigErrors`; nothing
    for none."""
    errors = list(errors)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigErrors(errors)
