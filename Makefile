# lutra: liblutra.so (C11 core + CPU backend) and the LuaJIT front's generated cdef.
# Honours PREFIX, DESTDIR, LIBDIR (where liblutra.so goes; luarocks passes its C module dir),
# LUADIR (where lua/lutra/*.lua goes), INCLUDEDIR, PKGCONFIGDIR, CFLAGS and LDFLAGS, as
# luarocks' "make" build type expects.

PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
LUADIR  ?= $(PREFIX)/share/lua/5.1
INCLUDEDIR   ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
CC      ?= cc
CFLAGS  ?= -O2 -g
LDFLAGS ?=
LUAJIT  ?= luajit
BUSTED  ?= $(LUAJIT) /usr/bin/busted
BLAS_CFLAGS ?= $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   ?= -lopenblas

LUTRA_CFLAGS = -std=c11 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -D_GNU_SOURCE \
               -Isrc $(BLAS_CFLAGS)
SRC := $(sort $(shell find src -name '*.c' -not -path 'src/backend/cuda/*'))
HDRS = $(wildcard src/*.h src/*/*.h src/*/*/*.h)
# the CPU library's sources and flags, for the native tests' sims (whatever CUDA is)
SIM_SRC    := $(SRC)
SIM_CFLAGS := $(LUTRA_CFLAGS)
LIBS = $(BLAS_LIBS) -lm -lpthread

comma := ,
space := $(subst ,, )
# CUDA: on when nvcc and cuBLASLt's header are found and nvidia-smi lists a GPU (CUDA=0 or CUDA=1
# overrides): with no GPU nothing could run the kernels, which take many minutes to compile, so
# make, make install, luarocks make and tools/bootstrap.sh build the CPU backend alone there (CI
# passes CUDA=1 to compile them anyway). The kernels
# are built for sm_89 (Ada: FP8 conversions and tensor cores, the oldest they run on), sm_90
# (Hopper) and, where this nvcc knows it, sm_100, plus the newest one's PTX, which the driver
# compiles for GPUs after it. No kernel uses Hopper-only features (wgmma, TMA, clusters); the
# GEMMs cuBLASLt has no Ada kernel for (block-scaled FP8) take its BF16 fallback.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
ifeq ($(origin CUDA),undefined)
  GPU_LISTED = $(shell nvidia-smi -L 2>/dev/null | grep '^GPU ')
  CUDA := $(if $(NVCC),$(if $(wildcard $(CUDA_HOME)/include/cublasLt.h),$(if $(GPU_LISTED),1,0),0),0)
endif
ifeq ($(CUDA),1)
  SM100       := $(if $(shell $(NVCC) --list-gpu-arch 2>/dev/null | grep -x compute_100),1)
  PTX_ARCH    := $(if $(SM100),100,90)
  CUDA_ARCHS  ?= -gencode arch=compute_89,code=sm_89 -gencode arch=compute_90,code=sm_90 \
                 $(if $(SM100),-gencode arch=compute_100$(comma)code=sm_100) \
                 -gencode arch=compute_$(PTX_ARCH),code=compute_$(PTX_ARCH)
  NVCCFLAGS   ?= -O3 -lineinfo
  SRC         += $(sort $(shell find src/backend/cuda -name '*.c'))
  CU_SRC       = $(sort $(shell find kernels -name '*.cu'))
  LUTRA_CFLAGS += -DLUTRA_WITH_CUDA -Ikernels -I$(CUDA_HOME)/include
  LIBS        += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
endif
# MPI (process groups, src/parallel/): on when mpicc is found (MPI=0 or MPI=1 overrides); its flags
# come from the wrapper (Open MPI's -showme, MPICH's -compile_info/-link_info). With CUDA too,
# NCCL (which comes with the CUDA toolkit) carries the CUDA collectives.
MPICC ?= $(shell command -v mpicc 2>/dev/null)
ifeq ($(origin MPI),undefined)
  MPI := $(if $(MPICC),1,0)
