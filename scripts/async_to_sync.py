"""Write the blocking faces from the async one: ``src/konduit/_blocking.py`` from
``src/konduit/operations.py`` (psycopg's ``tools/async_to_sync.py`` is the model).

Every operation is defined once, as a coroutine of ``AsyncOperations``. The blocking mixin
``Operations``, which :class:`konduit.App` and :class:`konduit.Client` inherit, gets each of
them with the same parameters, annotations and docstring, its body one hop to the face's event
loop (``self._run``); an operation that returns handles returns blocking ones.
``AsyncExecutionHandle`` becomes ``ExecutionHandle`` by dropping ``async`` and ``await``.

    python scripts/async_to_sync.py            # write src/konduit/_blocking.py
    python scripts/async_to_sync.py --check    # exit 1, with a diff, when it is out of date

The suite runs ``--check`` (tests/test_faces.py): an operation added to the async face and not
generated, or an edit of the generated file, fails it.
"""

from __future__ import annotations

import ast
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "konduit" / "operations.py"
TARGET = ROOT / "src" / "konduit" / "_blocking.py"

RENAMES = {"AsyncOperations": "Operations", "AsyncExecutionHandle": "ExecutionHandle"}

HEADER = '''"""The blocking faces of every operation: GENERATED from ``konduit/operations.py`` by
``scripts/async_to_sync.py``; do not edit (``python scripts/async_to_sync.py`` writes it again,
and the suite fails while it is out of date).

:class:`Operations` is what :class:`konduit.App` and :class:`konduit.Client` inherit: each
method is the coroutine of :class:`konduit.operations.AsyncOperations` of the same name, with
the same parameters and docstring, run on the face's own event-loop thread (``_run``), so any
thread may call it. :class:`ExecutionHandle` is :class:`konduit.AsyncExecutionHandle` without
``await``.
"""

# ruff: noqa: E501, F401, I001
'''


class _Sync(ast.NodeTransformer):
    """``async def`` to ``def``, ``await x`` to ``x``, async names to blocking ones."""

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.FunctionDef:
        self.generic_visit(node)
        return ast.FunctionDef(name=node.name, args=node.args, body=node.body,
                               decorator_list=node.decorator_list, returns=node.returns,
                               type_comment=node.type_comment, type_params=[],
                               lineno=node.lineno)

    def visit_Await(self, node: ast.Await) -> ast.expr:
        return self.visit(node.value)  # type: ignore[no-any-return]

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = RENAMES.get(node.id, node.id)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if isinstance(node.value, str):
            node.value = node.value.replace("await ", "")
        return node


def _forwarded(args: ast.arguments) -> str:
    """The call that passes a method's own parameters on, unchanged."""
    out = [a.arg for a in [*args.posonlyargs, *args.args][1:]]  # without self
    if args.vararg:
        out.append(f"*{args.vararg.arg}")
    out += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    if args.kwarg:
        out.append(f"**{args.kwarg.arg}")
    return ", ".join(out)


def _yields(node: ast.AsyncFunctionDef) -> bool:
    """Whether ``node`` is an async generator (a ``yield`` of its own, not of a nested def)."""
    todo: list[ast.AST] = list(node.body)
    while todo:
        item = todo.pop()
        if isinstance(item, ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(item))
    return False


def _blocking_method(node: ast.AsyncFunctionDef) -> ast.FunctionDef:
    """``node`` as a method of ``Operations``: same signature and docstring, one hop."""
    returns = ast.unparse(node.returns) if node.returns is not None else "None"
    call = f"self._run(self._operations.{node.name}({_forwarded(node.args)}))"
    if _yields(node):  # an async generator: a generator, each item fetched on the loop
        returns = returns.replace("AsyncIterator[", "Iterator[", 1)
        body = f"return self._iterate(self._operations.{node.name}({_forwarded(node.args)}))"
    elif returns == "AsyncExecutionHandle":
        body = f"return ExecutionHandle(self, {call}.id)"
    elif returns == "builtins.list[AsyncExecutionHandle]":
        body = f"return [ExecutionHandle(self, h.id) for h in {call}]"
    else:
        body = f"return {call}"
    stub = ast.parse(f"def {node.name}(): {body}").body[0]
    assert isinstance(stub, ast.FunctionDef)
    doc = ast.get_docstring(node, clean=False)
    return ast.FunctionDef(
        name=node.name, args=node.args, decorator_list=[], type_params=[],
        returns=ast.parse(returns.replace("AsyncExecutionHandle", "ExecutionHandle"),
                          mode="eval").body,
        body=[*([ast.Expr(ast.Constant(doc))] if doc else []), *stub.body], lineno=0)


OPERATIONS = '''
class Operations:
    """Every operation of :class:`konduit.operations.AsyncOperations`, blocking: the methods
    :class:`konduit.App` and :class:`konduit.Client` share."""

    _operations: AsyncOperations

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """The items of an async generator of the async face, each fetched on the face's
        loop (``_run``); leaving the loop early closes it there too."""

        async def following() -> T:
            return await items.__anext__()

        async def closing() -> None:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

        try:
            while True:
                try:
                    item = self._run(following())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            self._run(closing())
'''


def generate() -> str:
    """The text of ``_blocking.py`` for the current ``operations.py``."""
    tree = ast.parse(SOURCE.read_text())
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    handle = _Sync().visit(classes["AsyncExecutionHandle"])
    handle.name = "ExecutionHandle"
    operations = ast.parse(OPERATIONS).body[0]
    assert isinstance(operations, ast.ClassDef)
    operations.body += [_blocking_method(n) for n in classes["AsyncOperations"].body
                        if isinstance(n, ast.AsyncFunctionDef) and not n.name.startswith("_")]
    module = ast.fix_missing_locations(ast.Module(body=[handle, operations], type_ignores=[]))
    classes_text = "\n\n\n".join(ast.unparse(c) for c in module.body)
    return "\n".join([
        HEADER,
        "from __future__ import annotations",
        "",
        *imports,
        "from collections.abc import Coroutine, Iterator",
        "from typing import TypeVar",
        "from konduit.operations import AsyncOperations, ExecutionId",
        "",
        "T = TypeVar('T')",
        "",
        "",
        classes_text,
    ]).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = generate()
    if "--check" in argv:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(keepends=True), text.splitlines(keepends=True),
            str(TARGET.relative_to(ROOT)), "generated"))
        print(f"\n{TARGET.relative_to(ROOT)} is out of date: run python scripts/async_to_sync.py")
        return 1
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
