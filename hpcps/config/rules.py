"""The rules between keys and between sections of a job file, in one place: keys that only
apply to one data format, consistency model, optimizer or mode; what ``mode = "sandblaster"``,
``[elastic]`` and ``[fault_tolerance] mode = "continue"`` require of the rest. Each rule
records its problems on the :class:`~hpcps.config.schema.Checker` and skips keys that already
have one. No I/O, no MPI.
"""

from __future__ import annotations

import difflib
import re

from hpcps.config.schema import Checker, show
from hpcps.config.sections import MODEL_TYPES

# [data] keys that only make sense for one format; setting them for another is an error.
_STREAM_KEYS = ("stream", "stream_above_mb", "prefetch", "shuffle_buffer", "on_bad_line")
FORMAT_ONLY = {
    "adult_csv": ("test_fraction", "split_seed", "hash_bits", "numeric_bins", "crosses"),
    "svmlight": ("test_path", "index_base", "n_features", "duplicate_indices") + _STREAM_KEYS,
    "prepared": (),
    "criteo": ("test_path", "hash_bits") + _STREAM_KEYS,
}
# (n_features is not required when the weights are a dynamic table: :func:`storage`)
FORMAT_REQUIRED = {"adult_csv": (), "svmlight": ("test_path", "index_base", "n_features"),
                   "prepared": (), "criteo": ("test_path",)}

# [consistency] keys that only apply to some models.
MODEL_ONLY = {
    "staleness": ("ssp",),
    "n_fetch": ("async",),
    "n_push": ("async",),
    "push_threshold": ("async",),
    "staleness_aware_lr": ("ssp", "async"),
}

# [optimizer] keys that only apply to some rules.
RULE_ONLY = {
    "initial_accumulator": ("adagrad",),
    "eps": ("adagrad", "adam"),
    "beta1": ("adam",),
    "beta2": ("adam",),
    "beta": ("ftrl",),
    "l1": ("ftrl",),
    "l2": ("ftrl",),
}

_USER_MODEL_RE = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def data_keys(ck: Checker, table: dict, fmt: str | None, dynamic: bool | None = False) -> tuple:
    """The ``[data]`` keys read for format ``fmt`` (None: a bad format, only the common
    ones); records keys of another format and the format's required keys that are absent
    (``n_features`` only when ``dynamic`` is False: fixed weights; None: not known)."""
    if fmt is None:
        return tuple(k for k in ("path", "max_rows")
                     if not any(k in ks for ks in FORMAT_ONLY.values()))
    for other, keys in FORMAT_ONLY.items():
        if other == fmt:
            continue
        for k in keys:
            if k not in table or (k == "test_path" and table[k] == ""):
                continue
            if k in FORMAT_ONLY[fmt] or not ck.good(f"data.{k}"):
                continue
            users = " or ".join(f"'{f}'" for f, ks in FORMAT_ONLY.items() if k in ks)
            if k == "test_path":
                ck.fail("data.test_path", f"must be empty for format '{fmt}' (the test set is "
                                          f"split off by data.test_fraction), got "
                                          f"{show(table[k])}")
            else:
                ck.fail(f"data.{k}", f"not used with format '{fmt}' (only with {users}); "
                                     f"remove it")
    for k in FORMAT_REQUIRED[fmt]:
        if k == "n_features" and dynamic is not False:
            continue                         # a dynamic table takes any id below 2**63 - 1
        if k not in table:
            ck.fail(f"data.{k}", f"required key missing (required for format '{fmt}')"
                    + ('; or [model] storage = "hash" for raw ids without a declared id space'
                       if k == "n_features" else ""))
    from hpcps.config.sections import SECTIONS

    return tuple(k for k in SECTIONS["data"] if k != "format" and (
        k in FORMAT_ONLY[fmt] or not any(k in ks for ks in FORMAT_ONLY.values())))


def consistency(ck: Checker, table: dict, vals: dict) -> None:
    """Keys of another consistency model; ``rma_fallback`` without RMA pulls."""
    if ck.good("consistency.model"):
        for k, models in MODEL_ONLY.items():
            if k in table and vals["model"] not in models:
                which = " or ".join(repr(m) for m in models)
                ck.fail(f"consistency.{k}", f"only used with model = {which}, not "
                                            f"{vals['model']!r}; remove it")
    if "rma_fallback" in table and vals["pull"] != "rma" and ck.good("consistency.pull"):
        ck.fail("consistency.rma_fallback", f"only used with pull = 'rma', not "
                                            f"{vals['pull']!r}; remove it")


