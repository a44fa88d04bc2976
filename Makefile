# pagedkv — set-up and checks. `make test` and `make demo` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU build of torch (already on disk on our machines); users with a GPU keep their own build.
TORCH_PIN ?= torch==2.13.0

.PHONY: install test check lint typecheck pytest pytest-slow crosshair bench bench-simulator bench-vllm-v1 bench-sglang vllm-v1-tests sglang-tests fuzz verify demo mutate gpu-check conform-vllm conform-vllm-v1 conform-vllm-offload conform-sglang clean sweep-ray-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check impl spec stateful tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# Two tiers of tests, split by cost as Hypothesis's own suite is (tests/README.md): the
# fast tier (make test: every layer, every machine, every check that is not a long search)
# and the slow tier (make check: the tests marked slow: the planted-bug searches, the
# conformance kit's end-to-end runs, the python -O batteries, the larger cross-checks),
# each at its full search budget. .ci/run runs both.
# Bytecode first: the suite starts many Python processes (the workers, each replay of a
# program in a fresh interpreter, the CLI's), and where PYTHONDONTWRITEBYTECODE is set (as
# on our machines) each would compile every project module it imports from source again
# (measured: about 5 % of the suite's time, 20-30 CPU s).
PYTEST := $(BIN)/python -m pytest -q -n auto --maxschedchunk 2
pytest: $(STAMP)
	$(BIN)/python -m compileall -q impl spec stateful tests benchmarks
	$(PYTEST) -m "not slow"

pytest-slow: $(STAMP)
	$(BIN)/python -m compileall -q impl spec stateful tests benchmarks
	$(PYTEST) -m slow

crosshair: $(STAMP)
	$(BIN)/python -m pagedkv_spec.check

test: lint typecheck pytest crosshair

check: pytest-slow

# CrossHair over every contract of the spec, with a deeper budget (CPU s per condition).
VERIFY_TIMEOUT ?= 60
verify: $(STAMP)
	$(BIN)/python -m pagedkv_spec.check --all --timeout $(VERIFY_TIMEOUT)

# A long HypoFuzz campaign over the machines on all cores, with a shared example database
# (README; docs/assurance.md). FUZZ_ARGS e.g. "--machines manager,kv --workers 2", or
# "--target mypkg:factory --level manager" to fuzz the conformance kit against your own.
DURATION ?= 10m
FUZZ_ARGS ?=
fuzz: $(STAMP)
	$(BIN)/python -m pagedkv_stateful.fuzz --duration $(DURATION) $(FUZZ_ARGS)

# Benchmarks: each figure beside a floor of the same run; the offload tier's also beside
# vLLM 0.34.0's CPU offloading manager and offloading connector once extracted to
# $(VLLM_OFFLOAD_DIR) and $(VLLM_OFFLOAD_CONNECTOR_DIR) (make conform-vllm-offload does), as
# the ratio vLLM / pagedkv.
VLLM_OFFLOAD_CONNECTOR_DIR ?= build/vllm-offload-connector-0.34.0
bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_allocator
	$(BIN)/python -m benchmarks.bench_v1
	$(BIN)/python -m benchmarks.bench_offload \
	  $$(test -f $(VLLM_OFFLOAD_DIR)/pagedkv-wheel.json && echo --vllm $(VLLM_OFFLOAD_DIR))
	$(BIN)/python -m benchmarks.bench_radix
	$(BIN)/python -m benchmarks.bench_offload_worker --threads 1
	$(BIN)/python -m benchmarks.bench_offload_connector \
	  $$(test -f $(VLLM_OFFLOAD_CONNECTOR_DIR)/pagedkv-wheel.json && echo --vllm $(VLLM_OFFLOAD_CONNECTOR_DIR))

# The simulator on an hour of the Azure conversation trace at Llama-3.1-8B's H100 cache
# (benchmarks/bench_simulator.py; reads ../shared/data when present, else the sample).
bench-simulator: $(STAMP)
	$(BIN)/python -m benchmarks.bench_simulator

# The demo installs only what it needs: pagedkv with the `demo` extra (torch, CPU build,
# for the toy KV backing; matplotlib for the plot), not the dev tools. Writes demo.png.
DEMO_STAMP := $(VENV)/.demo-installed
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m pagedkv simulate --preset overload --plot demo.png

