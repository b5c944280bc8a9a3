# Everyday commands. `make fit` and `make test` are all a fresh machine needs: each creates .venv
# and installs what it runs. Extra options go through ARGS, e.g.
#   make fit ARGS="--trainer.strategy=ddp --model=configs/model/resnet50.yaml"

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
LOGDIR ?= lightning_logs
# torch_xla pins an older torch than .venv has, so the XLA tests run in an environment of their own.
VENV_XLA ?= .venv-xla
PY_XLA := $(VENV_XLA)/bin/python

.PHONY: fit test test-xla test-slurm test-multinode lint tensorboard clean

# Which build of torch .venv gets. PyPI's, by default: on Linux its CUDA build (about 5.6 GB with its
# nvidia-* wheels), which runs on a CPU too and is what CI installs. TORCH_INDEX names another index to
# take torch and torchvision from first (both from the same one: a CPU torch with PyPI's torchvision fails
# on import), e.g. PyTorch's own CPU builds, about 0.7 GB: make fit TORCH_INDEX=$(CPU_TORCH_INDEX)
TORCH_INDEX ?=
CPU_TORCH_INDEX := https://download.pytorch.org/whl/cpu
# "yes" where a CUDA GPU is seen (nvidia-smi lists one, or a /dev/nvidia0 device exists); empty elsewhere.
HAS_CUDA_GPU ?= $(shell { nvidia-smi -L 2>/dev/null | grep -q GPU || test -e /dev/nvidia0; } && echo yes)
CPU_TORCH_NOTE := note: no CUDA GPU found, so PyPI's CUDA build of torch (about 5.6 GB) is more than this \
	machine needs; the CPU build (about 0.7 GB) installs with: rm -rf $(VENV) && make fit TORCH_INDEX=$(CPU_TORCH_INDEX)

# $(call torch_first,ENV): torch and torchvision from TORCH_INDEX when it is set; without it and without a
# GPU, one line saying how to get the smaller CPU build.
define torch_first
	$(if $(TORCH_INDEX),$(1)/bin/uv pip install --quiet --compile-bytecode --python $(1)/bin/python \
		--index-url $(TORCH_INDEX) torch torchvision,$(if $(HAS_CUDA_GPU),,@echo "$(CPU_TORCH_NOTE)"))
endef

# $(call install,ENV,EXTRAS[,torch_first]): create the virtual environment ENV if needed and install the project with
# EXTRAS into it. uv (put into ENV by pip) does the install: it downloads in parallel and hard-links
# files from its cache, so each CUDA build of torch (6-7 GB) lands in well under a minute and sits on
# the disk once; pip takes minutes and holds every downloaded wheel beside the installed files until
# it ends. --compile-bytecode does what pip does by default: without .pyc files, every process (the
# tests start dozens) compiles torch's and Lightning's sources again where PYTHONDONTWRITEBYTECODE is
# set, 13-16 s instead of 6 s for `import lightning` here. The stamp files re-run the install when
# pyproject.toml changes.
define install
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet uv
	$(if $(3),$(call $(3),$(1)))
	$(1)/bin/uv pip install --quiet --compile-bytecode --python $(1)/bin/python -e '.$(2)'
endef

# make fit installs what the README's everyday commands need: the rich progress bar and matplotlib,
# which draws the chart of `python -m project bench` and `compare`.
FIT_EXTRAS := [progress,bench]

$(VENV)/.installed: pyproject.toml
	$(call install,$(VENV),$(FIT_EXTRAS),torch_first)
	touch $@

$(VENV)/.installed-dev: pyproject.toml
	$(call install,$(VENV),[dev],torch_first)
	touch $@ $(VENV)/.installed

fit: $(VENV)/.installed  ## train the default job (configs/default.yaml)
	$(PY) -m project fit --config configs/default.yaml $(ARGS)

test: $(VENV)/.installed-dev  ## the whole test suite, slow tests included (SLURM, several machines: their targets)
	$(PY) -m pytest -m "not slurm and not multinode" $(ARGS)

# Several machines for real: ddp and fsdp across network namespaces of this host, each with its own interface and
# address (tests/support/machines.py), started by environment and by torchrun; a machine lost mid-epoch. Needs root
# (CI runs as root); REQUIRE_MULTINODE makes a machine that cannot make namespaces fail instead of skipping. The
# two-node SLURM job is in make test-slurm.
test-multinode: $(VENV)/.installed-dev  ## runs across two "machines" (network namespaces; root)
	REQUIRE_MULTINODE=1 $(PY) -m pytest -m "multinode and not slurm" $(ARGS)

# Template vs plain PyTorch, both with default options: training overhead, inference, input paths; what
# host memory reuse gives a CPU run, what the timing callback costs, the Python calls per inference batch.
# Results in benchmarks/results/perf/; each script's last line is its headline.
.PHONY: bench-perf bench-parity bench-host
bench-perf: $(VENV)/.installed-dev  ## the six perf benchmarks (ARGS go to the timed five, e.g. --repeats 6)
	$(PY) -m benchmarks.overhead $(ARGS)
	$(PY) -m benchmarks.inference $(ARGS)
	$(PY) -m benchmarks.input $(ARGS)
	$(PY) -m benchmarks.host_memory $(ARGS)
	$(PY) -m benchmarks.timing_cost $(ARGS)
	$(PY) -m benchmarks.host_calls

