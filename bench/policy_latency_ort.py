"""ONNX Runtime's per-action latency on the policy bench/policy_latency.c exported (the same
file, shapes and input), on the CPU: intra_op_num_threads = 1 and inter_op_num_threads = 1 (the
C side runs one thread too), sequential execution, every graph optimization on (ORT's default,
which fuses MatMul + Add into Gemm). Two figures per batch: InferenceSession.run, the call a
Python engine makes, and run_with_iobinding with the input and output bound once to ORT values
(the least work a call through the Python binding can ask for, nearest to what ORT's C API
costs). Method as the C side: warm-up, then 41 rounds, the median of each round's mean.
First checks that ORT's output at batch 64 matches lutra's (y64.bin) within 1e-4 + 1e-4 |y|.
    python3 bench/policy_latency_ort.py [DIR]   # DIR: where policy_latency wrote (build)"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

OBS, ACT, ROUNDS, WARMUP = 32, 8, 41, 2000


def median_us(call, calls):
    for _ in range(WARMUP):
        call()
    t = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        t.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(t)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "build"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(f"{d}/policy.onnx", opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    x64 = np.fromfile(f"{d}/x64.bin", dtype="<f4").reshape(64, OBS)
    y64 = np.fromfile(f"{d}/y64.bin", dtype="<f4").reshape(64, ACT)
    (got,) = sess.run(None, {name: x64})
    err = np.abs(got - y64).max()
    assert np.all(np.abs(got - y64) <= 1e-4 + 1e-4 * np.abs(y64)), f"ORT differs from lutra: {err}"
    print(f"onnxruntime {ort.__version__}, 1 intra-op thread; max |ort - lutra| at batch 64: {err:.2e}")
    for batch, calls in ((1, 20000), (64, 2000)):
        x = np.ascontiguousarray(x64[:batch])
        feeds = {name: x}
        run = median_us(lambda: sess.run(None, feeds), calls)
        binding = sess.io_binding()
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(x))
        binding.bind_ortvalue_output(
            sess.get_outputs()[0].name,
            ort.OrtValue.ortvalue_from_numpy(np.zeros((batch, ACT), dtype=np.float32)))
        bound = median_us(lambda: sess.run_with_iobinding(binding), calls)
        print(f"onnxruntime batch {batch:2d}: run {run:.3f} us, run_with_iobinding {bound:.3f} us "
              f"per forward (median of {ROUNDS} rounds of {calls})")


main()