# pagedkv sweep --executor ray: installs ray into the venv (the `ray` extra), starts a
# local Ray cluster of 2 worker CPUs, runs a small sweep as Ray tasks and the same sweep
# on local processes, stops the cluster (also after a failure) and checks that the CSVs
# agree but for wall time (benchmarks/sweep_ray_check.py). Not part of `make test`: ray
# is large (about 20 s here once ray is installed, most of it Ray's start and stop).
sweep-ray-check: $(STAMP)
	$(BIN)/python -m pip install -q 'ray>=2.9'
	PYTHONPATH=$(CURDIR)/impl:$(CURDIR)/spec:$(CURDIR)/stateful $(BIN)/python -m benchmarks.sweep_ray_check

# On a machine with CUDA: the @pytest.mark.cuda tests and the KV swap/copy benchmark, with
# the offload tier's store and load jobs through its worker (GB/s beside raw contiguous
# copies and the pinned PCIe bandwidth of the same run), one
# table, within --budget-s (default 8 minutes). Without CUDA it says so and exits 0. Not
# part of `make test`. Needs a CUDA build of torch in the venv (TORCH_PIN=torch==X+cuY
# with your index, or an existing venv); e.g. GPU_CHECK_ARGS="--json gpu-check.json".
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# The conformance kit on vLLM 0.6.3's own block layer, all four levels (docs/conformance.md;
# what it finds: docs/findings.md).
# Downloads the vllm 0.6.3 wheel once (pip --no-deps, about 190 MB, into $(VLLM_WHEELS)),
# copies only its pure-Python block-layer modules to $(VLLM_DIR) beside small stand-ins of
# pagedkv's own (pagedkv_stateful/engines/vllm063.py), and runs `pagedkv conform` at each level
# with the shipped factories, under python and under python -O (vLLM's asserts off);
# reports go to $(VLLM_DIR)/conform-LEVEL[-O].json too. Not part of `make test` (about 10
# minutes on 2 cores; needs the network once). Then every printed
# program is replayed in a fresh process (without PAGEDKV_VLLM_DIR: each program sets up
# its own import path). Exit 0 when every level ran, whatever it found (vLLM's findings
# are the point), and every program reproduced (failed at its last statement with its
# check); else 1 (2: setup error).
VLLM_WHEELS ?= build/wheels
VLLM_DIR    ?= build/vllm-0.6.3
CONFORM_VLLM_ARGS ?= --max-violations 100 --max-examples 1500
conform-vllm: $(STAMP)
	ls $(VLLM_WHEELS)/vllm-0.6.3-*.whl >/dev/null 2>&1 || \
	  $(BIN)/python -m pip download -q --no-deps vllm==0.6.3 -d $(VLLM_WHEELS)
	$(BIN)/python -m pagedkv_stateful.vllm063 extract $$(ls $(VLLM_WHEELS)/vllm-0.6.3-*.whl | head -1) $(VLLM_DIR)
	for opt in "" -O; do for level in allocator manager caching caching-manager; do \
	  PAGEDKV_VLLM_DIR=$(VLLM_DIR) $(BIN)/python $$opt -m pagedkv conform \
	    pagedkv_stateful.vllm063:$$(echo $$level | tr - _) \
	    --level $$level --json $(VLLM_DIR)/conform-$$level$$opt.json $(CONFORM_VLLM_ARGS); \
	  rc=$$?; [ $$rc -le 1 ] || exit $$rc; \
	done; done
	$(BIN)/python -m pagedkv_stateful.vllm063 replay $(VLLM_DIR)/conform-*.json

# pagedkv.v1 beside vLLM's own V1 KV cache manager, in one process (benchmarks/bench_v1.py).
# Downloads the vllm 0.34.0 wheel once (pip --no-deps, about 240 MB, into $(VLLM_WHEELS)),
# copies its V1 KV-cache files to $(VLLM_V1_DIR) beside pagedkv's stand-ins
# (pagedkv_stateful/engines/vllm_v1.py), checks the loaded code against pagedkv's (hashes, events,
# a shared prefix: tests/vllm_v1_wheel_checks.py) and times both on the same workloads.
# Needs the network once.
VLLM_V1_RELEASE ?= 0.34.0
VLLM_V1_DIR     ?= build/vllm-v1-$(VLLM_V1_RELEASE)
bench-vllm-v1: $(STAMP)
	ls $(VLLM_WHEELS)/vllm-$(VLLM_V1_RELEASE)-*.whl >/dev/null 2>&1 || \
	  $(BIN)/python -m pip download -q --no-deps vllm==$(VLLM_V1_RELEASE) -d $(VLLM_WHEELS)
	$(BIN)/python -m pagedkv_stateful.vllm_v1 extract \
	  $$(ls $(VLLM_WHEELS)/vllm-$(VLLM_V1_RELEASE)-*.whl | head -1) $(VLLM_V1_DIR)
	$(BIN)/python -m pytest -q tests/vllm_v1_wheel_checks.py
	$(BIN)/python -m benchmarks.bench_v1 --vllm $(VLLM_V1_DIR)

