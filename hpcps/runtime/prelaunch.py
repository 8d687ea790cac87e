"""What ``hpcps run`` checks before it starts ``mpirun`` (no MPI here): the rank count
against ``[cluster]``, the model can be imported (with the path the ranks will have), and —
when every rank runs on this node — the tables fit the servers' memory. A job that fails
these is refused in a second, once, naming the job file and the key, with nothing created;
the ranks check the same again inside the launch (:mod:`hpcps.runtime.preflight`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from hpcps.config import ConfigError, check_world
from hpcps.config.errors import file_and_line
from hpcps.config.files import display_path
from hpcps.core.resources import available_memory


def server_bytes(tables, n_servers: int) -> tuple[int, list[str]]:
    """Bytes of the largest server's shards (rows and optimizer slots) and the arithmetic.

    Parameters
    ----------
    tables : list of (TableSpec, optimizer)
    n_servers : int

    Returns
    -------
    (int, list of str)
        Bytes, and one line of arithmetic per table.
    """
    from hpcps.core.tables import KeyPartition

    total, parts = 0, []
    for spec, opt in tables:
        if spec.dynamic:            # grows with the keys pushed: nothing allocated up front
            parts.append(f"{spec.name}: dynamic (hash) table, grows with the keys stored")
            continue
        rows = KeyPartition(spec.num_keys, n_servers, permute=spec.sparse).range_size
        item = np.dtype(spec.dtype).itemsize
        state = opt.slot_bytes_per_row(spec.dim, spec.dtype)
        b = rows * (spec.dim * item + state)
        total += b
        slots = f" + {state} B {', '.join(opt.slot_names)}" if opt.slot_names else ""
        parts.append(f"{spec.name}: {rows:,} rows x ({spec.dim} x {item} B weights{slots}) "
                     f"= {b / 2**30:,.2f} GiB")
    return total, parts


def server_need(cfg, tables) -> tuple[int, list[str]]:
    """One server's bytes with the copies of ``[fault_tolerance] replicas``, and the
    arithmetic (:func:`server_bytes`)."""
    need, parts = server_bytes(tables, cfg.cluster.servers)
    copies = cfg.fault_tolerance.replicas if cfg.fault_tolerance.mode == "continue" else 1
    if copies > 1:                  # each server also holds a backup of its neighbour's range
        need *= copies
        parts = [f"{p} (x {copies} copies, [fault_tolerance] replicas)" for p in parts]
    return need, parts


def size_key(cfg) -> str:
    """The job-file key that sizes the model's tables the most (for messages)."""
    if cfg.model.type == "logistic":
        return {"adult_csv": "data.hash_bits", "svmlight": "data.n_features"}.get(
            cfg.data.format, "data.path")
    return {"mf": "model.factors", "mlp": "model.hidden"}.get(cfg.model.type, "model.type")


def memory_message(cfg, need: int, parts: list, here: int, have: int | None) -> str:
    """The refusal of tables that do not fit: the arithmetic, what is available, the cures.
    ``here``: servers on the node; ``have``: its available bytes (None: another rank's)."""
    detail = "; ".join(parts)
    where = (f"{here} server(s) on this node need {here} x {need / 2**30:,.2f} GiB = "
             f"{here * need / 2**30:,.2f} GiB but {have / 2**30:,.2f} GiB is available"
             if have is not None else "a server's node lacks the memory (see that rank's message)")
    cures = [f"more servers on more nodes ([cluster] servers = {cfg.cluster.servers} now,"
             f" {here} on this node)" if here > 1 else
             f"more servers ([cluster] servers = {cfg.cluster.servers} now)", "fewer keys"]
    if cfg.model.dtype != "float32":
        cures.append('[model] dtype = "float32"')
    if cfg.model.type == "logistic" and cfg.data.format in ("svmlight", "adult_csv", "criteo"):
        # a fixed table is sized by its key space; a dynamic one by the keys that occur
        cures.insert(-1, '[model] storage = "hash" (a dynamic table: memory for the ids that '
                         'occur, not the whole id space; docs/dynamic_tables.md)')
    return (f"{file_and_line(display_path(cfg.path), cfg.path, size_key(cfg))}: {size_key(cfg)}: "
            "the tables do not fit the servers' "
            f"memory: per server {detail}; {where}. Use {', '.join(cures[:-1])} or "
            f"{cures[-1]}.")


@contextmanager
def _ranks_path(cwd: Path):
    """``sys.path`` as the ranks will have it: they run ``python -m hpcps`` in ``cwd`` (its
    first entry) with the same environment (``PYTHONPATH``)."""
    entry = str(cwd)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        try:
            sys.path.remove(entry)
        except ValueError:
            pass


def check_before_launch(cfg, n_ranks: int, local: bool, cwd=None) -> list[ConfigError]:
    """The problems of job ``cfg`` launched on ``n_ranks`` ranks that can be seen before
    ``mpirun`` starts. Local (the ``hpcps run`` process); creates nothing.

    Parameters
    ----------
    cfg : hpcps.config.JobConfig
    n_ranks : int
    local : bool
        Every rank runs on this node (no hosts given to mpirun, not a multi-node
        allocation): the memory check applies.
    cwd : path-like, optional
        The ranks' working directory (default: this process's).

    Returns
    -------
    list of ConfigError
        Empty when the job may be launched.
    """
    problems = []
    try:
        check_world(cfg, n_ranks)
    except ConfigError as e:
        problems.append(e)
    from hpcps.data import DataError
    from hpcps.models import ModelLoadError
    from hpcps.models.load import load_model

    where = display_path(cfg.path)
    try:
        with _ranks_path(Path(cwd or os.getcwd())):
            model = load_model(dataclasses.replace(cfg, path=where))
    except ModelLoadError as e:
        problems.append(ConfigError(where, "model.type", str(e).removeprefix("model.type: ")))
        return problems
    except DataError as e:
        problems.append(ConfigError(where, "data.path", str(e)))
        return problems
    except ConfigError as e:
        problems.append(e)
        return problems
    except Exception:               # noqa: BLE001 - the ranks report it with its context
        return problems
    try:
        tables = model.tables()
    except ConfigError as e:        # a [tables.NAME] the model does not have
        problems.append(e)
        return problems
    except Exception:               # noqa: BLE001 - the ranks report it with its context
        return problems
    if local and cfg.cluster.mode == "ps" and not problems:
        have = available_memory()
        need, parts = server_need(cfg, tables)
        here = cfg.cluster.servers
        if have is not None and need * here > have:
            msg = memory_message(cfg, need, parts, here, have)
            problems.append(ConfigError(None, None, msg))
    return problems