def optimizer(ck: Checker, table: dict, vals: dict) -> None:
    """Keys of another update rule."""
    if not ck.good("optimizer.name"):
        return
    for k, rules in RULE_ONLY.items():
        if k in table and vals["name"] not in rules:
            which = " or ".join(repr(r) for r in rules)
            hint = " (the model's L2 penalty is [model] l2)" if k == "l2" else ""
            ck.fail(f"optimizer.{k}", f"only used with name = {which}, not {vals['name']!r}; "
                                      f"remove it{hint}")


def model(ck: Checker, vals: dict) -> None:
    """``type`` is built in or ``package.module:ClassName``; ``hidden`` holds layer widths.
    Turns ``hidden`` into a tuple."""
    t = vals["type"]
    if ck.good("model.type") and t not in MODEL_TYPES and not _USER_MODEL_RE.fullmatch(t):
        msg = (f"must be one of {', '.join(repr(m) for m in MODEL_TYPES)} or a user model "
               f"'package.module:ClassName', got {show(t)}")
        close = difflib.get_close_matches(t, MODEL_TYPES, n=1)
        if close:
            msg += f" (did you mean '{close[0]}'?)"
        ck.fail("model.type", msg)
    hidden = vals["hidden"]
    if ck.good("model.hidden") and (not hidden or not all(
            isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= 1 << 20
            for h in hidden)):
        ck.fail("model.hidden", f"must be a non-empty array of layer widths in [1, 1048576], "
                                f"got {hidden!r}")
    vals["hidden"] = tuple(hidden) if isinstance(hidden, (list, tuple)) else (256, 128)


def lbfgs(ck: Checker, doc: dict, table: dict, vals: dict, cluster: dict, model: dict) -> bool:
    """``[lbfgs]`` only with ``mode = "sandblaster"``, which trains the logistic model in
    float64 with ``0 < c1 < c2 < 1``. Returns whether the section applies."""
    if cluster["mode"] != "sandblaster":
        if ck.good("cluster.mode"):
            for k in table:
                ck.fail(f"lbfgs.{k}", f"only used with cluster.mode = 'sandblaster', not "
                                      f"{cluster['mode']!r}; remove the [lbfgs] section")
        return False
    if ck.good("lbfgs.wolfe_c1", "lbfgs.wolfe_c2") and not vals["wolfe_c1"] < vals["wolfe_c2"]:
        ck.fail("lbfgs.wolfe_c2", f"must be > lbfgs.wolfe_c1 = {show(vals['wolfe_c1'])} "
                                  f"(0 < c1 < c2 < 1), got {show(vals['wolfe_c2'])}")
    if ck.good("model.type") and model["type"] != "logistic":
        ck.fail("model.type", f"cluster.mode = 'sandblaster' trains the logistic model only, "
                              f"got {show(model['type'])}")
    given = doc.get("model", {})
    if isinstance(given, dict) and given.get("dtype") == "float32":
        ck.fail("model.dtype", "cluster.mode = 'sandblaster' keeps its vectors in float64 "
                               "(L-BFGS); remove the key or set \"float64\"")
    return True


def elastic(ck: Checker, table: dict, vals: dict, cluster: dict) -> None:
    """``[elastic]`` only for ``mode = "ps"``; ``at_step`` goes with ``add_workers``."""
    if table and cluster["mode"] != "ps" and ck.good("cluster.mode"):
        k = next(iter(table))
        ck.fail(f"elastic.{k}", f"workers are added to parameter-server jobs only "
                                f"(cluster.mode = 'ps'), not {cluster['mode']!r}; remove the "
                                "[elastic] section")
        return
    if not ck.good("elastic.add_workers", "elastic.at_step"):
        return
    if vals["add_workers"] and vals["at_step"] < 1:
        ck.fail("elastic.at_step", f"required with add_workers = {vals['add_workers']}: "
                                   "the clock (>= 1) at which the workers join")
    if not vals["add_workers"]:
        for k in ("at_step", "oversubscribe"):
            if k in table:
                ck.fail(f"elastic.{k}", "only used with add_workers >= 1; remove it "
                                        "(hpcps grow --oversubscribe for a request)")


