"""Loading the job's model with the errors a job file's reader understands. No MPI."""

from __future__ import annotations

from hpcps.config import ConfigError
from hpcps.data import DataError
from hpcps.models import ModelLoadError, make_model

__all__ = ["load_model"]


def load_model(cfg):
    """The job's model (:func:`hpcps.models.make_model`); a model that cannot be loaded is a
    :class:`~hpcps.config.ConfigError` on key ``model.type``, a data file the model cannot
    use (e.g. a prepared file of another kind) one on ``data.path``. Local; every rank calls it."""
    try:
        return make_model(cfg)
    except ModelLoadError as e:
        raise ConfigError(cfg.path, "model.type", str(e).removeprefix("model.type: ")) from None
    except DataError as e:
        raise ConfigError(cfg.path, "data.path", str(e)) from None
