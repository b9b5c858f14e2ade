"""What this project knows of accelerator cards: their bf16 dense peaks, by name (no TensorFlow).

The peaks are the vendors' dense tensor-core figures, without sparsity, in TFLOP/s: model FLOPs
utilisation (MFU) divides by them. The first card whose name is part of the device's counts, so
the PCIe and NVL H100s come before the SXM one.
"""

from __future__ import annotations

BF16_PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0),
                    ("L4", 121.0))


def bf16_peak_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of the card named `device_name` (as the driver names it), or None.

    >>> bf16_peak_tflops("NVIDIA H100 80GB HBM3"), bf16_peak_tflops("NVIDIA H100 PCIe"), bf16_peak_tflops("CPU")
    (989.0, 756.0, None)
    """
    return next((peak for card, peak in BF16_PEAK_TFLOPS if card in device_name), None)
