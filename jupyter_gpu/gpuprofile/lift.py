"""Ready steps: the body of the user's loop lifted into the step functions `%dataprobe`, `%speedprobe` and
`%batchprobe` take, so the commands the profile prints work when pasted into the next cell.

The loop is the innermost `for` whose `next()` the profile saw yield DataLoader batches, or the innermost loop
whose body fetches them itself (`batch = next(data_iter)`). Its body becomes
`profile_step(batch)` (one batch, as the loader yields it); `profile_train_step()` runs one optimizer step on the
last batch the loop saw (`profile_batch`), as many batches as the loop accumulated gradients over; and
`profile_sized_step(batch_size)` does the same on that batch resized; the body returns its loss (the name it calls
`backward()` on, however it writes that: lift_loss.py), and so do both. A loop inside a function closes over the
function's variables as they were when the loop began (`LoopScope`); the loop's `break` and `continue` end the step's
one batch (`return`), and leading `if step >= max_steps: break` guards are left out. The names the body needs from
outside are those Python resolves so, in the branches a step can enter (lift_names.py). Where the body cannot be
lifted (a `return` or `yield` of its function, a name it cannot see, no source), the reason is given with the
wrapper to fill in, and the caller drives the loop instead (drive.py). Pure Python: the code is built with `ast` and
defined by the caller.
"""

from __future__ import annotations

import ast
import builtins
import copy
import linecache
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpuprofile.lift_loss import backward_lines, loss_source
from jupyter_gpu.gpuprofile.lift_names import defined, free_names, scope_walk, without_dead_branches
from jupyter_gpu.gpuprofile.result import ReadyStep

DATA_STEP, TRAIN_STEP, SIZED_STEP, BATCH = "profile_step", "profile_train_step", "profile_sized_step", "profile_batch"
# The loader a loop made itself (a local of the function it runs in), defined in the notebook under this name so the
# printed %dataprobe command has a loader to measure.
LOADER = "profile_loader"
_FACTORY = "_make_profile_step"  # for a loop inside a function: makes profile_step, closing over its variables
# Wrappers that yield what they wrap: `for x in tqdm(loader)`, `for i, x in enumerate(loader)`.
_PASS_THROUGH = {"tqdm", "track", "iter"}
# Iterating these gives each step a batch from several loaders; the profile keeps the last batch only.
_SEVERAL = {"zip", "zip_longest", "product"}


@dataclass(frozen=True)
class LoopSource:
    """Where the profiled code lives: a cell's file as the line cache holds it, and the lines above its body
    that are not Python (the `%%gpuprofile` line)."""

    filename: str


def _parse(filename: str) -> ast.Module | None:
    lines = linecache.getlines(filename)
    if not lines:
        return None
    # A cell's first line is the magic line (`%%gpuprofile --steps 10`): blanked, so line numbers stay.
    text = "".join("\n" if line.lstrip().startswith("%") else line for line in lines)
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


@dataclass
class _LoopBody:
    """The loop whose batches the profile saw, as the step needs it."""

    loop: ast.For | ast.While      # the loop itself
    target: ast.expr               # what one batch is bound to
    counter: str | None            # a name counting the batches (enumerate's, or `for step in range(...)`)
    statements: list[ast.stmt]     # the body, without the statement that fetched the batch
    fetch_lines: range             # where the loop asked for a batch: the `for` line, or its `next()` statement
    why_not: str | None = None     # why it cannot be lifted, whatever its body (batches from several loaders)
    # The grad and precision contexts the loop runs in (`with torch.inference_mode():` around an evaluation loop,
    # `with torch.autocast(...):` around a training one): the step runs its body in them too.
    contexts: list[ast.withitem] = field(default_factory=list)

    @property
    def line(self) -> int:
        return self.loop.lineno


