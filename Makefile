# Two entry points for a fresh machine (see README.md): `make demo`, `make test`.
# Each creates .venv if needed, installs torch==2.13.0 first when the venv has no
# torch (the CPU wheel; GPU users can pre-install their own build), then placer.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out

.PHONY: demo test install clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,ray]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/placer plan gpt-125m.module --cluster two-sites --method evolution \
		--time-budget 20 -o $(OUT)/gpt-125m.two-sites.plan.json

test: $(VENV)/.installed
	$(PY) -m pytest

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
