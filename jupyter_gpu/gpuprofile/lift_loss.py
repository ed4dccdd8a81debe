"""The loss a lifted step returns: what the loop body calls backward on, however it writes that.

%speedprobe compares the loss of every configuration as well as its update, so a step that returns None is judged
on the update alone (issue 51: nanoGPT's `scaler.scale(loss).backward()` in its micro-step loop returned nothing).
The forms read, each down to the variable that holds the loss:
- `loss.backward()`, `(loss / accum).backward()`, `scaler.scale(loss).backward()`;
- `losses["loss"].backward()` (a dict a loss function returns), `outputs.loss.backward()` (an HF-style output);
- `accelerator.backward(loss)`, `fabric.backward(loss)`, `model_engine.backward(loss)` (the loss is the argument);
- a function the body defines that calls one of those on its parameter (timm's `def _backward(_loss):
  _loss.backward()`, then `_backward(loss)`).
With several (a GAN's `errD` then `errG`), the last one in the body. Pure Python (`ast`).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from jupyter_gpu.gpuprofile.lift_names import scope_walk


@dataclass(frozen=True)
class LossSource:
    """The expression the step returns, the variable it starts from, and the line of the backward call."""

    value: ast.expr
    base: str
    line: int


def loss_source(body: list[ast.stmt], assigned: set[str] | None = None) -> LossSource | None:
    """The loss of the last backward call in `body` whose loss starts from a variable (one of `assigned`, the
    variables the body assigns, where given)."""
    found = [source for source in _backward_calls(body, _backward_functions(body))
             if assigned is None or source.base in assigned]
    return found[-1] if found else None


def backward_lines(body: list[ast.stmt]) -> list[int]:
    """Lines of `body` that call something named backward: where the report says it looked for the loss."""
    return sorted({node.lineno for tree in body for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and _called(node.func) == "backward"})


def _called(function: ast.expr) -> str | None:
    if isinstance(function, ast.Attribute):
        return function.attr
    if isinstance(function, ast.Name):
        return function.id
    return None


def _receiver(call: ast.Call, functions: dict[str, int]) -> ast.expr | None:
    """The loss expression of a backward call, or of a call of one of the body's own backward functions."""
    name = _called(call.func)
    if name in functions and isinstance(call.func, ast.Name):
        index = functions[name]
        return call.args[index] if index < len(call.args) else None
    if name != "backward" or not isinstance(call.func, ast.Attribute):
        return None
    receiver = call.func.value
    # `accelerator.backward(loss)`: the loss is the argument (a tensor's own backward takes a gradient, made by a
    # call such as torch.ones_like(y), or nothing).
    if call.args and not isinstance(call.args[0], ast.Call):
        receiver = call.args[0]
    if isinstance(receiver, ast.Call) and len(receiver.args) == 1 and not receiver.keywords:  # scaler.scale(loss)
        receiver = receiver.args[0]
    if isinstance(receiver, ast.BinOp):  # loss / accumulation_steps
        receiver = receiver.left
    return receiver


def _base(expression: ast.expr) -> str | None:
    """The variable an expression reads its loss from: `losses["loss"]` -> losses, `out.loss` -> out."""
    while isinstance(expression, (ast.Subscript, ast.Attribute)):
        if isinstance(expression, ast.Subscript) and not isinstance(expression.slice, ast.Constant):
            return None  # losses[key]: the key may change before the step ends
        expression = expression.value
    return expression.id if isinstance(expression, ast.Name) else None


def _backward_calls(body: list[ast.stmt], functions: dict[str, int]) -> list[LossSource]:
    calls = [node for node in scope_walk(body) if isinstance(node, ast.Call)]
    found: list[LossSource] = []
    for call in sorted(calls, key=lambda node: (node.lineno, node.col_offset)):
        receiver = _receiver(call, functions)
        base = _base(receiver) if receiver is not None else None
        if receiver is not None and base is not None:
            found.append(LossSource(copy.deepcopy(receiver), base, call.lineno))
    return found


def _backward_functions(body: list[ast.stmt]) -> dict[str, int]:
    """The body's own functions that call backward on one of their parameters: name -> that parameter's index."""
    functions: dict[str, int] = {}
    for node in scope_walk(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            parameters = [argument.arg for argument in [*node.args.posonlyargs, *node.args.args]]
            for source in _backward_calls(node.body, functions):
                if source.base in parameters:
                    functions[node.name] = parameters.index(source.base)
    return functions