def _loop_body(tree: ast.Module, lines: set[int]) -> _LoopBody | None:
    """The innermost loop that asked for the batches the profile saw: a `for` over the loader (the site is its
    line), or a loop whose body fetches them itself (`batch = next(data_iter)`, also inside a `try` that makes a
    new iterator on StopIteration)."""
    found: list[_LoopBody] = []
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and node.lineno in lines:
            target, counter, iterable = _unwrap(node)
            several = (f"the loop at line {node.lineno} takes each batch from several loaders at once (`zip`), so "
                       "its step needs one batch of each" if isinstance(iterable, ast.Call)
                       and _name(iterable.func) in _SEVERAL else None)
            found.append(_LoopBody(node, target, counter, node.body, range(node.lineno, node.lineno + 1), several))
        elif isinstance(node, (ast.For, ast.While)):
            # (A loop over a loader that also fetches from another one keeps that fetch in its body, above.)
            for statement in node.body:
                fetched = _fetched(statement)
                span = range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
                if fetched is not None and lines & set(span):
                    counter = (node.target.id if isinstance(node, ast.For) and isinstance(node.target, ast.Name)
                               and isinstance(node.iter, ast.Call) and _name(node.iter.func) == "range" else None)
                    rest = [other for other in node.body if other is not statement]
                    found.append(_LoopBody(node, fetched, counter, rest, span))
    if not found:
        return None
    chosen = max(found, key=lambda body: body.fetch_lines.start)
    chosen.contexts = _enclosing_contexts(chosen.loop, parents)
    return chosen


# The contexts that change how the step computes, not what it touches: re-entered on each call of the step.
_COMPUTE_CONTEXTS = {"no_grad", "inference_mode", "enable_grad", "set_grad_enabled", "autocast"}


def _enclosing_contexts(node: ast.AST, parents: dict[int, ast.AST]) -> list[ast.withitem]:
    """The grad and autocast `with` items around `node`, outermost first, up to its function or cell. Others (an
    open file, a profiler) are left out: entering them again on each call would repeat what they do."""
    items: list[ast.withitem] = []
    parent = parents.get(id(node))
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        if isinstance(parent, ast.With):
            items[:0] = [item for item in parent.items if item.optional_vars is None
                         and isinstance(item.context_expr, ast.Call)
                         and _name(item.context_expr.func) in _COMPUTE_CONTEXTS]
        parent = parents.get(id(parent))
    return items


def _fetched(statement: ast.stmt) -> ast.expr | None:
    """The target of `batch = next(it)`, alone or as the whole body of a `try`."""
    if isinstance(statement, ast.Try) and len(statement.body) == 1:
        statement = statement.body[0]
    if (isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.value, ast.Call)
            and _name(statement.value.func) == "next"):
        return statement.targets[0]
    return None


def _without_stop_guards(statements: list[ast.stmt]) -> list[ast.stmt]:
    """The body without its leading `if step >= max_steps: break` guards: they stop the loop, and the step is one
    batch of it (a guard left in would make the step do nothing once the loop's count had passed it)."""
    kept = list(statements)
    while (kept and isinstance(kept[0], ast.If) and not kept[0].orelse and len(kept[0].body) == 1
           and isinstance(kept[0].body[0], ast.Break)):
        kept.pop(0)
    return kept


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _unwrap(loop: ast.For) -> tuple[ast.expr, str | None, ast.expr]:
    """The batch target, the loop counter's name (from `enumerate`) and what is iterated, through tqdm-like
    wrappers."""
    target, iterable, counter = loop.target, loop.iter, None
    while isinstance(iterable, ast.Call) and iterable.args:
        called = _name(iterable.func)
        if called == "enumerate" and isinstance(target, ast.Tuple) and len(target.elts) == 2 and counter is None:
            if isinstance(target.elts[0], ast.Name):
                counter = target.elts[0].id
            target = target.elts[1]
        elif called == "trange":  # tqdm's trange(a, b, step) is range(a, b, step) with a progress bar
            function = ast.copy_location(ast.Name(id="range", ctx=ast.Load()), iterable.func)
            return target, counter, ast.copy_location(ast.Call(func=function, args=iterable.args, keywords=[]),
                                                      iterable)
        elif called not in _PASS_THROUGH:
            break
        iterable = iterable.args[0]
    return target, counter, iterable


