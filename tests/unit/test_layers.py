"""The package's layering rule (docs/design.md, "Layers"), checked on the source with ``ast``:
every ``hpcps`` import — at module level or inside a function — goes to a folder the table
below allows, only :mod:`hpcps.comm` imports mpi4py, no module imports another that imports
it back (directly or through others), and no module is over the size limit."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "hpcps"

#: Folder -> the folders its modules may import (besides itself). Read bottom-up: a folder
#: may import the folders listed for it, never one above it.
ALLOWED = {
    "kernels": set(),
    "core": {"kernels"},                                    # no MPI: tables, optim, planning
    "data": {"kernels", "core"},
    # one layer: the job schema names the built-in models (hpcps.models.BUILTIN), a model's
    # checks raise ConfigError; the module cycle check keeps the two acyclic
    "config": {"kernels", "core", "data", "models"},
    "models": {"kernels", "core", "data", "config"},
    "checkpoint": {"kernels", "core", "data", "config", "models"},
    "analysis": {"kernels", "core", "data", "config", "models", "checkpoint"},
    "comm": {"kernels", "core"},                            # the only mpi4py user
    "server": {"kernels", "core", "comm", "checkpoint"},
    "worker": {"kernels", "core", "data", "config", "models", "comm", "checkpoint"},
    "resilience": {"kernels", "core", "data", "config", "models", "comm", "checkpoint",
                   "server", "worker"},
    "runtime": {"kernels", "core", "data", "config", "models", "comm", "checkpoint",
                "analysis", "server", "worker", "resilience", "sandblaster"},
    # a training mode beside the parameter server's: its own roles and messages
    "sandblaster": {"kernels", "core", "data", "config", "models", "comm", "checkpoint",
                    "runtime"},
    "cli": {"kernels", "core", "data", "config", "models", "comm", "checkpoint", "analysis",
            "server", "worker", "resilience", "runtime", "sandblaster"},
}
#: Modules of the package root: ``__init__`` (the version) is below everything, ``__main__``
#: is the command line.
ROOT_MODULES = {"hpcps": "kernels", "hpcps.__main__": "cli"}
#: Lines a module may have (docs: "Keep modules under ~600 lines"; Cython kernels aside), in
#: the folders split so far (issue 16: config, checkpoint, analysis and runtime are next).
MAX_LINES = 620
SIZED = ("core", "kernels", "data", "models", "comm", "server", "worker", "resilience",
         "sandblaster", "cli")


def _modules():
    out = {}
    for f in sorted(ROOT.rglob("*.py")):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


MODULES = _modules()


def _layer(module: str) -> str:
    if module in ROOT_MODULES:
        return ROOT_MODULES[module]
    return module.split(".")[1]


def _resolve(name: str) -> str:
    """The package module an imported name lives in (``hpcps.x.y.func`` -> ``hpcps.x.y``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(path: pathlib.Path):
    """(line, imported hpcps module or 'mpi4py') of every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("hpcps", "mpi4py"):
                    yield node.lineno, (_resolve(a.name) if a.name.startswith("hpcps") else "mpi4py")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top == "mpi4py":
                yield node.lineno, "mpi4py"
            elif top == "hpcps":
                for a in node.names:       # ``from hpcps import checkpoint``: a subpackage
                    sub = f"{node.module}.{a.name}"
                    yield node.lineno, sub if sub in MODULES else _resolve(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import (imports are absolute)")


GRAPH = {m: sorted({d for _, d in _imports(p) if d != "mpi4py" and d != m})
         for m, p in MODULES.items()}


def test_every_folder_has_a_layer():
    layers = {_layer(m) for m in MODULES}
    assert layers <= set(ALLOWED), sorted(layers - set(ALLOWED))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module):
    src = _layer(module)
    bad = []
    for line, dst in _imports(MODULES[module]):
        if dst == "mpi4py":
            if src != "comm":
                bad.append(f"line {line}: mpi4py outside hpcps.comm")
            continue
        to = _layer(dst)
        if to != src and to not in ALLOWED[src] and dst != "hpcps":
            bad.append(f"line {line}: {src} may not import {to} ({dst})")
    assert not bad, f"{MODULES[module]}: " + "; ".join(bad)


def test_no_import_cycle():
    """No module reaches itself through the imports of others (function-level ones count)."""
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in GRAPH.get(m, ()):
            if d not in GRAPH:
                continue
            # a package's __init__ imported for a submodule is not an edge back to the package
            if m.startswith(d + "."):
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle():
    """The check above can fail: a graph with a cycle is reported."""
    global GRAPH
    saved = GRAPH
    GRAPH = {"a": ["b"], "b": ["c"], "c": ["a"]}
    try:
        with pytest.raises(AssertionError, match="a -> b -> c -> a"):
            test_no_import_cycle()
    finally:
        GRAPH = saved


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) in SIZED))
def test_module_size(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[module]}: {n} lines (split it: at most ~600)"


def test_unit_tests_cannot_import_mpi4py():
    with pytest.raises(ImportError):
        import mpi4py  # noqa: F401
