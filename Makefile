# The two set-up commands (see README): `make demo` and `make test`. Both create .venv, install the
# pinned requirements and build the extension on first use; later runs rebuild incrementally.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CMAKE  := $(VENV)/bin/cmake
JOBS   ?= 2
VENV_ABS := $(abspath $(VENV))

.PHONY: demo test test-slow build ctest pytest clean bench bench-quick

$(STAMP): requirements.txt pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip wheel "setuptools>=64"
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

build: $(STAMP)
	$(CMAKE) --build build/cmake --target _C -j $(JOBS)

demo: build
	$(PY) examples/generate.py

# C unit tests (plain and under ASan + UBSan), then the Python suite.
ctest: $(STAMP)
	$(CMAKE) -S . -B build/c -DNEURON_BUILD_EXTENSION=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build build/c -j $(JOBS)
	cd build/c && $(VENV_ABS)/bin/ctest --output-on-failure
	$(CMAKE) -S . -B build/asan -DNEURON_BUILD_EXTENSION=OFF -DNEURON_SANITIZE=ON >/dev/null
	$(CMAKE) --build build/asan -j $(JOBS)
	cd build/asan && $(VENV_ABS)/bin/ctest --output-on-failure

pytest: build
	$(PY) -m pytest -q tests

# The default suite plus the @pytest.mark.slow variants (more ranks, other dtypes and backends, packaging).
test-slow: build
	RUN_SLOW=1 $(PY) -m pytest -q tests

test: ctest pytest

# Every benchmark, the machine's measured bounds first, into docs/performance.md (run on an otherwise idle
# machine: see the report's note on noise). bench-quick: every benchmark, shorter runs (about 20 minutes).
bench: build
	$(PY) benchmarks/report.py

bench-quick: build
	$(PY) benchmarks/report.py --quick

clean:
	rm -rf build torch_neuronx/_C*.so
