"""The code's layout rules (docs/architecture.md): no import cycle inside any package (gateway,
cache, synth, metrics, bench), cache/ and synth/ never import gateway/ or each other, metrics/
imports nothing of ours, and the architecture doc names every package and module that exists.

Imports are read from the source with :mod:`ast`, so every import counts: those inside functions
and those under ``if TYPE_CHECKING:`` too (a type-only cycle still ties two modules together).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "cache", "synth", "metrics")
# bench/ too has no cycle, though the architecture doc does not list its modules.
ACYCLIC = (*PACKAGES, "bench")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(p): p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported(path: Path, name: str, known: set[str]) -> Iterator[str]:
    """Every module of ours that ``path`` (module ``name``) imports, resolved to a module name."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _ours(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                # `from gateway.http import keys` imports the module gateway.http.keys
                yield from _ours(full if full in known else base, known)


def _ours(dotted: str, known: set[str]) -> Iterator[str]:
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    if dotted:
        yield dotted


def graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    mods = modules(packages)
    known = set(mods)
    return {name: set(imported(path, name, known)) - {name} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among ``edges`` as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_type_only_and_function_level_imports_are_seen(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gateway.speech.service import SpeechService\n"
        "def f():\n    from cache import keys\n"
    )
    known = {"gateway.speech.service", "cache", "cache.keys"}
    assert set(imported(src, "x", known)) == {"gateway.speech.service", "cache.keys"}


def inside(package: str, edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph among ``package``'s own modules."""
    top = package.split(".")[0]
    return {
        m: {d for d in deps if d.split(".")[0] == top}
        for m, deps in edges.items()
        if m.split(".")[0] == top
    }


def test_the_graph_sees_a_cycle_between_packages_modules_only_inside_one() -> None:
    edges = {"a.x": {"a.y", "b.z"}, "a.y": {"a.x"}, "b.z": {"a.x"}}
    assert find_cycle(inside("a", edges)) == ["a.x", "a.y", "a.x"]
    assert find_cycle(inside("b", edges)) is None


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycle_inside_a_package(package: str) -> None:
    edges = inside(package, graph(ACYCLIC))
    assert edges, f"{package}: no modules read"
    # A module's imports count as its package's __init__ does not: `from synth.providers.base
    # import X` is an edge to synth.providers.base, so synth/providers/__init__.py, the table
    # that imports every provider module, is no cycle with them.
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges) or [])}"


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("cache", ("gateway", "synth")),
        ("synth", ("gateway", "cache")),
        ("metrics", ("gateway", "cache", "synth")),
    ],
)
def test_lower_packages_never_import_upward_or_sideways(
    package: str, forbidden: tuple[str, ...]
) -> None:
    bad = sorted(
        f"{m} imports {d}"
        for m, deps in graph().items()
        if m.split(".")[0] == package
        for d in deps
        if d.split(".")[0] in forbidden
    )
    assert bad == []


def layout_tree(doc: str) -> set[str]:
    """The paths named by the tree drawn under "## Layout" in docs/architecture.md: a folder is a
    name ending in ``/``, indented entries live in the folder above them, and a line lists one or
    more names before its description (two spaces or more apart)."""
    section = doc.split("## Layout", 1)[1]
    block = section.split("```", 2)[1]
    named: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path) of the open folders
    for line in block.splitlines()[1:]:
        m = re.match(r"^( *)(\S.*?)(?:\s{2,}.*)?$", line)
        if m is None:
            continue
        names = m.group(2).split()
        if not all(n.endswith((".py", "/")) for n in names):
            continue  # a description carried over to the next line
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        for n in names:
            named.add(parent + n)
            if n.endswith("/"):
                stack.append((indent, parent + n))
    return named


def test_layout_tree_reads_nesting_and_several_names_a_line() -> None:
    doc = "## Layout\n```\na/   pkg\n  b/       sub\n    x.py y.py   two\n  z.py     one\n```\n"
    assert layout_tree(doc) == {"a/", "a/b/", "a/b/x.py", "a/b/y.py", "a/z.py"}


def test_architecture_doc_names_every_package_and_module() -> None:
    named = layout_tree((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    missing = []
    for path in modules().values():
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py" and rel.parent.as_posix() != "metrics":
            # a package is named by its folder: `gateway/http/`
            want = f"{rel.parent.as_posix()}/"
        else:
            want = rel.as_posix()
        if want not in named:
            missing.append(want)
    stale = sorted(n for n in named if not (ROOT / n).exists())
    assert missing == [], f"docs/architecture.md does not name: {', '.join(missing)}"
    assert stale == [], f"docs/architecture.md names what does not exist: {', '.join(stale)}"
