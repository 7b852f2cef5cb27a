# aioprof's front door (STYLE.md point 9). `make help` lists the targets.
#
# The extension is built in place (src/aioprof/_core.cpython-3XX-*.so, one file per
# interpreter, so all of them coexist) and tests run with PYTHONPATH=src.
# The sanitizer build goes to build/asan/ so it never clobbers the in-place .so.

SHELL := /bin/bash
.DEFAULT_GOAL := build

PY ?= python3
PYENV_ROOT ?= $(HOME)/.pyenv
# The newest installed patch release of each minor version (pyenv), else tools/bin/pythonX.Y
# (tools/python: 3.14, 3.15, 3.14-dbg from Debian sid, see docs/interpreters.md), else
# pythonX.Y on PATH.
pyenv_python = $(or $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python))),$(wildcard tools/bin/python$(1)),python$(1))
# tools/python's interpreters get their packages from their Debian root file system, not pip
# (Debian's uvloop is built for 3.14 only: the uvloop tests skip on 3.15).
sid_python = $(findstring tools/bin/,$(1))
SID_TEST_CHECK = $(BUILD_CHECK); import pytest, hypothesis
# PY=python3.12 means pyenv's 3.12 even where `pyenv global` puts no python3.12 on PATH.
PYTHON = $(if $(filter python3.%,$(PY)),$(call pyenv_python,$(patsubst python%,%,$(PY))),$(PY))
# 3.14 and 3.15 through tools/python (Debian sid, set up on first use: docs/interpreters.md).
PY_VERSIONS ?= 3.10 3.11 3.12 3.13 3.14 3.15
PYTHONS ?= $(foreach v,$(PY_VERSIONS),$(call pyenv_python,$(v)))
# ASan and valgrind run on one interpreter each, to stay fast. valgrind uses 3.10, the one
# on which CPython itself is clean under memcheck (see tools/valgrind.supp for why not 3.11+).
ASAN_PY ?= $(call pyenv_python,3.11)
VALGRIND_PY ?= $(call pyenv_python,3.10)
# The debug build (Py_DEBUG) of `make debug`.
DEBUG_PY ?= tools/bin/python3.14-dbg

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_ROOT_USER_ACTION := ignore
PIP_INSTALL = $(1) -m pip install --quiet --upgrade-strategy only-if-needed
BUILD_DEPS := "setuptools>=61" wheel
# The pip test dependencies, pinned to versions that install on 3.10-3.13 (tests/real/ needs
# the servers and clients it runs).
TEST_DEPS := -r tests/requirements.txt
# Checked first, so that `make deps` costs one import when everything is there.
BUILD_CHECK := import setuptools, wheel; assert int(setuptools.__version__.split(".")[0]) >= 61
TEST_CHECK := $(BUILD_CHECK); import pytest, pytest_rerunfailures, hypothesis, aiohttp, uvloop, \
	fastapi, uvicorn, httpx, websockets, sqlalchemy, greenlet, aiosqlite, asyncpg, anyio, \
	nest_asyncio, django, grpc, prometheus_client, gunicorn

# Extra arguments for every pytest run, e.g. `make test PYTEST_ARGS="-x -k hooks"`.
PYTEST_ARGS ?=
# Extra arguments for bench/run.py, e.g. `make bench BENCH_ARGS="--reps 3"`.
BENCH_ARGS ?=
PYTEST := tools/pytest.sh

ASAN_DIR := build/asan
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -g
LIBASAN = $(shell gcc -print-file-name=libasan.so)
# PYTHONMALLOC=malloc: every object is a malloc block, so ASan sees overflows and
# use-after-free of Python objects too. (log_path is no use here: once the extension loads
# libubsan, reports go to stderr whatever it says; see the asan target.)
ASAN_ENV = LD_PRELOAD=$(LIBASAN) PYTHONMALLOC=malloc PYTHONPATH=$(ASAN_DIR) \
	AIOPROF_SANITIZER=asan \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# What a sanitizer report starts with; `make asan` fails if its output holds one.
SAN_REPORT := ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer

VALGRIND_DIR := build/valgrind
# Reports go to stderr (valgrind keeps its own copy of fd 2, so pytest's capture does not
# hide them) and appear right after the name of the test that caused them (-v).
VALGRIND := valgrind --quiet --error-exitcode=99 --errors-for-leak-kinds=definite \
	--leak-check=full --show-leak-kinds=definite --num-callers=40 \
	--suppressions=tools/valgrind.supp

.PHONY: help build build-all deps deps-all build-deps test test-py test-real test-asyncio test-suites \
	test-micropython asan valgrind debug lint bench demo install-check clean

