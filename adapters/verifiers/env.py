"""collab_env envs as verifiers v1 tasksets and envs (prime-rl trains on these).

One verifiers task is one collab_env episode: the env id, its keywords, the reset seed and the
task item. :class:`CollabEnvBase.run` resets the collab_env env and plays it with the ONE driver,
:func:`collab_env.rollout.advance`: the trained roles' replies come from verifiers
(``agents.<role>.interaction(task)`` / ``it.turn(...)``, so the trainer's model, sampling and
token bookkeeping are verifiers'), enter each round as given ``actions=``, and the untrained
players (the simulated user, a fixed partner) act through collab_env's own policies inside the
same ``advance`` call. :meth:`CollabEnvBase.finalize` records each role's episode return as its
reward and the reward components as metrics.

What a role sees: its system prompt is the system text of its collab_env observation at reset,
and every turn sends it the messages of its observation that arrived since its last reply, in
order (other players' messages as ``user``), so the model's chat is its collab_env view.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from contextlib import AsyncExitStack
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from collab_env.errors import ConfigError, require

require("verifiers.v1", "verifiers", "The verifiers (prime-rl) adapter")  # names the extra when missing
import verifiers.v1 as vf  # noqa: E402

__all__ = [
    "CollabTaskData",
    "CollabTask",
    "CollabTasksetConfig",
    "CollabTaskset",
    "CollabEnvConfig",
    "CollabEnvBase",
    "taskset_class",
    "env_class",
    "taskset",
    "new_messages",
    "class_prefix",
    "REWARD_NAME",
]

#: Name of the reward recorded on each role's trace (the role's collab_env episode return).
REWARD_NAME = "collab_env"
#: Key of ``trace.info`` where :meth:`CollabEnvBase.run` leaves the episode's facts.
INFO_KEY = "collab_env"


class CollabTaskData(vf.TaskData):
    """One collab_env episode: which env, how it is built, its reset seed and task item."""

    env_id: str
    """Registered collab_env id (``"hidden-facts-v2"``)."""
    env_kwargs: dict[str, Any] = {}
    """Keywords of :func:`collab_env.make` (task knobs, budgets, ``reward=``...); JSON values."""
    seed: int
    """Seed of ``env.reset``; the untrained policies get ``seed + k`` in round ``k``, as
    :func:`collab_env.rollout.arun_episode` gives them."""
    index: int | None = None
    """Task item (``options={"index": index}``); ``None`` for generated suites."""


class CollabTask(vf.Task[CollabTaskData, vf.State, vf.TaskConfig]):
    """A collab_env episode as a verifiers task (scored by the env's ``finalize``)."""

    @property
    def key(self) -> str:
        """Stable identity: the env, its keywords, seed and item (not the load position)."""
        return vf.task.task_key({"env_id": self.data.env_id, "env_kwargs": self.data.env_kwargs,
                                 "seed": self.data.seed, "index": self.data.index})


class CollabTasksetConfig(vf.TasksetConfig):
    """Which episodes the taskset yields (``--env.taskset.*``)."""

    num_tasks: int = 256
    """Tasks to yield (task ``k`` resets with ``seed + k`` and item ``k % num_items``)."""
    seed: int = 0
    """Seed of the first task."""
    env_kwargs: dict[str, Any] = {}
    """Keywords of :func:`collab_env.make` for every task."""


class CollabTaskset(vf.Taskset[CollabTask, CollabTasksetConfig]):
    """The episodes of one collab_env env, one task per seed/item, as eval numbers them.

    Subclasses set :attr:`ENV_ID` (see :func:`taskset_class`).
    """

    ENV_ID: str = ""
    """The registered collab_env id this taskset plays."""

    def load(self) -> Iterable[CollabTask]:
        """Task ``k`` of ``num_tasks``: reset seed ``seed + k``, item ``k % num_items`` (``None``
        for generated suites), the same numbering as :func:`collab_env.evaluate`."""
        if not self.ENV_ID:
            raise ConfigError(f"{type(self).__name__} has no ENV_ID; build it with taskset_class(env_id).")
        cfg = self.config
        if cfg.num_tasks < 1:
            raise ConfigError(f"num_tasks must be >= 1, got {cfg.num_tasks}.")
        num_items = _num_items(self.ENV_ID, cfg.env_kwargs)
        for k in range(cfg.num_tasks):
            yield CollabTask(CollabTaskData(
                id=f"{self.ENV_ID}/{cfg.seed + k}", env_id=self.ENV_ID, env_kwargs=dict(cfg.env_kwargs),
                seed=cfg.seed + k, index=(k % num_items) if num_items else None,
            ), cfg.task)


class CollabEnvConfig(vf.EnvConfig):
    """Knobs every collab_env env has; :func:`env_class` adds one ``AgentConfig`` field per
    trained role (its player id)."""

    policies: dict[str, str] = {}
    """Player -> policy reference (a registered name or ``"module:Class"``) for the players that
    are not roles, over the env spec's default policies (e.g. ``{"user": "hidden-facts-user"}``)."""


def _make(env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
    import collab_env

    return collab_env.make(env_id, **dict(env_kwargs))


def _num_items(env_id: str, env_kwargs: Mapping[str, Any]) -> int | None:
    env = _make(env_id, env_kwargs)
    return getattr(env, "unwrapped", env).task.num_items()


def new_messages(observation: Any, player: str) -> list[dict[str, Any]]:
    """The messages of ``player``'s observation since its last reply (all of them before its
    first), system prompts left out before the first reply, as ``{"role", "content"}`` dicts.

    Args:
        observation: ``player``'s :class:`~collab_env.types.Conversation` (its own view).
        player: The role.

    Returns:
        What the role's model is sent this turn (other players' text has role ``user``).
    """
    msgs = list(observation)
    last = max((i for i, m in enumerate(msgs) if m.author == player), default=-1)
    tail = msgs[last + 1:]
    if last < 0:
        tail = [m for m in tail if m.role != "system"]
    return [m.to_chat() for m in tail]  # tool calls and results with their ids, as chat templates read them


class CollabEnvBase:
    """The control flow of a collab_env episode under verifiers (mixed into the ``vf.Env``
    subclass :func:`env_class` builds; ``ROLES`` and ``ENV_ID`` are set there)."""

    ENV_ID: str = ""
    """The registered collab_env id."""
    ROLES: tuple[str, ...] = ()
    """The players verifiers plays (one agent each)."""
    CONFIG: type = CollabEnvConfig
    """The config class (with one ``AgentConfig`` field per role)."""
    if TYPE_CHECKING:  # vf.Env's, set when verifiers builds the env (not a field of this mixin)
        config: Any

    async def setup(self, agents: Any) -> None:
        """Every role is trainable; the untrained players are collab_env policies, not agents."""
        for role in self.ROLES:
            getattr(agents, role).trainable = True

    async def run(self, task: CollabTask, agents: Any) -> None:
        """Play one episode with :func:`collab_env.rollout.advance`: the roles' replies are the
        given ``actions``, the other players act through their policies; the episode's facts go
        to each role's ``trace.info["collab_env"]`` for :meth:`finalize`."""
        from collab_env.policy import policies_for, resolve_policy
        from collab_env.rollout import advance

        data = task.data
        env = _make(data.env_id, data.env_kwargs)
        base = getattr(env, "unwrapped", env)
        options = {} if data.index is None else {"index": data.index}
        obs, infos = await env.areset(seed=data.seed, options=options)
        roles = [r for r in self.ROLES if r in env.possible_agents]
        others = policies_for(getattr(env, "spec", None) or getattr(base, "spec", None), self.config.policies)
        policies = {p: resolve_policy(ref) for p, ref in others.items() if p not in roles}
        rounds = 0
        returns = dict.fromkeys(env.possible_agents, 0.0)
        components: dict[str, dict[str, float]] = {p: {} for p in env.possible_agents}
        stopped: str | None = None
        async with AsyncExitStack() as stack:
            chats = {}
            for role in roles:
                system = obs[role].system_prompt if role in obs else None
                role_task = type(task)(task.data.model_copy(update={"prompt": None, "system_prompt": system}),
                                       task.config)
                chats[role] = await stack.enter_async_context(getattr(agents, role).interaction(role_task))
            given: dict[str, str] | None = None
            while True:
                start = rounds

                def seed(k: int, s: int = start) -> int:  # round k of this call is round start + k
                    return data.seed + s + k

                run = await advance(env, policies, obs=obs, infos=infos, until=roles, actions=given, seed=seed)
                rounds += len(run.steps)
                for p in env.possible_agents:
                    returns[p] += run.reward(p)
                    for name, v in run.components(p).items():
                        components[p][name] = components[p].get(name, 0.0) + v
                obs, infos = run.obs, run.infos
                if run.done:
                    break
                on_turn = [r for r in roles if infos.get(r, {}).get("on_turn")]
                segments = await asyncio.gather(*(self._turn(chats[r], obs[r], r) for r in on_turn))
                done = [r for r, seg in zip(on_turn, segments, strict=True) if seg.terminated]
                if done:  # a role's own limit (max_turns, tokens) ended its exchange
                    stopped = f"agent_stopped:{done[0]}"
                    env.end_episode(stopped)
                    break
                given = {r: _reply(seg) for r, seg in zip(on_turn, segments, strict=True)}
            state = base.episode
            facts = {
                "env_id": data.env_id, "seed": data.seed, "index": state.index,
                "end_reason": state.end_reason, "terminated": state.terminated, "truncated": state.truncated,
                "rounds": rounds, "returns": returns, "components": components,
                "moves": [[m.author, m.content] for m in state.conversation if m.author in env.possible_agents],
            }
            for role, chat in chats.items():
                chat.trace.info[INFO_KEY] = {**facts, "role": role}

    @staticmethod
    async def _turn(chat: Any, observation: Any, role: str) -> Any:
        msgs = new_messages(observation, role)
        if not msgs:
            raise ConfigError(
                f"role {role!r} is on turn with no new message since its last reply; a verifiers "
                "interaction needs a user turn to answer. Play this player with a policy instead "
                "(leave it out of roles=)."
            )
        return await chat.turn(msgs)

    async def finalize(self, task: CollabTask, episode: Any) -> None:
        """Record each role's collab_env return as the reward ``"collab_env"`` (weight 1) and its
        reward components and the episode's length as metrics."""
        for trace in episode.traces:
            facts = trace.info.get(INFO_KEY)
            if facts is None:
                continue
            role = facts["role"]
            trace.record_reward(REWARD_NAME, facts["returns"][role])
            for name, v in facts["components"][role].items():
                trace.record_metric(name, v)
            trace.record_metric("rounds", float(facts["rounds"]))
            trace.record_metric("truncated", float(facts["truncated"]))


def _reply(segment: Any) -> str:
    """The text of the last assistant message of a segment, as the model wrote it."""
    for message in reversed(segment.messages):
        if isinstance(message, vf.AssistantMessage):
            return message.content if isinstance(message.content, str) else vf.types.content_text(message.content)
    return ""


def class_prefix(env_id: str) -> str:
    """The CamelCase prefix of an env's class names (``hidden-facts-v2`` -> ``HiddenFactsV2``)."""
    return "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", env_id) if part)


