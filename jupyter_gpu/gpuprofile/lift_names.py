"""Which names a lifted loop body needs from outside it, as Python itself resolves them.

Two things used to block a lift that runs fine (issue 51):
- functions the body defines (timm's `def _forward():` and `def _backward(_loss):` inside its epoch loop): their
  names are bound by the body, their parameters and locals are theirs, and only what they read from outside is
  free. Python's own `symtable` answers that, for closures, comprehensions and lambdas alike;
- a branch no step can enter (`if wandb_log: wandb.log(...)` with `wandb_log = False`, nanoGPT's train.py): its
  names matter only if it runs. A branch is dead when its test reads only names the body never assigns (so it
  cannot change from one step to the next), through nothing that can run code but attribute and item reads, and is
  false where the loop runs (its `else` when true).

Pure Python (`ast`, `symtable`): no torch.
"""

from __future__ import annotations

import ast
import copy
import symtable
from collections.abc import Mapping
from typing import Any

_PURE = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Load,
         ast.And, ast.Or, ast.Not, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot, ast.In,
         ast.NotIn, ast.Tuple)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def free_names(body: list[ast.stmt]) -> set[str]:
    """The names `body`, run as a function's body, reads from outside it (globals and closures), nested functions'
    and comprehensions' included; a name the body assigns anywhere in its own scope is not free."""
    wrapper = ast.Module(body=[ast.FunctionDef(
        name="__lifted__", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=copy.deepcopy(body) or [ast.Pass()], decorator_list=[], returns=None, type_params=[])],
        type_ignores=[])
    # `nonlocal` has nowhere to bind in the wrapper: as a global it is still a name from outside.
    for node in ast.walk(wrapper):
        if isinstance(node, ast.Nonlocal):
            node.__class__ = ast.Global
    try:
        table = symtable.symtable(ast.unparse(ast.fix_missing_locations(wrapper)), "<lifted>", "exec")
    except SyntaxError:
        return set()
    found: set[str] = set()
    pending = list(table.get_children())
    while pending:
        scope = pending.pop()
        found |= {symbol.get_name() for symbol in scope.get_symbols()
                  if symbol.is_referenced() and symbol.is_global()}
        pending.extend(scope.get_children())
    return found


def scope_walk(nodes: list[ast.stmt]) -> list[ast.AST]:
    """Every node of `nodes` in their own scope: the bodies of functions, lambdas and classes they define are left
    out (their names are theirs), the definitions themselves are in."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = list(nodes)
    while pending:
        node = pending.pop()
        found.append(node)
        if isinstance(node, _SCOPES):
            pending.extend(getattr(node, "decorator_list", []))
            arguments = getattr(node, "args", None)
            if isinstance(arguments, ast.arguments):
                pending.extend(d for d in [*arguments.defaults, *arguments.kw_defaults] if d is not None)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return found


def defined(nodes: list[ast.stmt]) -> set[str]:
    """Names bound in the body's own scope other than by assignment: functions and classes it defines, imports."""
    names: set[str] = set()
    for node in scope_walk(nodes):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*"}
    return names


def without_dead_branches(body: list[ast.stmt], scope: Mapping[str, Any]) -> list[ast.stmt]:
    """A copy of `body` with the branches no step can enter emptied (see the module docstring). `scope`: what the
    loop sees (the notebook's names, a function's own variables)."""
    assigned = _assigned_anywhere(body)

    class Prune(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST:
            self.generic_visit(node)
            value = _judged(node.test, assigned, scope)
            if value is False:
                node.body = [ast.copy_location(ast.Pass(), node)]
            elif value is True:
                node.orelse = []
            return node

    return [Prune().visit(statement) for statement in copy.deepcopy(body)]


def _assigned_anywhere(body: list[ast.stmt]) -> set[str]:
    """Every name the body (nested functions included) can bind: assignments, loop targets, parameters, imports."""
    names = {n.id for tree in body for n in ast.walk(tree) if isinstance(n, ast.Name)
             and isinstance(n.ctx, (ast.Store, ast.Del))}
    names |= {a.arg for tree in body for a in ast.walk(tree) if isinstance(a, ast.arg)}
    for tree in body:
        names |= defined([tree]) if isinstance(tree, ast.stmt) else set()
        names |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def _judged(test: ast.expr, assigned: set[str], scope: Mapping[str, Any]) -> bool | None:
    """The test's truth where the loop runs, when no step can change it; None when that cannot be told."""
    if not all(isinstance(node, _PURE) for node in ast.walk(test)):
        return None
    names = {node.id for node in ast.walk(test) if isinstance(node, ast.Name)}
    if names & assigned or not names <= set(scope):
        return None
    try:
        value = eval(compile(ast.Expression(body=test), "<branch>", "eval"),  # reads only: no calls
                     {"__builtins__": {}}, dict(scope))
        return bool(value)
    except Exception:  # an attribute a property computes and fails on: not judged
        return None
