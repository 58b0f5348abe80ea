"""vLLM's async engine (``AsyncLLMEngine`` / ``AsyncLLM``) as a policy: :class:`AsyncVLLMPolicy`.

Every observation is its own engine request and the engine batches whatever is in flight
(continuous batching). The engine runs on its own event loop in a background thread. What the
completions hold is described in :mod:`collab_env.agents.vllm`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab_env.agents.vllm_base import VLLMBase, import_vllm, share_key
from collab_env.errors import ConfigError, PolicyError
from collab_env.types import Completion, Conversation

__all__ = ["AsyncVLLMPolicy"]


class AsyncVLLMPolicy(VLLMBase):
    """vLLM's async engine (``AsyncLLMEngine`` / ``AsyncLLM``) as a policy.

    Every observation is its own engine request; the engine batches whatever is in flight
    (continuous batching), so many episodes advancing on an event loop share the model without
    a queue of ours. The engine lives on its own event loop in a background thread: ``act`` works
    from any event loop (``asyncio.run``, the rollout's sync facades, notebooks).

    Arguments are those of :class:`VLLMPolicy` (without ``max_wait_ms``).
    """

    #: The async engine batches every request in flight (continuous batching) by itself.
    batches_concurrent_calls = True

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: str | None = None,
        lora_path: str | Path | None = None,
        enable_prefix_caching: bool = True,
        logprobs_mode: str = "processed_logprobs",
        seed: int = 0,
        system_prompt: str | None = None,
        name: str | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        **default_sampling: Any,
    ) -> None:
        super().__init__(
            model, tokenizer=tokenizer, lora_path=lora_path,
            enable_prefix_caching=enable_prefix_caching, logprobs_mode=logprobs_mode, seed=seed,
            system_prompt=system_prompt, name=name, engine_kwargs=engine_kwargs,
            default_sampling=default_sampling,
        )
        if name is None:
            self.name = "async-" + self.name
        vllm = import_vllm()
        kwargs = dict(self.engine_kwargs)
        kwargs.setdefault("disable_log_stats", True)
        try:
            args = vllm.AsyncEngineArgs(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"{self.name}: vLLM rejected an engine argument: {exc}. "
                              "engine_kwargs takes vllm.AsyncEngineArgs fields.") from exc
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True)
        self._thread.start()
        self._ids = itertools.count()
        self._closed = False
        # share_key -> the engine request in flight for it (touched only on the engine's loop)
        self._inflight: dict[tuple, asyncio.Task] = {}

        async def start() -> Any:
            return vllm.AsyncLLMEngine.from_engine_args(args)

        try:
            self._engine = asyncio.run_coroutine_threadsafe(start(), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    @property
    def engine(self) -> Any:
        """The underlying ``AsyncLLM`` (use it on :attr:`loop`)."""
        return self._engine

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine runs on."""
        return self._loop

    async def act(self, observations: Sequence[Conversation], **sampling: Any) -> list[Completion]:
        """One completion per observation; all are in flight in the engine at once.

        Raises:
            ConfigError: Unknown or invalid sampling keyword.
            PolicyError: The chat template or the engine failed, or a prompt does not fit.
        """
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        requests = self._requests(observations, sampling)
        if not requests:
            return []
        fut = asyncio.run_coroutine_threadsafe(self._run(requests), self._loop)
        return await asyncio.wrap_future(fut)

    async def _run(self, requests: list[tuple]) -> list[Completion]:
        n = len(requests)
        self.stats.engine_calls += 1
        t0 = time.perf_counter()
        try:
            outs = await asyncio.gather(*(self._one(req) for req in requests))
        except PolicyError:
            raise
        except Exception as exc:
            raise PolicyError(f"{self.name}: vLLM generate failed: {exc!r}") from exc
        finally:
            self.stats.generate_seconds += time.perf_counter() - t0
        return [self._completion(o, req, n, shared) for (o, shared), req in zip(outs, requests, strict=True)]

    async def _prompt_logprobs(self, rows: list[list[int]], *, read_cache: bool) -> list[Any]:
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        params = self._scoring_params(read_cache)

        async def one(row: list[int]) -> Any:
            final = None
            async for out in self._engine.generate({"prompt_token_ids": row}, params,
                                                   f"{self.name}-score-{next(self._ids)}"):
                final = out
            if final is None or not final.finished:
                raise PolicyError(f"{self.name}: vLLM returned no final output for a scoring request.")
            return final

        async def run() -> list[Any]:
            self.stats.engine_calls += 1
            t0 = time.perf_counter()
            try:
                return list(await asyncio.gather(*(one(r) for r in rows)))
            except PolicyError:
                raise
            except Exception as exc:
                raise PolicyError(f"{self.name}: vLLM scoring failed: {exc!r}") from exc
            finally:
                self.stats.generate_seconds += time.perf_counter() - t0

        fut = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return await asyncio.wrap_future(fut)

    async def _one(self, req: tuple) -> tuple[Any, bool]:
        """The final output of ``req``, and whether an identical request in flight
        (:func:`~collab_env.agents.vllm_base.share_key`) gave it."""
        key = share_key(req)
        if key is None:
            return await self._generate(req), False
        task = self._inflight.get(key)
        shared = task is not None
        if task is None:
            task = self._loop.create_task(self._generate(req))
            self._inflight[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        # shielded: a caller that is cancelled does not cancel the request the others wait for
        return await asyncio.shield(task), shared

    def _forget(self, key: tuple, task: asyncio.Task) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter has it (or none is left to)

    async def _generate(self, req: tuple) -> Any:
        ids, sp, lora, _ = req
        final = None
        async for out in self._engine.generate(
            {"prompt_token_ids": ids}, sp, f"{self.name}-{next(self._ids)}", lora_request=lora
        ):
            final = out
        if final is None or not final.finished:
            raise PolicyError(f"{self.name}: vLLM returned no final output for a request.")
        return final

    async def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache (its cached KV blocks): after the weights changed, or
        to time requests from a cold cache. Returns whether vLLM reset it (it does not while
        requests are running).

        Raises:
            PolicyError: The policy was closed.
        """
        if self._closed:
            raise PolicyError(f"{self.name}: the policy was closed.")
        fut = asyncio.run_coroutine_threadsafe(self._engine.reset_prefix_cache(), self._loop)
        return bool(await asyncio.wrap_future(fut))

    def close(self) -> None:
        """Shut the engine down and stop its event loop."""
        if self._closed:
            return
        self._closed = True

        async def stop() -> None:
            # Cancel the engine's output handler first: it would report the dying engine core.
            handler = getattr(self._engine, "output_handler", None)
            if handler is not None:
                handler.cancel()
            self._engine.shutdown()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=60)
        finally:
            self._engine = None  # its __del__ runs now, not at interpreter exit
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def __repr__(self) -> str:
        return f"AsyncVLLMPolicy({self.model!r})"
