# Stoker: `make run` sets up and runs the default job; `make test` sets up and runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
APT_PACKAGES := libjpeg62-turbo-dev zlib1g-dev prometheus systemd
# prometheus gives promtool and systemd gives systemd-analyze: the tests validate deploy/ with them.
# pillow-simd compiles from source: build it for AVX2 where the CPU has it.
SIMD_CC := $(shell grep -q avx2 /proc/cpuinfo 2>/dev/null && echo "cc -mavx2" || echo cc)

.PHONY: setup run test lint bench soak protos lock clean docs

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.lock Makefile
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# every dependency at the version and hash requirements.lock gives (make lock rewrites it), then Stoker
	CC="$(SIMD_CC)" $(BIN)/pip install -q --require-hashes -r requirements.lock
	CC="$(SIMD_CC)" $(BIN)/pip install -q --no-deps -e .
	# pillow and pillow-simd both install the module PIL and the last one installed wins:
	# if anything pulled in stock pillow, remove it and put pillow-simd back on top.
	if $(BIN)/pip show -q pillow >/dev/null 2>&1; then \
	  $(BIN)/pip uninstall -q -y pillow; \
	  CC="$(SIMD_CC)" $(BIN)/pip install -q --force-reinstall --no-deps pillow-simd==12.1.1.post0; \
	fi
	touch $@

run: setup
	$(BIN)/stoker run --epochs 1 --json run-summary.json

test: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	site=$$(mktemp -d) && $(BIN)/mkdocs build --strict --site-dir $$site; built=$$?; rm -rf $$site; exit $$built
	# two at a time (most tests wait on processes and sockets), a module's tests on one worker; then,
	# alone, the tests whose assertion is a CPU-time rate or a contention verdict (tests/conftest.py)
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not serial"
	$(BIN)/pytest -q -m serial

# the reference pages under docs/ as a static site in site/ (mkdocs.yml)
docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python -m benchmarks all

# each restart-in-place and kill shape 10 times, half beside two busy loops (about 20 minutes)
soak: setup
	$(BIN)/python -m benchmarks soak

protos: setup
	cd stoker/protos && ../../$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. stoker.proto

lock: setup
	$(BIN)/pip-compile -q --generate-hashes --extra accel --extra dev --allow-unsafe --strip-extras --no-emit-index-url \
	  --no-emit-find-links \
	  -o requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) *.egg-info build run-summary.json site
