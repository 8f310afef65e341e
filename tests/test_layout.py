"""The packages' import structure: no module of lcfed/ or actors/ imports, through others, one that
imports it back (not even for annotations), each layer imports only the layers below it, no module is
over 400 lines, and the pure parts of the Ray engine stay free of Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lcfed", "actors", "tune_jobs")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imported(body: list[ast.stmt], functions: bool, types: bool = False) -> list[str]:
    """Dotted names imported by these statements: at module level (also inside ``if``/``try``; under
    ``if TYPE_CHECKING``, which does not run, only with ``types``), and with ``functions`` also inside functions."""
    names: list[str] = []
    for node in body:
        if _type_checking(node) and not types:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if functions:
                names += _imported(node.body, functions, types)
        elif isinstance(node, ast.ClassDef):
            names += _imported(node.body, functions, types)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt | ast.excepthandler):
                    stmts = [s for h in block for s in (h.body if isinstance(h, ast.excepthandler) else [h])]
                    names += _imported(stmts, functions, types)
    return names


def import_graph(functions: bool, types: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of lcfed/ and actors/ it imports (``from a.b import c`` counts ``a.b.c``
    if it is a module, else ``a.b``); with ``types`` also what it imports for annotations only."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for dotted in _imported(ast.parse(path.read_text()).body, functions, types):
            while dotted and dotted not in modules:
                dotted = dotted.rpartition(".")[0]
            if dotted and dotted != name:
                deps.add(dotted)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_top_level_imports():
    graph = import_graph(functions=False)
    assert {"lcfed.config", "lcfed.methods.base", "actors.ray_engine", "actors.placement"} <= set(graph)
    assert cycles(graph) == []


def test_imports_inside_functions_close_no_cycle():
    graph = import_graph(functions=True)
    # the config validates method names through the registry (lcfed.config.overrides resolves them), which names
    # the methods by module:attr paths: the config imports no method (the methods import the config)
    assert "lcfed.config.overrides" in graph["lcfed.config.experiment"] and "lcfed.registry" in graph["lcfed.config.overrides"]
    assert not any(d.startswith("lcfed.methods") for m in graph if m.startswith(("lcfed.config", "lcfed.registry"))
                   for d in graph[m])
    assert not any("lcfed.config" in c for c in cycles(graph))
    assert cycles(graph) == []


def test_split_modules_sit_below_the_modules_they_came_from():
    graph = import_graph(functions=True)
    # the config's checks and helpers: imported by the config, never importing it back
    assert "lcfed.config.data" in graph["lcfed.config.experiment"]
    assert not {"lcfed.config", "lcfed.config.experiment"} & graph["lcfed.config.data"]
    # what clustered methods share builds on the base; the base prices traffic and knows no clustered method
    assert {"lcfed.methods.base"} <= graph["lcfed.methods.clustered"]
    assert "lcfed.methods.traffic" in graph["lcfed.methods.base"]
    assert not graph["lcfed.methods.base"] & {"lcfed.methods.clustered", "lcfed.methods"}
    # DC-PFL's constants live with its steps, which no longer import the strategy module
    assert "lcfed.methods.dcpfl" not in import_graph(functions=False)["lcfed.methods.dcpfl_steps"]
    assert "lcfed.data.cache" in graph["lcfed.data.formats"]


@pytest.mark.subprocess
def test_the_server_group_module_is_stdlib_only():
    code = ("import sys, tune_jobs.server_group; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lcfed', 'mlflow', 'ray', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_import_cycle_even_through_annotations():
    """``if TYPE_CHECKING:`` imports count: a circle of types is still a circle of concepts."""
    graph = import_graph(functions=True, types=True)
    assert "lcfed.devices.clock" in graph["lcfed.methods.round"]  # RoundPlan.timing's type, for annotations only
    assert cycles(graph) == []


#: the layers, bottom up: a module imports (at run time, in functions or for annotations) only from its own layer
#: and those below; a module belongs to the layer of its longest matching prefix ("lcfed" itself: exactly)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("lcfed", "lcfed._moved", "lcfed.errors", "lcfed.logs", "lcfed.numerics", "lcfed.registry")),
    ("data (samples and partitions, self-contained)", ("lcfed.data",)),
    ("configuration", ("lcfed.config",)),
    ("learning pieces", ("lcfed.learning", "lcfed.devices.fleet", "lcfed.devices.generators", "lcfed.devices.traces",
                         "lcfed.devices.trace_files", "lcfed.devices.trace_budget")),
    ("the round's types", ("lcfed.methods.round", "lcfed.methods.traffic", "lcfed.devices.clock")),
    ("methods and the device model", ("lcfed.methods", "lcfed.devices")),
    ("the run", ("lcfed.run", "lcfed.numerics.fingerprint", "lcfed.numerics.provenance")),
    ("tracking", ("lcfed.tracking",)),
    ("engines", ("lcfed.engines", "actors")),
    ("the API and the command", ("lcfed.api", "lcfed.conformance", "tune_jobs")),
]


def layer(module: str) -> int:
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or (p != "lcfed" and module.startswith(p + "."))) and len(p) > best[1]:
                best = (i, len(p))
    assert best[0] >= 0, f"{module} is in no layer"
    return best[0]


def test_each_layer_imports_only_the_layers_below():
    graph = import_graph(functions=True, types=True)
    upward = [f"{m} ({LAYERS[layer(m)][0]}) imports {d} ({LAYERS[layer(d)][0]})"
              for m in sorted(graph) for d in sorted(graph[m]) if layer(d) > layer(m)]
    assert upward == []
    # the configuration reads the engines' and the methods' names, never their modules
    assert "lcfed.registry" in graph["lcfed.config.engine"]
    assert not any(d.startswith(("lcfed.engines", "lcfed.methods")) for m in graph if m.startswith("lcfed.config")
                   for d in graph[m])


MAX_LINES = 400


def test_no_module_is_over_400_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split by concern: {long}"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.subprocess
def test_placement_arithmetic_does_not_import_ray():
    code = "import sys, actors.placement, actors.feasibility; assert 'ray' not in sys.modules, 'ray was imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_sweep_package_exports_nothing_but_what_old_sweeps_pickled():
    """Each name has one home, the module that defines it: the package lists none, and resolves only the names
    an old sweep's pickled Tune state carries (so that sweep still resumes)."""
    import tune_jobs.sweep as sweep
    from tune_jobs.sweep.callbacks import TrialTracker, trial_error
    from tune_jobs.sweep.trial import run_trial

    assert not hasattr(sweep, "__all__")
    with pytest.raises(AttributeError):
        sweep.run_sweep  # noqa: B018
    assert (sweep.TrialTracker, sweep._trial_error, sweep.run_trial) == (TrialTracker, trial_error, run_trial)


@pytest.mark.subprocess
def test_building_the_parser_loads_neither_ray_nor_mlflow_nor_matplotlib():
    code = ("import sys; from tune_jobs.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('ray', 'mlflow', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
