"""Which device an operation ran on, which copies cross the host/device boundary, and which calls make
the host wait for the GPU. Pure functions over device strings, so every rule is testable without a GPU.
"""

from __future__ import annotations

# Device types whose work is queued asynchronously: reading a result back makes the host wait.
HOST_DEVICE_TYPES = frozenset({"cpu"})
NOT_A_DEVICE = frozenset({"meta"})  # shape-only tensors: no memory, no work, no copies

# ATen operators that copy data (`.to()`, `.cuda()`, `.cpu()`, `copy_` all arrive as one of these).
COPY_OPS = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "copy"})

# ATen operators that force the host to wait for an accelerator, and how a user would recognise them.
SYNC_OPS = {
    "_local_scalar_dense": ".item() / float() / bool(tensor)",
    "is_nonzero": ".item() / float() / bool(tensor)",
    "equal": "torch.equal()",
    "nonzero": "data-dependent shape (nonzero, masked_select, unique, boolean indexing)",
    "masked_select": "data-dependent shape (nonzero, masked_select, unique, boolean indexing)",
    "_unique2": "data-dependent shape (nonzero, masked_select, unique, boolean indexing)",
    "unique_consecutive": "data-dependent shape (nonzero, masked_select, unique, boolean indexing)",
    "unique_dim": "data-dependent shape (nonzero, masked_select, unique, boolean indexing)",
}
DEVICE_TO_HOST_SYNC = ".cpu() / .to('cpu') / .tolist() / .numpy()"
PRINT_SYNC = "print(tensor) / repr"

HOST_TO_DEVICE = "host_to_device"
DEVICE_TO_HOST = "device_to_host"
DEVICE_TO_DEVICE = "device_to_device"


def device_type(device: str) -> str:
    """`cuda:1` -> `cuda`."""
    return device.split(":", 1)[0]


def is_accelerator(device: str) -> bool:
    kind = device_type(device)
    return kind not in HOST_DEVICE_TYPES and kind not in NOT_A_DEVICE


def op_device_type(input_devices: tuple[str, ...], output_devices: tuple[str, ...]) -> str | None:
    """Where an operator did its work: an accelerator wins over the CPU (a CUDA add with a CPU scalar
    tensor runs on the GPU); factory functions have no inputs, so their output decides."""
    for devices in (input_devices, output_devices):
        for device in devices:
            if is_accelerator(device):
                return device_type(device)
    for device in (*input_devices, *output_devices):
        return device_type(device)
    return None


def copy_direction(source: str, destination: str) -> str | None:
    """The direction of a copy between two devices, or None when it stays on one device."""
    if device_type(source) in NOT_A_DEVICE or device_type(destination) in NOT_A_DEVICE:
        return None
    source_host, destination_host = not is_accelerator(source), not is_accelerator(destination)
    if source_host and destination_host:
        return None
    if source_host:
        return HOST_TO_DEVICE
    if destination_host:
        return DEVICE_TO_HOST
    return DEVICE_TO_DEVICE if _normalise(source) != _normalise(destination) else None


def sync_reason(op_name: str, input_devices: tuple[str, ...], *, copy: str | None = None,
                non_blocking: bool = False) -> str | None:
    """Why this operator made the host wait for an accelerator, or None if it did not."""
    if copy == DEVICE_TO_HOST:
        return None if non_blocking else DEVICE_TO_HOST_SYNC
    if op_name in SYNC_OPS and any(is_accelerator(d) for d in input_devices):
        return SYNC_OPS[op_name]
    return None


def _normalise(device: str) -> str:
    # `cuda` and `cuda:0` are the same device for a user who never switched devices.
    return device if ":" in device else f"{device}:0"
