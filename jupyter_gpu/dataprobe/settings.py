"""One DataLoader configuration the probe measures: the keyword arguments it varies, and the line to paste."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# torch's default once num_workers > 0; with no workers the DataLoader accepts none.
DEFAULT_PREFETCH = 2


@dataclass(frozen=True, order=True)
class LoaderSettings:
    """The DataLoader keyword arguments the sweep varies; every other argument stays the user's.

    `prefetch_factor` and `persistent_workers` mean nothing without workers, so they are normalised away
    (None / False) at `num_workers == 0`: two spellings of the same loader compare equal.
    """

    num_workers: int
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be 0 or more, not {self.num_workers}")
        if self.num_workers == 0:
            object.__setattr__(self, "prefetch_factor", None)
            object.__setattr__(self, "persistent_workers", False)
        elif self.prefetch_factor is None:
            object.__setattr__(self, "prefetch_factor", DEFAULT_PREFETCH)

    @property
    def cost(self) -> tuple[int, bool, int, bool]:
        """What the setting costs, cheapest first: worker processes, then restarting them every epoch (their
        start-up, which the timed windows rarely include, is paid again each epoch), batches held, pinned memory."""
        return (self.num_workers, not self.persistent_workers, self.prefetch_factor or 0, self.pin_memory)

    def kwargs(self) -> dict[str, Any]:
        """The DataLoader keyword arguments, as DataLoader accepts them (no prefetch_factor without workers)."""
        found: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            found["prefetch_factor"] = self.prefetch_factor
            found["persistent_workers"] = self.persistent_workers
        return found

    def label(self) -> str:
        """Short, for a table row: "4 workers · prefetch 2 · persistent · pinned"."""
        if self.num_workers == 0:
            parts = ["0 workers (main process)"]
        else:
            parts = [f"{self.num_workers} worker{'s' if self.num_workers > 1 else ''}",
                     f"prefetch {self.prefetch_factor}"]
            if self.persistent_workers:
                parts.append("persistent")
        if self.pin_memory:
            parts.append("pinned")
        return " · ".join(parts)

    def code(self, name: str = "loader", current: LoaderSettings | None = None) -> str:
        """The line to paste: `loader = DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True)`.

        Against `current` (the user's loader) every argument that differs is written, switched-off ones too:
        "keep your other arguments" must not keep a `persistent_workers=True` that 0 workers refuse.
        """
        wanted = self._arguments()
        had = current._arguments() if current is not None else {}
        shown = {}
        for key, value in wanted.items():
            user_set = current is not None and had[key] != value and not current._is_default(key, had[key])
            if key == "num_workers" or not self._is_default(key, value) or user_set:
                shown[key] = value
        text = ", ".join(f"{key}={value!r}" for key, value in shown.items())
        return f"{name} = DataLoader(..., {text})  # keep your other arguments"

    def _is_default(self, key: str, value: Any) -> bool:
        """Whether DataLoader would use this value with the argument left out, at this many workers."""
        if key == "prefetch_factor":
            return value == (DEFAULT_PREFETCH if self.num_workers > 0 else None)
        return value is False

    def _arguments(self) -> dict[str, Any]:
        """Every argument this setting decides, as it would be written (None/False where it is switched off)."""
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "pin_memory": self.pin_memory, "persistent_workers": self.persistent_workers}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
