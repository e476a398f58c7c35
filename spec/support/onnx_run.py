"""Runs an ONNX model lutra exported (spec/onnx_export_spec.lua): onnx's checker on the file
(full_check: types and shapes inferred through every node), then ONNX Runtime (CPU) on the f32
input in INPUT (raw little-endian, reshaped to the dims given), the output written raw to OUTPUT.
Prints the model's metadata ("meta key=value"), its operators ("ops A,B,...") and the output's
shape ("shape d0,d1"): the spec asserts on them and on the values.
    python3 spec/support/onnx_run.py MODEL INPUT OUTPUT d0 [d1 ...]"""
import sys

import numpy as np
import onnx
import onnxruntime as ort

model_path, in_path, out_path = sys.argv[1:4]
dims = [int(d) for d in sys.argv[4:]]
model = onnx.load(model_path)
onnx.checker.check_model(model, full_check=True)
for p in model.metadata_props:
    print(f"meta {p.key}={p.value}")
print("ops " + ",".join(sorted({n.op_type for n in model.graph.node})))
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
x = np.fromfile(in_path, dtype="<f4").reshape(dims)
(y,) = sess.run(None, {sess.get_inputs()[0].name: x})
print("shape " + ",".join(str(d) for d in y.shape))
y.astype("<f4").tofile(out_path)
