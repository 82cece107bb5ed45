# make test : create or reuse .venv, install depthpack with its dev extras, run the test suite
# make test-fast : the same without the tests marked slow (the inner loop; CI runs `make test`)
# make demo : the main job end to end on the embedded synthetic data (see README)
# make cross-aarch64 : build deploy_cpp for aarch64 (a Jetson's CPU), run its error paths under qemu
# make fuzz : fuzz the C++ runner's readers with libFuzzer, 60 s per target (deploy_cpp/fuzz/README.md)
# make asan : the C++ runner's tests on an ASan/UBSan build of it (deploy_cpp/fuzz/README.md)
PY       ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
# The tested pair on a CPU-only x86_64 machine (PyPI's torchvision does not import beside the
# CPU-only torch 2.13 wheel, and timm imports torchvision).
TORCH    ?= torch==2.14.1 torchvision==0.29.1
STAMP    := $(VENV)/.depthpack-installed
PYTEST_ARGS ?=

.PHONY: test test-fast demo cross-aarch64 fuzz asan clean

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

test-fast: $(STAMP)
	@$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

# The demo runs on a python that already holds every runtime dependency (a GPU machine's own torch,
# say, where nothing can be installed), else on .venv, made as for the tests. The modules are found,
# not imported: importing them took seconds on every make, the demo's included.
RUNTIME_MODULES := torch torchvision timm numpy cv2 yaml safetensors tqdm h5py matplotlib rosbags
RUNTIME_PY := $(shell $(PY) -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" $(RUNTIME_MODULES) >/dev/null 2>&1 && echo $(PY))
ifneq ($(RUNTIME_PY),)
demo:
	@echo "demo: $(RUNTIME_PY) already holds depthpack's dependencies; running on it (no .venv)"
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(RUNTIME_PY) scripts/demo.py --out runs/demo
else
demo: $(STAMP)
	$(BIN)/python scripts/demo.py --out runs/demo
endif

# Cross-compiles against the aarch64 wheel of the torch pinned above (docs/cross_aarch64.md); needs no .venv.
cross-aarch64:
	DP_CROSS_TORCH="$(firstword $(TORCH))" PYTHON="$(PY)" bash scripts/cross_aarch64.sh

# The readers of deploy_cpp under libFuzzer (clang, ASan, UBSan); FUZZ_SECONDS per target. Needs no .venv.
fuzz:
	bash deploy_cpp/fuzz/run.sh

# depthpack_run and robot_loop built with ASan and UBSan, then tests/deploy/test_cpp_runner.py on them.
asan: $(STAMP)
	PY="$(BIN)/python" bash deploy_cpp/fuzz/asan.sh

clean:
	rm -rf runs build deploy_cpp/build