# vLLM's own KV-cache-manager unit tests (tests/v1/core: test_prefix_caching.py,
# test_kv_cache_utils.py, test_single_type_kv_cache_manager.py,
# test_prompt_block_hash_vectors.py) run unchanged against pagedkv.v1 through a module
# shim (pagedkv_stateful/engines/vllm_v1_shim.py; docs/findings.md). Fetches the test files
# once from the release's sdist (pip download, about 50 MB; vLLM is not built) into
# $(VLLM_V1_TESTS_DIR), their small pure dependencies into its deps/, then prints passed,
# out of scope per reason and the in-scope failures, each matched against the documented
# differences. Exit 0 iff every in-scope failure is documented. Not part of `make test`
# (one to two minutes on 2 cores; needs the network once). VLLM_V1_TESTS_ARGS: more pytest
# arguments, e.g. "-k prefill".
VLLM_V1_TESTS_DIR  ?= build/vllm-v1-tests-$(VLLM_V1_RELEASE)
VLLM_V1_TESTS_ARGS ?=
vllm-v1-tests: $(STAMP)
	test -f $(VLLM_V1_TESTS_DIR)/pagedkv-fetched-release.txt || \
	  $(BIN)/python -m pagedkv_stateful.vllm_v1_tests fetch $(VLLM_V1_TESTS_DIR) \
	    --release $(VLLM_V1_RELEASE)
	$(BIN)/python -m pagedkv_stateful.vllm_v1_tests run $(VLLM_V1_TESTS_DIR) $(VLLM_V1_TESTS_ARGS)