help:
	@echo "make build         build aioprof._core in place for PY (default python3)"
	@echo "make build-all     build in place for every interpreter in PYTHONS"
	@echo "make deps          pip install the test dependencies into PY"
	@echo "make deps-all      the same for every interpreter in PYTHONS"
	@echo "make test          setup (apt, pip), then build and pytest on each of PYTHONS, asan, valgrind"
	@echo "make test-py       pytest (minus 'bench' tests) on PY only; tests/real/ included"
	@echo "make test-real     only tests/real/ (real servers and clients under aioprof) on PY"
	@echo "make test-asyncio  CPython's test_asyncio under aioprof on PY (SAMPLE_MS=1: sampling)"
	@echo "make test-micropython  the MicroPython port's tests (micropython/, tools/micropython), pytest on PY"
	@echo "make test-suites   uvloop's, anyio's, pytest-asyncio's, aiohttp's suites under aioprof on PY (SUITES=...)"
	@echo "make asan          '-m sanitize' tests against an ASan+UBSan build ($(ASAN_PY))"
	@echo "make valgrind      '-m sanitize' tests under valgrind memcheck ($(VALGRIND_PY))"
	@echo "make debug         '-m sanitize' tests, reference leaks included, on a debug build ($(DEBUG_PY))"
	@echo "make lint          cppcheck on src/aioprof/_core"
	@echo "make bench         bench/run.py (peers from bench/requirements.txt installed first)"
	@echo "make demo          profile examples/webserver.py"
	@echo "make install-check 'pip install .' with and without build isolation, into /tmp"
	@echo "make clean         remove build products"
	@echo "PYTHONS = $(PYTHONS)"

# --- dependencies -----------------------------------------------------------------

build-deps:
	@$(PYTHON) -c '$(BUILD_CHECK)' 2>/dev/null || $(if $(call sid_python,$(PYTHON)),$(PYTHON) -c '$(BUILD_CHECK)',$(call PIP_INSTALL,$(PYTHON)) $(BUILD_DEPS))

deps:
	@$(PYTHON) -c '$(TEST_CHECK)' 2>/dev/null || $(if $(call sid_python,$(PYTHON)),$(PYTHON) -c '$(SID_TEST_CHECK)',$(call PIP_INSTALL,$(PYTHON)) $(BUILD_DEPS) $(TEST_DEPS))

deps-all:
	@set -e; for p in $(PYTHONS); do $(MAKE) --no-print-directory deps PY=$$p; done

# --- build --------------------------------------------------------------------------

build: build-deps
	$(PYTHON) setup.py --quiet build_ext --inplace

build-all:
	@set -e; for p in $(PYTHONS); do $(MAKE) --no-print-directory build PY=$$p; done

# --- tests --------------------------------------------------------------------------

# The whole suite: see tools/test-all.sh for the steps and the summary it prints.
test:
	@PYTHONS="$(PYTHONS)" tools/test-all.sh

# tests/real must run every program on pyenv's interpreters; on 3.14/3.15 (Debian sid, no
# PyPI wheels there; tools/python installs Debian's packages of the programs) a program
# whose package Debian lacks for that version skips (docs/testing.md).
test-py: build
	@PYTHONPATH=src $(if $(call sid_python,$(PYTHON)),AIOPROF_REQUIRE_REAL=) $(PYTEST) py$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
		$(PYTHON) -m pytest -m "not bench" $(PYTEST_ARGS)

test-real: build
	@PYTHONPATH=src $(PYTEST) real$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
		$(PYTHON) -m pytest tests/real $(PYTEST_ARGS)

# CPython's own test_asyncio with aioprof started in every process (tests/suites/).
SAMPLE_MS ?= 0
test-asyncio: build
	@timeout --kill-after=30 $${PYTEST_TIMEOUT:-1200} $(PYTHON) tests/suites/run_stdlib.py --interval $(SAMPLE_MS)

# The MicroPython port (micropython/): pytest on PY drives tools/micropython (Debian sid's
# micropython, set up on first use like 3.14); a micropython that cannot run fails here.
test-micropython: build
	@AIOPROF_REQUIRE_MICROPYTHON=1 PYTHONPATH=src $(PYTEST) micropython $(PYTHON) -m pytest \
		tests/micropython/micropython_checks.py -p no:cacheprovider $(PYTEST_ARGS)

# Libraries' own test suites with aioprof started in every process (tests/suites/run_suites.py;
# fetched into build/suites/ on first use). tools/test-all.sh picks one interpreter per suite.
SUITES ?= uvloop anyio pytest-asyncio aiohttp
test-suites: build
	@set -e; for s in $(SUITES); do timeout --kill-after=30 $${PYTEST_TIMEOUT:-900} \
		$(PYTHON) tests/suites/run_suites.py $$s --interval $(SAMPLE_MS); done

