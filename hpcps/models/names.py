"""The table names of the built-in models, in a module of their own (no import): the models
declare their tables with them, and the job-file checker (:func:`hpcps.models.builtin_tables`,
called from :mod:`hpcps.config`) names a ``[tables.NAME]`` the model lacks with them without
importing the models (which import the configuration)."""

#: logistic regression (:mod:`hpcps.models.logistic`): sparse weights, a dense bias
WEIGHTS, BIAS = "weights", "bias"
#: matrix factorisation (:mod:`hpcps.models.mf`): all sparse
USER_FACTORS, ITEM_FACTORS, USER_BIAS, ITEM_BIAS = ("user_factors", "item_factors",
                                                    "user_bias", "item_bias")


def layer_names(i: int) -> tuple[str, str]:
    """The weight and bias tables of layer ``i`` of the MLP (:mod:`hpcps.models.mlp`)."""
    return f"w{i}", f"b{i}"