def aggregate(ck: Checker, table: dict, vals: dict, cluster: dict, consistency: dict,
              fault_tolerance: dict, elastic: dict) -> None:
    """``[comm] aggregate = "node"`` only for BSP with p2p pulls in ``mode = "ps"``, not in
    continue mode or with workers added; ``group_workers`` only with it."""
    if not ck.good("comm.aggregate"):
        return
    if vals["aggregate"] == "off":
        if "group_workers" in table:
            ck.fail("comm.group_workers", "only used with [comm] aggregate = 'node'")
        return
    why = None
    if cluster["mode"] != "ps" and ck.good("cluster.mode"):
        why = f"[cluster] mode = 'ps', got {cluster['mode']!r}"
    elif consistency["model"] != "bsp" and ck.good("consistency.model"):
        why = (f"[consistency] model = 'bsp' (a group's step is one clock of all its "
               f"workers), got {consistency['model']!r}")
    elif consistency["pull"] != "p2p" and ck.good("consistency.pull"):
        why = "[consistency] pull = 'p2p' (a group's owners pull for it), got 'rma'"
    elif fault_tolerance["mode"] == "continue" and ck.good("fault_tolerance.mode"):
        why = "[fault_tolerance] mode = 'restart' (a group cannot lose a member and go on)"
    elif elastic.get("add_workers"):
        why = "no [elastic] add_workers (groups are formed once, at the start)"
    if why:
        ck.fail("comm.aggregate", f"'node' needs {why}")


def fault_tolerance(ck: Checker, table: dict, vals: dict, cluster: dict,
                    consistency: dict) -> None:
    """``replicas`` and ``on_server_loss`` only with mode = 'continue'; replicas = 2 needs
    two servers and BSP/SSP; under async a lost range restarts the job (the default
    ``on_server_loss`` becomes ``"restart"``); continue mode needs ``mode = "ps"``, p2p pulls
    and, under async, no gradients held back by a worker."""
    if not ck.good("fault_tolerance.mode"):
        return
    if vals["mode"] != "continue":
        for k in ("replicas", "on_server_loss"):
            if k in table:
                ck.fail(f"fault_tolerance.{k}", f"only used with fault_tolerance.mode = "
                                                f"'continue', not {vals['mode']!r}")
        return
    cons_ok = ck.good("consistency.model")
    if vals["replicas"] > 1 and ck.good("fault_tolerance.replicas"):
        if cluster["servers"] < vals["replicas"] and ck.good("cluster.servers"):
            ck.fail("fault_tolerance.replicas",
                    f"{vals['replicas']} copies of every key range need at least "
                    f"{vals['replicas']} servers, got [cluster] servers = {cluster['servers']}")
        elif consistency["model"] == "async" and cons_ok:
            ck.fail("fault_tolerance.replicas",
                    "replicas = 2 needs [consistency] model = 'bsp' or 'ssp' (replication "
                    "forwards each aggregated clock), got 'async'")
    if consistency["model"] == "async" and cons_ok:
        if table.get("on_server_loss") == "reload":
            ck.fail("fault_tolerance.on_server_loss",
                    "'reload' needs [consistency] model = 'bsp' or 'ssp' (a reloaded range "
                    "resumes at a clock), got 'async'; use 'restart'")
        vals["on_server_loss"] = "restart"
    if cluster["mode"] != "ps" and ck.good("cluster.mode"):
        ck.fail("fault_tolerance.mode", f"'continue' needs [cluster] mode = 'ps', got "
                                        f"{cluster['mode']!r}")
    elif consistency["pull"] != "p2p" and ck.good("consistency.pull"):
        ck.fail("fault_tolerance.mode", "'continue' needs [consistency] pull = 'p2p' (RMA "
                                        "windows cannot be used after a rank dies)")
    elif (consistency["model"] == "async" and cons_ok
          and (consistency["n_push"] != 1 or consistency["push_threshold"])):
        ck.fail("fault_tolerance.mode", "'continue' with async needs n_push = 1 and no "
                                        "push_threshold (a worker must hold no unpushed "
                                        "gradients when it dies)")


