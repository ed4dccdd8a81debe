"""The user's own forward lines, read from their step's source, so that the lines to adopt wrap them as written.

A template says `loss = loss_fn(model(x), y)` and `x = x.to(memory_format=...)`; the step says
`outputs = net(inputs)` and `loss = criterion(outputs, labels)`. Pasting the template means translating it first.
Where the step's source can be read (a function from a cell, a step `%%gpuprofile` lifted) and it calls one of
the models the probe saw, the autocast block holds the step's own statements from the model call up to the
`backward()`, and the channels_last line converts the variable the model is called with. Anything else (no source,
the forward and backward in one statement, a model called under another name) keeps the template.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MOST_LINES = 12  # a longer forward is not repeated in the report: the template says where the block goes


@dataclass(frozen=True)
class ForwardCode:
    lines: tuple[str, ...]   # the step's statements from the first model call up to the backward, dedented
    loss: str | None         # what `.backward()` is called on (`loss`); None for a step that trains nothing
    channels_last: str | None  # the line that gives the model its input in channels_last, in the step
    # Where that line is the model's call itself with its input converted (the input is a global or an expression):
    # the call, converted, which replaces lines[0] (the call) wherever the forward lines are quoted again.
    converted_call: str | None = None


def forward_code(step: Callable[..., Any], models: tuple[str, ...], forward_only: bool = False,
                 depth: int = 2) -> ForwardCode | None:
    """The forward of `step` as its source writes it, or None where it cannot be read reliably. A step that calls
    no model itself but a function of the notebook (`profile_train_step` calls `profile_step(profile_batch)`) is
    read in that function, `depth` calls down."""
    function = inspect.unwrap(step) if callable(step) else None
    if isinstance(function, types.MethodType):
        function = function.__func__
    if not isinstance(function, types.FunctionType) or function.__name__ == "<lambda>":
        return None
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    if not tree.body or not isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    body = tree.body[0].body
    names = {name for model in models for name in (model, model.rsplit(".", 1)[-1])}
    first = next((i for i, statement in enumerate(body) if _model_call(statement, names) is not None), None)
    if first is None:
        called = [function.__globals__.get(node.func.id) for node in ast.walk(tree.body[0])
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
        inner = [f for f in called if isinstance(f, types.FunctionType) and f.__globals__ is function.__globals__]
        if depth > 0 and len(inner) == 1:
            return forward_code(inner[0], models, forward_only, depth - 1)
        return None
    channels_last = _channels_last_line(source, body[first], _model_call(body[first], names), function)
    if forward_only:
        return _code(source, body[first:first + 1], None, channels_last)
    backwards = [node for node in ast.walk(tree.body[0]) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"]
    if len(backwards) != 1:
        return None  # a GAN's two losses, each with its backward: one autocast block and one scaled loss won't do
    backward = next((i for i in range(first, len(body)) if _backward_of(body[i]) is not None), None)
    if backward is None or backward == first:
        return None  # the backward inside a block, or `criterion(net(x), y).backward()` in one line
    block = body[first:backward]
    loss = _backward_of(body[backward])
    # The block ends where the loss is made: `optimizer.zero_grad()` between it and the backward stays outside.
    base = next((node.id for node in ast.walk(ast.parse(loss, mode="eval")) if isinstance(node, ast.Name)), None) \
        if loss else None
    makes_loss = [i for i, statement in enumerate(block) if base in _assigned(statement)]
    if makes_loss:
        block = block[:makes_loss[-1] + 1]
    return _code(source, block, loss, channels_last)


def _assigned(statement: ast.stmt) -> set[str]:
    return {node.id for node in ast.walk(statement) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


CONVERTED_CALL = "  # in the step: the model's input in channels_last"


def _channels_last_line(source: str, statement: ast.stmt, call: ast.Call | None,
                        function: types.FunctionType) -> str | None:
    """`inputs = inputs.to(memory_format=torch.channels_last)` for a local the model is called with. For a global
    (or an expression), the model's call line with its input converted: assigning a global inside the step would
    make it a local there, and the step would raise UnboundLocalError."""
    if call is None or not call.args or isinstance(call.args[0], ast.Starred):
        return None
    argument = call.args[0]
    if isinstance(argument, ast.Name) and argument.id in function.__code__.co_varnames:
        return f"{argument.id} = {argument.id}.to(memory_format=torch.channels_last)  # each input batch, in the step"
    if statement.lineno != statement.end_lineno:
        return None
    line = source.splitlines()[statement.lineno - 1].encode()  # ast's column offsets count UTF-8 bytes
    start, end = argument.col_offset, argument.end_col_offset
    if argument.lineno != statement.lineno or end is None:
        return None
    text = line[start:end].decode()
    simple = isinstance(argument, ast.Name | ast.Attribute | ast.Call | ast.Subscript)
    converted = f"{text if simple else f'({text})'}.to(memory_format=torch.channels_last)"
    return (line[:start].decode() + converted + line[end:].decode()).strip() + CONVERTED_CALL


def _code(source: str, statements: list[ast.stmt], loss: str | None,
          channels_last: str | None) -> ForwardCode | None:
    lines = source.splitlines()[statements[0].lineno - 1:statements[-1].end_lineno]
    text = textwrap.dedent("\n".join(lines)).splitlines()
    if len(text) > MOST_LINES or any("autocast" in line for line in text):
        return None  # too long to repeat, or already under its own autocast: not wrapped in a second one
    converted = channels_last.removesuffix(CONVERTED_CALL) if channels_last and channels_last.endswith(
        CONVERTED_CALL) else None
    return ForwardCode(lines=tuple(text), loss=loss, channels_last=channels_last, converted_call=converted)


def _model_call(statement: ast.stmt, names: set[str]) -> ast.Call | None:
    """The first call of one of the models in `statement` (`net(inputs)`, `self.model(x)`)."""
    for node in ast.walk(statement):
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func)
            if called in names or called.rsplit(".", 1)[-1] in names:
                return node
    return None


def _backward_of(statement: ast.stmt) -> str | None:
    """What `statement` calls `.backward()` on: `loss` in `loss.backward()` and in `scaler.scale(loss).backward()`."""
    if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
        return None
    func = statement.value.func
    if not isinstance(func, ast.Attribute) or func.attr != "backward":
        return None
    target = func.value
    if isinstance(target, ast.Call) and isinstance(target.func, ast.Attribute) and target.func.attr == "scale" \
            and target.args:
        target = target.args[0]
    return ast.unparse(target)
