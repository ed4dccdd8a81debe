"""What the user asked `%%gpuprofile` for. Pure Python."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STEPS = 20
DEFAULT_WARMUP = 5
# --apply: how long %dataprobe may measure DataLoader settings (its own default budget is for a full sweep).
DEFAULT_DATA_SECONDS = 10.0


@dataclass(frozen=True)
class ProfileRequest:
    steps: int | None = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP
    seconds: float | None = None
    keep: bool = False
    apply: bool = False      # then run the loop again with the fixes that need no edit, and compare
    compile: bool = False    # --apply may try torch.compile too
    data_seconds: float = DEFAULT_DATA_SECONDS  # --apply: %dataprobe's budget
