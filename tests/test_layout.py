"""The code's layout rules (docs/architecture.md): no import cycle inside gateway/, cache/ and synth/
never import gateway/ or each other, metrics/ imports nothing of ours, and the architecture doc
names every package and module that exists.

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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


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


def graph() -> dict[str, set[str]]:
    mods = modules()
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


def test_no_import_cycle_inside_gateway() -> None:
    edges = {m: {d for d in deps if d.startswith("gateway")} for m, deps in graph().items()}
    edges = {m: deps for m, deps in edges.items() if m.startswith("gateway")}
    # A package's __init__ that re-exports is not an edge back; ours are empty, so none exist.
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


def test_architecture_doc_names_every_package_and_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"[A-Za-z_][\w/]*\.py|[A-Za-z_][\w/]*/", doc))
    missing = []
    for path in modules().values():
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py":
            # a package is named by its folder: `gateway/http/`
            if f"{rel.parent.as_posix()}/" not in named:
                missing.append(f"{rel.parent.as_posix()}/")
        elif rel.as_posix() not in named:
            missing.append(rel.as_posix())
    assert missing == [], f"docs/architecture.md does not name: {', '.join(missing)}"
