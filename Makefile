# ftune — build, test, benchmark.
#   make            library (build/libftune.a: exports only ftune_*), the ftune command
#                   (build/ftune, linked against it) and the tests (against build/libftune-internal.a)
#   make demo       the main job: LoRA fine-tune of SmolLM2-135M-Instruct (GGUF) on GSM8K, answers before and after
#   make test       build and run the whole test suite (tests/run.sh)
#   make debug      the same binaries with AddressSanitizer + UBSan in build-debug/
#   make fuzz       libFuzzer targets: safetensors, GGUF, tokenizer.json, config.json, the dataset readers, trainer_state.json (clang)
#   make bench      benchmarks; writes BENCHMARKS.md
#   make bench-dist data-parallel training over 1/2/4 MPI ranks, ZeRO 0/1 (a Markdown table)
#   make bench-gemm the matrix products alone: peaks, ours vs oneDNN (DNNL=1) vs PyTorch
#   make bench-real prefill and decode of the two real GGUF models (scripts/fetch_models.sh)
#   make bench-levels LoRA training steps at each bf16 kernel level (amx, avx512bf16) vs PyTorch bf16
#   make clean
# Options: BUILD=dir  CC=compiler  OPT="-O2 ..."  MPI=auto|1|0 (data-parallel training over
#          Open MPI; auto: 1 when mpicc is found; 0: a one-rank build without MPI)

CC      ?= gcc
BUILD   ?= build
OPT     ?= -O2 -g
WARN    := -Wall -Wextra -Wno-unused-parameter -Wshadow=local -Wvla -Wno-format-truncation -Wno-missing-field-initializers
# -Wno-psabi: gcc notes that passing __m512 by value changed ABI in gcc 4.6; it
# only concerns static inline vector helpers that never cross a library boundary
WARN    += -Wno-psabi
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -pthread -Iinclude -Isrc $(EXTRA_CFLAGS)
# Only what ftune.h marks FTUNE_API is visible outside the library; -MMD -MP
# writes each object's header dependencies next to it (included at the end).
LIB_CFLAGS := -fvisibility=hidden
DEPFLAGS := -MMD -MP
# No BLAS and no OpenMP: every matrix product runs on ftune's own kernels
# (src/cpu/kernels*.c) and every parallel loop on its own thread pool
# (src/core/parallel.c), so -t bounds every thread and nothing depends on a BLAS
# library recognising the CPU.
LDLIBS  := -lpcre2-8 -lcjson -lm -lpthread
LDFLAGS += -pthread $(EXTRA_LDFLAGS)

# MPI: src/dist/ has two implementations of one interface (dist.h); the
# build takes dist_mpi.c with mpicc's flags, or dist_one.c (one rank).
MPI ?= auto
ifeq ($(MPI),auto)
  override MPI := $(if $(shell command -v mpicc 2>/dev/null),1,0)
endif
ifeq ($(MPI),1)
  MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
  MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
  ifeq ($(MPI_LIBS),)
    $(error MPI=1: `mpicc --showme:link` gave nothing; install Open MPI (libopenmpi-dev) or build with MPI=0)
  endif
  DIST_SKIP := src/dist/dist_one.c
else ifeq ($(MPI),0)
  DIST_SKIP := src/dist/dist_mpi.c
else
  $(error MPI=$(MPI): expected 1, 0 or auto)
endif
$(info ftune: MPI=$(MPI))
LDLIBS  += $(MPI_LIBS)

