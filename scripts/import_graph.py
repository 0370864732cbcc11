"""The house in numbers (issue 17): konduit's import graph by floor, its upward arrows and
circles, who imports the bench, and the longest functions. Reads the sources with ``ast``;
imports nothing of konduit, so it runs on any checkout (``git worktree`` or ``git archive`` of an
old commit) with any Python 3.11+::

    python scripts/import_graph.py [SRC_DIR]      # default: src/konduit beside this script

An import at module level (outside ``if TYPE_CHECKING:``) is an arrow of the graph; one inside
a function runs when called and is counted apart (``deferred``): a circle that needs one of
them is a circle that the code already works around.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

# The floors, lowest first: a module may import its own floor and the ones below it.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    # errors and masking import nothing of konduit; threads and loop_thread are plumbing for
    # user code and loops that the engine and the worker alike use; settings (the KONDUIT_
    # environment, read by every floor) imports only core and errors.
    ("core", ("konduit.core", "konduit.errors", "konduit.masking", "konduit.logs",
              "konduit.loop_thread", "konduit.threads", "konduit.settings")),
    ("db", ("konduit.db",)),
    # tracing: the spans of starts and attempts, used by the engine and the worker alike.
    ("engine", ("konduit.engine", "konduit.records", "konduit.tracing")),
    ("worker", ("konduit.worker",)),
    # What the faces show, read above the engine: the read model (reads/) and the analysis of
    # what the engine stored (observe/: plans, stats, budgets); observe's exporter
    # (observe.metrics) is a face.
    ("reads", ("konduit.reads", "konduit.observe")),
    # operations: every operation defined once, as coroutines; _blocking: its generated
    # blocking face, which App and Client inherit.
    ("faces", ("konduit.app", "konduit.client", "konduit.operations", "konduit._blocking",
               "konduit.observe.metrics", "konduit.web",
               "konduit.cli", "konduit.testing", "konduit.demo", "konduit")),
    ("bench", ("konduit.bench", "konduit.bench_")),  # bench_*.py: before konduit/bench/
]

BENCH = len(FLOORS) - 1


def floor_of(module: str) -> int:
    best, length = len(FLOORS) - 1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for p in prefixes:
            inside = module.startswith(p) if p.endswith("_") else (
                module == p or module.startswith(p + "."))
            if inside and len(p) > length:
                best, length = i, len(p)
    return best


def placed(module: str) -> bool:
    """Whether a floor names ``module`` (beyond the bare ``konduit`` package, which names every
    module of the top level): one it does not is counted on the top floor."""
    return any(module.startswith(p) if p.endswith("_") else (
        module == p or (p != "konduit" and module.startswith(p + ".")))
        for _, prefixes in FLOORS for p in prefixes)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(tree: ast.Module, name: str, is_package: bool, known: set[str]
            ) -> tuple[set[str], set[str], set[str]]:
    """(module-level imports, deferred imports, imports for types only) of konduit modules."""
    top: set[str] = set()
    deferred: set[str] = set()
    typing: set[str] = set()

    def resolve(node: ast.Import | ast.ImportFrom) -> set[str]:
        found: set[str] = set()
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
            return {m for m in found if m.split(".")[0] == "konduit"}
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        if base.split(".")[0] != "konduit":
            return set()
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in known else base)
        return found

    def walk(node: ast.AST, in_function: bool, for_types: bool) -> None:
        for child in ast.iter_child_nodes(node):
            types_only = for_types or (isinstance(child, ast.If) and _type_checking(child.test))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (typing if for_types else deferred if in_function else top).update(
                    resolve(child))
            walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), types_only)

    walk(tree, False, False)
    return top, deferred, typing


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _span(node: ast.AST) -> int:
    end = getattr(node, "end_lineno", None)
    return 0 if end is None else end - getattr(node, "lineno", end) + 1


def _outermost(outer: ast.AST, inner: ast.AST) -> bool:
    """``inner`` is a function nested in ``outer`` with no function between them."""
    for child in ast.iter_child_nodes(outer):
        if child is inner:
            return True
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
                and _outermost(child, inner):
            return True
    return False


def main(root: Path) -> None:
    files = sorted(root.rglob("*.py"))
    names = {module_name(root, f): f for f in files}
    known = set(names)
    graph: dict[str, set[str]] = {}
    later: dict[str, set[str]] = {}
    for_types: dict[str, set[str]] = {}
    functions: list[tuple[int, str]] = []
    lines: dict[str, int] = defaultdict(int)
    for name, path in names.items():
        source = path.read_text()
        tree = ast.parse(source)
        top, deferred, typing = imports(tree, name, path.name == "__init__.py", known)
        graph[name] = {m for m in top if m != name and m in known}
        later[name] = {m for m in deferred if m != name and m in known}
        for_types[name] = {m for m in typing if m != name and m in known}
        lines[FLOORS[floor_of(name)][0]] += len(source.splitlines())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = _span(node)
                nested = sum(_span(n) for n in ast.walk(node) if n is not node and isinstance(
                    n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _outermost(node, n))
                functions.append((span, f"{name}:{node.name} (line {node.lineno}; "
                                        f"{span - nested} without its nested functions)"))

    print(f"# konduit import graph of {root}")
    print(f"{len(names)} modules, {sum(map(len, graph.values()))} module-level arrows, "
          f"{sum(map(len, later.values()))} deferred (inside functions), "
          f"{sum(map(len, for_types.values()))} for types only (if TYPE_CHECKING)\n")
    print("## floors (modules, lines)")
    by_floor: dict[int, list[str]] = defaultdict(list)
    for name in names:
        by_floor[floor_of(name)].append(name)
    for i, (label, _) in enumerate(FLOORS):
        print(f"- {label}: {len(by_floor[i])} modules, {lines[label]} lines")
    unplaced = sorted(n for n in names if not placed(n))
    print(f"modules no floor names (counted on the top floor): {len(unplaced)}")
    for name in unplaced:
        print(f"- {name}")

    arrows: dict[tuple[str, str], int] = defaultdict(int)
    for a, targets in graph.items():
        for b in targets:
            arrows[(FLOORS[floor_of(a)][0], FLOORS[floor_of(b)][0])] += 1
    print("\n## arrows between floors (module-level imports)")
    for (a, b), n in sorted(arrows.items(), key=lambda kv: (-kv[1], kv[0])):
        if a != b:
            print(f"- {a} -> {b}: {n}")

    def upward(edges: dict[str, set[str]]) -> list[str]:
        # The CLI's bench commands start the bench: its one door (checked below).
        return [f"{a} -> {b}" for a, targets in sorted(edges.items()) for b in sorted(targets)
                if floor_of(b) > floor_of(a)
                and not (a.startswith("konduit.cli") and floor_of(b) == BENCH)]

    up, up_later, up_types = upward(graph), upward(later), upward(for_types)
    print(f"\n## upward arrows (a lower floor importing a higher one): {len(up)} module-level, "
          f"{len(up_later)} deferred, {len(up_types)} for types only")
    for line in up:
        print(f"- {line}")
    for line in up_later:
        print(f"- (deferred) {line}")
    for line in up_types:
        print(f"- (types only) {line}")

    found = circles(graph)
    print(f"\n## import circles at module level: {len(found)}")
    for c in found:
        print(f"- {' <-> '.join(c)}")
    both = {k: graph[k] | later[k] for k in graph}
    found_later = circles(both)
    print(f"\n## circles counting deferred imports too: {len(found_later)}")
    for c in found_later:
        print(f"- ({len(c)} modules) {', '.join(c)}")

    every = {k: both[k] | for_types[k] for k in graph}
    found_types = circles(every)
    print(f"\n## circles counting type-only imports too (data types): {len(found_types)}")
    for c in found_types:
        print(f"- ({len(c)} modules) {', '.join(c)}")

    bench = sorted((a, b) for a, targets in both.items() for b in targets
                   if floor_of(b) == BENCH and floor_of(a) != BENCH
                   and not a.startswith("konduit.cli"))
    print(f"\n## bench modules imported from below the CLI: {len(bench)}")
    for a, b in bench:
        print(f"- {a} -> {b}")
    bench_up = sorted((a, b) for a, targets in both.items() for b in targets
                      if floor_of(a) == BENCH and b.startswith("konduit.cli"))
    print(f"## bench modules importing the CLI (the circle of issue 17): {len(bench_up)}")
    for a, b in bench_up:
        print(f"- {a} -> {b}")

    print("\n## the 10 longest functions (lines)")
    for length, where in sorted(functions, reverse=True)[:10]:
        print(f"- {length:4d}  {where}")


if __name__ == "__main__":
    here = Path(__file__).resolve().parent.parent / "src" / "konduit"
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else here)
