"""Datasheet peaks: dense TFLOP/s per compute format and memory bandwidth, for the GPUs users train on.

Dense means without 2:4 sparsity: NVIDIA's Ampere, Hopper, Ada and Blackwell sheets print Tensor-Core figures
"with sparsity", twice the dense ones. GeForce cards run fp16/bf16 Tensor Cores at half rate when accumulating in
fp32, which is what PyTorch does, so their figures here are the fp32-accumulate ones. Each row names its source.
A figure nobody has checked is None ("peak unknown"), never a neighbour's number: torchtitan falls back to the
A100 for an L4 or T4 and reports an MFU 2.6-4.8x too low (research notes, why-slow.md §4.3).

Pure Python: the device name is matched as text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FP32, TF32, BF16, FP16 = "fp32", "tf32", "bf16", "fp16"


@dataclass(frozen=True)
class DevicePeak:
    name: str                       # as the report shows it
    pattern: str                    # a regular expression on torch.cuda.get_device_name()
    tflops: dict[str, float | None]  # dense TFLOP/s by compute format; None: no such unit, or not checked
    bandwidth_gbs: float            # memory bandwidth, GB/s
    source: str

    def peak_flops(self, compute: str) -> float | None:
        value = self.tflops.get(compute)
        return None if value is None else value * 1e12

    def ridge_point(self, compute: str) -> float | None:
        """FLOPs per byte where an operator turns from memory-bound to compute-bound."""
        peak = self.peak_flops(compute)
        return None if peak is None else peak / (self.bandwidth_gbs * 1e9)


def _tf(fp32: float | None, tf32: float | None, bf16: float | None, fp16: float | None) -> dict[str, float | None]:
    return {FP32: fp32, TF32: tf32, BF16: bf16, FP16: fp16}


# Most specific first: "H100 PCIe" before "H100", "L40S" before "L40", "A10G" and "A100" apart from "A10".
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("H200", r"\bH200\b", _tf(67, 494.5, 989, 989), 4800,
               "NVIDIA H200 datasheet (sparse figures halved); ml-engineering TFLOPS table; torchtitan 989e12"),
    DevicePeak("H100 PCIe", r"\bH100\b.*\bPCIe\b", _tf(51, 378, 756, 756), 2000,
               "NVIDIA H100 datasheet, PCIe column (sparse figures halved); torchtitan 756e12"),
    DevicePeak("H100 SXM", r"\bH100\b", _tf(67, 494.5, 989, 989), 3350,
               "NVIDIA H100 datasheet, SXM column (sparse figures halved); Lightning h100-sxm; Inductor device_info"),
    DevicePeak("B200", r"\bB200\b", _tf(None, 1100, 2250, 2250), 8000,
               "NVIDIA HGX B200 datasheet, per GPU (sparse figures halved); torchtitan 2.25e15"),
    DevicePeak("A100 40GB", r"\bA100\b.*\b40\s?GB\b", _tf(19.5, 156, 312, 312), 1555,
               "NVIDIA A100 datasheet, 40 GB column (sparse figures halved); Lightning a100"),
    DevicePeak("A100 80GB PCIe", r"\bA100\b.*\b80\s?GB\b.*\bPCIe\b|\bA100\b.*\bPCIe\b.*\b80\s?GB\b",
               _tf(19.5, 156, 312, 312), 1935, "NVIDIA A100 datasheet, 80 GB PCIe column (sparse figures halved)"),
    DevicePeak("A100 80GB", r"\bA100\b", _tf(19.5, 156, 312, 312), 2039,
               "NVIDIA A100 datasheet, 80 GB SXM column (sparse figures halved); Inductor dram_bw_gbs=2039"),
    DevicePeak("L40S", r"\bL40S\b", _tf(91.6, 183, 362, 362), 864,
               "NVIDIA L40S datasheet (sparse figures halved); torchtitan 362e12"),
    DevicePeak("L4", r"\bL4\b", _tf(30.3, 60, 121, 121), 300,
               "NVIDIA L4 datasheet (sparse figures halved; torch's Inductor table lists the sparse ones)"),
    DevicePeak("T4", r"\bT4\b", _tf(8.1, None, None, 65), 320,
               "NVIDIA T4 datasheet (mixed fp16/fp32; Turing has no TF32 or bf16 units); Lightning t4"),
    DevicePeak("A10G", r"\bA10G\b", _tf(31.2, 62.5, 125, 125), 600,
               "NVIDIA A10 datasheet (A10G is AWS's variant of the same GA102 part); Lightning a10g"),
    DevicePeak("A10", r"\bA10\b", _tf(31.2, 62.5, 125, 125), 600, "NVIDIA A10 datasheet (sparse figures halved)"),
    DevicePeak("V100", r"\bV100\b", _tf(15.7, None, None, 125), 900,
               "NVIDIA V100 datasheet, SXM2 column (Volta has no TF32 or bf16 units)"),
    DevicePeak("RTX 5090", r"\bRTX 5090\b", _tf(104.8, 104.8, 209.5, 209.5), 1792,
               "NVIDIA RTX Blackwell architecture whitepaper, GeForce RTX 5090 (dense, fp32 accumulate)"),
    DevicePeak("RTX 4090", r"\bRTX 4090\b(?! D)", _tf(82.6, 82.6, 165.2, 165.2), 1008,
               "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (dense, fp32 accumulate)"),
    DevicePeak("RTX 3090", r"\bRTX 3090\b(?! Ti)", _tf(35.6, 35.6, 71, 71), 936,
               "NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090 (dense, fp32 accumulate)"),
)


def find_peak(device_name: str | None) -> DevicePeak | None:
    """The table's row for a CUDA device name such as "NVIDIA H100 80GB HBM3"; None when it has none."""
    if not device_name:
        return None
    for peak in PEAKS:
        if re.search(peak.pattern, device_name, flags=re.IGNORECASE):
            return peak
    return None
