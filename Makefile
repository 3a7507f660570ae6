# Two entry points for a fresh machine (see README.md): `make demo`, `make test`.
# Each creates .venv if needed, installs torch==2.13.0 first when the venv has no
# torch (the CPU wheel; GPU users can pre-install their own build), then placer.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out

.PHONY: demo test install clean postgres

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,ray,postgres]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/placer plan gpt-125m.module --cluster two-sites --method evolution \
		--time-budget 20 -o $(OUT)/gpt-125m.two-sites.plan.json

test: $(VENV)/.installed
	$(PY) -m pytest

# PostgreSQL server binaries for the shared-study tests (tests/postgres_server.py
# starts a throwaway server from them): Debian's package when initdb is found
# neither on PATH nor under /usr/lib/postgresql (apt needs root), told not to
# create (and start) a cluster of its own.
APT := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
postgres:
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		apt-get update -qq && $(APT) postgresql-common && \
		sed -i 's/^#*[[:space:]]*create_main_cluster.*/create_main_cluster = false/' \
			/etc/postgresql-common/createcluster.conf && \
		$(APT) postgresql; }

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
