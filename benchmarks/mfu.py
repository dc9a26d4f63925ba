"""Model FLOPs utilisation against two peaks: the measured bf16 matmul rate and the vendor's spec.

The project's MFU figures have always divided by a **measured** peak: 795 TFLOP/s, the bf16 matmul
rate measured on an H200 (issue #4; ``--peak-flops``). Peers quote MFU against the **spec** peak,
the vendor's dense bf16 figure (989 TFLOP/s for an H200), which gives a lower percentage for the
same step. The train benchmarks report both: :func:`spec_peak` looks the device up in
:data:`SPEC_PEAK_TFLOPS` by name (``--peak-tflops`` sets it for a device not in the table), and
:func:`mfu_fields` gives the JSON fields and :func:`mfu_lines` the table rows.
"""

from __future__ import annotations

#: dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by a fragment of ``torch.cuda.get_device_name()``;
#: the first fragment that occurs in the name wins, so the more specific ones come first.
SPEC_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
)
#: the bf16 matmul rate measured on an H200 (issue #4): the denominator of every MFU the project published.
MEASURED_PEAK_FLOPS = 795e12


def spec_peak(device_name: str, peak_tflops: float | None) -> tuple[float | None, str]:
    """(spec peak FLOP/s or None, where it came from): ``peak_tflops`` when given, else the table's
    entry for ``device_name``, else None (a CPU run, or a GPU the table lacks)."""
    if peak_tflops is not None:
        if peak_tflops <= 0:
            raise SystemExit(f"--peak-tflops must be positive, got {peak_tflops}")
        return peak_tflops * 1e12, "--peak-tflops"
    for fragment, tflops in SPEC_PEAK_TFLOPS:
        if fragment in device_name:
            return tflops * 1e12, f"table ({fragment})"
    return None, f"unknown device {device_name!r}: pass --peak-tflops"


def mfu_fields(flops: float, seconds: float, devices: int, peak_flops: float, spec: tuple[float | None, str]) -> dict:
    """JSON fields of MFU against both peaks: ``flops`` done in ``seconds`` on ``devices`` devices.
    ``mfu`` (measured peak) keeps its name and meaning from the earlier JSON files."""
    spec_flops, source = spec
    return {
        "mfu": flops / seconds / (peak_flops * devices),
        "peak_flops": peak_flops,
        "mfu_spec": flops / seconds / (spec_flops * devices) if spec_flops else None,
        "spec_peak_flops": spec_flops,
        "spec_peak_source": source,
    }


def mfu_lines(result: dict) -> list[tuple[str, str]]:
    """Two table rows: MFU against the measured peak and against the spec peak."""
    spec = result["spec_peak_flops"]
    return [
        (f"MFU (measured peak {result['peak_flops'] / 1e12:.0f} TFLOP/s)", f"{100 * result['mfu']:.1f} %"),
        (
            f"MFU (spec peak {spec / 1e12:.0f} TFLOP/s)" if spec else "MFU (spec peak)",
            f"{100 * result['mfu_spec']:.1f} %" if spec else f"n/a ({result['spec_peak_source']})",
        ),
    ]
