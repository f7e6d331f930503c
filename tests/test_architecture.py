"""The shape of the package, checked on its source: no import cycle between fairfl's modules (lazy
imports inside functions included), the server rules and the message types independent of client
training, and no private name imported from another module."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fairfl

ROOT = Path(fairfl.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(name: str) -> list[tuple[str, list[str]]]:
    """(fairfl module imported, names taken from it) for every import statement anywhere in the
    module, relative ones resolved."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("fairfl")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("fairfl"):
                continue
            names = [a.name for a in node.names]
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            out += [(m, []) for m in submodules]
            rest = [n for n in names if f"{target}.{n}" not in MODULES]
            if rest or not submodules:
                out.append((target, rest))
    return [(t, n) for t, n in out if t in MODULES and t != name]


GRAPH = {name: sorted({t for t, _ in imports(name)}) for name in MODULES}


def test_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in GRAPH[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_server_rules_and_messages_do_not_depend_on_client_training():
    # the algorithms get the simulated clients handed in (ClientRuntime); they never import the engine
    for name in [n for n in MODULES if n.startswith("fairfl.federated.algorithms")] + ["fairfl.federated.messages", "fairfl.federated.minnorm"]:
        below = reachable(name)
        # a package's modules count as the package (fairfl.training.client.training is client training too)
        for room in ("fairfl.training.client", "fairfl.federated.stacked"):
            assert not any(m == room or m.startswith(room + ".") or m.startswith(room + "_") for m in below), \
                f"{name} depends on {room}"


def test_no_private_name_is_imported_from_another_module():
    bad = [(name, target, n) for name in MODULES for target, names in imports(name) for n in names
           if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]   # a dunder is public
    assert not bad, bad


def test_every_algorithm_module_is_registered_and_documented():
    from fairfl.federated.algorithms import ALGORITHMS
    # the package's own (tests may have registered toy algorithms from other modules)
    own = {name: cls for name, cls in ALGORITHMS.items() if cls.__module__.startswith("fairfl.")}
    modules = {cls.__module__ for cls in own.values()}
    files = {n for n in MODULES if n.startswith("fairfl.federated.algorithms.") and n != "fairfl.federated.algorithms.base"}
    assert files == modules, files ^ modules          # every file holds a registered algorithm
    readme = (ROOT.parent / "README.md").read_text()
    for name in own:
        assert f"`{name}`" in readme, f"algorithm {name} is not in the README's table"


# The engine's rooms, lowest first: a room imports only rooms below it (the package's __init__ only
# re-exports). stacked (fairfl.federated.stacked, the fused kernels) sits below them all and is handed the
# one rule it needs (exactness.transposed_is_exact) by its caller.
ENGINE_LAYERS = ["cores", "jobs", "graphs", "stack", "predict", "exactness", "device", "fused", "reference", "dispatch", "lockstep"]


def test_the_engines_rooms_import_only_rooms_below_them():
    rooms = {n.rsplit(".", 1)[1] for n in MODULES if n.startswith("fairfl.training.engine.")}
    assert rooms == set(ENGINE_LAYERS), rooms ^ set(ENGINE_LAYERS)
    for i, room in enumerate(ENGINE_LAYERS):
        for target in GRAPH[f"fairfl.training.engine.{room}"]:
            if target.startswith("fairfl.training.engine"):
                assert target.rsplit(".", 1)[1] in ENGINE_LAYERS[:i], f"engine.{room} imports {target}"
    assert not [t for t in GRAPH["fairfl.federated.stacked"] if t.startswith("fairfl.training.engine")]


# The package's layers, lowest first (fairfl.LAYERS; docs/package.md draws them): the top level of
# fairfl holds one package per layer and the commands, nothing else, and a layer imports only from
# its own and the layers below it. The package's __init__ (its public names) and the commands stand
# above every layer.
TOP = ["base", "federated", "training", "runs", "studies", "cli", "__main__", "fairfl"]


def _top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "fairfl"


def test_the_top_level_shows_the_layers_and_no_layer_imports_one_above_it():
    assert list(fairfl.LAYERS) == TOP[:5]
    assert {p.name for p in ROOT.iterdir() if not p.name.startswith((".", "__pycache__"))} == {
        "__init__.py", "__main__.py", "cli", "notebooks", *fairfl.LAYERS}
    for layer, units in fairfl.LAYERS.items():
        held = {p.stem for p in (ROOT / layer).iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
        assert held - {"__init__"} == set(units), f"fairfl/{layer}/ holds {sorted(held)}, fairfl.LAYERS says {units}"
    level = {unit: i for i, unit in enumerate(TOP)}
    level["cli"] = level["__main__"] = level["fairfl"] = len(TOP)      # the commands and the public names: on top
    up = [f"{name} imports {target}" for name, targets in GRAPH.items() for target in targets
          if level[_top(target)] > level[_top(name)]]
    assert not up, up
    drawn = (ROOT.parent / "docs" / "package.md").read_text()
    missing = [f"{layer}/{u}" for layer, units in fairfl.LAYERS.items() for u in units
               if f"{u}.py" not in drawn and f"{u}/" not in drawn]
    assert not missing, f"docs/package.md does not place {missing}"


def test_the_package_imports_itself_by_its_layered_paths_only():
    # the former paths (fairfl.sweeps, fairfl.engine.fused...) are for code written against them; the
    # package, its tests, benchmarks and scripts use the layered ones, so the graph above sees every import
    import re
    former = re.compile(r"\bfairfl\.(" + "|".join(u for units in fairfl.LAYERS.values() for u in units) + r")\b(?!\w)")
    repo = ROOT.parent
    found = [f"{p.relative_to(repo)}:{i}" for folder in ("fairfl", "tests", "benchmarks", "scripts")
             for p in (repo / folder).rglob("*.py") if p not in (ROOT / "__init__.py", Path(__file__))
             for i, line in enumerate(p.read_text().splitlines(), 1) if former.search(line)]
    assert not found, found


def test_a_former_path_is_the_same_module_and_the_same_class():
    import importlib
    from fairfl.federated.algorithms.fedavg import FedAvg
    from fairfl.algorithms.fedavg import FedAvg as FormerFedAvg
    assert FormerFedAvg is FedAvg
    for former, layered in [("fairfl.sweeps", "fairfl.runs.sweeps"), ("fairfl.engine.fused", "fairfl.training.engine.fused"),
                            ("fairfl.errors", "fairfl.base.errors"), ("fairfl.plotting.style", "fairfl.studies.plotting.style")]:
        assert importlib.import_module(former) is importlib.import_module(layered), former
    from fairfl import metrics, sweeps
    assert (metrics.__name__, sweeps.__name__) == ("fairfl.federated.metrics", "fairfl.runs.sweeps")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("fairfl.algorithms.no_such_rule")


def test_every_exactness_switch_lives_in_one_module():
    # MKL's reproducibility mode and torch's CUDA determinism switches are set in fairfl.training.engine.exactness
    # only (fairfl/__init__.py sets MKL_CBWR's value before torch is imported, as exactness says)
    switches = ("mkl_serv_cbwr_set", "cudnn.deterministic", "fp32_precision", "allow_tf32", "CUBLAS_WORKSPACE_CONFIG")
    found = {name for name, path in MODULES.items() if any(s in path.read_text() for s in switches)}
    assert found == {"fairfl.training.engine.exactness"}, found
    assert max(len(MODULES[n].read_text().splitlines()) for n in MODULES if n.startswith("fairfl.training.engine")) < 400


def test_the_readers_of_results_do_not_import_the_round_loop():
    # History and checkpoints live on a low floor (fairfl.runs.history): what reads results (the cache,
    # the results index, plotting) does not need the loop at all; the explorer reads through the
    # history too, and reaches the loop only through the sweeps that train the runs you ask it for
    for name in ("fairfl.runs.history", "fairfl.runs.cache", "fairfl.runs.index", "fairfl.studies.plotting"):
        assert "fairfl.runs.loop" not in reachable(name), f"{name} depends on fairfl.runs.loop"
    for name in ("fairfl.runs.cache", "fairfl.runs.index", "fairfl.studies.plotting", "fairfl.studies.explorer"):
        assert "fairfl.runs.history" in GRAPH[name] and "fairfl.runs.loop" not in GRAPH[name], name
    assert "fairfl.training.client" not in GRAPH["fairfl.runs.history"]