LIB_SRC   := $(filter-out $(DIST_SKIP),$(sort $(wildcard src/*/*.c)))
LIB_OBJ   := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o)
CLI_SRC   := $(sort $(wildcard tools/*.c))
CLI_OBJ   := $(CLI_SRC:tools/%.c=$(BUILD)/obj/tools/%.o)
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# helpers the test scripts call (not run by themselves)
HELPER_SRC := $(sort $(wildcard tests/helper_*.c))
HELPER_BIN := $(HELPER_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all test debug fuzz bench bench-dist bench-gemm bench-memory bench-real bench-levels clean demo FORCE
all: $(BUILD)/libftune.a $(BUILD)/libftune-internal.a $(BUILD)/ftune $(TEST_BIN) $(HELPER_BIN)

# Objects also depend on this Makefile: its flags (visibility) are part of them.
$(BUILD)/obj/%.o: src/%.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIB_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(BUILD)/obj/dist/dist_mpi.o: CFLAGS += $(MPI_CFLAGS)

# The build's options as a file that changes only when they do, so that
# switching MPI=1/0 relinks the libraries with the other dist object.
$(BUILD)/build-options: FORCE
	@mkdir -p $(BUILD)
	@echo 'MPI=$(MPI)' | cmp -s - $@ || echo 'MPI=$(MPI)' > $@
FORCE:

$(BUILD)/obj/tools/%.o: tools/%.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# The tests reach into the internals: every object as it is.
$(BUILD)/libftune-internal.a: $(LIB_OBJ) $(BUILD)/build-options
	@rm -f $@
	ar rcs $@ $(LIB_OBJ)

# The public library: the objects linked into one (ld -r) whose hidden
# symbols are then made local, so no internal name (gguf_find_tensor, ...)
# can collide with another library's; nm -g shows only ftune_*. link-flags
# records what a program linking it needs after it (tests/cli_symbols.sh).
$(BUILD)/libftune.a: $(LIB_OBJ) $(BUILD)/build-options
	@rm -f $@ $(BUILD)/obj/ftune-public.o
	$(LD) -r -o $(BUILD)/obj/ftune-public.o $(LIB_OBJ)
	objcopy --localize-hidden $(BUILD)/obj/ftune-public.o
	ar rcs $@ $(BUILD)/obj/ftune-public.o
	@echo '$(LDFLAGS) $(LDLIBS)' > $(BUILD)/link-flags

# The command uses nothing but the public header (and its own cli.h).
$(BUILD)/ftune: $(CLI_OBJ) $(BUILD)/libftune.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libftune-internal.a
	@mkdir -p $(dir $@) $(BUILD)/obj/tests
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $(BUILD)/obj/tests/$*.d -o $@ $< $(BUILD)/libftune-internal.a $(LDFLAGS) $(LDLIBS)

FTUNE_DATA ?= ../shared/data
demo: all
	BUILD=$(BUILD) FTUNE_DATA=$(FTUNE_DATA) bash scripts/demo.sh

test: all
	BUILD=$(BUILD) bash tests/run.sh

debug:
	$(MAKE) BUILD=build-debug OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	    EXTRA_LDFLAGS="-fsanitize=address,undefined" all

# one command compiles several sources, so their headers are listed by -MM
FUZZ_DEPS = clang -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -MM -MP -MT $@ $(filter %.c,$^) > $@.d
FUZZ_SRC := src/formats/safetensors.c src/formats/gguf.c src/core/core.c src/core/mem.c src/core/dtype.c src/core/dtype_ggml.c src/core/dtype_dot.c src/data/data.c src/data/chat_template.c src/train/train_state.c
fuzz: build-fuzz/fuzz_safetensors build-fuzz/fuzz_gguf build-fuzz/fuzz_data build-fuzz/fuzz_trainer_state
build-fuzz/fuzz_%: fuzz/fuzz_%.c $(FUZZ_SRC) Makefile
	@mkdir -p build-fuzz
	$(FUZZ_DEPS)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -o $@ $< $(FUZZ_SRC) -lcjson -lm
# the tokenizer.json and config.json parsers (model and tokenizer loading)
FUZZ_TOK_SRC := src/tokenizer/tokenizer.c src/tokenizer/tokenizer_load.c src/tokenizer/nfc.c src/formats/gguf.c src/formats/safetensors.c src/core/core.c src/core/mem.c src/core/dtype.c src/core/dtype_ggml.c src/core/dtype_dot.c
FUZZ_CFG_SRC := src/model/model_config.c src/core/core.c src/core/mem.c
fuzz: build-fuzz/fuzz_tokenizer_json build-fuzz/fuzz_config
build-fuzz/fuzz_tokenizer_json: fuzz/fuzz_tokenizer_json.c $(FUZZ_TOK_SRC) Makefile
	@mkdir -p build-fuzz
	$(FUZZ_DEPS)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -o $@ $< $(FUZZ_TOK_SRC) -lpcre2-8 -lcjson -lm
build-fuzz/fuzz_config: fuzz/fuzz_config.c $(FUZZ_CFG_SRC) Makefile
	@mkdir -p build-fuzz
	$(FUZZ_DEPS)
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -o $@ $< $(FUZZ_CFG_SRC) -lcjson -lm

# (the benchmark's own bandwidth probe uses OpenMP; the library does not)
$(BUILD)/bench_forward: bench/bench_forward.c $(BUILD)/libftune.a
	$(CC) $(CFLAGS) -fopenmp $(DEPFLAGS) -MF $(BUILD)/obj/bench_forward.d -o $@ $< $(BUILD)/libftune.a $(LDFLAGS) -fopenmp $(LDLIBS)

$(BUILD)/bench_train: bench/bench_train.c $(BUILD)/libftune.a
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $(BUILD)/obj/bench_train.d -o $@ $< $(BUILD)/libftune.a $(LDFLAGS) $(LDLIBS)

bench: all $(BUILD)/bench_forward $(BUILD)/bench_train $(BUILD)/bench_gemm
	BUILD=$(BUILD) bash bench/run.sh

# data parallelism: llama-110m full fine-tuning over 1/2/4 MPI ranks, ZeRO 0/1 (bench/dist.sh)
bench-dist: $(BUILD)/ftune
	BUILD=$(BUILD) FTUNE_DATA=$(FTUNE_DATA) bash bench/dist.sh

# the real GGUF models setup.sh fetches: prefill/decode at the best level and avx2 (bench/real_models.sh)
bench-real: $(BUILD)/ftune $(BUILD)/bench_gemm
	BUILD=$(BUILD) FTUNE_DATA=$(FTUNE_DATA) bash bench/real_models.sh

# The GEMM benchmark (peaks, then the Linear/LoRA shapes; internal, so built
# from tests/ against the internal library). DNNL=1 (the default when
# <dnnl.h> is installed: libdnnl-dev) adds oneDNN's bf16 matmul to compare
# with; only this benchmark links it, never the library.
DNNL ?= $(shell echo '\#include <dnnl.h>' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(filter $(DNNL),0 1),)
$(error DNNL must be 0 or 1, not "$(DNNL)")
endif
BENCH_GEMM_DNNL := $(if $(filter 1,$(DNNL)),-DFT_DNNL -fopenmp,)
BENCH_GEMM_DNNL_LIBS := $(if $(filter 1,$(DNNL)),-ldnnl -fopenmp,)
$(BUILD)/bench_gemm: tests/bench_gemm.c $(BUILD)/libftune-internal.a Makefile
	@echo "bench_gemm: DNNL=$(DNNL)"
	$(CC) $(CFLAGS) $(BENCH_GEMM_DNNL) $(DEPFLAGS) -MF $(BUILD)/obj/bench_gemm.d -o $@ $< $(BUILD)/libftune-internal.a $(LDFLAGS) $(BENCH_GEMM_DNNL_LIBS) $(LDLIBS)

# test_amx_state also runs a oneDNN matmul between its tile products where
# oneDNN is installed (oneDNN's AMX kernels end with tilerelease)
$(BUILD)/tests/test_amx_state: tests/test_amx_state.c $(BUILD)/libftune-internal.a Makefile
	@mkdir -p $(dir $@) $(BUILD)/obj/tests
	$(CC) $(CFLAGS) $(BENCH_GEMM_DNNL) $(DEPFLAGS) -MF $(BUILD)/obj/tests/test_amx_state.d -o $@ $< $(BUILD)/libftune-internal.a $(LDFLAGS) $(BENCH_GEMM_DNNL_LIBS) $(LDLIBS)

# LoRA steps at FTUNE_CPU=amx and avx512bf16 against PyTorch bf16, interleaved (bench/levels_train.sh)
bench-levels: $(BUILD)/ftune $(BUILD)/bench_train
	BUILD=$(BUILD) bash bench/levels_train.sh

bench-gemm: $(BUILD)/bench_gemm
	BUILD=$(BUILD) bash bench/gemm.sh

# memory (issue #8): QLoRA of a random llama-2-7b (13.5 GB bf16 made under
# $$TMPDIR and removed) and the cumulative table on llama-3.2-1b (bench/memory.sh)
bench-memory: $(BUILD)/ftune
	FT=$(BUILD)/ftune FTUNE_DATA=$(FTUNE_DATA) bash bench/memory.sh

clean:
	rm -rf build build-debug build-fuzz

-include $(wildcard $(BUILD)/obj/*.d $(BUILD)/obj/*/*.d build-fuzz/*.d)