class _LoopExitsEndTheStep(ast.NodeTransformer):
    """The loop's own `break` and `continue` become `return`: either ends the body's run on this batch, which is all
    one call of the step is (an inner loop's keep theirs, except in its `else`, which belongs to this loop). They
    return `value` (the loss, where the step sets its variable to None first, so an exit before it is computed
    returns None), else None."""

    def __init__(self, value: ast.expr | None = None) -> None:
        self.value = value

    def visit_Break(self, node: ast.Break) -> ast.Return:
        return ast.copy_location(ast.Return(value=copy.deepcopy(self.value)), node)

    def visit_Continue(self, node: ast.Continue) -> ast.Return:
        return ast.copy_location(ast.Return(value=copy.deepcopy(self.value)), node)

    def visit_For(self, node: ast.For | ast.While | ast.AsyncFor) -> ast.AST:
        node.orelse = [self.visit(statement) for statement in node.orelse]
        return node

    visit_While = visit_AsyncFor = visit_For

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:
        return node  # a function defined in the body (an LBFGS closure) has its own loops and returns

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef


def _blocked(body: list[ast.stmt]) -> str | None:
    """Why the body cannot run as a function body: a `return` or `yield` of the enclosing function."""
    def visit(node: ast.AST) -> str | None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
        if isinstance(node, ast.Return):
            return f"a `return` at line {node.lineno}"
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return f"a `yield` at line {node.lineno}"
        return next((found for child in ast.iter_child_nodes(node) if (found := visit(child))), None)
    return next((found for statement in body if (found := visit(statement))), None)


