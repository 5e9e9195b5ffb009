# Every target builds what it needs; environments are cached under .venv/ and .cache/ (git-ignored).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The engine environment (scripts/build-engine-env.sh): Python 3.12 + SGLang 0.5.23 + amd-mori
# 1.2.4 in one process, like the engine image; the mori, sglang and pod tiers run in it.
ENGINE_PY := .cache/venvs/engine/bin/engine-python
EXAMPLE ?= examples/deepseek-r1-mi355x.yaml

.PHONY: help venv demo test lint test-unit test-mori test-sglang test-pod test-e2e test-chart \
        engine-env pod-node-tools chart-tools router-env bench-router bench-l3 bench-host-pool bench-plan bench-sglang \
        bench-backends bench-ssd bench-ssd-served bench-pod bench-l3-hit bench-rollout bench-reconcile bench-router-load bench-router-memory bench-router-replay bench-sidecar-slots bench-soak bench-trace render-chart crd env-doc clean

help:
	@echo "make demo   - plan an example SGLangHiCache CR and show what the operator would create"
	@echo "make test   - lint + every test tier (unit, mori, sglang, pod, e2e, chart); builds the environments"

$(VENV)/.installed: pyproject.toml scripts/bootstrap-venv.sh
	bash scripts/bootstrap-venv.sh $(VENV)
	@touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m hicache_operator plan -f $(EXAMPLE) -o summary

lint: venv
	$(VENV)/bin/ruff check backend operator tests bench scripts
	$(VENV)/bin/mypy backend/hicache_umbp operator/hicache_operator
	$(VENV)/bin/mypy tests
	$(VENV)/bin/lint-imports

# The environments (downloads, unpacking: network and disk) build while lint and the unit tier
# (CPU) run; their output is shown once both are done. The other tiers then run one at a time.
test: venv
	@mkdir -p .cache
	@( $(MAKE) --no-print-directory -j1 engine-env router-env chart-tools pod-node-tools \
	    > .cache/envs.log 2>&1; echo $$? > .cache/envs.rc ) & \
	  $(MAKE) --no-print-directory -j1 lint test-unit; rc=$$?; wait; \
	  echo "== the environments (built beside lint and the unit tier) =="; cat .cache/envs.log; \
	  [ $$rc -eq 0 ] && [ "$$(cat .cache/envs.rc)" = 0 ]
	$(MAKE) --no-print-directory -j1 test-mori test-sglang test-pod test-e2e test-chart

test-unit: venv
	bash scripts/pytest-tier.sh unit $(PY)

engine-env:
	bash scripts/build-engine-env.sh

test-mori: engine-env
	bash scripts/pytest-tier.sh mori $(ENGINE_PY)

test-sglang: engine-env
	bash scripts/pytest-tier.sh sglang $(ENGINE_PY)

# Needs root (mount namespaces, memory cgroups, hugepage reservation), as CI runs.
test-pod: engine-env pod-node-tools venv router-env chart-tools
	bash scripts/pytest-tier.sh pod $(ENGINE_PY)

pod-node-tools:
	@bash scripts/pod-node-tools.sh

# SGLang's model gateway (smg) and Debian's prometheus/promtool, unpacked under .cache.
router-env:
	@bash scripts/build-router-env.sh

test-e2e: venv router-env chart-tools
	bash scripts/pytest-tier.sh e2e $(PY)

chart-tools: venv
	@bash scripts/build-chart-tools.sh

test-chart: chart-tools router-env
	bash scripts/pytest-tier.sh chart $(PY)

render-chart: chart-tools
	@bash scripts/render-chart.sh

crd: venv
	$(PY) -m hicache_operator crd -o charts/sglang-hicache-operator/crds/sglanghicaches.yaml

# docs/env.md from the env contract's settings table (a unit test fails when it is stale).
env-doc: venv
	$(PY) -m hicache_umbp.contract.envdoc > docs/env.md

bench-l3: engine-env
	$(ENGINE_PY) bench/l3_store.py

bench-host-pool: engine-env
	$(ENGINE_PY) bench/host_pool.py

bench-plan: venv
	$(PY) bench/plan.py

# The trace model on Mooncake's conversation trace, and a slice of it through served CPU pods
# (one pod, then two behind the router; needs root like the pod tier). docs/capacity-planning.md.
bench-trace: venv engine-env pod-node-tools router-env
	$(PY) bench/trace.py --served

bench-sglang: engine-env
	$(ENGINE_PY) bench/sglang_backend.py

# Ours vs SGLang's built-in `mori` backend vs its `file` backend, same stack, same pages.
bench-backends: engine-env
	$(ENGINE_PY) bench/backends.py

# Our SSD tier vs the volume's own O_DIRECT bandwidth, mori's SSD node and SGLang's file
# backend, through SGLang's controller, in one run on one directory (BENCH_SSD_DIR, /var/tmp).
bench-ssd: engine-env
	$(ENGINE_PY) bench/ssd.py

# Storage-hit TTFT from our SSD tier vs cold, after an engine and a whole-pod restart (root).
bench-ssd-served: engine-env pod-node-tools
	$(ENGINE_PY) bench/ssd_served.py

bench-pod: engine-env pod-node-tools
	$(ENGINE_PY) bench/pod.py

# Where the time of one L3 hit goes, and storage-hit TTFT vs cold by prompt length (root).
bench-l3-hit: engine-env pod-node-tools
	$(ENGINE_PY) bench/l3_hit.py

# An engine-only rollout in place vs by replacing the pod, on a served pod with a warm L3 (root).
bench-rollout: engine-env pod-node-tools
	$(ENGINE_PY) bench/rollout.py

bench-reconcile: venv
	$(PY) bench/reconcile.py

# Two served replicas behind the real router: cache_aware vs round_robin vs one replica (root).
bench-router: engine-env router-env
	$(ENGINE_PY) bench/router.py

# The real router in front of stand-in engines that report load: smg's defaults vs the
# planner's load rules, counted per follow-up turn (no root, no engine).
bench-router-load: venv router-env
	$(PY) bench/router_load.py

# Where the real router sends each request of bench-trace's router slice, run after run,
# through the trace model's caches (no root, no engine)
bench-router-replay: engine-env router-env
	$(ENGINE_PY) bench/router_replay.py

bench-router-memory: venv router-env
	$(PY) bench/router_memory.py

bench-sidecar-slots: engine-env
	$(ENGINE_PY) bench/sidecar_slots.py

# Interleaved reads and writes on the real store: acknowledged-then-lost pages (0) and
# throughput, this checkout's data path against the baseline commit's in the same run.
bench-soak: engine-env
	$(ENGINE_PY) bench/soak.py

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
