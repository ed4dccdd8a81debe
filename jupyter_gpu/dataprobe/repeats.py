"""Whether a worker setting delivers the same data as the kernel's own process, or every item once per worker.

An IterableDataset runs whole in every worker unless its `__iter__` splits the items with `get_worker_info()`.
Then k workers yield each batch k times: samples/s rise k-fold, and all of it is duplicated data. Batches from a
map-style dataset cannot repeat this way (the main process hands each index to one worker), so only iterable ones
are checked.

The check runs on the batches the trials load anyway: the first epoch's first batches of each trial are
fingerprinted (a digest of each tensor or value in the batch), and the number of distinct fingerprints among the
first M batches is compared with what the same M batches hold at num_workers=0. Each part of the batch is judged on
its own: random augmentation makes every worker's images differ, but the labels or ids still repeat. A dataset
whose batches repeat at 0 workers already (a constant sample) gives no evidence either way: None.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

Fingerprint = tuple[bytes, ...]  # one digest per tensor or value of a batch, in the batch's order

# The batches of a trial's first epoch that are fingerprinted; the reference at 0 workers keeps as many.
FINGERPRINT_BATCHES = 32
# Batches the reference is first built from, in the kernel's process, before any worker starts.
REFERENCE_BATCHES = 4
# Up to this many bytes of a tensor are hashed whole; past it, evenly spaced elements of it (and its shape).
HASH_BYTES = 1 << 20
# A setting "repeats" its data when the reference's distinct batches outnumber its own by this factor: k
# workers that each yield everything give k, splitting workers 1.
REPEATS_AT = 1.5
_MAX_DEPTH = 6


def fingerprint(batch: Any) -> Fingerprint:
    """A digest of each tensor and plain value in the batch, walked as the DataLoader collates it."""
    digests: list[bytes] = []
    _walk(batch, digests, 0)
    return tuple(digests)


def _walk(value: Any, digests: list[bytes], depth: int) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        digests.append(_tensor_digest(value))
    elif depth < _MAX_DEPTH and isinstance(value, dict):
        for key in value:
            _walk(value[key], digests, depth + 1)
    elif depth < _MAX_DEPTH and isinstance(value, list | tuple) and any(
            isinstance(item, torch.Tensor | list | tuple | dict) for item in value):
        for item in value:
            _walk(item, digests, depth + 1)
    else:  # numbers, strings, lists of them: their repr is their content
        digests.append(hashlib.blake2b(repr(value).encode(), digest_size=16).digest())


def _tensor_digest(tensor: Any) -> bytes:
    import torch

    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr((tuple(tensor.shape), str(tensor.dtype))).encode())
    try:
        flat = tensor.detach().reshape(-1)
        if flat.numel() * flat.element_size() > HASH_BYTES:  # a large tensor: evenly spaced elements of it
            count = HASH_BYTES // flat.element_size()
            flat = flat[:: max(1, flat.numel() // count)][:count]
        digest.update(flat.contiguous().cpu().view(torch.uint8).numpy().tobytes())
    except (RuntimeError, TypeError):  # sparse, quantized or nested tensors: their shape alone
        pass
    return digest.digest()


def repeats(reference: Sequence[Fingerprint], delivered: Sequence[Fingerprint]) -> float | None:
    """How many times each batch came, against the reference (0 workers), over the first batches both have.

    The largest ratio of distinct values over the parts of the batch: 2.0 when two workers each yielded the
    whole stream, 1.0 when they split it. None without evidence: fewer than two batches to compare, batches of
    another shape, or a reference whose batches already repeat.
    """
    count = min(len(reference), len(delivered))
    if count < 2:
        return None
    reference, delivered = reference[:count], delivered[:count]
    parts = len(reference[0])
    if any(len(batch) != parts for batch in (*reference, *delivered)):
        return None
    ratios = []
    for part in range(parts):
        expected = len({batch[part] for batch in reference})
        if expected >= 2:  # a part that does not change between batches says nothing
            ratios.append(expected / len({batch[part] for batch in delivered}))
    return max(ratios) if ratios else None


def repeated(ratio: float | None) -> bool:
    return ratio is not None and ratio >= REPEATS_AT
