"""The package's layers (DESIGN.md "Architecture"): arrows point down, never up, and never round.

(entry ->) ui -> api -> report -> repro -> engine / record / frontend -> judge / runtime / host -> trace -> model
-> portable / errors / settings
(trace sits above model: the capture window of a recording is parsed by model.select).
Read with `ast` from the source files: nothing is imported, so a broken module still gets judged.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tapml_dbg"
ROOT = "tapml_dbg"

# rank of each top-level part; a module may import only parts of a lower rank (or its own part)
RANKS = {
    "errors": 0, "portable": 0, "settings": 0,
    "model": 1, "trace": 2,
    "judge": 3, "runtime": 3, "host": 3,
    "frontend": 4, "record": 4, "engine": 4,
    "repro": 5,
    "report": 6,  # the HTML report's folder: what `Replay.report` writes (it sizes files as repro/ does)
    "api": 7,
    "ui": 8,
    "entry": 9, "__main__": 10,
}
# the package's `open()` imports the API when called: a worker process imports the package first
# and must not import the engine; the entry point imports the CLI after it set the process's
# defaults (settings.PROCESS_DEFAULTS), which numpy reads when first imported; the fork server's
# process (entry.serve_main) imports what a zygote and a command import, each on its side of a fork
LAZY_IMPORTS = {("tapml_dbg", "tapml_dbg.api"), ("tapml_dbg.entry", "tapml_dbg.ui.cli"),
                ("tapml_dbg.entry", "tapml_dbg.runtime.tvm_import"), ("tapml_dbg.entry", "tapml_dbg.runtime.zygote"),
                ("tapml_dbg.entry", "tapml_dbg.engine.session"),
                ("tapml_dbg.runtime.fork_server", "tapml_dbg.runtime.zygote")}  # (a served command's fresh one)
SIDEWAYS = {("record", "frontend")}  # the recorder runs the model the frontend imported
UI_LIBRARIES = ("rich", "prompt_toolkit")  # only ui/ may draw on a terminal


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, at module level?, line) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            found.append((name, id(node) in top_level, node.lineno))
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _known_modules() -> set[str]:
    return {_module_name(path) for path in _sources()}


def test_every_part_has_a_rank():
    parts = {_part(_module_name(path)) for path in _sources()} - {"__init__"}
    assert parts <= set(RANKS), f"parts without a rank in this test: {sorted(parts - set(RANKS))}"


def test_no_import_points_up_the_layers():
    known = _known_modules()
    wrong = []
    for path in _sources():
        module = _module_name(path)
        mine = _part(module)
        for name, _top, line in _imports(path):
            if name not in known or not name.startswith(ROOT + "."):
                continue
            theirs = _part(name)
            if theirs in (mine, "__init__") or mine == "__init__":
                continue
            if RANKS[theirs] < RANKS[mine] or (mine, theirs) in SIDEWAYS:
                continue
            wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({mine}) imports {name} ({theirs})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_internal_imports_are_at_module_level():
    """Imports inside functions are for heavy optional libraries (tvm, torch), never to dodge a cycle."""
    known = _known_modules()
    inside = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
              for path in _sources() for name, top, line in _imports(path)
              if not top and name in known and (_module_name(path), name) not in LAZY_IMPORTS]
    assert not inside, "imports of tapml_dbg modules inside functions:\n" + "\n".join(inside)


def test_no_import_cycle():
    known = _known_modules()
    graph = {_module_name(path): {name for name, top, _ in _imports(path) if top and name in known}
             for path in _sources()}
    for module, deps in graph.items():  # a package's __init__ is not a cycle with its own modules
        graph[module] = {d for d in deps if d != module and not module.startswith(d + ".")}
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_only_the_ui_imports_terminal_libraries():
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
             for path in _sources() if _part(_module_name(path)) != "ui"
             for name, _top, line in _imports(path) if name.split(".")[0] in UI_LIBRARIES]
    assert not wrong, "\n".join(wrong)


def test_the_engine_never_prints():
    wrong = []
    for path in _sources():
        if _part(_module_name(path)) in ("ui", "portable", "__main__"):
            continue  # portable is the repros' own script library: it reports on stdout by design
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not wrong, "print() outside ui/: " + ", ".join(wrong)


# ------------------------------------------------------------------------------ the size of functions
LONG_FUNCTION_LINES = 60  # a function longer than this is one of the few allowed long ones
MAX_LONG_FUNCTIONS = 3
ARGPARSE_BUILDERS = {"build_parser"}  # one long list of options is easier read as one function
MAX_ENGINE_PARAMETERS = 7  # self / cls not counted
# known engine functions over MAX_ENGINE_PARAMETERS (none now: a sweep's options are a SweepPlan); don't grow it
ENGINE_PARAMETERS_ALLOWED: set[str] = set()


def _functions(path: Path):
    """(qualified name, node) for every function and method in the file, nested ones included."""
    found = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


def test_at_most_three_long_functions():
    long = sorted((node.end_lineno - node.lineno + 1, f"{path.relative_to(PACKAGE.parent)}:{name}")
                  for path in _sources() for name, node in _functions(path)
                  if node.end_lineno - node.lineno + 1 > LONG_FUNCTION_LINES and node.name not in ARGPARSE_BUILDERS)
    assert len(long) <= MAX_LONG_FUNCTIONS, (
        f"{len(long)} functions over {LONG_FUNCTION_LINES} lines (at most {MAX_LONG_FUNCTIONS}; split one into "
        "named helpers):\n" + "\n".join(f"{where} ({lines} lines)" for lines, where in reversed(long)))


def test_engine_functions_take_at_most_seven_parameters():
    wrong = []
    for path in _sources():
        if _part(_module_name(path)) != "engine":
            continue
        for name, node in _functions(path):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
            count = len([n for n in names if n not in ("self", "cls")])
            where = f"{path.relative_to(PACKAGE.parent)}:{name}"
            if count > MAX_ENGINE_PARAMETERS and where not in ENGINE_PARAMETERS_ALLOWED:
                wrong.append(f"{where} ({count} parameters)")
    assert not wrong, f"engine functions over {MAX_ENGINE_PARAMETERS} parameters (group them):\n" + "\n".join(wrong)


# ------------------------------------------------------------------------------ the plan seam ([14])
ENGINE_RUNTIME_MODULES = {  # what the engine may know of the runtime: what to run, where, and whom to hand it to
    "tapml_dbg.runtime.messages",  # the plan messages and their typed results
    "tapml_dbg.runtime.target",  # the target spec
    "tapml_dbg.runtime.scheduler",  # the one entry point: it decides how (lanes, threads, compile ahead)
}
CONCURRENCY_LIBRARIES = ("threading", "concurrent", "multiprocessing", "_thread", "asyncio")


def _engine_imports():
    for path in _sources():
        if _part(_module_name(path)) == "engine":
            for name, _top, line in _imports(path):
                yield path, name, line


def test_the_engine_reaches_the_runtime_through_three_modules():
    known = _known_modules()
    used = {name for _path, name, _line in _engine_imports()
            if name.startswith(ROOT + ".runtime") and name in known and name != ROOT + ".runtime"}
    assert used <= ENGINE_RUNTIME_MODULES, (
        f"engine/ imports runtime modules beyond the plan seam: {sorted(used - ENGINE_RUNTIME_MODULES)} "
        "(ask runtime/scheduler.py for it)")


def test_the_engine_starts_no_thread():
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}" for path, name, line in _engine_imports()
             if name.split(".")[0] in CONCURRENCY_LIBRARIES]
    assert not wrong, "the engine states what to run, the runtime runs it beside (Runtime.beside):\n" + "\n".join(wrong)


def test_the_engine_neither_sleeps_nor_shares_closure_state():
    """No `time.sleep`, polling or `nonlocal` in engine/: a phase decides what runs next from findings,
    the runtime's overlap policy (runtime/overlap.py) waits and follows (issue 46)."""
    wrong = []
    for path in _sources():
        if _part(_module_name(path)) != "engine":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Nonlocal):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} nonlocal {', '.join(node.names)}")
            elif isinstance(node, ast.Attribute) and node.attr == "sleep":
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} .sleep")
    assert not wrong, "the engine decides, the runtime waits:\n" + "\n".join(wrong)


