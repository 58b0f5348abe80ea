"""Running episodes: players driven by policies, results as :class:`~collab_env.types.Episode`.

``arun_episode`` plays one episode; ``arun_episodes`` plays many at once on one event loop,
each advancing on its own, and yields them as they finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from collab_env.agents.base import Policy, add_usage, describe, resolve_policy
from collab_env.env import CollabEnv
from collab_env.errors import ConfigError, PolicyError
from collab_env.types import Completion, Conversation, Episode, TurnRecord

__all__ = ["act_for", "arun_episode", "run_episode", "arun_episodes", "check_policies"]

_USAGE_KEYS = ("model_calls", "prompt_tokens", "completion_tokens", "cost")




def check_policies(env: CollabEnv, policies: Mapping[str, Any], players: Iterable[str]) -> dict[str, Policy]:
    """Resolve policies for ``players``; a missing one is an error naming the player."""
    resolved: dict[str, Policy] = {}
    for p in players:
        if p not in policies or policies[p] is None:
            raise ConfigError(
                f"no policy for player {p!r}; pass policies={{{p!r}: ...}} "
                f"(players: {env.possible_agents})."
            )
        resolved[p] = resolve_policy(policies[p])
    return resolved


async def act_for(
    players: Iterable[str],
    observations: Mapping[str, Conversation],
    policies: Mapping[str, Policy],
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    seed: int | None = None,
) -> dict[str, Completion]:
    """Ask each player's policy for one completion, all concurrently."""
    players = list(players)
    sampling = sampling or {}

    async def one(p: str) -> Completion:
        kw = dict(sampling.get(p, {}))
        if seed is not None:
            kw.setdefault("seed", seed)
        try:
            out = await policies[p].act([observations[p]], **kw)
        except PolicyError:
            raise
        except Exception as exc:  # surface, never swallow: the caller counts and reports it
            raise PolicyError(f"policy {describe(policies[p])} for player {p!r} failed: {exc!r}") from exc
        if not isinstance(out, list) or len(out) != 1 or not isinstance(out[0], Completion):
            raise PolicyError(
                f"policy {describe(policies[p])} for {p!r} must return a list with one Completion "
                f"per observation, got {out!r:.200}."
            )
        return out[0]

    results = await asyncio.gather(*(one(p) for p in players))
    return dict(zip(players, results))


async def arun_episode(
    env: CollabEnv,
    policies: Mapping[str, Any],
    *,
    seed: int | None = None,
    index: int | None = None,
    options: Mapping[str, Any] | None = None,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
    on_step: Callable[[int, dict[str, Completion]], None] | None = None,
) -> Episode:
    """Play one episode of ``env`` with one policy per player; return the :class:`Episode`.

    ``sampling`` maps player -> sampling keywords. Policies get ``seed=seed + step`` so a
    seeded episode is reproducible with deterministic policies.
    """
    resolved = check_policies(env, policies, env.possible_agents)
    opts = dict(options or {})
    if index is not None:
        opts["index"] = index
    obs, infos = await env.areset(seed=seed, options=opts)
    ep = Episode(
        env_id=env.spec.id if env.spec is not None else None,
        seed=seed,
        index=env.episode.index,
        conversation=Conversation(),
        rewards={p: [] for p in env.possible_agents},
        returns=dict.fromkeys(env.possible_agents, 0.0),
        components={p: {} for p in env.possible_agents},
        costs=dict.fromkeys(_USAGE_KEYS, 0.0),
        info={"policies": {p: describe(pol) for p, pol in resolved.items()}},
    )
    step = 0
    while env.agents:
        on_turn = [a for a in env.agents if infos[a].get("on_turn")]
        step_seed = None if seed is None else seed + step
        completions = await act_for(on_turn, obs, resolved, sampling, step_seed)
        for c in completions.values():
            add_usage(ep.costs, c.usage)
        if on_step is not None:
            on_step(step, completions)
        faulty = [p for p, c in completions.items() if c.is_fault]
        if faulty:
            ep.costs["faults"] = ep.costs.get("faults", 0.0) + len(faulty)
            ep.info["faults"] = [{"step": step, "player": p, "reason": completions[p].meta.get("fault", "")}
                                 for p in faulty]
            env.end_episode(f"fault:{faulty[0]}")
            break
        agents = list(env.agents)
        obs, rewards, terms, truncs, infos = await env.astep({p: c.text for p, c in completions.items()})
        for p in agents:
            ep.rewards[p].append(rewards[p])
            ep.returns[p] += rewards[p]
            for name, v in infos[p].get("reward_components", {}).items():
                ep.components[p][name] = ep.components[p].get(name, 0.0) + float(v)
        # What the env stored (cleaned, clipped) is the move; the completion keeps the raw output.
        stored = env.episode.last_moves
        for p, c in completions.items():
            ep.turns.append(
                TurnRecord(
                    step=step,
                    player=p,
                    text=stored[p],
                    reward=rewards[p],
                    completion=c,
                    trainable=env.task.is_trainable(p),
                    components=dict(infos[p].get("reward_components", {})),
                )
            )
        step += 1
        if any(terms.values()) or any(truncs.values()):
            break
    st = env.episode
    ep.conversation = st.conversation
    ep.terminated, ep.truncated, ep.end_reason = st.terminated, st.truncated, st.end_reason
    return ep


def run_episode(env: CollabEnv, policies: Mapping[str, Any], **kwargs: Any) -> Episode:
    """Synchronous :func:`arun_episode`."""
    from collab_env._async import run_sync

    return run_sync(arun_episode(env, policies, **kwargs))


async def arun_episodes(
    make_env: Callable[[], CollabEnv],
    policies: Mapping[str, Any],
    jobs: Iterable[Mapping[str, Any]],
    *,
    concurrency: int = 8,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
) -> AsyncIterator[tuple[Mapping[str, Any], Episode | BaseException]]:
    """Run many episodes concurrently (one env each); yield ``(job, episode or error)`` as
    each finishes. A job is ``{"seed": s, "index": i}`` plus anything the caller wants back."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}.")
    sem = asyncio.Semaphore(concurrency)

    async def one(job: Mapping[str, Any]):
        async with sem:
            env = make_env()
            try:
                ep = await arun_episode(env, policies, seed=job.get("seed"), index=job.get("index"),
                                        sampling=sampling)
                return job, ep
            except Exception as exc:  # reported to the caller, who counts it
                return job, exc
            finally:
                env.close()

    tasks = [asyncio.ensure_future(one(j)) for j in jobs]
    try:
        for fut in asyncio.as_completed(tasks):
            yield await fut
    finally:
        for t in tasks:
            t.cancel()
