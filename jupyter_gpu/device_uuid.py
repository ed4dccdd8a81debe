"""One spelling for a GPU's UUID, whoever wrote it: NVML, torch or CUDA_VISIBLE_DEVICES. Pure."""

from __future__ import annotations

import re

# NVML says GPU-<uuid> or MIG-<uuid>; str() of torch's device-properties uuid (a _CUuuid, printed by
# torch/csrc/cuda/Module.cpp with uuid_to_string) is the bare 8-4-4-4-12 lower-case hex form, and for a MIG
# slice it is the slice's own UUID.
UUID_PREFIX = re.compile(r"^(?:GPU|MIG)-", re.I)
CANONICAL_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def canonical_uuid(value: object, *, partial: bool = False) -> str | None:
    """One spelling for a device UUID from NVML, torch or CUDA_VISIBLE_DEVICES: bare lower-case 8-4-4-4-12 hex.

    None when the text is not such a UUID (old-style MIG-GPU-<uuid>/1/0 names, test labels), so callers
    compare devices by UUID only when both sides really are UUIDs. `partial` accepts a leading part, as
    CUDA_VISIBLE_DEVICES does (GPU-1b2c selects the one GPU whose UUID starts so).
    """
    if not isinstance(value, str) or not value.strip():
        return None
    text = UUID_PREFIX.sub("", value.strip()).lower()
    if partial:
        return text if re.fullmatch(r"[0-9a-f-]+", text) else None
    return text if CANONICAL_UUID.match(text) else None
