"""``benchmarks/profiling.py`` sorts a step's device kernels into the kinds the train benchmark
reports (matmuls, attention, the LM head's soft-max, optimizer, compiled element-wise, copies),
by names as the H200 profiles print them, and sums their time per kind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from benchmarks.profiling import (
    busy_fraction,
    device_kernels,
    device_time_by_kind,
    idle_gaps,
    idle_summary,
    kernel_kind,
    top_kernels_by_kind,
)


@pytest.mark.parametrize(
    "name,kind",
    [
        ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        (
            "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, "
            "2, 4, 2, false, false, cutlass::bfloat16_t>>",
            "attention",
        ),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", "attention"),
        ("partial_stats_kernel", "lm_head soft-max"),
        ("logit_grad_kernel", "lm_head soft-max"),
        ("triton_red_fused__to_copy_exp_gather_logsumexp_mul_squeeze_0", "lm_head soft-max"),
        ("triton_poi_fused__to_copy_add_arange_eq_exp_sub_unsqueeze_0", "lm_head soft-max"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
            "optimizer and clipping",
        ),
        ("triton_per_fused__to_copy_mean_mul_pow_rsqrt_0", "compiled element-wise"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", "copies and casts"),
        ("Memcpy HtoD (Pinned -> Device)", "copies and casts"),
        ("void at::native::embedding_backward_feature_kernel<float>", "other"),
    ],
)
def test_kernel_names_map_to_their_kind(name: str, kind: str) -> None:
    assert kernel_kind(name) == kind


def test_device_time_sums_kernels_by_kind_and_ignores_host_events_and_annotations() -> None:
    """A ``record_function`` range also has a device-side span (first to last kernel inside it,
    idle time included): it is neither a kernel nor busy time."""

    def event(
        name: str, start: float, end: float, device: DeviceType = DeviceType.CUDA, annotation: bool = False
    ) -> SimpleNamespace:
        return SimpleNamespace(
            name=name,
            device_type=device,
            time_range=SimpleNamespace(start=start, end=end),
            is_user_annotation=annotation,
        )

    events = [
        event("nvjet_a", 0, 1500),
        event("nvjet_b", 2000, 2500),
        event("flash_fwd_kernel", 2500, 3000),
        event("aten::mm", 0, 9000, DeviceType.CPU),
        event("Optimizer.step#AdamW.step", 0, 8000, annotation=True),
    ]
    assert device_time_by_kind(events) == {"matmul": 2.0, "attention": 0.5}
    assert [e.name for e in device_kernels(events)] == ["nvjet_a", "nvjet_b", "flash_fwd_kernel"]
    assert busy_fraction([(0, 1500), (1000, 2500)], 0, 5000) == pytest.approx(0.5)


def test_top_kernels_by_kind_lists_each_kinds_costliest_names() -> None:
    def kernel(name: str, start: float, end: float) -> SimpleNamespace:
        return SimpleNamespace(
            name=name,
            device_type=DeviceType.CUDA,
            time_range=SimpleNamespace(start=start, end=end),
            is_user_annotation=False,
        )

    events = [
        kernel("nvjet_a", 0, 1000),
        kernel("nvjet_b", 1000, 4000),
        kernel("nvjet_a", 4000, 5000),
        kernel("void at::native::embedding_backward_feature_kernel<float>", 5000, 5500),
    ]
    top = top_kernels_by_kind(events, top=1)
    assert top["matmul"] == [{"kernel": "nvjet_b", "ms": 3.0, "launches": 1}]
    assert top["other"][0]["launches"] == 1 and top["other"][0]["ms"] == 0.5
    assert top_kernels_by_kind(events)["matmul"][1] == {"kernel": "nvjet_a", "ms": 2.0, "launches": 2}


def test_idle_summary_bins_the_gaps_and_places_them_in_the_step() -> None:
    """Kernels at 100-200, 210-300 (a 10 us gap), 400-500 (100 us), 1500-1600 (1 ms); host events
    from 0 to 2000 us: 0.1 ms before the first kernel, 0.4 ms after the last."""

    def event(name: str, start: float, end: float, device: DeviceType = DeviceType.CUDA) -> SimpleNamespace:
        return SimpleNamespace(
            name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), is_user_annotation=False
        )

    events = [
        event("aten::mm", 0, 2000, DeviceType.CPU),
        event("k1", 100, 200),
        event("k2", 210, 300),
        event("k3", 400, 500),
        event("k4", 1500, 1600),
    ]
    idle = idle_summary(events, tenths=2)
    assert idle["lead_ms"] == pytest.approx(0.1) and idle["tail_ms"] == pytest.approx(0.4)
    assert [(b["count"], round(b["ms"], 3)) for b in idle["by_length"]] == [(1, 0.01), (0, 0.0), (1, 0.1), (1, 1.0)]
    # the 1 ms gap (500-1500) straddles the halves at 1000 us
    assert idle["by_tenth_ms"] == pytest.approx([0.01 + 0.1 + 0.5, 0.5])
    assert idle_summary([event("aten::mm", 0, 10, DeviceType.CPU)]) == {}


def test_idle_gaps_lists_the_long_stretches_longest_first_with_the_host_work_meanwhile() -> None:
    def event(name: str, start: float, end: float, device: DeviceType = DeviceType.CUDA) -> SimpleNamespace:
        return SimpleNamespace(
            name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), is_user_annotation=False
        )

    events = [
        event("aten::mm", 0, 3000, DeviceType.CPU),
        event("aten::pin_memory", 600, 1400, DeviceType.CPU),
        event("k1", 0, 100),
        event("k2", 50, 600),
        event("k3", 1400, 1500),
        event("k4", 2100, 2200),
    ]
    rows = idle_gaps(events, min_us=500.0)
    assert [(r["start_ms"], r["ms"]) for r in rows] == [(0.6, 0.8), (1.5, 0.6)]  # k1 and k2 overlap: no gap
    assert rows[0]["host"] == ["aten::mm", "aten::pin_memory"] and rows[1]["host"] == ["aten::mm"]
