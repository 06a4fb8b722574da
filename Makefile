# Two entry points for a new user: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check types lint java browser setup proto docs manifests clean connect \
	spark-versions dropin

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("pyshuffle needs Python >= 3.11, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# PySpark needs Java 17+: say so, and how to install it, before Spark starts.
java: $(STAMP)
	$(BIN)/python -m pyspark_shuffle.spark.local

demo: java
	$(BIN)/pyshuffle demo --verify

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The status page's test drives a real headless browser: Debian's chromium.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	command -v chromium >/dev/null || $(SUDO) env DEBIAN_FRONTEND=noninteractive sh -c \
		'apt-get install -y -qq chromium || (apt-get update -qq && apt-get install -y -qq chromium)'

# Two pytest processes, each given whole modules (a module's daemons and data are made once):
# about 1.4x faster on 2 cores, the Spark tests' JVMs and daemons waiting much of the time.
PARALLEL := -n 2 --dist loadfile

test: lint java browser
	$(BIN)/pytest $(PARALLEL) --durations=25
	$(MAKE) connect spark-versions

# The drop-in switch's conformance suite (pyspark_shuffle.enable): the same user code run on
# plain Spark and with the switch on, on both services; results, paths and errors compared.
DROPIN_TESTS := $(wildcard tests/integration/test_pyspark_dropin*.py)
dropin: java
	$(BIN)/pytest -q $(PARALLEL) $(DROPIN_TESTS)

# The PySpark operations' tests again from a Spark Connect client (pytest processes of their
# own: a Connect client cannot share a process with a classic session): every operation once (a
# broadcast join among them) and the failures, on the default service (what a Connect client
# does differently is on the client side, the same for either service and store). The variants
# of each operation (test_pyspark_operations.py, test_pyspark_broadcast_join.py) differ in
# data, not in what a Connect client does. The drop-in suite too: the switch wraps a Connect
# client's own classes.
CONNECT_TESTS := $(addprefix tests/integration/test_pyspark_,failures.py every_operation.py) \
	$(DROPIN_TESTS)
connect: java
	TEST_SPARK_SESSION=connect $(BIN)/pytest -q $(PARALLEL) -k netty_like $(CONNECT_TESTS)

# Every operation once and a failure on older Spark releases, on the default service, each in
# a virtual environment of its own (kept, as .venv is, until `make clean`): 3.5, the last 3.x
# (.venv has the newest 4.x; `make spark-versions SPARK_VERSIONS="3.5 4.0"` adds others).
SPARK_VERSIONS ?= 3.5
.venv-spark-%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-spark-$*
	.venv-spark-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-spark-$*/bin/python -m pip install --quiet -e ".[spark,external]" "pyspark==$*.*" \
		pytest pytest-timeout
	touch $@

spark-versions: java $(foreach version,$(SPARK_VERSIONS),.venv-spark-$(version)/.installed)
	for version in $(SPARK_VERSIONS); do \
		.venv-spark-$$version/bin/pytest -q -p no:cacheprovider -k netty_like \
			tests/integration/test_pyspark_every_operation.py || exit 1; \
	done

# The quick loop while working: lint, then every test not marked slow (the unit and
# conformance suites and the quick reliability cases).
check: lint
	$(BIN)/pytest -q -m "not slow" tests/unit tests/conformance tests/reliability

# Every Spark type through every operation on many more generated schemas than CI draws
# (random seeds; TYPE_TEST_EXAMPLES per test and service).
TYPE_TEST_EXAMPLES ?= 200
types: java
	TYPE_TEST_EXAMPLES=$(TYPE_TEST_EXAMPLES) $(BIN)/pytest --timeout=0 tests/integration/test_pyspark_types.py

proto: $(STAMP)
	$(BIN)/python scripts/generate_proto.py

# docs/configuration.md's option tables, from the options' own docs.
docs: $(STAMP)
	$(BIN)/python scripts/generate_config_docs.py

# deploy/kubernetes/: the Helm chart rendered with its defaults.
manifests: $(STAMP)
	$(BIN)/python scripts/render_manifests.py

clean:
	rm -rf $(VENV) .venv-spark-* .mypy_cache .pytest_cache .ruff_cache
