"""Loading the job's model with the errors a job file's reader understands. No MPI."""

from __future__ import annotations

from hpcps.config import ConfigError
from hpcps.data import DataError
from hpcps.models import ModelLoadError, make_model

__all__ = ["load_model", "apply_storage"]


def load_model(cfg):
    """The job's model (:func:`hpcps.models.make_model`); a model that cannot be loaded is a
    :class:`~hpcps.config.ConfigError` on key ``model.type``, a data file the model cannot
    use (e.g. a prepared file of another kind) one on ``data.path``. Its ``tables()`` give each
    table the storage of the job file (:func:`apply_storage`): a ``[tables.NAME]`` the model
    lacks is a ConfigError when they are first asked for. Local; every rank calls it."""
    try:
        model = make_model(cfg)
    except ModelLoadError as e:
        raise ConfigError(cfg.path, "model.type", str(e).removeprefix("model.type: ")) from None
    except DataError as e:
        raise ConfigError(cfg.path, "data.path", str(e)) from None
    declared = model.tables

    def tables():
        return apply_storage(cfg, declared())

    model.tables = tables          # every caller sees the storage the job file gives
    return model


def apply_storage(cfg, tables: list) -> list:
    """The model's ``[(TableSpec, Optimizer)]`` with each table's storage from the job file
    (:meth:`hpcps.config.sections.JobConfig.storage_of`).

    Raises
    ------
    hpcps.config.ConfigError
        On key ``tables.NAME`` for a name that is not a table of the model, or
        ``tables.NAME.storage`` for a dense table declared ``"hash"``.
    """
    import dataclasses
    import difflib

    names = [t.name for t, _ in tables]
    for name in getattr(cfg, "tables", {}):
        if name not in names:      # a user model's (the checker knows the built-in ones')
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"; did you mean [tables.{close[0]}]?" if close else ""
            raise ConfigError(cfg.path, f"tables.{name}",
                              f"no table {name!r} in model {cfg.model.type!r} (its tables: "
                              f"{', '.join(names)}{hint})")
    out = []
    for spec, opt in tables:
        st = cfg.storage_of(spec.name, spec.sparse) if hasattr(cfg, "storage_of") else spec.storage
        if st == "hash" and not spec.sparse:
            if spec.name in cfg.tables:
                raise ConfigError(cfg.path, f"tables.{spec.name}.storage",
                                  f"table {spec.name!r} is dense (pulled whole, in key order): "
                                  "only a sparse table can be dynamic ('hash')")
            st = "array"
        if st != spec.storage:
            spec = dataclasses.replace(spec, storage=st)
        extra = {k: v for k, v in cfg.tables.get(spec.name, {}).items() if k != "storage"} \
            if st == "hash" else {}
        if extra:                       # admission and eviction of a dynamic table
            spec = dataclasses.replace(spec, **extra)
        out.append((spec, opt))
    return out

