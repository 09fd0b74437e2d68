"""bench_update --profile: kernel names from real H200 profiles land in the group a reader expects."""
from types import SimpleNamespace

import pytest

from tools.bench.bench_update import breakdown, format_breakdown, group_of


@pytest.mark.parametrize("name,group", [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("_decode_attention_split", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>",
     "loss/softmax"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "triton (fused)"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>", "reduction/norm"),
    ("void at::native::index_elementwise_kernel<128, 4>", "copy/cast"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_group_of(name, group):
    assert group_of(name) == group


def test_breakdown_sums_cuda_events_only():
    cuda = SimpleNamespace(device_type="DeviceType.CUDA")
    cpu = SimpleNamespace(device_type="DeviceType.CPU")
    events = [
        SimpleNamespace(key="nvjet_a", self_device_time_total=3000.0, count=2, **vars(cuda)),
        SimpleNamespace(key="sm90_xmma_gemm_b", self_device_time_total=1000.0, count=1, **vars(cuda)),
        SimpleNamespace(key="flash_fwd_kernel", self_device_time_total=500.0, count=4, **vars(cuda)),
        SimpleNamespace(key="aten::mm", self_device_time_total=9999.0, count=9, **vars(cpu)),
    ]
    groups = breakdown(events)
    assert list(groups) == ["gemm", "attention"]
    assert groups["gemm"] == dict(seconds=pytest.approx(0.004), launches=3)
    text = format_breakdown(groups, wall_s=0.005)
    assert "gaps 0.5 ms" in text and "88.9%" in text