def _stored(nodes: list[ast.stmt] | ast.expr) -> set[str]:
    trees = nodes if isinstance(nodes, list) else [nodes]
    names = {n.id for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    # The functions and classes the body defines, and what it imports (timm's `def _forward():` in its loop).
    return names | (defined(trees) if isinstance(nodes, list) else set())


def _stored_here(nodes: list[ast.stmt]) -> set[str]:
    """What the body itself binds: not the locals of the functions it defines."""
    return {n.id for n in scope_walk(nodes) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} \
        | defined(nodes)


def _loaded(nodes: list[ast.stmt]) -> set[str]:
    return {n.id for tree in nodes for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _read_before_written(nodes: list[ast.stmt]) -> set[str]:
    """Names whose first use in the body, in the order Python evaluates it, reads them: the loop carries them
    across batches. An assignment's targets are written after its value is read, so `hidden = tuple(h.detach()
    for h in hidden)` (truncated backpropagation through time) reads `hidden` first."""
    after_value: dict[int, tuple[int, int]] = {}
    for tree in nodes:
        for statement in scope_walk([tree]):
            if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
                value = statement.value
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                for target in targets:
                    for name in (n for n in ast.walk(target) if isinstance(n, ast.Name)):
                        after_value[id(name)] = (value.end_lineno or value.lineno, (value.end_col_offset or 0) + 1)
    # In the body's own scope: a function it defines reads and writes its own locals (timm's `_forward` does
    # `loss /= accum_steps` on its own `loss`), not the loop's.
    names = sorted((n for n in scope_walk(nodes) if isinstance(n, ast.Name)),
                   key=lambda n: after_value.get(id(n), (n.lineno, n.col_offset)))
    first: dict[str, ast.expr_context] = {}
    for name in names:
        first.setdefault(name.id, name.ctx)
    stored = _stored_here(nodes)
    return {name for name, ctx in first.items() if isinstance(ctx, ast.Load) and name in stored}


def _loss_returned(body: list[ast.stmt]) -> ast.Return | None:
    """`return <the loss>` for the loss the body calls backward on (lift_loss.py reads every form), when the body
    assigns its variable; None when there is none."""
    source = loss_source(body, _stored_here(body))
    return ast.Return(value=copy.deepcopy(source.value)) if source is not None else None


@dataclass
class _LossExit:
    """How the step returns its loss: statements before the body (its variable set to None, where not every run of
    the body assigns it), the value every exit returns, and, where there is none, the sentence that says where the
    profile looked."""

    prelude: list[ast.stmt]
    value: ast.expr | None
    exits_return_it: bool
    missing: str | None = None


def _loss_exit(body: list[ast.stmt], carried: set[str], line: int) -> _LossExit:
    returned = _loss_returned(body)
    if returned is None or returned.value is None:
        lines = backward_lines(body)
        looked = (f"the backward call at line {lines[-1]} is not on a variable the loop body assigns" if lines else
                  f"the loop body at line {line} calls no backward()")
        return _LossExit([], None, False, f"The ready steps return None, not the loss: {looked}, so %speedprobe "
                                          "compares only the update.")
    source = loss_source(body, _stored_here(body))
    assert source is not None
    if source.base in carried or source.base in _always_assigned(body):
        return _LossExit([], returned.value, False)
    # Assigned in a micro-step loop or a branch (nanoGPT's accumulation, timm's `if has_no_sync ... else`): set
    # to None first, so the step returns None only where the body stopped before computing it.
    prelude = [ast.Assign(targets=[ast.Name(id=source.base, ctx=ast.Store())], value=ast.Constant(None), lineno=0)]
    value: ast.expr = returned.value
    if not isinstance(value, ast.Name):
        value = ast.IfExp(test=ast.Compare(left=ast.Name(id=source.base, ctx=ast.Load()), ops=[ast.Is()],
                                           comparators=[ast.Constant(None)]),
                          body=ast.Constant(None), orelse=value)
    return _LossExit(prelude, value, True)


def _always_assigned(body: list[ast.stmt]) -> set[str]:
    """Names every run of `body` assigns: its top-level assignments and those inside `with` blocks
    (`with torch.autocast(...): loss = ...`), not those under an `if` or in a loop that may not run."""
    names: set[str] = set()
    for statement in body:
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            names |= _always_assigned(statement.body)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names |= _stored(targets)  # `loss = ...`, and `logits, loss = model(xb, yb)`
    return names


def _augmented(nodes: list[ast.stmt]) -> set[str]:
    return {n.target.id for n in scope_walk(nodes) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}


@dataclass(frozen=True)
class LoopScope:
    """What a function whose loop the profile saw could see when the loop first asked for a batch."""

    local_names: dict[str, Any]
    module_globals: dict[str, Any]

    def visible(self, namespace: Mapping[str, Any]) -> dict[str, Any]:
        """Its locals, and its module's globals where that module is not the notebook (a function from a .py)."""
        if self.module_globals is namespace:
            return dict(self.local_names)
        return {**self.module_globals, **self.local_names}


@dataclass
class Lifted:
    """The ready steps (with their code; templates with the reason when nothing could be lifted), the names they
    define in the notebook, and the values they close over: a function's own variables (`net`, `optimizer`, a
    running total) when the loop runs inside a function, which `define` passes to the step's factory."""

    steps: list[ReadyStep]
    defined: list[str] = field(default_factory=list)
    bound: dict[str, Any] = field(default_factory=dict)
    factory_for: str = DATA_STEP  # the step the factory makes, when `bound` is not empty
    notes: list[str] = field(default_factory=list)  # for the report: which path the steps took, their loss


def ready_steps(source: LoopSource | None, loop_sites: Mapping[tuple[str, int], int], namespace: Mapping[str, Any],
                loaders: list[str], *, accumulation: int, batch: Any,
                scopes: Mapping[tuple[str, int], LoopScope] | None = None,
                step_sites: Mapping[tuple[str, int], int] | None = None, samples: int | None = None) -> Lifted:
    """The ready steps, or the templates and why. `batch` is the last batch the loop saw (None when it saw none);
    `scopes`: for a loop inside a function, what that function saw when its loop first asked for a batch (or, for
    a loop without a DataLoader, called its optimizer's step); `step_sites`: where the loop called it; `samples`:
    how many the loader's dataset holds (a batch larger than that is no batch the loop can make)."""
    loader = loaders[0] if loaders else "LOADER"
    why = _why_not(source, loop_sites, batch)
    if why is not None and step_sites:
        lifted = _lift_without_loader(source, step_sites, namespace, scopes or {})
        if lifted is not None:
            return lifted
    if why is not None:
        return Lifted(_templates(loader, why))
    loop = None
    # The profiled cell first, then the files the loop's next() was called from (a function defined elsewhere).
    files = [source.filename] if source is not None else []
    files += [file for (file, _), _ in sorted(loop_sites.items(), key=lambda item: -item[1])]
    for filename in dict.fromkeys(files):
        tree = _parse(filename)
        loop = _loop_body(tree, {line for (file, line) in loop_sites if file == filename}) if tree else None
        if loop is not None:
            break
    if loop is None:
        return Lifted(_templates(loader, "the loop over the DataLoader is not in the profiled code (it runs in a "
                                         "function defined elsewhere)"))
    loop.statements = _without_stop_guards(loop.statements)
    blocked = loop.why_not or _blocked(loop.statements)
    if blocked is not None:
        return Lifted(_templates(loader, blocked))
    site = next((site for site in (scopes or {}) if site[0] == filename and site[1] in loop.fetch_lines), None)
    scope = (scopes or {})[site].visible(namespace) if site is not None else {}
    loop_names = _stored(loop.target) | ({loop.counter} if loop.counter else set())
    bound, missing = _closed_over(loop.statements, loop_names, scope, namespace)
    if missing:
        return Lifted(_templates(loader, missing))
    code, no_loss = _data_step_code(loop, namespace, list(bound), _batches_per_epoch(namespace, loaders))
    steps, names = _lifted(loader, loop.line, accumulation, code, samples)
    notes = [f"The ready steps are lifted from the loop at line {loop.line} (its body, one batch a call).",
             *([no_loss] if no_loss else [])]
    return Lifted(steps, names, bound, notes=notes)


def _closed_over(body: list[ast.stmt], loop_names: set[str], scope: Mapping[str, Any],
                 namespace: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """What the lifted body closes over, and why it cannot be lifted (a name it cannot see), if so. A loop inside a
    function: what its body reads from the function (arguments, a running total it carries across batches) is
    closed over, with the value it had when the loop began; it shadows the notebook's."""
    carried = _carried(body)
    bound = {name: scope[name] for name in sorted((_loaded(body) | carried) - loop_names)
             if name in scope and (name not in _stored(body) or name in carried)}
    known = set(namespace) | set(dir(builtins)) | loop_names | set(bound)
    # As Python resolves them (a function the body defines binds its name and its parameters), in the branches a
    # step can enter (`if wandb_log: wandb.log(...)` with wandb_log False needs no wandb).
    missing = sorted(free_names(without_dead_branches(body, {**namespace, **scope})) - known)
    if missing:
        return bound, (f"the body uses {', '.join(f'`{m}`' for m in missing)}, which "
                       f"{'is' if len(missing) == 1 else 'are'} not a notebook variable (a function's own variables?)")
    return bound, None


def _lift_without_loader(source: LoopSource | None, step_sites: Mapping[tuple[str, int], int],
                         namespace: Mapping[str, Any], scopes: Mapping[tuple[str, int], LoopScope]) -> Lifted | None:
    """A loop that makes its own batches (`xb, yb = get_batch('train')`, as nanoGPT and Karpathy's tutorials do),
    found around the line that called the optimizer's step: its body, one iteration, becomes `profile_train_step()`
    for %speedprobe. %dataprobe measures DataLoaders, so it gets no step; %batchprobe gets the wrapper to fill in,
    since the profile cannot resize a batch it never saw. None when no such loop is in the profiled code."""
    files = [source.filename] if source is not None else []
    files += [file for (file, _), _ in sorted(step_sites.items(), key=lambda item: -item[1])]
    for filename in dict.fromkeys(files):
        tree = _parse(filename)
        lines = {line for (file, line) in step_sites if file == filename}
        loops = [node for node in ast.walk(tree) if isinstance(node, (ast.For, ast.While))
                 and any(node.body[0].lineno <= line <= (node.body[-1].end_lineno or 0) for line in lines)] if tree \
            else []
        if loops:
            break
    else:
        return None
    loop = max(loops, key=lambda node: node.lineno)  # the innermost
    statements = _without_stop_guards(loop.body)
    why = _blocked(statements)
    counters: list[tuple[str, str]] = []  # (name, the value it takes on this call)
    iterable = None
    if isinstance(loop, ast.For):
        # Through enumerate and progress bars: `for batch, i in enumerate(range(0, n, bptt))`, the PyTorch word
        # language model's loop, and `for i in tqdm(range(n))`.
        target, enumerated, iterable = _unwrap(loop)
        if (isinstance(target, ast.Name) and isinstance(iterable, ast.Call) and _name(iterable.func) == "range"
                and not iterable.keywords):
            # The counters go on from call to call as the loop counted, round its range (`if iter % 50 == 0`).
            span = ast.unparse(iterable)
            position = f"{TRAIN_STEP}.calls % len({span})"
            counters = [(target.id, f"{span}[{position}]"), *([(enumerated, position)] if enumerated else [])]
        else:
            why = why or (f"the loop at line {loop.lineno} takes each step's data from `{ast.unparse(loop.iter)}`, "
                          "neither a DataLoader nor a counter")
    if why is None and not any(_top_level_holds(statements, line) for line in lines):
        why = ("the optimizer steps only on some of the loop's iterations (its step is under an `if`: gradient "
               "accumulation without a DataLoader)")
    if why is None:
        site = next((site for site in scopes if site[0] == filename and site[1] in lines), None)
        scope = scopes[site].visible(namespace) if site is not None else {}
        # The counter's range is evaluated in the step too (`range(iterations)`, a function's argument).
        seen = [*statements, ast.Expr(iterable)] if counters and iterable is not None else statements
        bound, why = _closed_over(seen, {name for name, _ in counters}, scope, namespace)
    if why is not None:
        return Lifted(_loader_free_templates(why))
    code, no_loss = _train_step_code(loop, statements, counters, namespace, list(bound))
    steps = [ReadyStep("%speedprobe", TRAIN_STEP, f"%speedprobe {TRAIN_STEP}", code),
             *_loader_free_templates(f"the loop at line {loop.lineno} makes its own batches, so the profile cannot "
                                     "resize one")[1:]]
    notes = [f"The ready steps are lifted from the loop at line {loop.lineno} ({TRAIN_STEP}: one iteration, making its "
             "own batch as the loop does).", *([no_loss] if no_loss else [])]
    return Lifted(steps, [TRAIN_STEP], bound, factory_for=TRAIN_STEP, notes=notes)


def _top_level_holds(statements: list[ast.stmt], line: int) -> bool:
    """Whether `line` is in a statement of `statements` that runs on every iteration: a plain statement or a
    `with` block, not under an `if` or an inner loop."""
    for statement in statements:
        if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            if isinstance(statement, (ast.With, ast.AsyncWith)):
                return _top_level_holds(statement.body, line)
            return not isinstance(statement, (ast.If, ast.For, ast.While, ast.Try, ast.AsyncFor))
    return False


def _train_step_code(loop: ast.For | ast.While, statements: list[ast.stmt], counters: list[tuple[str, str]],
                     namespace: Mapping[str, Any], bound: list[str]) -> tuple[str, str | None]:
    """`profile_train_step()`: one iteration of a loop that makes its own batches, returning its loss. `counters`:
    the loop's counters and the value each takes on a call. Also: why it returns None, where it does."""
    body: list[ast.stmt] = [ast.Expr(ast.Constant(f"One iteration of the loop at line {loop.lineno}, which makes "
                                                  "its own batch; returns its loss (lifted by %%gpuprofile)."))]
    carried = _carried(statements) - {name for name, _ in counters}
    body.extend(_carried_declarations(carried, namespace, bound))
    used = [(name, value) for name, value in counters if name in _loaded(statements)]
    if used:
        assignments = "\n".join(f"{name} = {value}" for name, value in used)
        body.extend(ast.parse(f"{assignments}\n{TRAIN_STEP}.calls += 1").body)
    loss = _loss_exit(statements, carried, loop.lineno)
    body.extend(loss.prelude)
    exits = _LoopExitsEndTheStep(loss.value if loss.exits_return_it else None)
    lifted = [exits.visit(statement) for statement in copy.deepcopy(statements)]
    lifted.append(ast.Return(value=copy.deepcopy(loss.value)))
    body.extend(lifted)
    return _step_source(TRAIN_STEP, [], body, bound), loss.missing


def _carried_declarations(carried: set[str], namespace: Mapping[str, Any], bound: list[str]) -> list[ast.stmt]:
    """`global` for the names the body carries that are the notebook's, `nonlocal` for those the factory closes
    over (a function's own variables), so the step updates them where the loop did."""
    declarations: list[ast.stmt] = []
    shared = sorted(carried & set(namespace) - set(bound))
    if shared:
        declarations.append(ast.Global(names=shared))
    nonlocal_names = sorted(carried & set(bound))
    if nonlocal_names:
        declarations.append(ast.Nonlocal(names=nonlocal_names))
    return declarations


def _step_source(name: str, parameters: list[str], body: list[ast.stmt], bound: list[str]) -> str:
    """The step function's source, with its call counter set to 0; for a loop inside a function, a factory that
    takes the function's variables the body uses (define() calls it with them) and returns the step."""
    function = ast.FunctionDef(
        name=name, args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in parameters], kwonlyargs=[],
                                      kw_defaults=[], defaults=[]),
        body=body, decorator_list=[], returns=None, type_params=[], lineno=0)
    if bound:
        made = ast.parse(f"{name}.calls = 0\nreturn {name}").body
        factory = ast.FunctionDef(
            name=_FACTORY, args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=b) for b in bound],
                                              kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=[function, *made], decorator_list=[], returns=None, type_params=[], lineno=0)
        return ast.unparse(ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))) + "\n"
    text = ast.unparse(ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[])))
    return text + f"\n{name}.calls = 0\n"


