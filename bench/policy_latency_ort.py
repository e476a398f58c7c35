"""Per-action latency of the 64-64 policy bench/policy_latency.c times in lutra, beside ONNX
Runtime (PyPI onnxruntime) on the same exported file, shapes and input, on the CPU: ORT with
intra_op_num_threads = 1 and inter_op_num_threads = 1 (lutra runs one thread too), sequential
execution, every graph optimization on (its default: MatMul + Add fused into Gemm, weights
prepacked at load).

ORT is timed through its Python binding, so three figures per batch: InferenceSession.run (the
call a Python engine makes), run_with_iobinding with the input and output bound once (the least
a call through the binding can do), and that figure less the same bound call of a one-Identity
model of the same input (the binding's own floor): an estimate of ORT's own work per call, what
its C API would cost. lutra's figures come from the C program, run in turn with ORT's
measurements REPEATS times (the two sides alternate, so that a busy machine slows both alike);
each side reports the median over its rounds (a round's mean per call), and the table gives the
median over the repeats. First checks that ORT's output at batch 64 matches lutra's (y64.bin)
within 1e-4 + 1e-4 |y|.
    make build/policy_latency && python3 bench/policy_latency_ort.py [DIR] [REPEATS]
DIR: where the C program writes policy.onnx, x64.bin and y64.bin (default build)."""
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

OBS, ACT, ROUNDS, WARMUP = 32, 8, 21, 1000
CALLS = {1: 5000, 64: 500}


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


def session(model):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def bound_call(sess, x, out_features):
    binding = sess.io_binding()
    binding.bind_ortvalue_input(sess.get_inputs()[0].name, ort.OrtValue.ortvalue_from_numpy(x))
    out = np.zeros((x.shape[0], out_features), dtype=np.float32)
    binding.bind_ortvalue_output(sess.get_outputs()[0].name, ort.OrtValue.ortvalue_from_numpy(out))
    return lambda: sess.run_with_iobinding(binding)


def identity_model():
    def value(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", OBS])

    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["output"])], "floor",
                              [value("input")], [value("output")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def ort_figures(sess, floor, x64):
    name = sess.get_inputs()[0].name
    fig = {}
    for batch, calls in CALLS.items():
        x = np.ascontiguousarray(x64[:batch])
        feeds = {name: x}
        run = median_us(lambda: sess.run(None, feeds), calls)
        bound = median_us(bound_call(sess, x, ACT), calls)
        empty = median_us(bound_call(floor, x, OBS), calls)
        fig[batch] = (run, bound, bound - empty)
    return fig


def lutra_figures(program, d):
    out = subprocess.run([program, d], check=True, capture_output=True, text=True).stdout
    return {(p != "", int(b)): float(us)
            for p, b, us in re.findall(r"lutra (packed )?batch +(\d+): ([0-9.]+) us", out)}


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "build"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    program = "build/policy_latency"
    lutra_runs = [lutra_figures(program, d)]  # also writes the model and the check's files
    sess, floor = session(f"{d}/policy.onnx"), session(identity_model())
    x64 = np.fromfile(f"{d}/x64.bin", dtype="<f4").reshape(64, OBS)
    y64 = np.fromfile(f"{d}/y64.bin", dtype="<f4").reshape(64, ACT)
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x64})
    err = np.abs(got - y64)
    assert np.all(err <= 1e-4 + 1e-4 * np.abs(y64)), f"ORT differs from lutra by {err.max()}"
    ort_runs = []
    for r in range(repeats):
        ort_runs.append(ort_figures(sess, floor, x64))
        if r + 1 < repeats:
            lutra_runs.append(lutra_figures(program, d))
    print(f"onnxruntime {ort.__version__}, 1 thread each; max |ort - lutra| at batch 64: "
          f"{err.max():.2e}; medians over {repeats} alternating repeats, us per forward")
    print("| batch | lutra (C) | lutra packed (C) | ORT run (Python) | ORT run_with_iobinding "
          "| ORT less binding floor |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in CALLS:
        ours = [statistics.median(f[(packed, batch)] for f in lutra_runs) for packed in (False, True)]
        theirs = [statistics.median(f[batch][i] for f in ort_runs) for i in range(3)]
        print(f"| {batch} | {ours[0]:.2f} | {ours[1]:.2f} | {theirs[0]:.2f} | {theirs[1]:.2f} "
              f"| {theirs[2]:.2f} |")


main()
