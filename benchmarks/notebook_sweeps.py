"""The sweeps a notebook asks for under a profile, read without training anything: the one reader
of ``benchmarks/gpu_check.py`` (section 5) and ``benchmarks/paper_cost.py``.

    found = read_sweeps(Path("notebooks/05_fmol_convergence.ipynb"), "paper")
    for sweep in found.sweeps:
        print(sweep.name, len(sweep.unique()), sum(c.rounds * client_steps(c) for c in sweep.unique()))

**What runs.** The notebook's code cells are sliced backwards from its sweeps (:func:`slice_notebook`):
a statement is executed when it calls a sweep (``session.sweep``, ``run_many``, ``run``, or a function
of the notebook that calls one) or defines a name that a later executed statement reads (a function's
global names count where it is called; a name mutated in place — ``points.append``, ``RUNS[k] = ...``,
``x.attr = ...`` — counts as defined). Compound statements (``for``/``while`` loops, ``if``, ``with``,
``try``) are sliced the same way inside: kept with the parts of their bodies that build sweep points
(and the ``break``/``continue`` that steer a kept loop), dropped where they only draw, print or
tabulate. Imports and definitions are always kept; expression statements that draw or print
(``session.save(fig)``, ``display(table)``, ``print(...)``) and ``assert``s are dropped. So a cell
that builds configs runs in full, and figures, tables and checks never run: the reader needs no
wall-clock limit per cell (none is set, so a busy machine cannot make it fail). Its guard is an event,
not a clock: every way into training — ``fairfl.runs.sweeps.run_many`` / ``run`` and
``fairfl.runs.loop.simulate`` / ``simulate_group``, wherever a ``fairfl`` module holds them — is replaced
while the notebook is read, the first two by recorders, the last two by an error, so nothing the
notebook does can start hours of training.

**Intercepted at ``run_many``.** ``Session.sweep`` (what most notebooks call) builds its configs and
calls ``run_many``; a notebook may call ``run_many`` or ``run`` itself. Each call is recorded as one
:class:`CapturedSweep` (named after the variable it is assigned to, e.g. ``tuning``) and returns one
*stand-in result* per config (:class:`StandIn`), so ``Session.sweep`` returns a real
:class:`~fairfl.studies.notebook.Sweep` whose selection methods (``get``, ``one``, ``select``, ``groups``) work.

**Exact and estimated.** A sweep whose configs come from the notebook's settings alone (every sweep
of notebooks 00-05, notebook 06's tuning sweep) is read exactly: the configs the notebook would
train, in its order. A sweep built from the results of an earlier one (notebook 06's edge extensions
and its reporting sweep, chosen on the tuning sweep's validation scores) is built here from the
stand-ins' results and is an ESTIMATE, flagged ``from_results``: a stand-in reports 100 % validation
accuracy on every client (:meth:`StandIn.validation_acc`), so every configuration ties, every
selection criterion takes the first configuration of a method's design (``fairfl.studies.protocol.select``
breaks ties by order), every federation's trained reference beats the constant predictor, and a
method gets one edge extension where its first configuration sits on an extendable edge. Notebook
06's reporting sweep is then exact in its structure (every method that is tuned on a federation,
every reporting seed) but counts one chosen configuration per method and federation, the fewest
possible: where the ``mean-std`` criterion chooses another configuration than ``mean`` (FedAvg,
FedFV, DQN-Fed) the notebook trains that one's seeds too, and a federation whose trained reference
fails to beat the constant predictor reports nothing. The extension count can be anything from none
to one per knob, method, federation and criterion. Against notebook 06's one measured run of its
quick profile (protocol 6.2, ``benchmarks/README.md``: 219 tuning runs, 60 edge extensions, 740
reported runs) the rule then counted 219, 30 and 730; under protocol 6.3 it counts the paper profile
as 970, 350 and 1,164 (``tests/test_paper_cost.py`` derives them by hand). A sweep is flagged as soon as any result was read before
it was asked for (conservative: a later sweep that did not use those results is flagged too); a
result read that a stand-in cannot answer raises :class:`StandInError`, reported per statement.

Runs are counted once per config (``ExperimentConfig.key``), as ``run_many`` trains them: a config
listed twice, or asked for again by a later sweep of the same notebook, is cached by then.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

# calls that start runs: session.sweep(...), run_many(...), run(...), sweeps.run(...)
SWEEP_CALLS = frozenset({"sweep", "run_many", "run"})
# methods that change the object they are called on (a name so changed counts as defined)
MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "add", "pop", "popitem", "remove",
                      "discard", "clear", "sort", "reverse", "__setitem__"})
ALWAYS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Global, ast.Nonlocal)
CONTROL = (ast.Break, ast.Continue, ast.Pass, ast.Raise, ast.Return)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
COMPOUND = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try) + \
    ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


class StandInError(AttributeError):
    """The notebook read something of a run's result that the reader's stand-in does not provide."""


class TrainingRefused(RuntimeError):
    """Something tried to train while a notebook's sweeps were being read."""