def _loader_free_templates(reason: str) -> list[ReadyStep]:
    """For a loop with no DataLoader: no %dataprobe (it measures DataLoaders); the wrappers for the others."""
    return [
        ReadyStep("%speedprobe", None, "%speedprobe train_step",
                  "def train_step():\n    # one training step: make a batch as the loop does, forward, loss, "
                  "backward, optimizer step\n    ...\n    return loss\n", reason),
        ReadyStep("%batchprobe", None, "%batchprobe sized_step",
                  "def sized_step(batch_size):\n    # one training step on a batch of batch_size samples, made as "
                  "the loop makes its batches\n    ...\n", reason),
    ]


def _carried(body: list[ast.stmt]) -> set[str]:
    """Names the loop carries across batches: it reads them before (or while) it writes them."""
    return _augmented(body) | _read_before_written(body)


def define(lifted: Lifted, namespace: dict[str, Any]) -> None:
    """Define the lifted steps in the notebook, their source in the line cache so a traceback shows it. A step
    that closes over a function's variables is made by its factory, called with them."""
    for step in lifted.steps:
        if step.name is None:
            continue
        filename = f"<%%gpuprofile {step.name}>"
        linecache.cache[filename] = (len(step.code), None, step.code.splitlines(True), filename)
        exec(compile(step.code, filename, "exec"), namespace)
        factory = namespace.pop(_FACTORY, None)
        if factory is not None:  # it takes the values it closes over, by name (a driven step: its driver, the cell)
            wanted = factory.__code__.co_varnames[:factory.__code__.co_argcount]
            namespace[step.name] = factory(**{name: lifted.bound[name] for name in wanted})


