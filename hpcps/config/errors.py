"""Errors of job files: :class:`ConfigError` (one problem, naming the file and the key) and
:class:`ConfigErrors` (every problem the checker found in one file, in file order). No MPI."""

from __future__ import annotations

import os
from pathlib import Path


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

    Attributes
    ----------
    path : pathlib.Path or None
        The job file, as given by the caller.
    key : str or None
        The dotted key.
    message : str
        The bare message, without file and key.
    errors : list of ConfigError
        The problems this error stands for: ``[self]`` here, every one for
        :class:`ConfigErrors`.

    Notes
    -----
    ``str(err)`` is ``"<path>: <key>: <message>"`` (parts that are ``None`` are left out).
    """

    def __init__(self, path: str | os.PathLike | None, key: str | None, message: str):
        self.path = Path(path) if path is not None else None
        self.key = key
        self.message = message
        parts = [str(p) for p in (self.path, key) if p is not None]
        super().__init__(": ".join(parts + [message]))

    @property
    def errors(self) -> list:
        return [self]

    def __reduce__(self):
        return (type(self), (self.path, self.key, self.message))


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
        super().__init__(first.path, first.key, first.message)
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
