"""Joint rewards: score the agents' joint response with a CoMLRL ``reward_func`` on any env.

:class:`JointReward` wraps a :class:`~collab_env.env.CollabEnv` and, at every step where the
scored agents acted, calls a CoMLRL-style reward function with one completion list per agent
and replaces the env's rewards by the result::

    from collab_env.rewards.joint import JointReward
    from collab_env.rewards.processors import RewardProcessors

    def reward_func(a_completions, b_completions, *, batch_items):
        return [float(len(b) > len(a)) for a, b in zip(a_completions, b_completions)]

    env = JointReward(base_env, reward_func, mode="difference",
                      reward_processor=RewardProcessors.scale(factor=10.0))

Modes
    ``"shared"``: every scored agent gets the joint reward ``r(joint)``.
    ``"per_agent"``: ``reward_func`` returns, per sample, a list/tuple with one reward per
    scored agent (in agent order); agent ``i`` gets entry ``i``.
    ``"difference"``: agent ``i`` gets ``r(joint) - r(joint with i's action replaced by
    default_action)`` (the counterfactual is computed by an extra ``reward_func`` call per acting
    agent; the env is not stepped).

The wrapper is not a subclass of ``CollabEnv``: it exposes the same PettingZoo ``ParallelEnv``
API through :class:`~collab_env.wrappers.base.EnvWrapper` (explicit delegation, no blanket
``__getattr__``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collab_env.env import CollabEnv, EpisodeState
from collab_env.errors import ConfigError, EnvStateError, TaskFunctionError
from collab_env.tasks.task_functions import (
    as_reward,
    call_reward_func,
    callable_name,
    check_reward_callables,
    check_reward_func,
    one_reward,
    process_reward,
)
from collab_env.wrappers.base import EnvWrapper

__all__ = ["JointReward", "MODES"]

#: The ways :class:`JointReward` turns the reward function's output into per-agent rewards.
MODES: tuple[str, ...] = ("shared", "per_agent", "difference")


class JointReward(EnvWrapper):
    """A :class:`CollabEnv` whose rewards come from a CoMLRL-style joint ``reward_func``.

    Args:
        env: The environment to wrap (a ``CollabEnv`` or a wrapper exposing ``unwrapped``).
        reward_func: Called with one completion list per scored agent, positionally, in agent
            order (each list holds that agent's completion of this step), plus
            ``batch_items=[item]`` and/or ``prompts=[latest prompt of each agent]`` when its
            signature declares them (both when it takes ``**kwargs``). Returns a list with one
            value (a bare value is accepted too): a number, or in ``"per_agent"`` mode a
            list/tuple with one number per scored agent.
        mode: ``"shared"``, ``"per_agent"`` or ``"difference"`` (see the module docstring).
        default_action: The counterfactual action of ``"difference"`` mode, and the completion
            passed for a scored agent that has not acted yet in the episode.
        reward_processor: ``float -> float`` applied to each agent's final reward (e.g.
            ``RewardProcessors.scale(factor=10.0)``); ``None`` keeps it unchanged.
        name: Key of the joint reward in ``infos[a]["reward_components"]``.
        agents: The scored agents, in order (default: the task's trainable players, i.e. every
            player that is not a simulated user).

    Scoring happens at every step where at least one scored agent acted. A scored agent that
    did not act in that step contributes its latest completion of the episode (or
    ``default_action``); in ``"difference"`` mode it gets 0.0. Players that are not scored
    (simulated users) and every player at steps without a scored move keep the env's reward.

    Logging: ``infos[a]["reward_components"]`` keeps the env's components, adds ``"env"`` (the
    env's own reward of ``a``) and, for scored agents at scoring steps, ``name`` (the raw joint
    reward, or the agent's own raw entry in ``"per_agent"`` mode), in ``"difference"`` mode
    ``f"{name}_counterfactual"`` and ``f"{name}_difference"``, and ``f"{name}_processed"`` (the
    reward returned).

    Errors: a reward function or processor that raises, returns the wrong number of values, or a
    non-numeric / non-finite value raises :class:`~collab_env.errors.TaskFunctionError`; it is
    never turned into 0.

    Cloning: :meth:`clone` clones the env and deep-copies the processor (a
    :class:`~collab_env.rewards.processors.RunningNormalizer` of a forked future does not move
    the original's statistics); the reward function is shared.
    """

    def __init__(
        self,
        env: Any,
        reward_func: Callable[..., Any],
        *,
        mode: str = "shared",
        default_action: str = "",
        reward_processor: Callable[[float], float] | None = None,
        name: str = "joint",
        agents: Sequence[str] | None = None,
    ) -> None:
        super().__init__(env)
        base = env.unwrapped
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {list(MODES)}, got {mode!r}.")
        if not isinstance(default_action, str):
            raise ConfigError(f"default_action must be a str, got {type(default_action).__name__}.")
        check_reward_callables(reward_func, reward_processor)
        if not isinstance(name, str) or not name or name == "env":
            raise ConfigError(f"name must be a non-empty str other than 'env', got {name!r}.")
        if agents is None:
            scored = tuple(p for p in env.possible_agents if base.task.is_trainable(p))
        else:
            if isinstance(agents, str):
                raise ConfigError(f"agents must be a list of player ids, got the str {agents!r}.")
            scored = tuple(agents)
            unknown = [a for a in scored if a not in env.possible_agents]
            if unknown:
                raise ConfigError(f"agents {unknown} are not players of the env {list(env.possible_agents)}.")
            if len(set(scored)) != len(scored):
                raise ConfigError(f"agents must be unique, got {list(scored)}.")
        if not scored:
            raise ConfigError("no agents to score: pass agents=[...] naming at least one player.")

        self.env = env
        self.reward_func = reward_func
        self.mode = mode
        self.default_action = default_action
        self.reward_processor = reward_processor
        self.name = name
        self.scored_agents: tuple[str, ...] = scored
        self._reward_keywords = check_reward_func(reward_func, scored)
        self._latest: dict[str, str] = {}

    def clone(self) -> JointReward:
        new = super().clone()
        new.reward_processor = copy.deepcopy(self.reward_processor)
        new._latest = dict(self._latest)
        return new

    def __repr__(self) -> str:
        return f"<JointReward mode={self.mode!r} {self.env!r}>"

    # -- async core ----------------------------------------------------------------------------
    async def areset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        obs, infos = await self.env.areset(seed=seed, options=options)
        self._latest = {}
        return obs, infos

    async def astep(self, actions: Mapping[str, str]):
        base = self.env.unwrapped
        prompts = None
        if "prompts" in self._reward_keywords and self._running(base):
            prompts = [self._prompt_of(base, a) for a in self.scored_agents]
        obs, rewards, terms, truncs, infos = await self.env.astep(actions)
        state = base.episode
        moves = dict(state.last_moves)  # the cleaned texts the env recorded
        for a in self.scored_agents:
            if a in moves:
                self._latest[a] = moves[a]
        acted = [a for a in self.scored_agents if a in moves]
        scored: dict[str, dict[str, Any]] = {}
        if acted:
            scored = self._score(acted, state, prompts)
        new_rewards: dict[str, float] = {}
        for a, r in rewards.items():
            info = infos.setdefault(a, {})
            components = dict(info.get("reward_components", {}))
            components["env"] = float(r)
            if a in scored:
                components.update(scored[a]["components"])
                new_rewards[a] = scored[a]["reward"]
            else:
                new_rewards[a] = float(r)
            info["reward_components"] = components
        return obs, new_rewards, terms, truncs, infos

    # -- scoring -------------------------------------------------------------------------------
    @staticmethod
    def _running(base: CollabEnv) -> bool:
        """Whether ``base`` has an episode that is not over (through its public ``episode``)."""
        try:
            return not base.episode.done
        except EnvStateError:  # no episode yet
            return False

    @staticmethod
    def _prompt_of(base: CollabEnv, agent: str) -> str:
        """The latest message in ``agent``'s view that it did not write ("" if none)."""
        for m in reversed(base.episode.conversation.view(agent).messages):
            if m.author != agent and m.role != "system":
                return m.content
        return ""

    def _call(self, completions: Sequence[str], state: EpisodeState,
              prompts: list[str] | None, what: str) -> Any:
        return call_reward_func(self.reward_func, self._reward_keywords, completions, state.item,
                                prompts, what)

    def _per_agent(self, out: Any, who: str, where: str) -> list[float]:
        n = len(self.scored_agents)
        if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
            out = out.tolist()
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            raise TaskFunctionError(
                f"{who} returned {type(out).__name__ if not isinstance(out, (list, tuple)) else f'{len(out)} samples'} "
                f"{where}; in 'per_agent' mode it must return a list with one sample, a list/tuple "
                f"of {n} rewards (one per agent, in the order {list(self.scored_agents)})."
            )
        sample = out[0]
        if hasattr(sample, "tolist") and not isinstance(sample, (list, tuple)):
            sample = sample.tolist()
        if not isinstance(sample, (list, tuple)) or len(sample) != n:
            got = (f"{len(sample)} values" if isinstance(sample, (list, tuple))
                   else f"a {type(sample).__name__}")
            raise TaskFunctionError(
                f"{who} returned {got} for the sample {where}; in 'per_agent' mode each sample is a "
                f"list/tuple of {n} rewards, one per agent in the order {list(self.scored_agents)}."
            )
        return [as_reward(v, who, where) for v in sample]

    def _score(self, acted: list[str], state: EpisodeState,
               prompts: list[str] | None) -> dict[str, dict[str, Any]]:
        who = f"reward_func {callable_name(self.reward_func)!r}"
        where = f"on item {state.index}, step {state.step}"
        joint = [self._latest.get(a, self.default_action) for a in self.scored_agents]
        out = self._call(joint, state, prompts, where)
        result: dict[str, dict[str, Any]] = {}
        if self.mode == "per_agent":
            values = self._per_agent(out, who, where)
            for a, v in zip(self.scored_agents, values, strict=True):
                result[a] = {"reward": v, "components": {self.name: v}}
        else:
            r = one_reward(out, who, where)
            for i, a in enumerate(self.scored_agents):
                if self.mode == "shared":
                    result[a] = {"reward": r, "components": {self.name: r}}
                elif a not in acted:
                    result[a] = {"reward": 0.0, "components": {self.name: r}}
                else:
                    counter = list(joint)
                    counter[i] = self.default_action
                    cwhere = f"{where} (counterfactual without {a!r})"
                    rc = one_reward(self._call(counter, state, prompts, cwhere), who, cwhere)
                    result[a] = {
                        "reward": r - rc,
                        "components": {
                            self.name: r,
                            f"{self.name}_counterfactual": rc,
                            f"{self.name}_difference": r - rc,
                        },
                    }
        for a, d in result.items():
            d["reward"] = process_reward(self.reward_processor, d["reward"], f"{where} (for {a!r})")
            d["components"][f"{self.name}_processed"] = d["reward"]
        return result