def _why_not(source: LoopSource | None, loop_sites: Mapping[tuple[str, int], int], batch: Any) -> str | None:
    if batch is None or not loop_sites:
        return "the profile saw no DataLoader batch, so there is no loop body to lift"
    return None


def _batches_per_epoch(namespace: Mapping[str, Any], loaders: list[str]) -> int | None:
    """len() of the loop's loader, where it has one: the loop's counter never reaches it. The loader is named as
    the loop names it: a variable or an attribute path from one (`trainer.train_loader`)."""
    try:
        head, *attributes = loaders[0].split(".")
        loader = namespace[head]
        for attribute in attributes:
            loader = getattr(loader, attribute)
        count = len(loader)
    except Exception:  # no loader named, an iterable-style dataset without a length
        return None
    return count if count > 0 else None


def _data_step_code(loop: _LoopBody, namespace: Mapping[str, Any], bound: list[str], epoch: int | None = None
                    ) -> tuple[str, str | None]:
    target, counter = loop.target, loop.counter
    body: list[ast.stmt] = []
    # Names the body both reads and assigns (running_loss += ...) are the notebook's, as in the loop; or, for a
    # loop inside a function, that function's (closed over by the factory below).
    carried = _carried(loop.statements) - _stored(target) - ({counter} if counter else set())
    body.extend(_carried_declarations(carried, namespace, bound))
    parameter = target.id if isinstance(target, ast.Name) else "batch"
    if not isinstance(target, ast.Name):
        body.append(ast.Assign(targets=[target], value=ast.Name(id="batch", ctx=ast.Load()), lineno=0))
    if counter is not None and counter in _loaded(loop.statements):
        # The loop counter, counted per call as the loop counted it (logging, gradient accumulation), round the
        # loader's length as the next epoch's loop would: timm's `if batch_idx >= last_batch_idx_to_accum:
        # accum_steps = last_accum_steps` made a probe's 33rd call of a 32-batch loader divide by zero.
        count = f"{DATA_STEP}.calls % {epoch}" if epoch else f"{DATA_STEP}.calls"
        calls = ast.parse(f"{counter} = {count}\n{DATA_STEP}.calls += 1").body
        body.extend(calls)
    loss = _loss_exit(loop.statements, carried, loop.line)
    body.extend(loss.prelude)
    exits = _LoopExitsEndTheStep(loss.value if loss.exits_return_it else None)
    statements = [exits.visit(statement) for statement in copy.deepcopy(loop.statements)]
    if loss.value is not None:
        statements.append(ast.Return(value=copy.deepcopy(loss.value)))
    if loop.contexts:
        statements = [ast.With(items=copy.deepcopy(loop.contexts), body=statements, lineno=0)]
    body.extend(statements)
    docstring = ast.Expr(ast.Constant(f"The loop body at line {loop.line}, one batch as the loader yields it "
                                      "(lifted by %%gpuprofile)."))
    return _step_source(DATA_STEP, [parameter], [docstring, *body], bound), loss.missing


