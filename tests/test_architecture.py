"""The shape of the package, checked on its source: no import cycle between fairfl's modules (lazy
imports inside functions included), the server rules and the message types independent of client
training, and no private name imported from another module."""
from __future__ import annotations

import ast
from pathlib import Path

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
    for name in [n for n in MODULES if n.startswith("fairfl.algorithms")] + ["fairfl.messages", "fairfl.minnorm"]:
        below = reachable(name)
        # a package's modules count as the package (fairfl.client.training is client training too)
        for room in ("fairfl.client", "fairfl.stacked"):
            assert not any(m == room or m.startswith(room + ".") or m.startswith(room + "_") for m in below), \
                f"{name} depends on {room}"


def test_no_private_name_is_imported_from_another_module():
    bad = [(name, target, n) for name in MODULES for target, names in imports(name) for n in names
           if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))]   # a dunder is public
    assert not bad, bad


def test_every_algorithm_module_is_registered_and_documented():
    from fairfl.algorithms import ALGORITHMS
    # the package's own (tests may have registered toy algorithms from other modules)
    own = {name: cls for name, cls in ALGORITHMS.items() if cls.__module__.startswith("fairfl.")}
    modules = {cls.__module__ for cls in own.values()}
    files = {n for n in MODULES if n.startswith("fairfl.algorithms.") and n != "fairfl.algorithms.base"}
    assert files == modules, files ^ modules          # every file holds a registered algorithm
    readme = (ROOT.parent / "README.md").read_text()
    for name in own:
        assert f"`{name}`" in readme, f"algorithm {name} is not in the README's table"


# The engine's rooms, lowest first: a room imports only rooms below it (the package's __init__ only
# re-exports). stacked (fairfl.stacked, the fused kernels) sits below them all and is handed the
# one rule it needs (exactness.transposed_is_exact) by its caller.
ENGINE_LAYERS = ["cores", "jobs", "graphs", "stack", "predict", "exactness", "device", "fused", "reference", "dispatch", "lockstep"]


def test_the_engines_rooms_import_only_rooms_below_them():
    rooms = {n.rsplit(".", 1)[1] for n in MODULES if n.startswith("fairfl.engine.")}
    assert rooms == set(ENGINE_LAYERS), rooms ^ set(ENGINE_LAYERS)
    for i, room in enumerate(ENGINE_LAYERS):
        for target in GRAPH[f"fairfl.engine.{room}"]:
            if target.startswith("fairfl.engine"):
                assert target.rsplit(".", 1)[1] in ENGINE_LAYERS[:i], f"engine.{room} imports {target}"
    assert not [t for t in GRAPH["fairfl.stacked"] if t.startswith("fairfl.engine")]


# The package's layers, lowest first (docs/package.md draws them): each top-level module or package
# of fairfl in exactly one, and a layer imports only from its own and the layers below it.
LAYERS = [
    ("foundations", {"errors", "atomic", "paths", "seeding", "validation", "progress", "metrics", "figure_checks",
                     "profiles", "messages", "schedules", "minnorm"}),
    ("federated learning", {"data", "partition", "models", "stacked", "stacked_lstm", "attacks", "algorithms"}),
    ("training", {"engine", "client", "backends"}),
    ("runs", {"config", "history", "server", "loop", "cache", "index", "flower_wire", "flower", "sweeps"}),
    ("studies", {"claims", "paper", "protocol", "plotting", "explorer", "notebook"}),
    ("commands", {"cli", "__main__", "fairfl"}),          # fairfl: the package's __init__ (its public names)
]


def _top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "fairfl"


def test_the_package_is_layered_and_no_layer_imports_one_above_it():
    layer_of = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
    units = {_top(name) for name in MODULES}
    assert units == set(layer_of), f"not in a layer: {sorted(units - set(layer_of))}; gone: {sorted(set(layer_of) - units)}"
    assert sum(len(u) for _, u in LAYERS) == len(layer_of), "a module is in two layers"
    up = [f"{name} ({LAYERS[layer_of[_top(name)]][0]}) imports {target} ({LAYERS[layer_of[_top(target)]][0]})"
          for name, targets in GRAPH.items() for target in targets
          if layer_of[_top(target)] > layer_of[_top(name)]]
    assert not up, up
    drawn = (ROOT.parent / "docs" / "package.md").read_text()
    missing = [u for u in units - {"fairfl", "__main__"} if f"{u}.py" not in drawn and f"{u}/" not in drawn]
    assert not missing, f"docs/package.md does not place {missing}"


def test_every_exactness_switch_lives_in_one_module():
    # MKL's reproducibility mode and torch's CUDA determinism switches are set in fairfl.engine.exactness
    # only (fairfl/__init__.py sets MKL_CBWR's value before torch is imported, as exactness says)
    switches = ("mkl_serv_cbwr_set", "cudnn.deterministic", "fp32_precision", "allow_tf32", "CUBLAS_WORKSPACE_CONFIG")
    found = {name for name, path in MODULES.items() if any(s in path.read_text() for s in switches)}
    assert found == {"fairfl.engine.exactness"}, found
    assert max(len(MODULES[n].read_text().splitlines()) for n in MODULES if n.startswith("fairfl.engine")) < 400


def test_the_readers_of_results_do_not_import_the_round_loop():
    # History and checkpoints live on a low floor (fairfl.history): what reads results (the cache,
    # the results index, plotting) does not need the loop at all; the explorer reads through the
    # history too, and reaches the loop only through the sweeps that train the runs you ask it for
    for name in ("fairfl.history", "fairfl.cache", "fairfl.index", "fairfl.plotting"):
        assert "fairfl.loop" not in reachable(name), f"{name} depends on fairfl.loop"
    for name in ("fairfl.cache", "fairfl.index", "fairfl.plotting", "fairfl.explorer"):
        assert "fairfl.history" in GRAPH[name] and "fairfl.loop" not in GRAPH[name], name
    assert "fairfl.client" not in GRAPH["fairfl.history"]
