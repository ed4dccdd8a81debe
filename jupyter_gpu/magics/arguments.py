"""A magic's line: its options parsed (a bad one is a one-sentence UsageError), and the one notebook name a probe
magic takes (`%dataprobe loader`, `%speedprobe train_step`), found in the user's namespace, with the sentence that
says what to type when it is missing, doubled or not defined."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from IPython.core.error import UsageError

from jupyter_gpu.options import OptionsError


def parse_line(magic: str, parser: argparse.ArgumentParser, line: str,
               validate: Callable[[argparse.Namespace], None] | None = None) -> argparse.Namespace:
    """The options of `line`, split as a shell would; a bad option, a failed `validate` or unbalanced quotes
    (shlex's ValueError) is a UsageError that starts with the magic's name."""
    try:
        options = parser.parse_args(shlex.split(line))
        if validate is not None:
            validate(options)
    except (OptionsError, ValueError) as exc:
        raise UsageError(f"{magic}: {exc}") from None
    return options


@dataclass(frozen=True)
class NamedObject:
    """How one magic words its argument: `%speedprobe` takes a "step function" such as `def train_step(): ...`."""

    magic: str         # "%speedprobe"
    what: str          # "step function", "DataLoader"
    noun: str          # what a stray word is not: "a step", "a loader"
    missing: str       # the whole sentence when no name was given
    definition: str    # how to define it, with {name}: "def {name}(): ..."
    option_hint: str   # an example option, for "options start with -, e.g. --try amp-bf16"

    def one_name(self, names: list[str]) -> str:
        if not names:
            raise UsageError(self.missing)
        name, *extra = names
        if extra:
            raise UsageError(f"{self.magic} takes one {self.what.split()[0]} name; {' '.join(extra)!r} is neither "
                             f"{self.noun} nor an option (options start with -, e.g. {self.option_hint}).")
        return name

    def look_up(self, namespace: dict[str, Any], name: str) -> Any:
        """The notebook's `name`, or an attribute path from one (`trainer.train_loader`, as the probes print an
        object a trainer holds); attributes are read as Python reads them (a property runs)."""
        from jupyter_gpu.probekit.training_state import value_at

        head, *path = name.split(".")
        if head not in namespace or not all(part.isidentifier() for part in path):
            raise UsageError(f"{self.magic}: there is no {self.what} {name!r} in the notebook; define "
                             f"{self.definition.format(name=name)} first.")
        try:
            return value_at(namespace, name)
        except AttributeError as exc:
            raise UsageError(f"{self.magic}: there is no {self.what} {name!r} in the notebook ({exc}).") from None