def _lifted(loader: str, line: int, accumulation: int, data_code: str, samples: int | None = None
            ) -> tuple[list[ReadyStep], list[str]]:
    # Both return what the body returned for the step's last batch: its loss (None when it has no single loss).
    # The loop counter goes on from call to call as it did in the loop (so `if i % 10 == 0: print(...)` logs every
    # 10th step, not every one); with accumulation each step starts a window of that many batches, as in the loop.
    repeat, align = "", ""
    if accumulation > 1:
        repeat = f"for _ in range({accumulation}):  # batches per optimizer step in the loop\n        "
        align = f"    {DATA_STEP}.calls += -{DATA_STEP}.calls % {accumulation}  # a window's first batch\n"
    train_code = (f"def {TRAIN_STEP}():\n"
                  f"    \"\"\"One optimizer step of the loop at line {line} on {BATCH}, the last batch it saw; returns "
                  f"its loss.\"\"\"\n"
                  f"{align}"
                  f"    {repeat}loss = {DATA_STEP}({BATCH})\n"
                  f"    return loss\n")
    sized_code = (f"def {SIZED_STEP}(batch_size):\n"
                  f"    \"\"\"{TRAIN_STEP} on {BATCH} resized to batch_size samples.\"\"\"\n"
                  f"    from jupyter_gpu.gpuprofile.batches import resize_batch\n"
                  f"    batch = resize_batch({BATCH}, batch_size)\n"
                  f"{align}"
                  f"    {repeat}loss = {DATA_STEP}(batch)\n"
                  f"    return loss\n")
    steps = [ReadyStep("%dataprobe", DATA_STEP, f"%dataprobe {loader} --step {DATA_STEP}", data_code),
             ReadyStep("%speedprobe", TRAIN_STEP, f"%speedprobe {TRAIN_STEP}", train_code),
             ReadyStep("%batchprobe", SIZED_STEP, f"%batchprobe {SIZED_STEP}{_batch_limit(samples)}", sized_code)]
    return steps, [DATA_STEP, TRAIN_STEP, SIZED_STEP, BATCH]


def _batch_limit(samples: int | None) -> str:
    """`--max N` for a dataset of N samples: the sized step repeats the batch's samples to any size, and on a CPU,
    where memory hardly limits it, %batchprobe had grown a 4,096-sample dataset's batch to 65,536."""
    # Not below %batchprobe's first size, 2 (its --start default): a --max under it is refused.
    return f" --max {samples}" if samples is not None and samples >= 2 else ""


def _templates(loader: str, reason: str) -> list[ReadyStep]:
    return [
        ReadyStep("%dataprobe", None, f"%dataprobe {loader} --step step",
                  "def step(batch):\n    # one training step on `batch`, as the loader yields it:\n"
                  "    # move it to the device, forward, loss, backward, optimizer step\n    ...\n", reason),
        ReadyStep("%speedprobe", None, "%speedprobe train_step",
                  "batch = next(iter(LOADER))\n\ndef train_step():\n    # one training step on `batch`: forward, "
                  "loss, backward, optimizer step\n    ...\n    return loss\n", reason),
        ReadyStep("%batchprobe", None, "%batchprobe sized_step",
                  "def sized_step(batch_size):\n    # one training step on a batch of batch_size samples\n    ...\n",
                  reason),
    ]
