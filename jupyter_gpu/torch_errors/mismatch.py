"""How PyTorch words "tensors on two devices in one operation": one table for every feature that recognises it.

The notebook facts gatherer (`facts.notebook`) reads it to decide that small tensors are worth naming
after such an error, and the diagnosis (`gpucheck.diagnose.usage`) reads it to explain the error, so the two can
never disagree on what counts as a device mismatch. Pure Python: messages are matched as text, never by
importing torch. Each pattern captures the two devices as `a` and `b`, and the argument as `arg` where the
message names one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEVICE_MISMATCH_PATTERNS: tuple[re.Pattern[str], ...] = (
    # torch < 2.5: "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    re.compile(r"found at least two devices, (?P<a>\S+) and (?P<b>\S+?)!"),
    # torch >= 2.5: "... but got mat1 is on cpu, different from other tensors on cuda:0 (when checking ...)"
    re.compile(r"but got (?P<arg>\w+) is on (?P<a>\S+), different from other tensors on (?P<b>\S+?)(?:[ ,(]|$)"),
    # meta and fake tensors: "Tensor on device cpu is not on the expected device meta!"
    re.compile(r"Tensor on device (?P<a>\S+) is not on the expected device (?P<b>\S+?)!"),
)


@dataclass(frozen=True)
class DeviceMismatch:
    devices: tuple[str, str]  # as the message names them: ("cuda:0", "cpu"), or ("cuda", "cpu")
    argument: str | None = None  # the operator's argument on the odd device ("mat1"), when the message says

    def involves(self, held: str) -> bool:
        """Whether a tensor held on `held` ("cuda:0") is on one of the two devices the message names."""
        return any(held_on(held, named) for named in self.devices)


def held_on(held: str, named: str) -> bool:
    """A message's "cuda" matches a tensor on "cuda:0"; "cuda:1" matches only "cuda:1"."""
    return named in (held, held.split(":")[0])


def find_device_mismatch(text: str) -> DeviceMismatch | None:
    """The first device-mismatch message in `text` (an exception and its chain), else None."""
    for pattern in DEVICE_MISMATCH_PATTERNS:
        if match := pattern.search(text):
            argument = match.groupdict().get("arg")
            return DeviceMismatch((match.group("a"), match.group("b")), argument)
    return None
