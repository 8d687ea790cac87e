"""Models trained by hpcps (no MPI): the protocol (:mod:`hpcps.models.base`), the built-in
models, and the loader of user models named in a job file.

Built-in ``[model] type`` values: ``"logistic"`` (:mod:`hpcps.models.logistic`), ``"mf"``
(:mod:`hpcps.models.mf`), ``"mlp"`` (:mod:`hpcps.models.mlp`). Any other value must be
``"package.module:ClassName"`` naming a subclass of :class:`hpcps.models.base.Model`; the
module is imported only because the job file names it.
"""

from __future__ import annotations

import importlib

from hpcps.models import names
from hpcps.models.base import Model

BUILTIN = {
    "logistic": "hpcps.models.logistic:LogisticRegression",
    "mf": "hpcps.models.mf:MatrixFactorization",
    "mlp": "hpcps.models.mlp:MLP",
}


def builtin_tables(type_name: str, hidden=()) -> dict[str, bool] | None:
    """The tables of built-in model ``type_name`` as ``{name: sparse}``, in the order its
    ``tables()`` declares them, known without its data (the job-file checker names a
    ``[tables.NAME]`` the model lacks with them); None for a user model, whose tables are
    known once it is built (:func:`hpcps.models.load.apply_storage`).

    Parameters
    ----------
    type_name : str
        ``[model] type``.
    hidden : sequence of int
        ``[model] hidden`` (``"mlp"``: one ``w<i>``, ``b<i>`` pair per layer, len + 1 layers).
    """
    if type_name == "logistic":
        return {names.WEIGHTS: True, names.BIAS: False}
    if type_name == "mf":               # all sparse
        return dict.fromkeys((names.USER_FACTORS, names.ITEM_FACTORS, names.USER_BIAS,
                              names.ITEM_BIAS), True)
    if type_name == "mlp":              # all dense
        return {n: False for i in range(len(hidden) + 1) for n in names.layer_names(i)}
    return None


class ModelLoadError(ImportError):
    """``[model] type`` names a model that cannot be imported or is not a
    :class:`~hpcps.models.base.Model` subclass."""


def load_model_class(type_name: str) -> type:
    """The model class named by ``[model] type``.

    Parameters
    ----------
    type_name : str
        A built-in name or ``"package.module:ClassName"``.

    Returns
    -------
    type
        A subclass of :class:`hpcps.models.base.Model`.

    Raises
    ------
    ModelLoadError
        If the module cannot be imported, has no such class, or the class is not a Model.
    """
    target = BUILTIN.get(type_name, type_name)
    mod_name, _, cls_name = target.partition(":")
    if not cls_name:
        raise ModelLoadError(f"model.type: {type_name!r} is neither a built-in model "
                             f"({', '.join(BUILTIN)}) nor 'package.module:ClassName'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ModelLoadError(f"model.type: cannot import module {mod_name!r} ({e}); is it "
                             "installed, or on PYTHONPATH on every node?") from None
    cls = getattr(mod, cls_name, None)
    if cls is None:
        raise ModelLoadError(f"model.type: module {mod_name!r} has no class {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise ModelLoadError(f"model.type: {target} is not a subclass of hpcps.models.base.Model")
    return cls


def make_model(cfg) -> Model:
    """Instantiate the model of job ``cfg`` (``cfg.model.type``).

    Raises
    ------
    ModelLoadError
        See :func:`load_model_class`.
    """
    return load_model_class(cfg.model.type)(cfg)
