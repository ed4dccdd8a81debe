"""CUDA_VISIBLE_DEVICES read exactly as PyTorch and the CUDA runtime read it."""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_gpu.device_uuid import UUID_PREFIX, canonical_uuid


@dataclass(frozen=True)
class Visibility:
    mode: str  # "all" (unset), "indices", "uuids"
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    problem: str | None = None  # why the list ends early or is empty


def parse_visible_devices(value: str | None, physical_count: int | None) -> Visibility:
    """Mirror torch.cuda._parse_visible_devices: an empty or negative element stops the list, a repeated
    ordinal empties it, and an index past the physical count truncates it."""
    if value is None:
        return Visibility("all")
    if value.strip().startswith(("GPU-", "MIG-")):
        uuids = tuple(v.strip() for v in value.split(",") if v.strip())
        return Visibility("uuids", uuids=uuids)
    indices: list[int] = []
    problem = None
    for raw in value.split(","):
        token = raw.strip()
        digits = ""
        for char in token:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            problem = f"element {token!r} is not a device index, so the list stops there"
            break
        index = int(digits)
        if index in indices:
            return Visibility("indices", (), problem=f"index {index} is repeated, which hides every GPU")
        if physical_count is not None and index >= physical_count:
            problem = f"index {index} does not exist (this machine has {physical_count} GPU(s))"
            break
        indices.append(index)
    if value.strip() == "":
        problem = "the variable is set to an empty string, which hides every GPU"
    return Visibility("indices", tuple(indices), problem=problem)


def short_uuid(value: object) -> str:
    """GPU-1b2c3d4e: enough of a UUID to tell GPUs apart in a sentence."""
    text = str(value or "").strip()
    prefix = UUID_PREFIX.match(text)
    bare = canonical_uuid(text)
    if bare is None:
        return text or "UUID unknown"
    return f"{prefix.group(0).upper() if prefix else 'GPU-'}{bare[:8]}"
