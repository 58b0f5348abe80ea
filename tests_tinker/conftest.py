"""Fixtures of the Tinker tests (run by ``make test-tinker`` in ``.venv-tinker``, never by ``make test``).

The service is SkyRL's local Tinker API server (``skyrl.tinker.api``, skyrl 0.4.0) with its JAX
backend on CPU, run from its own venv (``TINKER_SERVER_PYTHON``, default ``.venv-skyrl/bin/python``:
skyrl 0.4.0 needs Python >= 3.12 and transformers >= 5.6, tinker-cookbook 0.5.0 caps transformers
at 5.5.4, so client and server cannot share a venv). The server starts its engine as
``uv run <the uv flags it was started with> -m skyrl.tinker.engine``: it is started here with the real
``uv`` (installed in the server venv) as ``uv run --no-project --python <venv python>``, so the engine
runs in the same venv. The base model is a tiny random Qwen3 (the JAX backend serves Qwen3 and
Llama 3, not Qwen2) with the tiny ChatML tokenizer, given to the server and the client by its path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from collab_env.testing.openai_server import free_port

ROOT = Path(__file__).resolve().parents[1]
SERVER_PYTHON = Path(os.environ.get("TINKER_SERVER_PYTHON", ROOT / ".venv-skyrl" / "bin" / "python"))
#: The JAX backend without jit: a tiny model runs eagerly in well under a second a call, where each
#: new padded length would otherwise compile for tens of seconds on this CPU.
BACKEND_CONFIG = {"enforce_eager": True, "max_lora_adapters": 4, "max_lora_rank": 8}
LORA_RANK = 4
START_TIMEOUT = 300


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    """A tiny random Qwen3 chat model folder (its path is the model name on both sides)."""
    from collab_env.testing.tiny_model import build_tiny_chat_model

    return str(build_tiny_chat_model(tmp_path_factory.mktemp("tiny-qwen3"), architecture="qwen3"))


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 (127.0.0.1 only)
        return json.loads(r.read())


@pytest.fixture(scope="session")
def tinker_server(tiny_qwen3, tmp_path_factory):
    """``base_url`` of a SkyRL Tinker API server on 127.0.0.1 serving ``tiny_qwen3`` (JAX, CPU)."""
    if not SERVER_PYTHON.exists():
        pytest.fail(f"no Tinker server venv at {SERVER_PYTHON}: run `make test-tinker` (it builds .venv-skyrl) "
                    "or set TINKER_SERVER_PYTHON to the python of a venv with skyrl[tinker,jax]==0.4.0.")
    work = tmp_path_factory.mktemp("tinker-server")
    port = free_port()
    bin_dir = SERVER_PYTHON.parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "UV_OFFLINE": "1",
           "UV_NO_CONFIG": "1", "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [str(bin_dir / "uv"), "run", "--no-project", "--python", str(SERVER_PYTHON), "-m", "skyrl.tinker.api",
           "--host", "127.0.0.1", "--port", str(port), "--base-model", tiny_qwen3, "--backend", "jax",
           "--backend-config", json.dumps(BACKEND_CONFIG), "--checkpoints-base", str(work / "checkpoints"),
           "--database-url", f"sqlite:///{work / 'tinker.db'}"]
    log = open(work / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the Tinker server exited ({proc.returncode}):\n"
                            + (work / "server.log").read_text(errors="replace")[-4000:])
            try:
                _get(base_url + "/api/v1/healthz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the Tinker server did not answer in time:\n"
                                + (work / "server.log").read_text(errors="replace")[-4000:])
                time.sleep(1)
        os.environ.setdefault("TINKER_API_KEY", "tml-collab-env-local")
        yield base_url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