MAX_ENGINE_CLASS_METHODS = 20  # Session is state and its collaborators by job, not a corridor ([14], [19])
# the search's Bisection, being made a driver over phases (issue 46): remove it from here once it is
CLASS_METHODS_PENDING: set[str] = set()  # none left: Bisection is a driver over phases (16 methods)


def _engine_classes():
    for path in _sources():
        if _part(_module_name(path)) == "engine":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    yield path, node


def test_the_session_is_split_by_job():
    """Verdicts (engine/verdicts.py), the propagated replay and chains (engine/propagation.py), the
    kept ops (engine/kept.py) and the position (engine/stops.py) live beside the Session; no class of
    the engine keeps more than 20 methods."""
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{node.name} ({count} methods)" for path, node in _engine_classes()
             if (count := len([n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]))
             > MAX_ENGINE_CLASS_METHODS and f"{path.relative_to(PACKAGE)}:{node.name}" not in CLASS_METHODS_PENDING]
    assert not wrong, f"engine classes over {MAX_ENGINE_CLASS_METHODS} methods (move a job out):\n" + "\n".join(wrong)


MAX_CLASS_METHODS = 30  # a class with more does several jobs (the trace reader is split by job: trace/reader.py)


def _method_count(node: ast.ClassDef) -> int:
    """Methods defined in the class body (properties and dunders included; inherited ones not)."""
    return len([n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))])


