"""The shortcuts :func:`rollout` and :func:`arollout`: run jobs on the local engine or on Ray
workers and stream ``(job, episode or exception)`` pairs as episodes finish."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping
from typing import Any, Literal

from collab_env.errors import ConfigError
from collab_env.rollout.engine import RolloutEngine
from collab_env.rollout.jobs import Result

__all__ = ["rollout", "arollout"]


def rollout(env: Any, policies: Mapping[str, Any], jobs: int | Iterable[Any], *,
            backend: Literal["local", "ray"] = "local", env_kwargs: Mapping[str, Any] | None = None,
            num_workers: int = 2, **settings: Any) -> Iterator[Result]:
    """Run ``jobs`` and yield ``(job, episode or exception)`` as episodes finish.

    Args:
        env: Env id or factory (see :class:`RolloutEngine`).
        policies: Player -> policy.
        jobs: See :func:`normalize_jobs`.
        backend: ``"local"`` (this process, one event loop) or ``"ray"``
            (:class:`~collab_env.rollout.ray_engine.RayRolloutEngine`, ``num_workers`` actors).
        env_kwargs: Keywords of the env (env ids only; see :class:`RolloutEngine`).
        num_workers: Ray workers (``backend="ray"`` only).
        **settings: :class:`RolloutConfig` fields (with ``backend="ray"``, also
            :class:`~collab_env.rollout.ray_engine.RayRolloutEngine`'s ``chunk_size``).

    Raises:
        ConfigError: Unknown backend or setting.
        MissingDependencyError: ``backend="ray"`` without ray installed.
    """
    if backend == "local":
        return RolloutEngine(env, policies, env_kwargs=env_kwargs, **settings).stream(jobs)
    if backend == "ray":
        from collab_env.rollout.ray_engine import RayRolloutEngine

        return RayRolloutEngine(env, policies, env_kwargs=env_kwargs, num_workers=num_workers,
                                **settings).stream(jobs)
    raise ConfigError(f"backend must be 'local' or 'ray', got {backend!r}.")


async def arollout(env: Any, policies: Mapping[str, Any], jobs: int | Iterable[Any], *,
                   env_kwargs: Mapping[str, Any] | None = None, **settings: Any) -> AsyncGenerator[Result, None]:
    """Async :func:`rollout` on the running event loop (local backend).

    Args:
        env: Env id or factory (see :class:`RolloutEngine`).
        policies: Player -> policy.
        jobs: See :func:`normalize_jobs`.
        env_kwargs: Keywords of the env (env ids only; see :class:`RolloutEngine`).
        **settings: :class:`RolloutConfig` fields.
    """
    engine = RolloutEngine(env, policies, env_kwargs=env_kwargs, **settings)
    agen = engine.astream(jobs)
    try:
        async for item in agen:
            yield item
    finally:
        await agen.aclose()