# The conformance kit's V1 levels against vLLM's own KVCacheManager and BlockPool, per release
# (docs/conformance.md): each wheel downloaded once (pip --no-deps, 240-340 MB, into
# $(VLLM_WHEELS)), its V1 KV-cache files extracted to build/vllm-v1-RELEASE beside
# pagedkv's stand-ins, then `pagedkv conform pagedkv_stateful.vllm_v1:manager --level v1`
# and `pagedkv_stateful.vllm_v1:pool --level v1-pool` under python and python -O: one
# report per release, level and run, text and JSON in
# $(CONFORM_VLLM_V1_DIR) (each printed as it goes), then every finding's program replayed
# in a fresh process. Findings exit 1 per run and are kept; a usage error stops.
VLLM_V1_RELEASES     ?= 0.34.0 0.33.0 0.27.1
CONFORM_VLLM_V1_DIR  ?= build/conform-vllm-v1
CONFORM_VLLM_V1_ARGS ?= --max-violations 8
conform-vllm-v1: $(STAMP)
	mkdir -p $(CONFORM_VLLM_V1_DIR)
	for release in $(VLLM_V1_RELEASES); do \
	  ls $(VLLM_WHEELS)/vllm-$$release-*.whl >/dev/null 2>&1 || \
	    $(BIN)/python -m pip download -q --no-deps vllm==$$release -d $(VLLM_WHEELS) || exit 2; \
	  $(BIN)/python -m pagedkv_stateful.vllm_v1 extract \
	    $$(ls $(VLLM_WHEELS)/vllm-$$release-*.whl | head -1) build/vllm-v1-$$release || exit 2; \
	  for opt in "" -O; do for level in v1 v1-pool; do \
	    out=$(CONFORM_VLLM_V1_DIR)/$$level-$$release$$opt; \
	    factory=$$([ $$level = v1 ] && echo manager || echo pool); \
	    PAGEDKV_VLLM_V1_DIR=build/vllm-v1-$$release $(BIN)/python $$opt -m pagedkv conform \
	      pagedkv_stateful.vllm_v1:$$factory --level $$level $(CONFORM_VLLM_V1_ARGS) \
	      --json $$out.json > $$out.txt; \
	    rc=$$?; cat $$out.txt; [ $$rc -le 1 ] || exit $$rc; \
	  done; done; \
	done
	$(BIN)/python -m pagedkv_stateful.vllm_v1 replay $(CONFORM_VLLM_V1_DIR)/*.json

# The conformance kit's v1-offload level against vLLM's own CPU offloading manager, per
# release, per policy (docs/conformance.md): each wheel downloaded once (pip --no-deps, 240-340
# MB, into $(VLLM_WHEELS)), its offloading files extracted to build/vllm-offload-RELEASE beside
# pagedkv's stand-ins (pagedkv_stateful/engines/vllm_offload.py), checked against the release's
# own code (tests/vllm_offload_wheel_checks.py), then `pagedkv conform
# pagedkv_stateful.engines.vllm_offload:manager_POLICY --level v1-offload` under python and
# python -O: one report per release, policy and run, text and JSON in
# $(CONFORM_VLLM_OFFLOAD_DIR) (each printed as it goes), then every finding's program replayed
# in a fresh process. Findings exit 1 per run and are kept; a usage error stops. Not part of
# `make test` (a few minutes per release on 2 cores; needs the network once). Beside it, each
# release's offloading connector (scheduler side) over its KV cache manager and CPU manager
# is extracted to build/vllm-offload-connector-RELEASE
# (pagedkv_stateful/engines/vllm_offload_connector.py; needs msgspec, the dev extra), played
# by hand (tests/vllm_offload_connector_wheel_checks.py), then run at the kit's
# v1-offload-connector level (`pagedkv conform
# pagedkv_stateful.engines.vllm_offload_connector:connector_target`, python and python -O:
# reports connector-RELEASE[-O] in the same directory, replayed with the others).
VLLM_OFFLOAD_RELEASES     ?= 0.34.0 0.33.0 0.29.0 0.27.1
# the release `make bench` times pagedkv.v1.offload beside, once extracted here
VLLM_OFFLOAD_DIR          ?= build/vllm-offload-0.34.0
CONFORM_VLLM_OFFLOAD_DIR  ?= build/conform-vllm-offload
CONFORM_VLLM_OFFLOAD_ARGS ?= --max-violations 8
conform-vllm-offload: $(STAMP)
	mkdir -p $(CONFORM_VLLM_OFFLOAD_DIR)
	for release in $(VLLM_OFFLOAD_RELEASES); do \
	  ls $(VLLM_WHEELS)/vllm-$$release-*.whl >/dev/null 2>&1 || \
	    $(BIN)/python -m pip download -q --no-deps --only-binary :all: vllm==$$release \
	      -d $(VLLM_WHEELS) || exit 2; \
	  $(BIN)/python -m pagedkv_stateful.engines.vllm_offload extract \
	    $$(ls $(VLLM_WHEELS)/vllm-$$release-*.whl | head -1) build/vllm-offload-$$release || exit 2; \
	  $(BIN)/python -m pagedkv_stateful.engines.vllm_offload_connector extract \
	    $$(ls $(VLLM_WHEELS)/vllm-$$release-*.whl | head -1) \
	    build/vllm-offload-connector-$$release || exit 2; \
	done
	$(BIN)/python -m pytest -q tests/vllm_offload_wheel_checks.py
	$(BIN)/python -m pytest -q tests/vllm_offload_connector_wheel_checks.py
	for release in $(VLLM_OFFLOAD_RELEASES); do \
	  for opt in "" -O; do for policy in lru arc; do \
	    out=$(CONFORM_VLLM_OFFLOAD_DIR)/$$policy-$$release$$opt; \
	    PAGEDKV_VLLM_OFFLOAD_DIR=build/vllm-offload-$$release $(BIN)/python $$opt -m pagedkv conform \
	      pagedkv_stateful.engines.vllm_offload:manager_$$policy --level v1-offload \
	      $(CONFORM_VLLM_OFFLOAD_ARGS) --json $$out.json > $$out.txt; \
	    rc=$$?; cat $$out.txt; [ $$rc -le 1 ] || exit $$rc; \
	  done; done; \
	done
	for release in $(VLLM_OFFLOAD_RELEASES); do for opt in "" -O; do \
	  out=$(CONFORM_VLLM_OFFLOAD_DIR)/connector-$$release$$opt; \
	  PAGEDKV_VLLM_OFFLOAD_CONNECTOR_DIR=build/vllm-offload-connector-$$release \
	  $(BIN)/python $$opt -m pagedkv conform \
	    pagedkv_stateful.engines.vllm_offload_connector:connector_target \
	    --level v1-offload-connector $(CONFORM_VLLM_OFFLOAD_ARGS) --json $$out.json > $$out.txt; \
	  rc=$$?; cat $$out.txt; [ $$rc -le 1 ] || exit $$rc; \
	done; done
	$(BIN)/python -m pagedkv_stateful.engines.vllm_offload replay $(CONFORM_VLLM_OFFLOAD_DIR)/*.json
# SGLang's own radix-cache and allocator unit tests (test/registered/unit/mem_cache/
# test_radix_cache_unit.py, test_allocator_cpu.py: in no wheel or sdist) run unchanged
# against pagedkv.radix through a module shim (pagedkv_stateful/engines/sglang_shim.py;
# docs/findings.md). Fetches the files once from GitHub at pinned commits
# (pagedkv_stateful/engines/sglang_tests.py) into $(SGLANG_TESTS_DIR), then prints passed,
# out of scope per reason and the in-scope failures, each matched against the documented
# differences. Exit 0 iff every in-scope failure is documented. Not part of `make test`.
SGLANG_TESTS_DIR  ?= build/sglang-tests
SGLANG_TESTS_ARGS ?=
sglang-tests: $(STAMP)
	test -f $(SGLANG_TESTS_DIR)/pagedkv-fetched.txt || \
	  $(BIN)/python -m pagedkv_stateful.engines.sglang_tests fetch $(SGLANG_TESTS_DIR)
	$(BIN)/python -m pagedkv_stateful.engines.sglang_tests run $(SGLANG_TESTS_DIR) $(SGLANG_TESTS_ARGS)

# SGLang's own classic radix cache (RadixCache + PagedTokenToKVPoolAllocator + ReqToTokenPool),
# per release (docs/conformance.md; what it finds: docs/findings.md): each wheel downloaded
# once (pip --no-deps, 8-40 MB, into $(VLLM_WHEELS)), its radix-cache files extracted to
# build/sglang-RELEASE beside pagedkv's stand-ins (pagedkv_stateful/engines/sglang.py), the
# loaded code checked (tests/sglang_wheel_checks.py), then `pagedkv conform
# pagedkv_stateful.engines.sglang:radix_target --level radix` under python and python -O:
# one report per release and run, text and JSON in $(CONFORM_SGLANG_DIR), then every
# finding's program replayed in a fresh process. Findings exit 1 per run and are kept; a
# usage error stops. Not part of `make test` (needs the network once).
SGLANG_RELEASES    ?= 0.5.12 0.5.18 0.5.23
CONFORM_SGLANG_DIR ?= build/conform-sglang
CONFORM_SGLANG_ARGS ?= --max-violations 8
conform-sglang: $(STAMP)
	mkdir -p $(CONFORM_SGLANG_DIR)
	for release in $(SGLANG_RELEASES); do \
	  ls $(VLLM_WHEELS)/sglang-$$release-*.whl >/dev/null 2>&1 || \
	    $(BIN)/python -m pip download -q --no-deps --only-binary :all: sglang==$$release \
	      -d $(VLLM_WHEELS) || exit 2; \
	  $(BIN)/python -m pagedkv_stateful.engines.sglang extract \
	    $$(ls $(VLLM_WHEELS)/sglang-$$release-*.whl | head -1) build/sglang-$$release || exit 2; \
	done
	PAGEDKV_WHEEL_DIR=$(VLLM_WHEELS) $(BIN)/python -m pytest -q tests/sglang_wheel_checks.py
	for release in $(SGLANG_RELEASES); do for opt in "" -O; do \
	  out=$(CONFORM_SGLANG_DIR)/radix-$$release$$opt; \
	  PAGEDKV_SGLANG_DIR=build/sglang-$$release $(BIN)/python $$opt -m pagedkv conform \
	    pagedkv_stateful.engines.sglang:radix_target --level radix $(CONFORM_SGLANG_ARGS) \
	    --json $$out.json > $$out.txt; \
	  rc=$$?; cat $$out.txt; [ $$rc -le 1 ] || exit $$rc; \
	done; done
	$(BIN)/python -m pagedkv_stateful.engines.sglang replay $(CONFORM_SGLANG_DIR)/*.json

# pagedkv.radix beside SGLang 0.5.23's classic radix tree, in one process
# (benchmarks/bench_radix_sglang.py: evict at 40,000 leaves, a 4,096-token hit, a decode
# step's inserts for 256 requests). Downloads the sglang wheel once (about 40 MB).
SGLANG_BENCH_RELEASE ?= 0.5.23
bench-sglang: $(STAMP)
	ls $(VLLM_WHEELS)/sglang-$(SGLANG_BENCH_RELEASE)-*.whl >/dev/null 2>&1 || \
	  $(BIN)/python -m pip download -q --no-deps --only-binary :all: \
	    sglang==$(SGLANG_BENCH_RELEASE) -d $(VLLM_WHEELS)
	$(BIN)/python -m pagedkv_stateful.engines.sglang extract \
	  $$(ls $(VLLM_WHEELS)/sglang-$(SGLANG_BENCH_RELEASE)-*.whl | head -1) \
	  build/sglang-$(SGLANG_BENCH_RELEASE)
	$(BIN)/python -m benchmarks.bench_radix_sglang --sglang build/sglang-$(SGLANG_BENCH_RELEASE)

# Mutation testing of the allocator, manager, KV-engine and scheduler layers
# (docs/mutation.md); not part of `make test` (an hour or more on 2 cores). mutmut
# 3.8.1 names a mutant after its path relative to the working directory, so it runs
# in $(MUTATE_DIR) (build/NAME), where links make impl/pagedkv look like ./pagedkv. Always a fresh run: mutmut keeps old verdicts of
# surviving mutants even after new tests are added. Fails below MUTATE_MIN percent.
MUTATE_DIR  ?= build/mutmut
MUTATE_JOBS ?= 2
MUTATE_MIN  ?= 95
# Mutant name patterns to run (default: all), e.g. MUTATE_ONLY="'pagedkv.kv.cache*' 'pagedkv.kv.kv_*'";
# the score then counts those mutants only.
MUTATE_ONLY ?=
mutate: $(STAMP)
	rm -rf $(MUTATE_DIR) && mkdir -p $(MUTATE_DIR)
	ln -s ../../impl/pagedkv ../../spec/pagedkv_spec ../../stateful/pagedkv_stateful \
	  ../../tests ../../benchmarks ../../setup.cfg ../../pyproject.toml $(MUTATE_DIR)/
	printf '%s\n' '# Written by make mutate: unit tests first, then the planted-bug searches, the' \
	  '# machines last (mutmut runs -x, so a mutant a unit test kills costs no search).' \
	  'def pytest_collection_modifyitems(items):' \
	  '    items.sort(key=lambda item: ("_machine.py" in item.nodeid, "invariant_registry" in item.nodeid))' > $(MUTATE_DIR)/conftest.py
	cd $(MUTATE_DIR) && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 CI=true HYPOTHESIS_PROFILE=mutate \
	  $(CURDIR)/$(BIN)/mutmut run --max-children $(MUTATE_JOBS) $(MUTATE_ONLY)
	cd $(MUTATE_DIR) && $(CURDIR)/$(BIN)/mutmut results --all=true | grep -v ': not checked$$' | awk -v min=$(MUTATE_MIN) ' \
	  { key = $$1; sub(/:$$/, "", key); mod = key; sub(/\.x(_|ǁ).*/, "", mod); \
	    st = $$2; for (i = 3; i <= NF; i++) st = st " " $$i; \
	    tot[mod]++; all++; \
	    if (st == "timeout") { slow[mod]++; slows++ } \
	    if (st == "killed" || st == "timeout") { hit[mod]++; kills++ } \
	    else print "not killed (" st "): " key } \
	  END { for (m in tot) printf "%-28s %4d / %4d killed  %5.1f %%  (%d timed out)\n", m, hit[m], tot[m], 100 * hit[m] / tot[m], slow[m]; \
	    printf "%-28s %4d / %4d killed  %5.1f %%  (%d timed out; killed = failed or timed out)\n", "TOTAL", kills, all, 100 * kills / all, slows; \
	    if (100 * kills < min * all) { printf "mutation score below %s %%\n", min; exit 1 } }'

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