def _spec(env_id: str) -> Any:
    from collab_env.registry import spec

    return spec(env_id)


@cache
def taskset_class(env_id: str, module: str | None = None) -> type[CollabTaskset]:
    """The :class:`CollabTaskset` subclass of a registered env (one class per id and module).

    Args:
        env_id: Registered collab_env id (``"hidden-facts"`` means its latest version).
        module: ``__module__`` of the class (the generated package's module, so pickling finds it).

    Returns:
        A class named ``<CamelId>Taskset`` with ``ENV_ID`` set to the full versioned id.
    """
    s = _spec(env_id)
    name = f"{class_prefix(s.id)}Taskset"
    cls = type(name, (CollabTaskset,), {"ENV_ID": s.id, "__module__": module or __name__,
                                        "__doc__": f"collab_env's {s.id} as a verifiers taskset."})
    cls.__qualname__ = name
    return cls


@cache
def env_class(env_id: str, roles: tuple[str, ...] | None = None, module: str | None = None) -> type[CollabEnvBase]:
    """The ``vf.Env`` subclass of a registered env: one ``AgentConfig`` role per trained player.

    Args:
        env_id: Registered collab_env id.
        roles: The players verifiers plays (default: the spec's trainable players); the others
            act through collab_env policies (``--env.policies``, else the spec's defaults).
        module: ``__module__`` of the classes.

    Returns:
        ``<CamelId>Env``, bound to its config ``<CamelId>EnvConfig`` (roles default to the
        tool-less ``null`` harness: collab_env players only talk).

    Raises:
        ConfigError: A role is not a player of the env or is not a valid field name.
    """
    import types

    from pydantic import create_model

    s = _spec(env_id)
    roles = tuple(roles if roles is not None else (s.trainable or s.players))
    for r in roles:
        if r not in s.players:
            raise ConfigError(f"role {r!r} is not a player of {s.id}; players: {list(s.players)}.")
        if not r.isidentifier() or r in vf.EnvConfig.model_fields or r == "policies":
            raise ConfigError(f"player {r!r} of {s.id} cannot be a verifiers role name (a config field).")
    camel, mod = class_prefix(s.id), module or __name__
    fields: dict[str, Any] = {r: (vf.AgentConfig, vf.AgentConfig(harness={"id": "null"})) for r in roles}
    config = create_model(f"{camel}EnvConfig", __base__=CollabEnvConfig, __module__=mod, **fields)
    config.__qualname__ = f"{camel}EnvConfig"
    ns = {"ENV_ID": s.id, "ROLES": roles, "CONFIG": config, "__module__": mod,
          "__doc__": f"collab_env's {s.id} as a verifiers env: roles {list(roles)}."}
    # new_class is typed as returning a bare type; this one subclasses CollabEnvBase
    cls = cast("type[CollabEnvBase]",
               types.new_class(f"{camel}Env", (CollabEnvBase, vf.Env[config]), {}, lambda d: d.update(ns)))
    cls.__qualname__ = f"{camel}Env"
    return cls


def taskset(env_id: str, *, num_tasks: int = 256, seed: int = 0,
            env_kwargs: Mapping[str, Any] | None = None) -> CollabTaskset:
    """A taskset instance of a registered env (for Python use; prime-rl loads a package, see
    :func:`~collab_env.adapters.verifiers.write_package`).

    Args:
        env_id: Registered collab_env id.
        num_tasks: Tasks to yield.
        seed: Seed of the first task.
        env_kwargs: Keywords of :func:`collab_env.make` for every task.
    """
    cls = taskset_class(env_id)
    return cls(CollabTasksetConfig(num_tasks=num_tasks, seed=seed, env_kwargs=dict(env_kwargs or {})))
