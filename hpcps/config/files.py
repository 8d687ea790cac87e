"""The checks of a job that touch the file system, kept out of the schema: reading the job
file, the data files it names (exist, readable, splittable, of the right kind), the output
directory (writable) and where it lies. No MPI.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hpcps.config.errors import ConfigError, file_and_line
from hpcps.config.schema import Checker

_UNPACK = {".gz": "gunzip", ".bz2": "bunzip2", ".xz": "unxz", ".zst": "unzstd"}


def resolve(ck: Checker, value: str, dotted: str) -> Path | None:
    """A data path of the job file made absolute against the job file's directory (no
    I/O); None with a recorded problem when it is empty or holds a NUL."""
    if not value:
        ck.fail(dotted, "must not be empty")
        return None
    if "\x00" in value:
        ck.fail(dotted, f"path contains a NUL character: {value!r}")
        return None
    p = Path(value).expanduser()
    return (p if p.is_absolute() else ck.job_dir / p).resolve()


def check_inputs(ck: Checker, fmt: str, raw: dict, path: Path | None,
                 test_path: Path | None) -> None:
    """The data files of ``[data]`` exist, are readable regular files; svmlight ones are not
    compressed (the workers read byte ranges); a prepared one is an hpcps prepared file.
    Records the problems."""
    if fmt == "prepared" and path is not None and not path.exists():
        ck.fail("data.path", f"prepared data file not found: {path}; write it with "
                             f"`hpcps data prepare {path.stem} --out {path}`")
        return
    for key, p in (("data.path", path), ("data.test_path", test_path)):
        if p is None or not ck.good(key):
            continue
        value = raw.get(key.rpartition(".")[2], "")
        if fmt in ("svmlight", "criteo") and (fmt == "criteo" or raw.get("stream") is not False):
            _check_stream_input(ck, fmt, key, p, value, raw)
            continue
        why = _input_problem(ck, p, value)
        if why:
            ck.fail(key, why)
        elif fmt == "svmlight":
            from hpcps.data.svmlight import COMPRESSED

            if p.name.endswith(COMPRESSED):
                ck.fail(key, f"{p}: a compressed svmlight file cannot be split into byte "
                             f"ranges for the workers; decompress it first (e.g. "
                             f"`{_UNPACK[p.suffix]} -k {p.name}`), or stream it (remove "
                             f"data.stream = false)")
    if fmt == "prepared" and path is not None and ck.good("data.path"):
        from hpcps.data.prepared import PreparedError, file_attrs

        try:
            file_attrs(path)
        except PreparedError as e:
            ck.fail("data.path", str(e))


def _check_stream_input(ck: Checker, fmt: str, key: str, p: Path, value: str, raw: dict) -> None:
    """A streamed ``[data]`` path: a file, a directory or a glob naming at least one readable
    data file (:func:`hpcps.data.textstream.data_files`). svmlight data that cannot be read by
    byte ranges (compressed, many files) needs ``stream`` (absent or true)."""
    from hpcps.data import DataError
    from hpcps.data.textstream import data_files

    try:
        found = data_files(p)
    except DataError as e:
        rel = "" if Path(value).expanduser().is_absolute() else (
            f" (relative paths are resolved against the job file's directory {ck.job_dir})")
        ck.fail(key, f"{e}{rel}")
        return
    for f in found:
        if not os.access(f, os.R_OK):
            ck.fail(key, f"file not readable: {f}")
            return
        if f.endswith((".bz2", ".xz")):
            ck.fail(key, f"{f}: {f.rpartition('.')[2]}-compressed data is not read; streamed "
                         f"data may be plain, gzip or zstd (e.g. `{_UNPACK['.' + f.rpartition('.')[2]]} "
                         f"-k {os.path.basename(f)}`, or recompress with gzip or zstd)")
            return


def _input_problem(ck: Checker, p: Path, value: str) -> str | None:
    if not p.exists():
        rel = "" if Path(value).expanduser().is_absolute() else (
            f" (relative paths are resolved against the job file's directory {ck.job_dir})")
        return f"file not found: {p}{rel}"
    if not p.is_file():
        return f"not a regular file: {p}"
    if not os.access(p, os.R_OK):
        return f"file not readable: {p}"
    return None


def read_job_text(path: Path) -> str:
    """The text of job file ``path`` (UTF-8, a BOM allowed). Raises :class:`ConfigError`."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(path, None, f"job file not found ({path.absolute()})") from None
    except IsADirectoryError:
        raise ConfigError(path, None, "is a directory, expected a TOML job file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(path, None, f"not valid UTF-8 text: {e}") from None
    except OSError as e:
        raise ConfigError(path, None, f"cannot read job file: {e.strerror or e}") from None


def display_path(path: Path) -> Path:
    """`path` relative to the working directory if it lies below it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def check_output_writable(cfg) -> None:
    """Create the output directory (with parents) and check that it is writable.

    Parameters
    ----------
    cfg : JobConfig
        The job; uses ``cfg.output.dir``.

    Raises
    ------
    ConfigError
        With key ``"output.dir"`` if the directory cannot be created or written to.
    """
    d = cfg.output.dir
    where = display_path(cfg.path)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(where, "output.dir", f"exists and is not a directory: {d}") from None
    except OSError as e:
        raise ConfigError(where, "output.dir",
                          f"cannot create directory {d}: {e.strerror or e}") from None
    try:
        with tempfile.TemporaryFile(dir=d, prefix=".hpcps-write-test-"):
            pass
    except OSError as e:
        raise ConfigError(where, "output.dir",
                          f"directory is not writable: {d}: {e.strerror or e}") from None


def output_note(cfg, cwd: str | os.PathLike | None = None) -> str | None:
    """A note when the job writes outside the working directory, else None. Local.

    The only path of a job file that hpcps writes to is ``[output] dir`` (checkpoints,
    model, metrics all go below it). It is resolved (symbolic links followed) against the
    working directory; when the result does not lie below that directory — an absolute
    path, ``..``, or a link pointing elsewhere — the user should be told where the files
    go before they are written.

    Parameters
    ----------
    cfg : JobConfig
    cwd : path-like, optional
        The working directory (default: the process's).

    Returns
    -------
    str or None
        ``"<job>:<line>: output.dir: writing to <dir>, outside the working directory <cwd>"``
        (``<line>``: where ``[output] dir`` is written).
    """
    here = Path(cwd if cwd is not None else Path.cwd()).resolve()
    d = cfg.output.dir.resolve()
    if d == here or here in d.parents:
        return None
    return (f"{file_and_line(display_path(cfg.path), cfg.path, 'output.dir')}: output.dir: "
            f"writing to {d}, outside the working directory {here}")
