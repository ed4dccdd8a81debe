"""The probe commands the report prints, as they run when pasted: one whose step is a wrapper still to fill in says
so on its own line, with what to type first. Pure Python."""

from __future__ import annotations

from jupyter_gpu.gpuprofile.result import ReadyStep


def needs_first(ready: ReadyStep, command: str) -> str:
    """`first define train_step() (...), then: %speedprobe train_step`: a command whose step is a wrapper to fill
    in, with what to type first on the same line."""
    return (f"first define {step_name(ready)}() (fill in the wrapper under \"Ready steps\"), then: {command}")


def step_name(ready: ReadyStep) -> str:
    """The step function a probe command names: `--step NAME` for %dataprobe, its first word for the others."""
    words = ready.command.split()
    if "--step" in words and words.index("--step") + 1 < len(words):
        return words[words.index("--step") + 1]
    return words[1] if len(words) > 1 else "step"
