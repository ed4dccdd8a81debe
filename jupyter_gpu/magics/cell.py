"""Compile a cell once into the code objects `%%gputime` runs, with tracebacks that show the cell's lines.

IPython glue (input and AST transformers, the line cache); what it makes is `gputime.compiled.CompiledCell`.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from jupyter_gpu.gputime.compiled import LOOP_COUNT, LOOP_INDEX, CompiledCell
from jupyter_gpu.options import OptionsError, split_magic_line


def parse_line_or_cell(name: str, line: str, cell: str | None, make_parser: Callable[[str], Any],
                       validate: Callable[[Any], None], *, body: str, needs: str, empty: str) -> tuple[Any, str]:
    """The options and the statement of a magic that is both `%name STATEMENT` and `%%name` on a cell.

    Each mistake is one sentence: a statement beside a cell body (`body`: what goes in the cell), a line form
    without one (`needs`: the whole sentence), an empty cell (`empty`: what is missing)."""
    magic = f"%%{name}" if cell is not None else f"%{name}"
    parser = make_parser(magic)
    try:
        tokens, statement = split_magic_line(line, parser)
        options = parser.parse_args(tokens)
        validate(options)
    except OptionsError as exc:
        raise UsageError(f"{magic}: {exc}") from None
    if cell is not None and statement:
        raise UsageError(f"%%{name} takes only options on its first line, not {statement!r}; put {body} in the "
                         "cell body.")
    if cell is None and not statement:
        raise UsageError(needs)
    if cell is not None and not cell.strip():
        raise UsageError(f"%%{name} has an empty cell: {empty}.")
    return options, statement


def compile_magic_source(shell: Any, name: str, line: str, source: str, cell: str | None, example: str
                         ) -> CompiledCell:
    """compile_cell for a magic that is both `%name STATEMENT` and `%%name` on a cell. A cell's syntax error is
    the cell's (shown at its line); a line form that is not Python is one sentence with `example` to copy."""
    __tracebackhide__ = True
    if cell is not None:
        return compile_cell(shell, source, header=f"%%{name} {line}".rstrip())
    try:
        return compile_cell(shell, source)
    except SyntaxError as exc:
        raise UsageError(f"%{name}: {source!r} is not a Python statement ({exc.msg}); write it as in a cell, "
                         f"e.g. %{name} {example}") from None


def compile_cell(shell: Any, source: str, header: str | None = None) -> CompiledCell:
    """Compile as IPython would run the cell: its input transformers, AST transformers and flags.

    The source is registered in IPython's line cache under the cell's execution count, so a traceback
    points at "Cell In[12], line 3" with the line shown. `header` is the `%%gputime ...` line above a
    cell body: it is cached too, so line numbers match the notebook cell the user sees. The loop form
    runs at module level, so every assignment lands in the user's namespace as a plain cell's would.
    """
    statements, filename = _parse(shell, source, header)
    last = statements[-1] if isinstance(statements[-1], ast.Expr) else None
    body = ast.Module(body=statements[:-1] if last is not None else statements, type_ignores=[])
    loop = ast.Module(body=[_loop_over(statements)], type_ignores=[])
    return CompiledCell(
        body=shell.compile(ast.fix_missing_locations(body), filename, "exec"),
        last_expression=(shell.compile(ast.fix_missing_locations(ast.Expression(last.value)), filename, "eval")
                         if last is not None else None),
        loop=shell.compile(ast.fix_missing_locations(loop), filename, "exec"),
        filename=filename,
    )


def compile_cell_function(shell: Any, source: str, header: str, parameter: str, namespace: dict[str, Any]
                          ) -> Callable[[Any], None]:
    """The cell body as the body of `def step(<parameter>)` whose globals are the notebook's namespace.

    What the body assigns stays local to each call, so a training step's tensors are freed when the call
    returns instead of lingering as notebook variables. Tracebacks show the cell's lines.
    """
    statements, filename = _parse(shell, source, header)
    position = {"lineno": statements[0].lineno, "col_offset": 0, "end_lineno": statements[-1].end_lineno,
                "end_col_offset": 0}
    function = ast.FunctionDef(
        name="cell", args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=parameter)], kwonlyargs=[],
                                        kw_defaults=[], defaults=[]),
        body=statements, decorator_list=[], returns=None, type_params=[], **position)
    module = ast.Module(body=[function], type_ignores=[])
    defined: dict[str, Any] = {}
    exec(shell.compile(ast.fix_missing_locations(module), filename, "exec"), namespace, defined)
    return defined["cell"]


def _parse(shell: Any, source: str, header: str | None) -> tuple[list[ast.stmt], str]:
    transformed = shell.transform_cell(source)
    shown = transformed if header is None else f"{header}\n{transformed}"
    filename = shell.compile.cache(shown, shell.execution_count)
    try:
        tree = shell.compile.ast_parse(transformed, filename=filename)
    except SyntaxError as exc:
        if header is not None and exc.lineno is not None:
            # The cached text has the magic's line above the body: point at the body's line, as the notebook
            # shows it, not at `%%gputime`.
            exc.lineno += 1
            exc.end_lineno = exc.end_lineno + 1 if exc.end_lineno is not None else None
        raise
    if header is not None:
        ast.increment_lineno(tree, 1)
    tree = shell.transform_ast(tree)
    statements = list(tree.body)
    if not statements:
        statements = [ast.Pass(lineno=1, col_offset=0, end_lineno=1, end_col_offset=0)]
    return statements, filename


def _loop_over(statements: list[ast.stmt]) -> ast.For:
    first = statements[0]
    position = {"lineno": first.lineno, "col_offset": 0, "end_lineno": first.lineno, "end_col_offset": 0}
    # The runner binds LOOP_COUNT to a `range` object, so a user's own `range` cannot interfere.
    loops = ast.Name(id=LOOP_COUNT, ctx=ast.Load(), **position)
    return ast.For(target=ast.Name(id=LOOP_INDEX, ctx=ast.Store(), **position), iter=loops, body=statements,
                   orelse=[], **position)