# The host's cost of a training step: the template (progress bar in a pseudo-terminal), Lightning's bare loop and the
# plain loop with a negligible network, and each default callback's cost (about 4 minutes). Results in
# benchmarks/results/perf/host_cost.{md,json}.
bench-host: $(VENV)/.installed-dev  ## template / Lightning's bare loop per step, where a step is all host work
	$(PY) -m benchmarks.host_cost $(ARGS)

$(VENV)/.installed-parity: pyproject.toml
	$(call install,$(VENV),$(PARITY_EXTRAS),torch_first)
	touch $@ $(VENV)/.installed $(VENV)/.installed-dev

# Learning parity: the template and the plain loop with the same recipe on scikit-learn's digits, 3 seeds
# (about 6 minutes on 2 idle CPU cores). Results in benchmarks/results/perf/parity.{md,json}.
bench-parity: $(VENV)/.installed-parity  ## same test accuracy as the plain loop? (benchmarks/parity.py)
	$(PY) -m benchmarks.parity $(ARGS)

# Every CUDA path (precisions, compile, on-device data, ddp/fsdp/dp/deepspeed on one GPU, test/predict/resume from
# a checkpoint, the NaN guard) on this machine's GPU, in minutes, on synthetic data.
# Report in benchmarks/results/gpu-<device>/; ARGS go to the script, e.g. ARGS="--paths bf16-mixed,compile --jobs 4".
# Without a CUDA GPU it says so in one line and runs nothing. It is the one GPU command's --check; the command's
# other use, the template against Lightning's loop and the plain loop per mode: bash benchmarks/gpu_run.sh --plan.
.PHONY: gpu-check
gpu-check: $(VENV)/.installed  ## check every CUDA path on this GPU (bash benchmarks/gpu_run.sh --check)
	PYTHON=$(PY) bash benchmarks/gpu_run.sh --check $(ARGS)

# In variables because a comma written in $(call ...) would split its arguments.
XLA_EXTRAS := [xla,dev]
PARITY_EXTRAS := [dev,parity]

$(VENV_XLA)/.installed: pyproject.toml
	$(call install,$(VENV_XLA),$(XLA_EXTRAS))
	touch $@

# PJRT_DEVICE=CPU: torch_xla's CPU device stands in for a TPU (the xla_cpu accelerator also sets it when
# unset). REQUIRE_XLA turns the tests' "torch_xla is not installed" skip into a failure, so this target
# cannot pass without running them.
test-xla: $(VENV_XLA)/.installed  ## the XLA tests (fit + test on the XLA CPU device), in .venv-xla
	PJRT_DEVICE=CPU REQUIRE_XLA=1 $(PY_XLA) -m pytest -m xla $(ARGS)

# SLURM for real: the tests marked slurm start a one-node cluster on this machine (munged, slurmctld, slurmd, a
# config in a temporary folder; tests/support/slurm_cluster.py) and run scripts/slurm/train.sbatch and srun on it,
# and a two-node one, a slurmd on each of two network namespaces (sbatch -N 2, requeued mid-epoch).
# SLURM comes from the system's packages, installed here where missing (as root, as CI runs); where it cannot be
# installed or started, the tests say so and are skipped.
SLURM_PROGRAMS := slurmctld slurmd munged sbatch srun
test-slurm: $(VENV)/.installed-dev  ## the SLURM tests on a one-node cluster here (installs slurm-wlm, munge if missing)
	@missing=""; \
	for program in $(SLURM_PROGRAMS); do command -v $$program >/dev/null || missing="$$missing $$program"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "no$$missing here: installing slurm-wlm and munge (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			slurm-wlm munge >/dev/null || echo "note: slurm-wlm and munge did not install; the SLURM tests are skipped"; \
	elif [ -n "$$missing" ]; then \
		echo "note: no$$missing here, and installing needs root and apt-get; the SLURM tests will be skipped"; \
	fi
	$(PY) -m pytest -m slurm $(ARGS)

lint: $(VENV)/.installed-dev  ## the hooks of .pre-commit-config.yaml (ruff, ruff format, basic checks) on every file
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pre_commit run --all-files

# Each run is named by its setup (version_3-ddp-resnet50-2xcpu-b256), not version_N alone; TensorBoard opens
# on its TIME SERIES tab, every card: the addresses of accuracy and loss first and of the side-by-side view are printed.
tensorboard: $(VENV)/.installed  ## serve the runs under LOGDIR on http://localhost:6006
	@echo "accuracy and loss: http://localhost:6006/?tagFilter=%5E%28train%7Cval%29%2F%28acc%7Closs%29%24%7C%5Eval%2Fconfusion%24#timeseries"
	@echo "the side-by-side charts: http://localhost:6006/#custom_scalars"
	$(PY) -m tensorboard.main $$($(PY) -m project.toolkit.cli.tensorboard_runs $(LOGDIR))

clean:  ## caches and build files; keeps .venv, data/ and lightning_logs/
	rm -rf .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -not -path './.venv*' -prune -exec rm -rf {} +
