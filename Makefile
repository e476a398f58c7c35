# lutra: liblutra.so (C11 core + CPU backend) and the LuaJIT front's generated cdef.
# Honours PREFIX, LIBDIR (where liblutra.so goes; luarocks passes its C module dir), LUADIR
# (where lua/lutra/*.lua goes), CFLAGS and LDFLAGS, as luarocks' "make" build type expects.

PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib/lua/5.1
LUADIR  ?= $(PREFIX)/share/lua/5.1
CC      ?= cc
CFLAGS  ?= -O2 -g
LDFLAGS ?=
LUAJIT  ?= luajit
BUSTED  ?= $(LUAJIT) /usr/bin/busted
BLAS_CFLAGS ?= $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   ?= -lopenblas

LUTRA_CFLAGS = -std=c11 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -D_GNU_SOURCE \
               -Isrc $(BLAS_CFLAGS)
SRC  = $(sort $(wildcard src/*/*.c src/backend/cpu/*.c))
HDRS = $(wildcard src/*.h src/*/*.h src/*/*/*.h)
# the CPU library's sources and flags, for tools/sim_quantize_mx (whatever CUDA is)
SIM_SRC    := $(SRC)
SIM_CFLAGS := $(LUTRA_CFLAGS)
LIBS = $(BLAS_LIBS) -lm -lpthread

comma := ,
# CUDA: on when nvcc and cuBLASLt's header are found (CUDA=0 or CUDA=1 overrides). The kernels
# are built for sm_90 (Hopper) and, where this nvcc knows it, sm_100.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
ifeq ($(origin CUDA),undefined)
  CUDA := $(if $(NVCC),$(if $(wildcard $(CUDA_HOME)/include/cublasLt.h),1,0),0)
endif
ifeq ($(CUDA),1)
  SM100       := $(if $(shell $(NVCC) --list-gpu-arch 2>/dev/null | grep -x compute_100),1)
  CUDA_ARCHS  ?= -gencode arch=compute_90,code=sm_90 \
                 $(if $(SM100),-gencode arch=compute_100$(comma)code=sm_100)
  NVCCFLAGS   ?= -O3 -lineinfo
  SRC         += $(sort $(wildcard src/backend/cuda/*.c))
  CU_SRC       = $(sort $(wildcard kernels/*.cu))
  LUTRA_CFLAGS += -DLUTRA_WITH_CUDA -Ikernels -I$(CUDA_HOME)/include
  LIBS        += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
endif
# objects of CPU-only and CUDA builds differ (-DLUTRA_WITH_CUDA): keep them apart
BUILD = build/$(if $(filter 1,$(CUDA)),cuda,cpu)
OBJ  = $(SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.o)
# build/config changes when the configuration does, so switching CUDA=0/1 relinks the library
$(shell mkdir -p build && (echo 'CUDA=$(CUDA)' | cmp -s - build/config || echo 'CUDA=$(CUDA)' > build/config))
LIB  = liblutra.so
CDEF = lua/lutra/cdef.lua
LUA_FILES = $(filter-out $(CDEF),$(sort $(wildcard lua/lutra/*.lua)))
RUN_ENV = LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUAJIT="$(LUAJIT)"

.PHONY: all test test-asan test-gpu run bench install clean format sim-mx threads-check check-codecs check-activations lab

all: $(LIB) $(CDEF)

$(LIB): $(OBJ) build/config
	$(CC) -shared -Wl,--no-undefined -o $@ $(OBJ) $(LDFLAGS) $(LIBS)

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(LUTRA_CFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh) $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 $(CUDA_ARCHS) $(NVCCFLAGS) -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra \
	  -Werror all-warnings -Ikernels -Isrc -c -o $@ $<

# LuaJIT's cdef is the public header run through the preprocessor with LUTRA_CDEF defined.
$(CDEF): src/lutra.h $(wildcard src/lutra/*.h) tools/gen_cdef.sh
	sh tools/gen_cdef.sh "$(CC)" src/lutra.h > $@.tmp && mv $@.tmp $@

test: all
	$(RUN_ENV) $(BUSTED) --lpath="lua/?.lua;lua/?/init.lua" spec

# The CPU suite against an ASan + UBSan build of the CPU library (its own objects and
# liblutra.so under build/asan). LuaJIT itself is not instrumented, so the ASan runtime is
# preloaded; leak checking is off because LuaJIT's own allocations at exit are not ours.
ASAN_SAN    = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
ASAN_SRC    = $(sort $(wildcard src/*/*.c src/backend/cpu/*.c))
ASAN_OBJ    = $(ASAN_SRC:%.c=build/asan/%.o)
ASAN_LIB    = build/asan/liblutra.so
ASAN_CFLAGS = $(filter-out -DLUTRA_WITH_CUDA -Ikernels -I$(CUDA_HOME)/include,$(LUTRA_CFLAGS))
build/asan/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) -O1 -g $(ASAN_SAN) -c -o $@ $<
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

# the tiled quantizers (kernels/quantize_tile64.cu, quantize_mx16.cu, quantize_block.cu) emulated
# on the CPU (a thread per CUDA thread) against the CPU backend, byte for byte: needs the CUDA
# headers and a C++20 compiler, not a GPU.
# ARGS=quick for the small shapes only.
CXX ?= c++
SIM_OBJ = $(SIM_SRC:%.c=build/sim/%.o)
build/sim/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(SIM_CFLAGS) $(CFLAGS) -c -o $@ $<
SIM_KERNELS = kernels/quantize_tile64.cu kernels/quantize_mx16.cu kernels/quantize_block.cu \
              kernels/quantize_tiles.cuh kernels/common.cuh kernels/ops_common.cuh kernels/kernels.h
build/sim_quantize_mx: tools/sim_quantize_mx.cpp $(SIM_OBJ) $(SIM_KERNELS) $(HDRS)
	$(CXX) -std=c++20 -O1 -Wall -Wextra -Werror -Wno-unknown-pragmas -I$(CUDA_HOME)/include \
	  -Ikernels -Isrc -o $@ $< $(SIM_OBJ) $(BLAS_LIBS) -lm -lpthread
sim-mx: build/sim_quantize_mx
	./build/sim_quantize_mx $(ARGS)

# kernels/activation_math.cuh compiled for the host against the CPU backend's activations, bit
# for bit (both on libm's expf/erff there): needs the CUDA headers, not a GPU.
build/check_activation_math: tools/check_activation_math.cu $(SIM_OBJ) kernels/activation_math.cuh \
                             kernels/ops_common.cuh kernels/kernels.h $(HDRS)
	$(NVCC) -std=c++17 -O1 -Xcompiler -Wall,-Wextra -Werror all-warnings -Ikernels -Isrc \
	  -o $@ $< $(SIM_OBJ) $(BLAS_LIBS) -lm -lpthread
check-activations: build/check_activation_math
	./build/check_activation_math

# Threads training their own models at once against one thread alone, bit for bit, and the
# release of per-thread caches at thread exit (tools/threads_check.c; spec/threads_spec.lua runs
# it on the cpu, spec/gpu/threads_gpu.lua on cuda with LUTRA_GEMM_GRAPHS on and off).
# ARGS=cuda for the GPU.
build/threads_check: tools/threads_check.c src/lutra.h $(LIB)
	@mkdir -p build
	$(CC) -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Isrc -o $@ $< -L. -llutra \
	  -Wl,-rpath,$(CURDIR) -lpthread
threads-check: build/threads_check
	./build/threads_check $(or $(ARGS),cpu)

# src/core/codec.h against CUDA's host conversion functions over every f32 bit pattern and every
# code (tools/check_codecs.cu): needs nvcc, not a GPU. ARGS=STRIDE checks every STRIDE-th pattern.
build/check_codecs: tools/check_codecs.cu src/core/codec.h src/lutra.h
	@mkdir -p build
	$(NVCC) -std=c++17 -O2 -Xcompiler -fopenmp,-Wall,-Wextra -Werror all-warnings -Isrc -o $@ $< -lgomp
check-codecs: build/check_codecs
	./build/check_codecs $(ARGS)

bench: all
	$(RUN_ENV) $(LUAJIT) bench/overhead.lua $(ARGS)

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(LUADIR)/lutra
	install -m 755 $(LIB) $(DESTDIR)$(LIBDIR)/$(LIB)
	install -m 644 $(LUA_FILES) $(CDEF) $(DESTDIR)$(LUADIR)/lutra/

format:
	clang-format -i $(wildcard src/*.h src/*/*.[ch] src/*/*/*.[ch] kernels/*.cu kernels/*.cuh kernels/*.h)

clean:
	rm -rf build $(LIB) $(CDEF) $(CDEF).tmp
