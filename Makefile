# The two commands of README.md: `make demo` (set up, then the main job) and `make test`.
VENV ?= .venv

.PHONY: setup demo test bench zoo

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/meta-widget examples/llama_70b.py:config --input 1,4096 --depth 2 --html llama-70b.html

test: setup
	bash scripts/test.sh

bench: setup
	$(VENV)/bin/python benchmarks/analyzer.py

# The model zoo (benchmarks/zoo.py): real architectures run on the CPU and on meta, compared. Its
# own environment: torchvision from PyPI needs torch 2.14.1 (a large CUDA build, run on the CPU),
# not the test environment's CPU torch, so `make test` stays light.
ZOO_VENV ?= .venv-zoo
ZOO_PACKAGES = torch==2.14.1 torchvision==0.29.1 timm diffusers transformers \
	"anywidget>=0.9" "ipywidgets>=8" "pandas>=2" "plotly>=5"

zoo:
	[ -x $(ZOO_VENV)/bin/python ] || python3 -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/python -c "import torchvision, timm, diffusers, transformers" 2>/dev/null \
		|| $(ZOO_VENV)/bin/pip install --quiet $(ZOO_PACKAGES)
	$(ZOO_VENV)/bin/pip install --quiet --no-deps -e .
	$(ZOO_VENV)/bin/python benchmarks/zoo.py --markdown benchmarks/results/zoo.md
