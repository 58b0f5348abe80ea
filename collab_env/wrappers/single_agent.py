"""The single-agent Gymnasium view of a :class:`~collab_env.env.CollabEnv`.

One player is controlled through the Gymnasium API; every other player is driven by a policy
(given, or the spec's default). After each of the controlled player's moves the view lets the
others act until the controlled player is on turn again or the episode ends, and returns the
controlled player's reward summed over those steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium

from collab_env._async import run_sync
from collab_env.env import CollabEnv
from collab_env.errors import ConfigError, EnvStateError, did_you_mean
from collab_env.rollout import act_for, check_policies
from collab_env.types import Conversation

__all__ = ["SingleAgentEnv"]


class SingleAgentEnv(gymnasium.Env[Conversation, str]):
    """Gymnasium ``Env`` controlling ``player`` of a multi-player :class:`CollabEnv`.

    Args:
        env: The parallel environment.
        player: The controlled player.
        policies: Player -> policy (object or ``"module:Class"``) for the other players; players
            left out use ``env.spec.default_policies``.
        sampling: Player -> sampling keywords for those policies.

    Observation: the controlled player's view of the conversation. Action: its message text.
    Reward: the controlled player's reward, summed over the env steps between two of its moves.
    ``info`` is the env's info for the controlled player, plus ``other_moves`` (the
    completions of the other players since the last move).
    """

    metadata = {"render_modes": ["ansi", "human"]}

    def __init__(
        self,
        env: CollabEnv,
        player: str,
        policies: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if player not in env.possible_agents:
            raise ConfigError(
                f"view={player!r} is not a player of this env; players: {env.possible_agents}."
                + did_you_mean(str(player), env.possible_agents)
            )
        self.env = env
        self.player = player
        defaults = dict(env.spec.default_policies) if env.spec is not None else {}
        chosen = {**defaults, **dict(policies or {})}
        if player in (policies or {}):
            raise ConfigError(f"{player!r} is the controlled player; do not give it a policy.")
        others = [p for p in env.possible_agents if p != player]
        self.policies = check_policies(env, chosen, others)
        self.sampling = dict(sampling or {})
        self.observation_space = env.observation_space(player)
        self.action_space = env.action_space(player)
        self.render_mode = env.render_mode
        self._obs: dict[str, Conversation] = {}
        self._infos: dict[str, dict[str, Any]] = {}
        self._seed: int | None = None
        self._steps = 0

    # -- async core ----------------------------------------------------------------------------
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self._seed = seed
        self._steps = 0
        self._obs, self._infos = await self.env.areset(seed=seed, options=options)
        reward, done, moves, _ = await self._advance()
        info = dict(self._infos[self.player])
        info["other_moves"] = moves
        return self._obs[self.player], info

    async def astep(self, action: str):
        if not self.env.agents:
            raise EnvStateError("the episode has ended; call reset().")
        on_turn = [a for a in self.env.agents if self._infos[a].get("on_turn")]
        others = [a for a in on_turn if a != self.player]
        completions = await act_for(others, self._obs, self.policies, self.sampling, self._policy_seed())
        if self._fault(completions):
            return self._obs[self.player], 0.0, False, True, self._fault_info(completions)
        actions = {p: c.text for p, c in completions.items()}
        actions[self.player] = action
        out = await self.env.astep(actions)
        self._obs, rewards, terms, truncs, self._infos = out
        self._steps += 1
        reward = rewards[self.player]
        terminated, truncated = terms[self.player], truncs[self.player]
        moves = [(p, c.text) for p, c in completions.items()]
        # The info of our own move (it holds e.g. the multiturn-aware reward's details); later
        # steps update what they report and add their reward components.
        info = dict(self._infos[self.player])
        components = dict(info.get("reward_components", {}))
        if not (terminated or truncated):
            more, _, later, more_components = await self._advance()
            reward += more
            moves += later
            for k, v in more_components.items():
                components[k] = components.get(k, 0.0) + v
            info.update({k: v for k, v in self._infos[self.player].items() if k != "reward_components"})
            st = self.env.episode
            terminated, truncated = st.terminated, st.truncated
        if components:
            info["reward_components"] = components
        info["other_moves"] = moves
        return self._obs[self.player], reward, terminated, truncated, info

    async def _advance(self) -> tuple[float, bool, list[tuple[str, str]], dict[str, float]]:
        """Let the other players act until ours is on turn or the episode ends. Returns our
        reward, whether the episode ended, the moves and our summed reward components."""
        total, moves, components = 0.0, [], {}
        while self.env.agents and not self._infos[self.player].get("on_turn"):
            on_turn = [a for a in self.env.agents if self._infos[a].get("on_turn")]
            completions = await act_for(on_turn, self._obs, self.policies, self.sampling, self._policy_seed())
            if self._fault(completions):
                self._infos = {a: self._fault_info(completions) for a in self.env.possible_agents}
                break
            self._obs, rewards, terms, truncs, self._infos = await self.env.astep(
                {p: c.text for p, c in completions.items()}
            )
            self._steps += 1
            total += rewards[self.player]
            for k, v in self._infos[self.player].get("reward_components", {}).items():
                components[k] = components.get(k, 0.0) + float(v)
            moves += [(p, c.text) for p, c in completions.items()]
        return total, not self.env.agents, moves, components

    def _fault(self, completions) -> bool:
        """End the episode (as a truncation) when a partner's policy gave up."""
        faulty = [p for p, c in completions.items() if c.is_fault]
        if faulty:
            self.env.end_episode(f"fault:{faulty[0]}")
        return bool(faulty)

    def _fault_info(self, completions) -> dict[str, Any]:
        return {
            "on_turn": False,
            "end_reason": self.env.episode.end_reason,
            "faults": {p: c.meta.get("fault", "") for p, c in completions.items() if c.is_fault},
        }

    def _policy_seed(self) -> int | None:
        return None if self._seed is None else self._seed + self._steps

    # -- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> tuple[Conversation, SupportsFloat, bool, bool, dict[str, Any]]:
        return run_sync(self.astep(action))

    def render(self):
        return self.env.render()

    def close(self) -> None:
        self.env.close()
        super().close()

    def __repr__(self) -> str:
        return f"<SingleAgentEnv player={self.player!r} of {self.env!r}>"
