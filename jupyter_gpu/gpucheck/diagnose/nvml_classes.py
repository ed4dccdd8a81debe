"""NVML's answers by class, not by the one code a report showed: every `NVML_ERROR_*` code (nvidia-ml-py's table,
`nvml.h`) and every message nvidia-ml-py prints for one (`NVMLError._errcode_to_string`), read as what it says about
the machine. A snapshot keeps NVML's init error as a code and a GPU's failed queries as messages, so both are read.

A GPU that fell off the bus answers GPU_IS_LOST on one machine, Unknown Error or Timeout on the next; one that
needs a reset answers RESET_REQUIRED ("GPU requires restart") or, with a corrupted infoROM, CORRUPTED_INFOROM. The
rules act on the class, so a neighbour of a seen case gets the same answer. Pure Python.
"""

from __future__ import annotations

LOST = "lost"                          # the GPU stopped answering its driver: hardware, power, the bus
RESET = "reset needed"                 # the GPU must be reset before it works again
UNKNOWN = "unknown"                    # NVML cannot say: look further (the kernel log, a container's devices)
NOT_LOADED = "not loaded"              # no driver, or no NVML library
NO_PERMISSION = "no permission"        # the device files or the OS refuse this process
LIBRARY_MISMATCH = "library mismatch"  # the user-space libraries and the kernel module differ

# The classes that say a GPU itself is in trouble, worst first.
FAULTS = (LOST, RESET, UNKNOWN)

BY_CODE = {
    9: NOT_LOADED, 12: NOT_LOADED,                                   # DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND
    4: NO_PERMISSION, 17: NO_PERMISSION,                             # NO_PERMISSION, OPERATING_SYSTEM
    15: LOST, 10: LOST, 11: LOST, 28: LOST,                          # GPU_IS_LOST, TIMEOUT, IRQ_ISSUE, GPU_NOT_FOUND
    16: RESET, 14: RESET,                                            # RESET_REQUIRED, CORRUPTED_INFOROM
    18: LIBRARY_MISMATCH, 13: LIBRARY_MISMATCH, 25: LIBRARY_MISMATCH,  # LIB_RM_VERSION_MISMATCH, FUNCTION_NOT_FOUND,
                                                                     # ARGUMENT_VERSION_MISMATCH
    999: UNKNOWN,
}
# Codes one call answers about itself on a healthy GPU (a field it does not support, a wrong argument, nothing to
# report): no class. Any other code NVML may add later reads as unknown.
PER_CALL = {1, 2, 3, 5, 6, 7, 8, 19, 20, 21, 22, 23, 24, 26, 27, 29, 30}

BY_MESSAGE = {
    "gpu is lost": LOST, "timeout": LOST, "interrupt request issue": LOST, "gpu not found": LOST,
    "gpu requires restart": RESET, "gpu requires reset": RESET, "corrupted inforom": RESET,
    "unknown error": UNKNOWN,
    "driver not loaded": NOT_LOADED, "nvml shared library not found": NOT_LOADED,
    "insufficient permissions": NO_PERMISSION, "the operating system has blocked the request.": NO_PERMISSION,
    "rm has detected an nvml/rm version mismatch.": LIBRARY_MISMATCH,
}


def class_of_code(code: int | None) -> str | None:
    if code is None or code in PER_CALL:
        return None
    return BY_CODE.get(code, UNKNOWN)


def class_of_message(message: object) -> str | None:
    text = str(message).strip().lower()
    if text.startswith("nvml error with code "):  # nvidia-ml-py's text for a code its table lacks
        return UNKNOWN
    return BY_MESSAGE.get(text)


def worst(classes: list[str | None]) -> str | None:
    """The most serious fault among `classes`; None where none is a fault."""
    return next((fault for fault in FAULTS if fault in classes), None)
