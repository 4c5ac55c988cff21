# The two commands a new user needs (see README): `make demo` runs the main job, `make test` the tests.
# Everything else (the venv, Kafka's and Spark's jars) is set up on first use and reused.

PYTHON ?= python3
VENV := .venv
INSTALLED := $(VENV)/.installed

.PHONY: demo test setup clean-build

setup: $(INSTALLED)

# Re-install whenever the build changes (pyproject.toml, setup.py and the C sources it compiles).
$(INSTALLED): pyproject.toml setup.py $(shell find connector -name '*.c')
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[dev]"
	touch $@

demo: $(INSTALLED)
	$(VENV)/bin/msgindex demo $(ARGS)

test: $(INSTALLED)
	$(VENV)/bin/pytest $(ARGS)

clean-build:
	rm -rf $(VENV) .msgindex
