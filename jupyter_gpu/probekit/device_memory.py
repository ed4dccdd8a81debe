"""PyTorch's caching-allocator figures for one device over a measured window: what `probekit.clock`'s memory watch
returns to `%%gputime` and `%speedprobe`. Pure Python.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceMemory:
    """PyTorch's caching-allocator figures for one device over the whole magic."""

    device: str
    peak_allocated: int
    peak_reserved: int
    allocated_before: int
    allocated_after: int

    @property
    def allocated_delta(self) -> int:
        return self.allocated_after - self.allocated_before

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "allocated_delta": self.allocated_delta}
