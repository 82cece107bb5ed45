"""The roofline's arithmetic over profiler events: FLOPs and bytes from recorded shapes, grouping, the floor."""
import pytest

from conftest import load_script

analyze, markdown, op_cost = (getattr(load_script("roofline"), n) for n in ("analyze", "markdown", "op_cost"))

BF = "c10::BFloat16"


def _op(ext, name, dims, types):
    return {"cat": "cpu_op", "name": name, "args": {"External id": ext, "Input Dims": dims, "Input type": types}}


def _kernel(ext, name, dur):
    return {"cat": "kernel", "name": name, "dur": dur, "args": {"External id": ext}}


def test_gemm_flops_and_bytes_count_the_output_once():
    M, K, N = 4616, 384, 1152
    flops, nbytes = op_cost("aten::addmm", [[N], [M, K], [K, N], [], []], [BF, BF, BF, "Scalar", "Scalar"])
    assert flops == 2 * M * N * K
    assert nbytes == 2 * (N + M * K + K * N + M * N)  # bias, A, B read; C written
    # Inductor's out= form lists C among the arguments: it is not counted twice
    _, listed = op_cost("aten::addmm", [[N], [M, K], [K, N], [], [], [M, N]], [BF, BF, BF, "Scalar", "Scalar", BF])
    assert listed == nbytes
    bflops, _ = op_cost("aten::bmm", [[6, 10, 20], [6, 20, 30]], [BF, BF])
    assert bflops == 2 * 6 * 10 * 30 * 20


def test_attention_flops_and_a_triton_kernels_bytes():
    q = [8, 6, 577, 64]
    flops, nbytes = op_cost("aten::_cudnn_attention_forward", [q, q, q, [], []], [BF, BF, BF, "", "Scalar"])
    assert flops == 2 * 8 * 6 * 577 * 577 * 128
    assert nbytes == 4 * 2 * 8 * 6 * 577 * 64  # q, k, v read, the output written
    assert op_cost("triton_per_fused_layer_norm_0", [[4616, 384], [384], [4616, 384]], [BF, "float", BF]) == \
        (0.0, 2 * 4616 * 384 * 2 + 384 * 4)


def test_analyze_groups_launches_per_forward_and_bounds_each_kernel():
    events = []
    for call in range(2):  # two forwards, each: a GEMM launched twice (two blocks) and a Triton kernel once
        base = 10 * call
        events += [_op(base + 1, "aten::addmm", [[64], [128, 32], [32, 64], [], []], [BF, BF, BF, "Scalar", "Scalar"]),
                   _kernel(base + 1, "nvjet_gemm", 4.0),
                   _op(base + 2, "aten::addmm", [[64], [128, 32], [32, 64], [], []], [BF, BF, BF, "Scalar", "Scalar"]),
                   _kernel(base + 2, "nvjet_gemm", 6.0),
                   _op(base + 3, "triton_poi_fused_add_0", [[128, 64], [128, 64]], [BF, BF]),
                   _kernel(base + 3, "triton_poi_fused_add_0", 2.0),
                   {"cat": "kernel", "name": "Memcpy DtoD", "dur": 50.0, "args": {"External id": base + 4}}]
    r = analyze(events, calls=2, peak_tflops=1e-3, peak_gb_s=1.0)  # tiny ceilings: every floor is measurable
    assert r["kernels_per_forward"] == 3 and r["busy_us"] == pytest.approx(12.0)  # copies are not kernels of the forward
    gemm, add = r["kernels"]
    assert gemm["launches"] == 2 and gemm["us"] == pytest.approx(10.0) and gemm["op"] == "aten::addmm"
    assert gemm["gflop"] == pytest.approx(2 * 2 * 128 * 64 * 32 / 1e9)
    assert gemm["tflops"] == pytest.approx(gemm["gflop"] * 1e9 / 10.0 / 1e6)
    assert add["op"] == "" and add["mb"] == pytest.approx(2 * 128 * 64 * 2 / 1e6) and add["gflop"] == 0
    # floor = max(FLOPs / rate, bytes / bandwidth), in us: 1e-3 TFLOP/s is 1e3 FLOP per us, 1 GB/s is 1e3 bytes per us
    assert gemm["floor_us"] == pytest.approx(max(gemm["gflop"] * 1e9 / 1e3, gemm["mb"] * 1e6 / 1e3))
    assert gemm["bound"] == "compute" and add["bound"] == "memory"
    assert r["floor_us"] == pytest.approx(gemm["floor_us"] + add["floor_us"])
    assert sum(k["share"] for k in r["kernels"]) == pytest.approx(1.0)
    assert r["categories"]["gemm"]["us"] == pytest.approx(10.0)
    r.update(preset="t", dtype="bfloat16", batch=2, queries=8, bucket=8, gpu="X", latency_ms=0.1, back_to_back_ms=0.09,
             ceilings=dict(gemm_tflops=1e-3, copy_gb_s=1.0))
    md = markdown(r)
    assert "| `nvjet_gemm` | aten::addmm 64, 128x32, 32x64 | 2 | 10.0 |" in md


def test_the_command_needs_cuda(monkeypatch):
    import torch

    roofline = load_script("roofline")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        roofline.main(["--out", "unused"])


def test_a_square_gemms_output_is_counted_once_listed_or_not():
    """Operand and output shapes can coincide (n x n times n x n): the output counts once whether or not the
    out= form lists it, never mistaken for an operand."""
    n = 384
    flops, plain = op_cost("aten::mm", [[n, n], [n, n]], [BF, BF])
    assert flops == 2 * n**3 and plain == 3 * 2 * n * n
    _, listed = op_cost("aten::mm", [[n, n], [n, n], [n, n]], [BF, BF, BF])
    assert listed == plain