endif
ifeq ($(MPI),1)
  MPI_CFLAGS ?= $(shell $(MPICC) -showme:compile 2>/dev/null || $(MPICC) -compile_info 2>/dev/null | cut -d' ' -f2- | tr ' ' '\n' | grep '^-I' | tr '\n' ' ')
  MPI_LIBS   ?= $(shell $(MPICC) -showme:link 2>/dev/null || $(MPICC) -link_info 2>/dev/null | cut -d' ' -f2-)
  LUTRA_CFLAGS += -DLUTRA_WITH_MPI $(MPI_CFLAGS)
  LIBS        += $(MPI_LIBS)
  BLAS_LIBS   += $(MPI_LIBS)
  ifeq ($(CUDA),1)
    LIBS += -lnccl
  endif
endif
# cuDNN attention (the only C++ in src/): where cudnn.h is, and the C++ source when it is found
# (its compile rule and cudnn-frontend's headers come after CUTLASS's, below)
PYTHON ?= python3
CUDNN_FE_VERSION ?= 1.32.0
CUDNN_FE_DIR      = build/cudnn-frontend-$(CUDNN_FE_VERSION)
CUDNN_FE_STAMP    = $(CUDNN_FE_DIR)/.unpacked
ifeq ($(CUDA),1)
  # the folders under python3's nvidia namespace (nvidia/cudnn/, or another wheel's layout) that
  # hold FILE: py_nvidia_dirs,SUBFOLDER/FILE
  py_nvidia_dirs = $(shell $(PYTHON) -c "import glob, os, nvidia; print(' '.join(sorted({os.path.dirname(f) for d in nvidia.__path__ for f in glob.glob(os.path.join(d, '*', '$(1)'))})))" 2>/dev/null)
  PY_CUDNN_INCLUDE := $(call py_nvidia_dirs,include/cudnn.h)
  PY_CUDNN_LIB     := $(call py_nvidia_dirs,lib/libcudnn.so.9)
  CUDNN_INCLUDE ?= $(or $(if $(wildcard $(CUDA_HOME)/include/cudnn.h),$(CUDA_HOME)/include),$(firstword $(PY_CUDNN_INCLUDE)))
  CUDNN_FALLBACK_DIRS ?= $(subst $(space),:,$(strip $(PY_CUDNN_LIB) $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib))
  ifneq ($(CUDNN_INCLUDE),)
    $(info cuDNN attention: on, cudnn.h from $(CUDNN_INCLUDE); cudnn-frontend $(CUDNN_FE_VERSION))
    CPP_SRC       = src/backend/cuda/attention_cudnn.cpp src/backend/cuda/attention_cudnn_fp8.cpp
    LUTRA_CFLAGS += -DLUTRA_WITH_CUDNN
    LIBS         += -ldl
  else
    $(info cuDNN attention: off, no cudnn.h in $(CUDA_HOME)/include or python3's nvidia/cudnn/include)
  endif
endif
# objects of CPU-only and CUDA builds differ (-DLUTRA_WITH_CUDA): keep them apart
BUILD = build/$(if $(filter 1,$(CUDA)),cuda,cpu)$(if $(filter 0,$(MPI)),-nompi)
OBJ  = $(SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.o) $(CPP_SRC:%.cpp=$(BUILD)/%.o)
# build/config changes when the configuration does, so switching CUDA=0/1 relinks the library
$(shell mkdir -p build && (echo 'CUDA=$(CUDA) MPI=$(MPI)' | cmp -s - build/config || echo 'CUDA=$(CUDA) MPI=$(MPI)' > build/config))
LIB  = liblutra.so
# the version is src/lutra/version.h's (what lutra_version returns): the installed library is
# liblutra.so.MAJOR.MINOR.PATCH with SONAME liblutra.so.MAJOR (a link of that name sits beside
# liblutra.so in the build tree, for programs linked against it with -L. -llutra)
version_part = $(shell sed -n 's/.*LUTRA_VERSION_$(1) = \([0-9][0-9]*\).*/\1/p' src/lutra/version.h)
VERSION := $(call version_part,MAJOR).$(call version_part,MINOR).$(call version_part,PATCH)
SONAME  := $(LIB).$(call version_part,MAJOR)
CDEF = lua/lutra/cdef.lua
LUA_FILES = $(filter-out $(CDEF),$(sort $(wildcard lua/lutra/*.lua)))
RUN_ENV = LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUAJIT="$(LUAJIT)"

.PHONY: all test test-asan test-gpu run bench bench-dist doc install install-rock clean format sim-mx sim-moe sim-grouped sim-norm sim-rowwise threads-check check-codecs check-activations check-fp4 sim-nvfp4 check-call-graphs

all: $(LIB) $(SONAME) $(CDEF)

$(LIB): $(OBJ) build/config
	$(CC) -shared -Wl,--no-undefined -Wl,-soname,$(SONAME) -o $@ $(OBJ) $(LDFLAGS) $(LIBS)

$(SONAME): $(LIB)
	ln -sf $(LIB) $@

# Every object lists the headers it includes in its .d file (-MMD -MP: written beside it by the
# compiler, an empty rule per header so that a deleted header does not stop the build), so that
# touching a header rebuilds exactly the objects that include it.
DEPFLAGS = -MMD -MP
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(LUTRA_CFLAGS) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

# build/cuda_archs changes with CUDA_ARCHS, so a new architecture list recompiles the kernels
ifeq ($(CUDA),1)
$(shell mkdir -p build && (echo '$(CUDA_ARCHS)' | cmp -s - build/cuda_archs || echo '$(CUDA_ARCHS)' > build/cuda_archs))
endif
$(BUILD)/kernels/%.o: kernels/%.cu $(if $(filter 1,$(CUDA)),build/cuda_archs)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 $(CUDA_ARCHS) $(NVCCFLAGS) -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
	  -Werror all-warnings -Ikernels -Isrc $(DEPFLAGS) -c -o $@ $<

# CUTLASS (headers only) for GroupedLinear's grouped GEMM (kernels/grouped/grouped_gemm_sm90.cu):
# PyPI's nvidia-cutlass wheel at a pinned version, downloaded and unpacked into build/ by the CUDA
# build only; that one object is built for sm_90a alone (the only arch its kernels run on).
CUTLASS_VERSION ?= 4.2.0.0
CUTLASS_DIR      = build/cutlass-$(CUTLASS_VERSION)
CUTLASS_STAMP    = $(CUTLASS_DIR)/.unpacked
$(CUTLASS_STAMP):
	rm -rf $(CUTLASS_DIR) && mkdir -p $(CUTLASS_DIR)/wheel
	$(PYTHON) -m pip download --no-deps --only-binary=:all: nvidia-cutlass==$(CUTLASS_VERSION) \
	  -d $(CUTLASS_DIR)/wheel
	$(PYTHON) -m zipfile -e $(CUTLASS_DIR)/wheel/nvidia_cutlass-$(CUTLASS_VERSION)-py3-none-any.whl \
	  $(CUTLASS_DIR)/wheel/x
	mv $(CUTLASS_DIR)/wheel/x/cutlass_library/source/include $(CUTLASS_DIR)/include
	mv $(CUTLASS_DIR)/wheel/x/cutlass_library/source/tools/util/include $(CUTLASS_DIR)/util
	rm -rf $(CUTLASS_DIR)/wheel
	touch $@
# override: CUDA_ARCHS given on make's command line would otherwise replace this too, and the
# sm_90 build of wgmma code aborts at run time ("Arch conditional MMA instruction used without
# targeting appropriate compute capability")
$(BUILD)/kernels/grouped/grouped_gemm_sm90.o: override CUDA_ARCHS = -gencode arch=compute_90a,code=sm_90a
# NDEBUG as CUTLASS's own release builds: a device assert between wgmma instructions is a call
# that makes ptxas serialize them (its C7510 "Potential Performance Loss")
$(BUILD)/kernels/grouped/grouped_gemm_sm90.o: NVCCFLAGS += --expt-relaxed-constexpr -DNDEBUG \
  -isystem $(CUTLASS_DIR)/include -isystem $(CUTLASS_DIR)/util
$(BUILD)/kernels/grouped/grouped_gemm_sm90.o: | $(CUTLASS_STAMP)

# cuDNN's fused attention (src/backend/cuda/attention_cudnn*.cpp, the only C++ in src/), compiled
# where cudnn.h is found: in CUDA_HOME/include, else in python3's site-packages
# nvidia/cudnn/include (PyTorch's cuDNN), else not at all (the attention entries stay NULL and the
# module refuses on cuda). Nothing links cuDNN: libcudnn.so.9 is opened at the first attention
# plan, from LUTRA_CUDNN_PATH, the loader's search path, then CUDNN_FALLBACK_DIRS (baked in:
# python3's nvidia/cudnn/lib and the CUDA install's library folders). cudnn-frontend's headers:
# PyPI's nvidia-cudnn-frontend at a pinned version, unpacked into build/ as CUTLASS's are (one
# platform's wheel whatever the host: only its headers are used).
CUDNN_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -Werror -fPIC -fvisibility=hidden -D_GNU_SOURCE \
  -DLUTRA_WITH_CUDA -DLUTRA_WITH_CUDNN -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING \
  -DCUDNN_FRONTEND_SKIP_JSON_LIB -DLUTRA_CUDNN_FALLBACK_DIRS='"$(CUDNN_FALLBACK_DIRS)"' \
  -Isrc -Ikernels -isystem $(CUDNN_FE_DIR)/include -isystem $(CUDNN_INCLUDE) \
  -isystem $(CUDA_HOME)/include
$(CUDNN_FE_STAMP):
	rm -rf $(CUDNN_FE_DIR) && mkdir -p $(CUDNN_FE_DIR)/wheel
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 nvidia-cudnn-frontend==$(CUDNN_FE_VERSION) -d $(CUDNN_FE_DIR)/wheel
	$(PYTHON) -m zipfile -e $(CUDNN_FE_DIR)/wheel/nvidia_cudnn_frontend-$(CUDNN_FE_VERSION)-*.whl \
	  $(CUDNN_FE_DIR)/wheel/x
	mv $(CUDNN_FE_DIR)/wheel/x/include $(CUDNN_FE_DIR)/include
	rm -rf $(CUDNN_FE_DIR)/wheel
	touch $@
$(BUILD)/%.o: %.cpp | $(CUDNN_FE_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CUDNN_CXXFLAGS) $(DEPFLAGS) -c -o $@ $<

# ONNX export (src/io/onnx_export.c): the ONNX schema, onnx/onnx.proto (its proto2 variant) from
# PyPI's onnx wheel at a pinned version, compiled by protoc-c (Debian's protobuf-c-compiler) into
# build/onnx-VERSION/; src/io/onnx_pb.c includes the generated onnx.pb-c.c, so that every build
# of the library's sources (this one, ASan's, the sims') compiles it. The library links
# libprotobuf-c (the ASan library and the sims link BLAS_LIBS, so it goes there too). On when
# protoc-c and protobuf-c's header are found (ONNX=0 or ONNX=1 overrides; tools/bootstrap.sh
# installs both): a build without them, or for a machine that cannot reach PyPI, still builds,
# and lutra_export_onnx then refuses, saying so.
ONNX_VERSION ?= 1.17.0
ONNX_DIR      = build/onnx-$(ONNX_VERSION)
ONNX_PB       = $(ONNX_DIR)/onnx.pb-c.h
ONNX_OBJS     = onnx_pb.o onnx_graph.o onnx_export.o
ifeq ($(origin ONNX),undefined)
  ONNX := $(if $(and $(shell command -v protoc-c 2>/dev/null),$(wildcard /usr/include/protobuf-c/protobuf-c.h)),1,0)
endif
ifeq ($(ONNX),1)
LUTRA_CFLAGS += -DLUTRA_WITH_ONNX -I$(ONNX_DIR)
SIM_CFLAGS   += -DLUTRA_WITH_ONNX -I$(ONNX_DIR)
BLAS_LIBS    += -lprotobuf-c
$(ONNX_PB):
	rm -rf $(ONNX_DIR) && mkdir -p $(ONNX_DIR)/wheel
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_17_x86_64 onnx==$(ONNX_VERSION) -d $(ONNX_DIR)/wheel || \
	  { echo "ONNX export needs onnx.proto from PyPI's onnx $(ONNX_VERSION) wheel (above): build with ONNX=0 to leave the export out"; exit 1; }
	$(PYTHON) -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("onnx/onnx.proto"))' \
	  $(ONNX_DIR)/wheel/onnx-$(ONNX_VERSION)-*.whl $(ONNX_DIR)/onnx.proto
	rm -rf $(ONNX_DIR)/wheel
	cd $(ONNX_DIR) && protoc-c --c_out=. onnx.proto
# (the objects that include the generated header, in every build of the library's sources)
$(foreach d,$(BUILD) build/asan build/sim,$(addprefix $(d)/src/io/,$(ONNX_OBJS))): | $(ONNX_PB)
endif
# the policy latency bench beside ONNX Runtime (bench/policy_latency.c, bench/README.md)
build/policy_latency: bench/policy_latency.c $(LIB) $(CDEF)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -Isrc $< -o $@ -L. -llutra -Wl,-rpath,$(CURDIR)

# LuaJIT's cdef is the public header run through the preprocessor with LUTRA_CDEF defined.
$(CDEF): src/lutra.h $(wildcard src/lutra/*.h) tools/gen_cdef.sh
	sh tools/gen_cdef.sh "$(CC)" src/lutra.h > $@.tmp && mv $@.tmp $@

test: all
	$(RUN_ENV) $(BUSTED) --lpath="lua/?.lua;lua/?/init.lua" spec

# The CPU suite against an ASan + UBSan build of the CPU library (its own objects and
# liblutra.so under build/asan). LuaJIT itself is not instrumented, so the ASan runtime is
# preloaded; leak checking is off because LuaJIT's own allocations at exit are not ours.
ASAN_SAN    = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_SRC   := $(sort $(shell find src -name '*.c' -not -path 'src/backend/cuda/*'))
ASAN_OBJ    = $(ASAN_SRC:%.c=build/asan/%.o)
ASAN_LIB    = build/asan/liblutra.so
ASAN_CFLAGS = $(filter-out -DLUTRA_WITH_CUDA -Ikernels -I$(CUDA_HOME)/include,$(LUTRA_CFLAGS))
build/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -O1 -g $(ASAN_SAN) $(DEPFLAGS) -c -o $@ $<
$(ASAN_LIB): $(ASAN_OBJ)
	$(CC) -shared $(ASAN_SAN) -o $@ $(ASAN_OBJ) $(BLAS_LIBS) -lm -lpthread
test-asan: $(ASAN_LIB) $(CDEF)
	$(RUN_ENV) LUTRA_LIB=$(CURDIR)/$(ASAN_LIB) LD_PRELOAD="$$($(CC) -print-file-name=libasan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(BUSTED) --lpath="lua/?.lua;lua/?/init.lua" spec

# The GPU specs (spec/gpu/*_gpu.lua, which `make test` does not pick up): every op on cuda
# against the CPU backend. Needs a CUDA device.
test-gpu: all
	$(RUN_ENV) $(BUSTED) --lpath="lua/?.lua;lua/?/init.lua" --pattern=_gpu spec/gpu

run: all
	$(RUN_ENV) $(LUAJIT) examples/train_mlp.lua $(ARGS)

# The recipe lab (examples/recipe_lab.lua): every recipe of examples/recipes/default.lua (or
# ARGS="--recipes FILE ...") against f32, traces and a plot in lab_out/
lab: all
	$(RUN_ENV) $(LUAJIT) examples/recipe_lab.lua $(ARGS)

# The native tests (spec/native/, host programs that need no GPU; the specs named in each build
# and run them): the kernels emulated on the CPU (a thread per CUDA thread) against the CPU
# backend, byte for byte, and the codecs checked against CUDA's own host conversions. The sims
# need the CUDA headers and a C++20 compiler, the checks nvcc; they share their device model
# (spec/native/sim_harness.h) and the CPU library's objects (build/sim/). Each program's .d file
# lists the kernel files and headers it includes. ARGS=quick for the small shapes only.
CXX ?= c++
NATIVE = spec/native
SIM_OBJ = $(SIM_SRC:%.c=build/sim/%.o)
build/sim/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(SIM_CFLAGS) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<
# a program's dependency file: build/PROGRAM.d, its target the program
NATIVE_DEPFLAGS = $(DEPFLAGS) -MF $@.d -MT $@
# every sim: its spec/native/sim_*.cpp (which includes its kernels) against the CPU library's
# objects: sim-mx (the tiled quantizers: kernels/quantize/cast_transpose*.cu, quantize_block.cu),
# sim-moe (kernels/moe/moe.cu: router, permute, combines), sim-grouped (GroupedLinear's split
# quantization, kernels/grouped/), sim-norm (the norms and the fused norm + FP8 cast,
# kernels/norm/), sim-rowwise (rowwise scaling, kernels/quantize/quantize_rowwise.cu)
build/sim_%: $(NATIVE)/sim_%.cpp $(SIM_OBJ)
	$(CXX) -std=c++20 -O1 -Wall -Wextra -Werror -Wno-unknown-pragmas -I$(CUDA_HOME)/include \
	  -Ikernels -Isrc $(NATIVE_DEPFLAGS) -o $@ $< $(SIM_OBJ) $(BLAS_LIBS) -lm -lpthread
sim-mx: build/sim_quantize_mx
	./build/sim_quantize_mx $(ARGS)
sim-moe: build/sim_moe
	./build/sim_moe $(ARGS)
sim-grouped: build/sim_grouped_quantize
	./build/sim_grouped_quantize
sim-norm: build/sim_norm
	./build/sim_norm $(ARGS)
sim-rowwise: build/sim_rowwise
	./build/sim_rowwise $(ARGS)

# kernels/quantize/quantize_nvfp4.cu's per-thread work (kernels/quantize/nvfp4_math.cuh) run on
# the CPU against the CPU backend byte for byte (spec/native/sim_nvfp4.cu, built as host code by
# nvcc): needs nvcc, not a GPU.
build/sim_nvfp4: $(NATIVE)/sim_nvfp4.cu $(SIM_OBJ)
	$(NVCC) -std=c++17 -O1 -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -Werror all-warnings \
	  -Ikernels -Isrc $(NATIVE_DEPFLAGS) -o $@ $< $(SIM_OBJ) $(BLAS_LIBS) -lm -lpthread
sim-nvfp4: build/sim_nvfp4
	./build/sim_nvfp4

# kernels/activation/activation_math.cuh compiled for the host against the CPU backend's
# activations, bit for bit (both on libm's expf/erff there; spec/native/check_activation_math.cu):
# needs the CUDA headers, not a GPU.
build/check_activation_math: $(NATIVE)/check_activation_math.cu $(SIM_OBJ)
	$(NVCC) -std=c++17 -O1 -Xcompiler -Wall,-Wextra -Werror all-warnings -Ikernels -Isrc \
	  $(NATIVE_DEPFLAGS) -o $@ $< $(SIM_OBJ) $(BLAS_LIBS) -lm -lpthread
check-activations: build/check_activation_math
	./build/check_activation_math

# The call-graph cache (src/backend/cuda/call_graphs.c) against a fake CUDA runtime that replays
# what a capture recorded (spec/native/check_call_graphs.c; spec/call_graphs_spec.lua): needs the
# CUDA headers, not a GPU. spec/native/fake_cuda.h, forced in, renames the cache's CUDA calls
# onto the check's fakes.
build/check_call_graphs: spec/native/check_call_graphs.c spec/native/fake_cuda.h \
                         src/backend/cuda/call_graphs.c src/backend/cuda/cuda_backend.h $(HDRS)
	@mkdir -p build
	$(CC) -std=c11 -O1 -Wall -Wextra -Werror -Isrc -Ikernels -I$(CUDA_HOME)/include \
	  -DLUTRA_WITH_CUDA -DLUTRA_CALL_GRAPHS_CHECK -include spec/native/fake_cuda.h -o $@ \
	  spec/native/check_call_graphs.c src/backend/cuda/call_graphs.c
check-call-graphs: build/check_call_graphs
	./build/check_call_graphs

# Threads training their own models at once against one thread alone, bit for bit, and the
# release of per-thread caches at thread exit (spec/native/threads_check.c; spec/threads_spec.lua
# runs it on the cpu, spec/gpu/threads_gpu.lua on cuda with LUTRA_GEMM_GRAPHS on and off).
# ARGS=cuda for the GPU.
build/threads_check: spec/native/threads_check.c src/lutra.h $(LIB)
	@mkdir -p build
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o $@ $< -L. -llutra \
	  -Wl,-rpath,$(CURDIR) -lpthread
threads-check: build/threads_check
	./build/threads_check $(or $(ARGS),cpu)

# src/core/codec.h against CUDA's host conversion functions over every f32 bit pattern and every
# code (spec/native/check_codecs.cu): needs nvcc, not a GPU. ARGS=STRIDE checks every STRIDE-th
# pattern.
build/check_codecs: $(NATIVE)/check_codecs.cu
	@mkdir -p build
	$(NVCC) -std=c++17 -O2 -Xcompiler -fopenmp,-Wall,-Wextra -Werror all-warnings -Isrc \
	  $(NATIVE_DEPFLAGS) -o $@ $< -lgomp
check-codecs: build/check_codecs
	./build/check_codecs $(ARGS)

# src/core/fp4.h (NVFP4's E2M1 and block scale steps) against cuda_fp4.h / cuda_fp8.h's host
# conversions (spec/native/check_fp4.cpp, built as host code by nvcc): needs nvcc, not a GPU.
# ARGS=STRIDE checks every STRIDE-th f32 pattern (default: all 2^32).
build/check_fp4: $(NATIVE)/check_fp4.cpp
	@mkdir -p build
	$(NVCC) -x cu -std=c++17 -O2 -Xcompiler -fopenmp,-Wall,-Wextra,-Wno-unused-parameter -Werror all-warnings \
	  -Isrc $(NATIVE_DEPFLAGS) -o $@ $< -lgomp
check-fp4: build/check_fp4
	./build/check_fp4 $(ARGS)

# the embedding examples (examples/embed/): plain C against lutra.h, and a host embedding LuaJIT;
# spec/embed_examples_spec.lua builds and runs both on the cpu
EXAMPLE_CFLAGS = -std=c11 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc
examples/embed/frame_loop: examples/embed/frame_loop.c examples/embed/alloc_count.h $(HDRS) $(LIB) $(SONAME)
	$(CC) $(EXAMPLE_CFLAGS) -o $@ $< -L. -llutra -Wl,-rpath,$(CURDIR) -lm
examples/embed/host: examples/embed/host.c $(HDRS) $(LIB) $(SONAME)
	$(CC) $(EXAMPLE_CFLAGS) $(shell pkg-config --cflags luajit) -o $@ $< -L. -llutra \
	  -Wl,-rpath,$(CURDIR) $(shell pkg-config --libs luajit) -lm
# PPO in a frame loop (examples/embed/ppo/; spec/ppo_spec.lua builds and runs it)
PPO_SRCS = $(addprefix examples/embed/ppo/,main.c agent.c ppo.c cartpole.c pendulum.c)
examples/embed/ppo/ppo: $(PPO_SRCS) $(wildcard examples/embed/ppo/*.h) examples/embed/alloc_count.h \
  $(HDRS) $(LIB) $(SONAME)
	$(CC) $(EXAMPLE_CFLAGS) -o $@ $(PPO_SRCS) -L. -llutra -Wl,-rpath,$(CURDIR) -lm

# the Lua API reference from the Lua front's doc comments (LDoc, config.ld) into build/doc;
# warnings are errors (spec/doc_spec.lua checks it builds, holds every file of lua/lutra and
# documents every public function and method)
doc:
	ldoc --fatalwarnings -c config.ld .

bench: all
	$(RUN_ENV) $(LUAJIT) bench/overhead.lua $(ARGS)

# process groups: host time of the parallel Linear beside Linear + collective, collectives per
# step of a 16-layer TP MLP, SP all-gather bytes (bench/dist_overhead.lua; 2 MPI ranks on the cpu)
bench-dist: all
	$(RUN_ENV) OPENBLAS_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --bind-to core -np 2 -x LUA_PATH \
	  $(LUAJIT) bench/dist_overhead.lua $(ARGS)

# the library with its version links, the headers, lutra.pc, and the Lua front; the front's
# lutra/libpath.lua names the installed library (LIBDIR/SONAME), so require("lutra") finds it
# without LUTRA_LIB
install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(LUADIR)/lutra $(DESTDIR)$(INCLUDEDIR)/lutra \
	  $(DESTDIR)$(PKGCONFIGDIR)
	install -m 755 $(LIB) $(DESTDIR)$(LIBDIR)/$(LIB).$(VERSION)
	ln -sf $(LIB).$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/$(LIB)
	install -m 644 src/lutra.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 $(wildcard src/lutra/*.h) $(DESTDIR)$(INCLUDEDIR)/lutra/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	  -e 's|@LUADIR@|$(LUADIR)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@LIBS@|$(LIBS)|' tools/lutra.pc.in \
	  > $(DESTDIR)$(PKGCONFIGDIR)/lutra.pc
	install -m 644 $(LUA_FILES) $(CDEF) $(DESTDIR)$(LUADIR)/lutra/
	printf -- '-- Generated by make install: the installed library.\nreturn "%s"\n' \
	  '$(LIBDIR)/$(SONAME)' > $(DESTDIR)$(LUADIR)/lutra/libpath.lua

# what the rockspec installs (luarocks deploys plain files only, so no links; the front finds
# liblutra.so on luarocks' C path, package.cpath): the library and the Lua front
install-rock: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(LUADIR)/lutra
	install -m 755 $(LIB) $(DESTDIR)$(LIBDIR)/$(LIB)
	install -m 644 $(LUA_FILES) $(CDEF) $(DESTDIR)$(LUADIR)/lutra/

format:
	clang-format -i $(wildcard src/*.h src/*/*.[ch] src/*/*/*.[ch] src/*/*/*.cpp) \
	  $(shell find kernels spec/native -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.cpp')

# the dependency files the compilers wrote (-MMD -MP) for the objects and programs of this build
-include $(OBJ:.o=.d) $(ASAN_OBJ:.o=.d) $(SIM_OBJ:.o=.d) $(wildcard build/sim_*.d build/check_*.d)

clean:
	rm -rf build $(LIB) $(SONAME) $(CDEF) $(CDEF).tmp