def test_no_class_has_more_than_30_methods():
    """No class of the package keeps more than 30 methods; CLASS_METHODS_PENDING names the ones being
    split (issue 46), each to be removed from there once it is."""
    wrong = [f"{path.relative_to(PACKAGE.parent)}:{node.name} ({_method_count(node)} methods)"
             for path in _sources() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef) and _method_count(node) > MAX_CLASS_METHODS
             and f"{path.relative_to(PACKAGE)}:{node.name}" not in CLASS_METHODS_PENDING]
    assert not wrong, f"classes over {MAX_CLASS_METHODS} methods (split them by job):\n" + "\n".join(wrong)


# the search's modules, whose phases are being narrowed to the few parts they use (issue 46): a `session`
# parameter there is untyped until then; remove a module from this list when it has none (don't grow it)
SESSION_UNTYPED_PENDING: set[str] = set()


def _untyped_session_parameters() -> dict[str, list[str]]:
    """engine module -> its functions whose parameter `session` has no annotation."""
    found: dict[str, list[str]] = {}
    for path in _sources():
        if _part(_module_name(path)) != "engine":
            continue
        for name, node in _functions(path):
            args = node.args
            if any(a.arg == "session" and a.annotation is None for a in args.posonlyargs + args.args + args.kwonlyargs):
                found.setdefault(str(path.relative_to(PACKAGE)), []).append(f"{name}:{node.lineno}")
    return found


def test_every_session_parameter_is_typed():
    """A collaborator gets the few parts it uses, typed; what still takes the session says so (`Session`,
    from a module the session does not import): an untyped `session` hides a reach back into it."""
    untyped = _untyped_session_parameters()
    wrong = [f"tapml_dbg/{module}: {', '.join(where)}" for module, where in sorted(untyped.items())
             if module not in SESSION_UNTYPED_PENDING]
    assert not wrong, "untyped `session` parameters (type them, or pass the parts they use):\n" + "\n".join(wrong)
    done = sorted(module for module in SESSION_UNTYPED_PENDING - set(untyped) if (PACKAGE / module).exists())
    assert not done, f"no untyped `session` left in {done}: remove them from SESSION_UNTYPED_PENDING"
