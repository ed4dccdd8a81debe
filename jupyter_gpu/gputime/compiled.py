"""What `%%gputime`'s runner runs: a cell compiled once into code objects (made by `magics.cell`)."""

from __future__ import annotations

from dataclasses import dataclass
from types import CodeType

# Names the loop uses in the user's namespace while it runs (LOOP_COUNT holds a range); removed afterwards.
LOOP_COUNT = "__jupyter_gpu_loops__"
LOOP_INDEX = "__jupyter_gpu_index__"


@dataclass(frozen=True)
class CompiledCell:
    body: CodeType                 # every statement but a final expression, run once
    last_expression: CodeType | None  # the final expression, evaluated for its value (like %%time)
    loop: CodeType                 # the whole cell inside `for LOOP_INDEX in LOOP_COUNT:`, at module level
    filename: str

    def code_objects(self) -> set[CodeType]:
        found = {self.body, self.loop}
        if self.last_expression is not None:
            found.add(self.last_expression)
        return found
