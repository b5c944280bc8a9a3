"""The layers, read file by file: the machinery (``project/toolkit/``, what a run executes, and ``project/tools/``, the
offline commands beside it) never imports the template layer (``project.model``, ``project.nets``, ``project.data``,
``project.__main__``); the toolkit never imports the tools; no module imports itself back through others (no circles),
nor does any folder of the machinery; and the template layer stays small enough to read first.

Every ``import`` and ``from ... import`` counts, also those inside functions: a lazy import is an arrow
all the same."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "project"
TOOLKIT, TOOLS = "project.toolkit", "project.tools"
MACHINERY = (TOOLKIT, TOOLS)
TEMPLATE = ("project.model", "project.nets", "project.data", "project.__main__")
TEMPLATE_LINE_BUDGET = 600  # Python lines, comments and docstrings included


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports: ``from a.b import c`` counts as ``a.b.c`` when that is a
    module, else as ``a.b``; relative imports are resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {module for module in found if module in known}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(path, name, set(known)) - {name} for name, path in known.items()}


def is_template(module: str) -> bool:
    return any(module == t or module.startswith(f"{t}.") for t in TEMPLATE)


def test_the_machinery_never_imports_the_template_layer() -> None:
    arrows = [
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        if source.startswith(MACHINERY)
        for target in sorted(targets)
        if is_template(target)
    ]
    assert arrows == []


def test_a_run_carries_only_what_it_runs() -> None:
    """No module of the toolkit imports the offline tools, also lazily: a training run never loads them."""
    graph = import_graph()
    assert any(name.startswith(f"{TOOLS}.") for name in graph)  # the check has something to look at
    arrows = [
        f"{source} imports {target}"
        for source, targets in graph.items()
        if source.startswith(TOOLKIT)
        for target in sorted(targets)
        if target == TOOLS or target.startswith(f"{TOOLS}.")
    ]
    assert arrows == []


def circles(graph: dict[str, set[str]]) -> list[str]:
    """The circles of ``graph`` (module -> the modules it imports) found by a depth-first walk, each as
    ``a -> b -> a``."""
    found: list[list[str]] = []

    def visit(module: str, path: list[str], done: set[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                found.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target], done)
        done.add(module)

    finished: set[str] = set()
    for module in sorted(graph):
        if module not in finished:
            visit(module, [module], finished)
    return [" -> ".join(circle) for circle in found]


def test_no_module_imports_itself_back_through_others() -> None:
    # A package that re-exports its submodules is not a circle: `pkg/__init__` -> `pkg.sub` only.
    assert circles(import_graph()) == []


def test_the_check_sees_a_forbidden_arrow_and_a_circle(tmp_path: Path) -> None:
    """The checks above can fail: a machinery file importing the model, and two files importing each
    other, written into a scratch copy of the rules."""
    bad = tmp_path / "project" / "toolkit" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from project.model import ImageClassifier\n    from . import other\n")
    (bad.parent / "other.py").write_text("from project.toolkit.bad import f\n")
    known = {"project.model", "project.toolkit.bad", "project.toolkit.other"}
    assert imports_of(bad, "project.toolkit.bad", known) == {"project.model", "project.toolkit.other"}
    assert imports_of(bad.parent / "other.py", "project.toolkit.other", known) == {"project.toolkit.bad"}
    graph = {
        "project.model": set(),
        "project.toolkit.bad": imports_of(bad, "project.toolkit.bad", known),
        "project.toolkit.other": imports_of(bad.parent / "other.py", "project.toolkit.other", known),
    }
    assert circles(graph) == ["project.toolkit.bad -> project.toolkit.other -> project.toolkit.bad"]
    assert circles({"a": {"b"}, "b": {"a"}}) == ["a -> b -> a"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b -> c -> b"]  # entered from outside the circle
    assert circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []  # a diamond: two paths, no circle


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows between the toolkit's parts: each folder (``project.tools.plan``) or top-level module
    (``project.toolkit.errors``) is one node, and an import between two modules is an arrow between their parts."""

    def part(module: str) -> str | None:
        names = module.split(".")
        return ".".join(names[:3]) if module.startswith(tuple(f"{m}." for m in MACHINERY)) else None

    arrows: dict[str, set[str]] = {}
    for source, targets in graph.items():
        if (a := part(source)) is not None:
            arrows.setdefault(a, set()).update(b for t in targets if (b := part(t)) not in (None, a))
    for targets in list(arrows.values()):
        for target in targets:
            arrows.setdefault(target, set())
    return arrows


def test_no_folder_imports_a_folder_that_imports_it_back() -> None:
    assert circles(folder_graph(import_graph())) == []


def test_the_folder_check_sees_a_circle_between_two_folders() -> None:
    graph = {
        "project.toolkit.a.x": {"project.toolkit.b.y"},
        "project.toolkit.b.y": set(),
        "project.toolkit.b.z": {"project.toolkit.a"},
    }
    assert folder_graph(graph) == {
        "project.toolkit.a": {"project.toolkit.b"},
        "project.toolkit.b": {"project.toolkit.a"},
    }
    assert circles(folder_graph(graph)) == ["project.toolkit.a -> project.toolkit.b -> project.toolkit.a"]


def test_the_template_layer_is_small_enough_to_read_first() -> None:
    """What a user reads first: the module, the networks, the data package and its default data set; every other
    data set is a file of its own, read when chosen."""
    template = {name: path for name, path in modules().items() if is_template(name)}
    first = {"project.model", "project.nets", "project.data", "project.data.cifar10", "project.__main__"}
    assert first <= set(template)
    lines = {name: len(template[name].read_text().splitlines()) for name in first}
    assert sum(lines.values()) <= TEMPLATE_LINE_BUDGET, lines


def test_every_module_is_in_one_layer() -> None:
    """Outside ``project/toolkit/`` and ``project/tools/`` only the template layer (and the package's own
    ``__init__``)."""
    strays = [name for name in modules() if name != "project" and not name.startswith(MACHINERY)]
    assert all(is_template(name) for name in strays), strays
