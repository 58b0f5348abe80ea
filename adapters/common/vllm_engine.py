"""Generation for a learner through vLLM, with the trained weights pushed into the engine.

:class:`VLLMGenerator` starts a ``vllm.LLM`` on a copy of the model being trained (saved once to a
temporary folder with its tokenizer), generates from *token ids* (the learner's own tokenisation,
so prompts are exactly those the loss sees), with one seed per row and the log-probs of the
distribution sampled from, and takes the current weights before a generation whenever the
optimiser stepped since the last one (:meth:`PolicyModel.generate_tokens` calls :meth:`sync`). After a
weight update the engine's prefix cache is reset: cached keys and values of the old weights must
not be reused.

The weights are loaded by each engine worker through ``LLM.collective_rpc`` and the worker's
``reload_weights`` (Hugging Face parameter names; vLLM redoes its kernel-format processing). A LoRA
model is merged on the fly (``merge_and_unload`` on a copy) before its weights are sent. Tested on the CPU build of vLLM
(``make test-vllm``); on GPUs the same calls apply (use ``gpu_memory_utilization`` in
``vllm_engine_kwargs`` to leave room for training).
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from collab_env.errors import ConfigError, PolicyError

__all__ = ["VLLMGenerator", "vllm_available"]


def vllm_available() -> bool:
    """Whether ``import vllm`` can work here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _load_weights(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Runs inside each vLLM worker: load HF-named (checkpoint-format) weights into its model.

    ``reload_weights`` (recent vLLM) re-runs the loader's post-processing (kernel repacking on
    CPUs, quantisation...); older versions load straight into the model."""
    if hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    else:
        worker.model_runner.model.load_weights(weights)
    return len(weights)


class VLLMGenerator:
    """A vLLM engine holding a copy of a learner's model.

    Args:
        model: The (PEFT or plain) transformers model being trained.
        tokenizer: Its tokenizer (prompts are tokenised by it; completions decoded by it).
        engine_kwargs: ``vllm.EngineArgs`` fields (``dtype``, ``max_model_len``,
            ``gpu_memory_utilization``, ``enforce_eager``...).
    """

    def __init__(self, model: Any, tokenizer: Any, engine_kwargs: Mapping[str, Any] | None = None) -> None:
        from collab_env.agents.vllm import VLLMPolicy

        self.tokenizer = tokenizer
        self._dir = tempfile.TemporaryDirectory(prefix="collab_env_vllm_")
        plain = self._plain(model)
        plain.save_pretrained(self._dir.name)
        tokenizer.save_pretrained(self._dir.name)
        kwargs = dict(engine_kwargs or {})
        import torch

        if torch.cuda.is_available():
            # The engine shares the GPU with the model being trained (and its optimiser state):
            # vLLM's default of 90% of the memory would leave training nothing.
            kwargs.setdefault("gpu_memory_utilization", 0.3)
        self.policy = VLLMPolicy(self._dir.name, tokenizer=self._dir.name, enable_prefix_caching=True,
                                 name="learner-vllm", engine_kwargs=kwargs)
        self.version = -1  # the weights' version the engine holds (-1: sync before the first use)
        self.syncs = 0
        self.sync_seconds = 0.0

    @staticmethod
    def _plain(model: Any) -> Any:
        """The model as plain transformers weights (LoRA merged into a copy)."""
        if hasattr(model, "merge_and_unload"):
            return copy.deepcopy(model).merge_and_unload()
        return model

    def sync(self, model: Any, version: int) -> None:
        """Push ``model``'s current weights into the engine (when ``version`` is newer)."""
        if version == self.version:
            return
        import torch

        t0 = time.perf_counter()
        plain = self._plain(model)
        with torch.no_grad():
            weights = [(name, p.detach().to("cpu" if p.device.type == "cpu" else p.device).clone())
                       for name, p in plain.state_dict().items()]
        llm = self.policy.llm
        try:
            llm.collective_rpc(_load_weights, args=(weights,))
            llm.reset_prefix_cache()
        except Exception as exc:  # an engine that cannot take weights must not go on silently
            raise PolicyError(f"pushing the trained weights into the vLLM engine failed: {exc!r}") from exc
        self.version = version
        self.syncs += 1
        self.sync_seconds += time.perf_counter() - t0

    @property
    def pad_token_id(self) -> int:
        """The learner tokenizer's pad id (its EOS when it has none)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if pad is None:
            raise ConfigError("the tokenizer names neither a pad nor an EOS token.")
        return int(pad)

    def generate_tokens(self, prompts: Sequence[Sequence[int]], params: Any, seeds: Sequence[int]) -> list[Any]:
        """One :class:`~collab_env.types.Completion` per tokenised prompt in one engine call (row
        ``i`` seeded by ``seeds[i]``), decoded with the learner's tokenizer
        (:class:`~collab_env.agents.tokens.TokenGenerator`). Call :meth:`sync` first to generate with
        the current weights (:meth:`PolicyModel.generate_tokens` does)."""
        from dataclasses import replace

        outs = self.policy.generate_tokens(prompts, params, seeds)
        return [replace(c, text=self.tokenizer.decode(list(c.token_ids or ()), skip_special_tokens=True))
                for c in outs]

    def close(self) -> None:
        """Stop the engine and remove the weight copy. With in-process engines
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) shutting one down tears down vLLM's process-wide
        parallel state: close only the last engine of the process."""
        self.policy.close()
        self._dir.cleanup()