def tables(ck: Checker, doc: dict, model: dict) -> dict:
    """The ``[tables.NAME]`` sections: ``{name: {storage, min_count, ttl_steps, max_keys,
    evict}}``. ``storage`` is ``"array"`` or ``"hash"``, unset: ``[model] storage`` for a
    sparse table, ``"array"`` for a dense one; the others (admission and eviction of a
    dynamic table, :mod:`hpcps.server.dynshard`) only when it is ``"hash"``. NAME must be a
    table of a built-in model (:func:`hpcps.models.builtin_tables`; reported before anything
    about its keys, and the section is left out); a user model's are checked when it is built
    (:func:`hpcps.models.load.apply_storage`). ``model``: the checked ``[model]`` values."""
    from hpcps.config.sections import STORAGES, Rule
    from hpcps.models import builtin_tables

    given = doc.get("tables", {})
    if not isinstance(given, dict):
        ck.fail("tables", "expected [tables.NAME] sections, got a value")
        return {}
    known = None
    if ck.good("model.type", "model.hidden"):
        known = builtin_tables(model["type"], model["hidden"])
    its = f"its tables: {', '.join(known)}" if known is not None else ""
    rules = {"storage": Rule(kind=str, default="array", choices=STORAGES),
             "min_count": Rule(kind=int, default=0, lo=0, hi=1 << 31),
             "ttl_steps": Rule(kind=int, default=0, lo=0),
             "max_keys": Rule(kind=int, default=0, lo=0, hi=(1 << 31) - 2),
             "evict": Rule(kind=str, default="none", choices=("none", "lfu"))}
    default = model["storage"] if ck.good("model.storage") else "array"
    out = {}
    for name, t in given.items():
        if not isinstance(t, dict) and name in rules:   # [tables] storage = "hash"
            ck.fail(f"tables.{name}", f"[tables] holds one section per table, [tables.NAME]"
                                      f"{f' ({its})' if its else ''}: set {name!r} in one"
                                      + (", or [model] storage for every sparse table"
                                         if name == "storage" else ""))
            continue
        if known is not None and name not in known:
            close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
            hint = f"; did you mean [tables.{close[0]}]?" if close else ""
            ck.fail(f"tables.{name}", f"no table {name!r} in model {model['type']!r} "
                                      f"({its}{hint})")
            continue
        if not isinstance(t, dict):
            ck.fail(f"tables.{name}", f"expected a table ([tables.{name}]) with key 'storage'")
            continue
        ck.unknown_keys(t, rules, f"tables.{name}.")
        sparse = True if known is None else known[name]
        own = "storage" in t
        rules["storage"] = Rule(kind=str, default=default if sparse else "array",
                                choices=STORAGES)
        v = {k: ck.value(t, k, r, f"tables.{name}.{k}") for k, r in rules.items()}
        storage_ok = ck.good(f"tables.{name}.storage")
        if storage_ok and v["storage"] == "hash" and not sparse:
            ck.fail(f"tables.{name}.storage", f"table {name!r} of model {model['type']!r} is "
                                              "dense (pulled whole, in key order): only a "
                                              "sparse table can be dynamic ('hash')")
        elif storage_ok and v["storage"] != "hash":
            if not sparse:
                why = (f"table {name!r} of model {model['type']!r} is dense, always an "
                       "array")
            elif own:
                why = f"[tables.{name}] storage = {v['storage']!r}"
            else:
                why = f"its storage is [model] storage = {v['storage']!r}"
            for k in ("min_count", "ttl_steps", "max_keys", "evict"):
                if k in t:
                    ck.fail(f"tables.{name}.{k}", "only used with storage = 'hash' (admission "
                                                  f"and eviction of a dynamic table); {why}")
        if v["evict"] == "lfu" and not v["max_keys"] and ck.good(f"tables.{name}.evict"):
            ck.fail(f"tables.{name}.evict", "'lfu' evicts when max_keys is reached: set "
                                            f"[tables.{name}] max_keys")
        out[name] = v
    return out


def storage(ck: Checker, doc: dict, tables_: dict, model: dict, cluster: dict,
            consistency: dict, ft: dict) -> None:
    """What a dynamic table (``storage = "hash"``) needs: ``[cluster] mode = "ps"``, p2p
    pulls (an RMA read needs a row's fixed offset), one copy of each key range and no
    server-loss reload (``[fault_tolerance] mode = "continue"``), no async
    ``push_threshold`` (its filter is an array over the key space)."""
    where = [f"tables.{n}.storage" for n, v in tables_.items() if v["storage"] == "hash"]
    if model.get("storage") == "hash":
        where.insert(0, "model.storage")
    if not where:
        return
    k = where[0]
    what = "a dynamic table (storage = 'hash')"
    if cluster["mode"] != "ps" and ck.good("cluster.mode"):
        ck.fail(k, f"{what} needs [cluster] mode = 'ps', got {cluster['mode']!r}")
    if consistency["pull"] == "rma" and ck.good("consistency.pull"):
        ck.fail(k, f"{what} cannot be read by RMA: [consistency] pull = 'rma' reads a row at "
                   "a fixed offset of a fixed array, a dynamic table has none; use "
                   "pull = 'p2p' (the default)")
    if ft["mode"] == "continue" and ck.good("fault_tolerance.mode"):
        ck.fail(k, f"{what} is not supported with [fault_tolerance] mode = 'continue' "
                   "(replicas and range reloads copy fixed key ranges); use mode = 'restart'")
    if consistency.get("push_threshold", 0) and ck.good("consistency.push_threshold"):
        ck.fail(k, f"{what} is not supported with [consistency] push_threshold > 0 (its "
                   "filter is an array over the key space)")
