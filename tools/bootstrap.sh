#!/bin/sh
# Installs the Debian packages lutra needs when they are missing, then runs a make target:
#   sh tools/bootstrap.sh run     # builds and trains the example MLP
#   sh tools/bootstrap.sh test    # builds and runs the specs
#   sh tools/bootstrap.sh test-asan  # the CPU specs under ASan + UBSan (libasan comes with gcc)
#   sh tools/bootstrap.sh lab     # the recipe lab, with gnuplot for its plot
# Nothing is downloaded but Debian packages (and, for the test targets, PyPI's safetensors,
# numpy, onnx and onnxruntime, which the checkpoint interop and ONNX export specs run; make
# fetches the ONNX schema from PyPI's onnx wheel, Makefile: ONNX_VERSION, and a CUDA build
# CUTLASS's headers from PyPI's nvidia-cutlass, CUTLASS_VERSION, through pip). make runs with one job per
# core (nproc) and decides CUDA as it always does: on a machine without a usable GPU (nvidia-smi
# lists none) it builds the CPU backend only; CUDA=1 on the command line builds the kernels
# anyway (CI does, so that they compile on every submission).
set -eu
cd "$(dirname "$0")/.."

packages="gcc make pkg-config luajit libluajit-5.1-dev lua-busted libopenblas-dev libopenmpi-dev openmpi-bin"
# luarocks, LDoc (make doc), lua-argparse (command lines); python3 + pip: the checkpoint interop
# spec's side and CUTLASS's headers
packages="$packages luarocks lua-ldoc lua-argparse python3 python3-pip"
# protobuf-c: the ONNX export writes its models with it (protoc-c compiles PyPI onnx's schema)
packages="$packages protobuf-c-compiler libprotobuf-c-dev"
# the recipe lab plots with gnuplot: sh tools/bootstrap.sh lab
case " $* " in *" lab "*) packages="$packages gnuplot-nox" ;; esac
missing=""
for p in $packages; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  echo "bootstrap: installing$missing"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends $missing ||
    { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends $missing; }
fi

# the checkpoint interop spec (spec/checkpoint_python_spec.lua) reads and writes files with
# Python's safetensors and numpy, from PyPI (safetensors is not packaged by Debian); the ONNX
# export spec (spec/onnx_export_spec.lua) checks and runs its models with PyPI's onnx and
# onnxruntime
case " $* " in
*" test"*)
  if ! python3 -c 'import safetensors, numpy, onnx, onnxruntime' 2>/dev/null; then
    echo "bootstrap: installing safetensors numpy onnx onnxruntime (pip)"
    # into a virtual environment's own packages; else into the user's (~/.local), which pip
    # refuses for a Python its distribution marks externally managed (PEP 668: the
    # EXTERNALLY-MANAGED file in its stdlib folder; Debian 12 on) unless told it is meant
    # (PIP_BREAK_SYSTEM_PACKAGES, which older pips ignore; with --user only ~/.local changes)
    stdlib=$(python3 -c 'import sys, sysconfig
print(sysconfig.get_path("stdlib") if sys.prefix == sys.base_prefix else "")')
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    if [ -z "$stdlib" ]; then
      python3 -m pip install --quiet safetensors numpy onnx onnxruntime
    elif [ -f "$stdlib/EXTERNALLY-MANAGED" ]; then
      PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --user safetensors numpy onnx onnxruntime
    else
      python3 -m pip install --quiet --user safetensors numpy onnx onnxruntime
    fi
  fi
  ;;
esac

exec make -j"$(nproc)" "$@"