# Copy the pure-Python package next to the ASan .so, so that `import aioprof._core` under
# PYTHONPATH=build/asan finds the ASan build and never the in-place one in src/.
# --capture=sys: pytest must not swallow, in its fd-level capture, the report that a
# sanitizer writes to fd 2 just before it aborts the process; -v puts it after the name
# of the test that caused it. The output is also kept in
# build/asan/pytest.log and searched for reports (a subprocess's report that its test
# printed but did not fail on counts too).
asan: PY := $(ASAN_PY)
asan: build-deps
	rm -rf $(ASAN_DIR)/aioprof
	mkdir -p $(ASAN_DIR)
	tar -C src --exclude='*.so' --exclude=__pycache__ -cf - aioprof | tar -C $(ASAN_DIR) -xf -
	AIOPROF_CFLAGS="$(SAN_FLAGS)" AIOPROF_LDFLAGS="$(SAN_FLAGS)" $(PYTHON) setup.py --quiet \
		build_ext --force --build-lib $(ASAN_DIR) --build-temp $(ASAN_DIR)/tmp
	@ldd $(ASAN_DIR)/aioprof/_core.*.so | grep -q libasan || \
		{ echo "asan: $(ASAN_DIR)/aioprof/_core is not linked with libasan" >&2; exit 1; }
	@$(ASAN_ENV) $(PYTHON) -c 'import sys, aioprof._core as c; \
		sys.exit(0 if "/$(ASAN_DIR)/" in c.__file__ else "asan: imported " + c.__file__)'
	@set -o pipefail; rc=0; \
	$(PYTEST) asan env $(ASAN_ENV) $(PYTHON) -m pytest -m sanitize -p no:cacheprovider \
		--capture=sys -v $(PYTEST_ARGS) 2>&1 | tee $(ASAN_DIR)/pytest.log || rc=$$?; \
	if grep -qE '$(SAN_REPORT)' $(ASAN_DIR)/pytest.log; then \
		echo "asan: sanitizer report in the output above (also in $(ASAN_DIR)/pytest.log)" >&2; \
		[ $$rc -ne 0 ] || rc=1; fi; \
	exit $$rc

# The in-place build of $(VALGRIND_PY); PYTHONMALLOC=malloc so memcheck sees every object.
# Fails on valgrind's exit code 99 and, to be sure, on any valgrind line in the output.
valgrind: PY := $(VALGRIND_PY)
valgrind: build
	@command -v valgrind >/dev/null || { echo "valgrind: not installed" >&2; exit 1; }
	@mkdir -p $(VALGRIND_DIR)
	@set -o pipefail; rc=0; \
	PYTHONPATH=src PYTHONMALLOC=malloc AIOPROF_SANITIZER=valgrind PYTEST_TIMEOUT=1500 \
		$(PYTEST) valgrind $(VALGRIND) $(PYTHON) -m pytest -m sanitize -p no:cacheprovider -v \
		$(PYTEST_ARGS) 2>&1 | tee $(VALGRIND_DIR)/pytest.log || rc=$$?; \
	if grep -qE '^==[0-9]+== ' $(VALGRIND_DIR)/pytest.log; then \
		echo "valgrind: memcheck errors in the output above (also in $(VALGRIND_DIR)/pytest.log)" >&2; \
		[ $$rc -ne 0 ] || rc=1; fi; \
	exit $$rc

# The in-place build for the debug interpreter (src/aioprof/_core.cpython-314d-*.so, next to
# the release build's): CPython's assertions and aioprof's own (no NDEBUG there) are on, and
# tests/unit/test_refleaks.py must run, not skip (AIOPROF_REQUIRE_DEBUG). A debug CPython
# also loads a release build's .so: the check makes sure it imported its own.
debug: PY := $(DEBUG_PY)
debug: build
	@PYTHONPATH=src $(PYTHON) -c 'import sys, sysconfig, aioprof._core as c; \
		sys.exit(0 if hasattr(sys, "gettotalrefcount") and c.__file__.endswith(sysconfig.get_config_var("EXT_SUFFIX")) \
		else "debug: %s is not a debug build, or imported %s" % (sys.executable, c.__file__))'
	@PYTHONPATH=src AIOPROF_REQUIRE_DEBUG=1 AIOPROF_REQUIRE_REAL= $(PYTEST) debug \
		$(PYTHON) -m pytest -m sanitize -p no:cacheprovider $(PYTEST_ARGS)

# --- other --------------------------------------------------------------------------

CPPCHECK := cppcheck --std=c11 --library=python --quiet --error-exitcode=1 --inline-suppr \
	--enable=warning,style,performance,portability \
	--suppress=missingIncludeSystem --suppress=unusedFunction --suppress=constParameter \
	--template='{file}:{line}: {severity} ({id}): {message}'

lint:
	@command -v cppcheck >/dev/null || tools/install-deps.sh --apt cppcheck
	$(CPPCHECK) -I src/aioprof/_core src/aioprof/_core

# run.py skips a peer profiler that is not installed, so a failed install is not fatal.
bench: build
	@$(call PIP_INSTALL,$(PYTHON)) -r bench/requirements.txt || \
		echo "bench: some of bench/requirements.txt did not install" >&2
	PYTHONPATH=src $(PYTHON) bench/run.py $(BENCH_ARGS)

demo: build
	@$(PYTHON) -c 'import aiohttp' 2>/dev/null || $(call PIP_INSTALL,$(PYTHON)) aiohttp
	PYTHONPATH=src $(PYTHON) -m aioprof examples/webserver.py

install-check:
	tools/install-check.sh $(PYTHON)

clean:
	rm -rf build dist src/*.egg-info .pytest_cache .hypothesis
	rm -f src/aioprof/*.so
	find src tests bench examples -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
