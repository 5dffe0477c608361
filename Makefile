# The two commands of README.md: `make demo` (set up, then the main job) and `make test`.
VENV ?= .venv

.PHONY: setup demo test bench

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/meta-widget examples/llama_70b.py:config --input 1,4096 --depth 2 --html llama-70b.html

test: setup
	bash scripts/test.sh

bench: setup
	$(VENV)/bin/python benchmarks/analyzer.py