# ----------------------------------------------------------------------------- names read and written

def _target_names(node: ast.AST) -> tuple[set[str], set[str]]:
    """(names bound, names mutated) by an assignment target: ``x`` binds x; ``x[i]``, ``x.a`` and
    ``x[i].a`` mutate x."""
    if isinstance(node, ast.Name):
        return {node.id}, set()
    if isinstance(node, (ast.Tuple, ast.List)):
        bound, mutated = set(), set()
        for e in node.elts:
            b, m = _target_names(e)
            bound |= b
            mutated |= m
        return bound, mutated
    if isinstance(node, ast.Starred):
        return _target_names(node.value)
    base = node
    while isinstance(base, (ast.Subscript, ast.Attribute)):
        base = base.value
    return set(), ({base.id} if isinstance(base, ast.Name) else set())


def _mutated_by_calls(node: ast.AST) -> set[str]:
    """Names whose in-place methods are called: ``points.append(p)``, ``RUNS[k].update(...)``."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
            base = n.func.value
            while isinstance(base, (ast.Subscript, ast.Attribute)):
                base = base.value
            if isinstance(base, ast.Name):
                out.add(base.id)
    return out


def _scope_bound(args: ast.arguments) -> set[str]:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return set(names)


def free_names(node: ast.AST) -> set[str]:
    """The names ``node`` reads from the scope around it (a lambda's, a comprehension's and a
    nested function's own names left out; a function's body is read as a whole)."""
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    if isinstance(node, ast.Lambda):
        outer = set().union(*(free_names(d) for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None))
        return outer | (free_names(node.body) - _scope_bound(node.args))
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        bound: set[str] = set()
        used = free_names(node.generators[0].iter)
        for i, gen in enumerate(node.generators):
            if i:
                used |= free_names(gen.iter) - bound
            bound |= _target_names(gen.target)[0]
            used |= set().union(*(free_names(c) for c in gen.ifs)) - bound
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        return used | (set().union(*(free_names(p) for p in parts)) - bound)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return _def_time_names(node) | _body_free(node)
    return set().union(*(free_names(c) for c in ast.iter_child_nodes(node)))


def _def_time_names(node: ast.AST) -> set[str]:
    """What a ``def``/``class`` statement evaluates when it runs: decorators, defaults, bases."""
    parts = list(node.decorator_list)
    if isinstance(node, ast.ClassDef):
        parts += [*node.bases, *(k.value for k in node.keywords)]
    else:
        parts += [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
    return set().union(*(free_names(p) for p in parts)) if parts else set()


def _body_free(node: ast.AST) -> set[str]:
    """The global names a function (or class) body reads when it is called: every name it loads
    less its parameters and the names it binds itself."""
    own = _scope_bound(node.args) if not isinstance(node, ast.ClassDef) else set()
    bound: set[str] = set()
    for n in ast.walk(ast.Module(body=node.body, type_ignores=[])):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            bound.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.Global):
            own -= set(n.names)
            bound -= set(n.names)
    used = set().union(*(free_names(s) for s in node.body)) if node.body else set()
    return used - own - bound


def _is_sweep_call(node: ast.AST, sweeping: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return name in SWEEP_CALLS or (isinstance(f, ast.Name) and f.id in sweeping)


def calls_sweep(node: ast.AST, sweeping: set[str] = frozenset()) -> bool:
    """Whether ``node`` (outside nested function bodies) starts runs: a sweep call, or a call of a
    notebook function in ``sweeping`` (one whose body starts runs)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if _is_sweep_call(n, sweeping):
            return True
        stack += [c for c in ast.iter_child_nodes(n) if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return False


# ----------------------------------------------------------------------------- the slice

@dataclass
class Statement:
    """A top-level statement of a code cell, as parsed."""
    cell: int
    node: ast.stmt


class _Slicer:
    """The backward slice of a notebook's statements from its sweep calls (module docstring)."""

    def __init__(self, statements: list[Statement]):
        self.functions: dict[str, set[str]] = {}       # a notebook function's global names, transitively
        bodies: dict[str, list[ast.AST]] = {}
        for s in statements:
            for n in ast.walk(s.node):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    bodies.setdefault(n.name, []).append(n)
        direct = {name: set().union(*(_body_free(d) for d in defs)) for name, defs in bodies.items()}
        # functions whose bodies start runs, through any chain of calls
        self.sweeping = {name for name, defs in bodies.items() if any(calls_sweep(ast.Module(d.body, []))
                                                                      for d in defs)}
        changed = True
        while changed:
            changed = False
            for name, defs in bodies.items():
                if name not in self.sweeping and any(calls_sweep(ast.Module(d.body, []), self.sweeping) for d in defs):
                    self.sweeping.add(name)
                    changed = True
        for name in direct:
            seen, todo = set(), [name]
            while todo:
                n = todo.pop()
                if n in seen:
                    continue
                seen.add(n)
                todo += [m for m in direct.get(n, ()) if m in direct]
            self.functions[name] = set().union(*(direct[n] for n in seen)) | seen

    def uses(self, node: ast.AST) -> set[str]:
        names = free_names(node)
        for n in list(names):
            names |= self.functions.get(n, set())
        return names

    def block(self, body: list[ast.stmt], needed: set[str], in_loop: bool) -> tuple[list[ast.stmt], set[str]]:
        """The statements of ``body`` to keep (compound ones pruned), and the names needed before it."""
        kept: list[ast.stmt] = []
        needed = set(needed)
        for node in reversed(body):
            out = self.statement(node, needed, in_loop)
            if out is None:
                continue
            stmt, needed = out
            kept.append(stmt)
        return kept[::-1], needed

    def statement(self, node: ast.stmt, needed: set[str], in_loop: bool) -> tuple[ast.stmt, set[str]] | None:
        """(the statement as kept, the names needed before it), or None where it is dropped."""
        if isinstance(node, ALWAYS):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return node, needed | _def_time_names(node)
            return node, needed
        if isinstance(node, CONTROL):
            # inside a loop, control flow is kept (the compound holding it is kept only where it does
            # something: :meth:`compound`); a top-level raise or return is a check, dropped
            return (node, needed | free_names(node)) if in_loop else None
        if isinstance(node, COMPOUND):
            return self.compound(node, needed, in_loop)
        if isinstance(node, (ast.Assert, ast.Delete)):
            return None
        # a simple statement (or a match): kept where it starts runs or defines what is needed
        bound, mutated = set(), _mutated_by_calls(node)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                b, m = _target_names(t)
                bound |= b
                mutated |= m
            if isinstance(node, ast.AugAssign):
                mutated |= bound
                bound = set()
        elif not isinstance(node, ast.Expr):
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    mutated.add(n.id)
        if not (calls_sweep(node, self.sweeping) or (bound | mutated) & needed):
            return None
        # a plain assignment at the top of a cell replaces the name: what came before is not needed for it
        killed = bound if not in_loop and getattr(node, "_top", False) else set()
        return node, (needed - killed) | self.uses(node)

    def compound(self, node: ast.stmt, needed: set[str], in_loop: bool) -> tuple[ast.stmt, set[str]] | None:
        """A loop, ``if``, ``with`` or ``try`` with its bodies sliced: kept where a body keeps a
        statement that does something, or (inside a loop) a ``break``/``continue`` that steers it."""
        loop = isinstance(node, LOOPS)
        header_defs: set[str] = set()
        if isinstance(node, (ast.For, ast.AsyncFor)):
            header_defs = set().union(*_target_names(node.target))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    header_defs |= set().union(*_target_names(item.optional_vars))
        fields = [f for f in ("body", "handlers", "orelse", "finalbody") if getattr(node, f, None)]
        todo = set(needed)
        while True:     # a loop's body may need, at its top, what its bottom defines in the iteration before
            new, before = {}, set()
            for f in fields:
                inner = in_loop or (loop and f == "body")
                if f == "handlers":
                    new[f] = []
                    for h in node.handlers:
                        body, b = self.block(h.body, todo, inner)
                        new[f].append((h, body))
                        before |= b
                else:
                    new[f], b = self.block(getattr(node, f), todo, inner)
                    before |= b
            if not loop or before <= todo:
                break
            todo |= before
        kept = [s for f, v in new.items() for s in (v if f != "handlers" else [s for _, b in v for s in b])]
        substantive = any(_substantive(s) for s in kept)
        steers = in_loop and not loop and any(isinstance(n, (ast.Break, ast.Continue)) for s in kept
                                              for n in ast.walk(s))
        if not (substantive or steers):
            return None
        pruned = ast.copy_location(type(node)(**{f: getattr(node, f) for f in node._fields}), node)
        for f, v in new.items():
            if f == "handlers":
                pruned.handlers = [ast.copy_location(ast.ExceptHandler(type=h.type, name=h.name,
                                                                       body=body or [ast.Pass()]), h) for h, body in v]
            else:
                setattr(pruned, f, v or ([ast.Pass()] if f == "body" else []))
        header = [getattr(node, a) for a in ("iter", "test") if getattr(node, a, None) is not None]
        if isinstance(node, (ast.With, ast.AsyncWith)):
            header += [i.context_expr for i in node.items]
        header += [h.type for h in getattr(node, "handlers", []) if h.type is not None]
        uses = set().union(*(self.uses(h) for h in header)) if header else set()
        # the loop's own target is defined by it; what is needed after it may come from before it
        # (the loop may not run, the branch not be taken)
        return pruned, needed | uses | (before - header_defs)


def _substantive(stmt: ast.stmt) -> bool:
    """A statement that does something: not only control flow (``pass``, ``break``, ...)."""
    return any(isinstance(n, ast.stmt) and not isinstance(n, COMPOUND + CONTROL) for n in ast.walk(stmt))


def slice_notebook(statements: list[Statement]) -> list[Statement]:
    """The statements that lead to a sweep (compound ones pruned inside), in notebook order."""
    slicer = _Slicer(statements)
    for s in statements:
        s.node._top = True        # noqa: SLF001 - marks a statement at the top of its cell
    kept: list[Statement] = []
    needed: set[str] = set()
    for s in reversed(statements):
        out = slicer.statement(s.node, needed, in_loop=False)
        if out is None:
            continue
        node, needed = out
        kept.append(Statement(s.cell, node))
    return kept[::-1]


# ----------------------------------------------------------------------------- stand-in results

class StandIn:
    """What an intercepted sweep returns in place of a run's History: its config (as a History holds
    it, a dict) and a validation accuracy of 1.0 (100 %) on every client at one evaluation, so that a
    selection over configurations sees a tie everywhere and takes the first, and every trained model
    beats the constant predictor. Anything else a notebook reads raises :class:`StandInError`. Every
    read is logged (``reads``): a sweep asked for after a read is flagged as built from results."""

    __slots__ = ("config", "_log", "_clients")

    def __init__(self, config, log: list):
        object.__setattr__(self, "config", config.to_dict())
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_clients", max(1, int(config.partition.federation_size)))

    def validation_acc(self):
        import numpy as np
        self._log.append("validation_acc")
        return np.ones((1, self._clients))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        self._log.append(name)
        raise StandInError(f"the notebook reads {name!r} of a run's result; the sweep reader's stand-in has only "
                           "config and validation_acc()")

    def __repr__(self) -> str:
        return f"StandIn({self.config.get('algorithm', {}).get('name')}, seed={self.config.get('seed')})"


# ----------------------------------------------------------------------------- reading a notebook

@dataclass
class CapturedSweep:
    """One ``run_many``/``run`` call of a notebook: the configs as asked (duplicates kept), where it
    was asked, and whether it was built after any run's result was read (an estimate)."""
    name: str
    cell: int
    line: int
    configs: list
    from_results: bool

    def unique(self) -> list:
        """Each config once (``run_many`` trains a config listed twice once)."""
        return list({c.key(): c for c in self.configs}.values())


@dataclass
class NotebookSweeps:
    notebook: str
    profile: str
    sweeps: list[CapturedSweep]
    errors: list[str]                  # "cell i line j: Error: message" per executed statement that failed
    statements: tuple[int, int]        # (executed, in the notebook)
    output: str                        # what the executed statements printed
    seconds: float
    new_runs: list[list] = field(default_factory=list)     # per sweep: its configs not asked for by an earlier one

    def runs(self) -> list:
        """Every config the notebook trains, each once (a later sweep's repeat is cached by then)."""
        return [c for new in self.new_runs for c in new]


def notebook_cells(path: Path) -> list[tuple[int, str, list[str]]]:
    """(index among the code cells, source without IPython magics, tags) of each code cell."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        source = "".join(cell["source"])
        source = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        out.append((i, source, cell.get("metadata", {}).get("tags", [])))
    return out


@contextlib.contextmanager
def _intercepted(fake_many, fake_run):
    """``run_many``/``run`` replaced by the recorders and ``simulate``/``simulate_group`` by a refusal
    in every loaded ``fairfl`` module that holds them, and again in those imported meanwhile on the
    way out (which bound the replacements)."""
    import fairfl.runs.loop as loop
    import fairfl.studies.notebook as notebook_module
    import fairfl.runs.sweeps as sweeps

    def refusal(name):
        def refuse(*_a, **_k):
            raise TrainingRefused(f"{name} was called while the notebook's sweeps were read: nothing may train")
        return refuse
    swaps = [(sweeps.run_many, fake_many), (sweeps.run, fake_run), (loop.simulate, refusal("simulate")),
             (loop.simulate_group, refusal("simulate_group"))]

    def patch(pairs: list[tuple[Any, Any]]) -> None:
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "fairfl" or name.startswith("fairfl.")):
                continue
            for attr, value in list(vars(module).items()):
                for old, new in pairs:
                    if value is old:
                        setattr(module, attr, new)
                        break
    real_save = notebook_module.Session.save
    notebook_module.Session.save = lambda self, fig, name: None       # a guard: no figure is written
    patch(swaps)
    try:
        yield
    finally:
        patch([(fake, real) for real, fake in swaps])
        notebook_module.Session.save = real_save


def read_sweeps(notebook: Path, profile: str, device: str = "cpu") -> NotebookSweeps:
    """The sweeps ``notebook`` asks for under ``profile``: its sliced statements executed in order
    (:func:`slice_notebook`), each on its own so that one that fails (reported in ``errors``) does
    not stop the rest, with the training calls intercepted (module docstring)."""
    notebook = Path(notebook)
    t0 = time.perf_counter()
    cells = notebook_cells(notebook)
    statements, parse_errors, tags = [], [], {}
    for i, source, cell_tags in cells:
        tags[i] = cell_tags
        try:
            statements += [Statement(i, n) for n in ast.parse(source).body]
        except SyntaxError as e:
            parse_errors.append(f"cell {i}: SyntaxError: {e}")
    kept = slice_notebook(statements)
    found: list[CapturedSweep] = []
    reads: list[str] = []
    names: dict[str, int] = {}
    where = {"cell": -1}

    def origin() -> tuple[str, int, int]:
        """The name a sweep is assigned to in the notebook, and its cell and line."""
        frame = sys._getframe(2)
        while frame is not None and not frame.f_code.co_filename.startswith(f"<{notebook.stem} cell "):
            frame = frame.f_back
        if frame is None:
            return f"cell {where['cell']}", where["cell"], 0
        cell = int(frame.f_code.co_filename.split(" cell ")[1].rstrip(">"))
        line = frame.f_lineno
        name = None
        for s in kept:
            if s.cell != cell:
                continue
            for n in ast.walk(s.node):
                if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and \
                        n.lineno <= line <= (n.end_lineno or n.lineno):
                    target = n.targets[0] if isinstance(n, ast.Assign) else n.target
                    name = ast.unparse(target)
        name = name or f"cell {cell}"
        names[name] = names.get(name, 0) + 1
        return (name if names[name] == 1 else f"{name}#{names[name]}"), cell, line

    def fake_many(configs: Iterable, *_a, **_k):
        configs = list(configs)
        name, cell, line = origin()
        found.append(CapturedSweep(name, cell, line, configs, from_results=bool(reads)))
        return [StandIn(c, reads) for c in configs]

    def fake_run(config, *_a, **_k):
        name, cell, line = origin()
        found.append(CapturedSweep(name, cell, line, [config], from_results=bool(reads)))
        return StandIn(config, reads)

    errors = list(parse_errors)
    namespace: dict[str, Any] = {"__name__": "__notebook__", "display": lambda *a, **k: None}
    out = io.StringIO()
    old_device = os.environ.get("FAIRFL_DEVICE")
    os.environ["FAIRFL_DEVICE"] = device
    import fairfl.runs.sweeps  # noqa: F401 - loaded before the interception, which patches it
    try:
        with _intercepted(fake_many, fake_run), contextlib.redirect_stdout(out):
            done_cells = set()
            for s in kept:
                where["cell"] = s.cell
                for c in sorted(i for i in tags if i < s.cell and i not in done_cells):
                    done_cells.add(c)
                    if "parameters" in tags[c]:
                        namespace["profile"] = profile
                module = ast.fix_missing_locations(ast.Module(body=[s.node], type_ignores=[]))
                try:
                    exec(compile(module, f"<{notebook.stem} cell {s.cell}>", "exec"), namespace)
                except Exception as e:  # noqa: BLE001 - reported; the next statement runs
                    errors.append(f"cell {s.cell} line {s.node.lineno}: {type(e).__name__}: {str(e)[:200]}")
                if "parameters" in tags.get(s.cell, []):
                    namespace["profile"] = profile
    finally:
        if old_device is None:
            os.environ.pop("FAIRFL_DEVICE", None)
        else:
            os.environ["FAIRFL_DEVICE"] = old_device
        with contextlib.suppress(Exception):
            import matplotlib.pyplot as plt
            plt.close("all")
    result = NotebookSweeps(notebook.stem, profile, found, errors, (len(kept), len(statements)), out.getvalue(),
                            time.perf_counter() - t0)
    seen: set[str] = set()
    for sweep in found:
        new = [c for c in sweep.unique() if c.key() not in seen]
        seen |= {c.key() for c in new}
        result.new_runs.append(new)
    return result


# ----------------------------------------------------------------------------- counting client steps

_SIZES: dict[str, list[int]] = {}


def train_sizes(config) -> list[int]:
    """Each client's number of training samples in ``config``'s partition (memoised per partition)."""
    from fairfl.federated.data import load_dataset
    from fairfl.federated.partition import train_sizes as sizes_of
    key = json.dumps([config.dataset, dict(config.dataset_options), config.to_dict()["partition"]], sort_keys=True,
                     default=str)
    if key not in _SIZES:
        _SIZES[key] = list(sizes_of(load_dataset(config.dataset, **dict(config.dataset_options)), config.partition))
    return _SIZES[key]


def client_steps(config) -> float:
    """Client SGD steps of one round of ``config``: sampled clients × the mean steps of a client
    (its training samples, batch size, epochs or steps) over the clients it samples from — the
    expected steps of a round under uniform sampling (exact where every client takes the same
    number, or every client is sampled). Local steps only: an algorithm's extra work (Ditto's
    personal model, a second-order method's Hessian products, losses for tracking) is not a step
    here; it shows in the time a step takes (``paper_cost.py`` times each model on its own runs)."""
    sizes = train_sizes(config)
    if config.eligible_clients:
        sizes = [sizes[i] for i in config.eligible_clients]
    local = config.local
    per = [local.steps if local.steps is not None else
           local.epochs * (math.ceil(n / local.batch_size) if local.batch_size else 1) for n in sizes]
    return config.num_sampled * statistics.fmean(per)


def run_steps(config) -> float:
    """Client steps of a whole run: rounds × :func:`client_steps`."""
    return config.rounds * client_steps(config)


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/notebook_sweeps.py [NOTEBOOK ...] [--profile paper | --smoke]``: each
    notebook's sweeps under the profile, read without training: per sweep its new runs and client
    steps, whether it was built from stand-in results (an estimate), and the statements that failed.
    Exit status 1 when a notebook could not be read whole."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="names or prefixes (default: all)")
    parser.add_argument("--profile", default="paper", choices=("smoke", "quick", "paper"))
    parser.add_argument("--smoke", action="store_true", help="the smoke profile (seconds)")
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    from fairfl.cli import notebook_paths
    profile = "smoke" if args.smoke else args.profile
    failed = 0
    for path in notebook_paths(args.notebooks):
        found = read_sweeps(path, profile)
        for sweep, new in zip(found.sweeps, found.new_runs):
            print(f"{path.stem}: {sweep.name}: {len(new):,} new runs, "
                  f"{sum(run_steps(c) for c in new):,.0f} client steps"
                  + (" (ESTIMATE: built from stand-in results)" if sweep.from_results else ""))
        for error in found.errors:
            print(f"{path.stem}: could not read {error}")
        failed += bool(found.errors)
        print(f"{path.stem} ({profile}): {len(found.sweeps)} sweep(s), {len(found.runs()):,} runs, "
              f"{found.statements[0]} of {found.statements[1]} statements executed, {found.seconds:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
