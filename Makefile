# make test : create or reuse .venv, install depthpack with its dev extras, run the test suite
# make demo : the main job end to end on the embedded synthetic data (see README)
PY       ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
# The tested pair on a CPU-only x86_64 machine (PyPI's torchvision does not import beside the
# CPU-only torch 2.13 wheel, and timm imports torchvision).
TORCH    ?= torch==2.14.1 torchvision==0.29.1
STAMP    := $(VENV)/.depthpack-installed
PYTEST_ARGS ?=

.PHONY: test demo clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $@

# pytest exits 5 when it collected no test: that is a failure here, never a silent pass.
test: $(STAMP)
	@$(BIN)/python -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

demo: $(STAMP)
	$(BIN)/python -m depthpack.demo --out runs/demo

clean:
	rm -rf runs build deploy_cpp/build
