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
from collab_env.policy import policies_for
from collab_env.rollout.driver import advance, check_policies
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
        chosen = policies_for(env.spec, policies)
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
        obs, _, _, _, info = await self._advance()
        if not info.get("faults"):  # the latest info of the controlled player, as the env gave it
            info = {**self._infos.get(self.player, {}), "other_moves": info["other_moves"]}
        return obs, info

    async def astep(self, action: str):
        if not self.env.agents:
            raise EnvStateError("the episode has ended; call reset().")
        # Our move, with the other players on turn in the same round, then the others until we
        # are on turn again: one call of the episode driver.
        run = await advance(self.env, self.policies, obs=self._obs, infos=self._infos, until=(self.player,),
                            actions={self.player: action}, sampling=self.sampling, seed=self._seeds())
        return self._result(run, first_is_ours=True)

    async def _advance(self):
        """Let the other players act until ours is on turn or the episode ends."""
        run = await advance(self.env, self.policies, obs=self._obs, infos=self._infos, until=(self.player,),
                            sampling=self.sampling, seed=self._seeds())
        return self._result(run, first_is_ours=False)

    def _result(self, run: Any, first_is_ours: bool):
        """``(obs, reward, terminated, truncated, info)`` of the controlled player after ``run``."""
        self._steps += len(run.steps)
        self._obs, self._infos = run.obs, run.infos
        steps = [s for s in run.steps if s.actions]  # a faulty round has no actions
        reward = sum(float(s.rewards.get(self.player, 0.0)) for s in steps)
        # The info of our own move (it holds e.g. the multiturn-aware reward's details); later
        # steps update what they report and add their reward components.
        info: dict[str, Any] = {}
        if first_is_ours and steps:
            info = dict(steps[0].infos.get(self.player, {}))
        for s in steps[1 if first_is_ours else 0:]:
            info.update({k: v for k, v in s.infos.get(self.player, {}).items() if k != "reward_components"})
        components = run.components(self.player)
        had = info.pop("reward_components", None) is not None
        if components or had:
            info["reward_components"] = components
        moves = [(p, t) for s in run.steps for p, t in s.actions.items() if p != self.player]
        # An env whose other players act elsewhere (a served env's seat) reports their moves itself.
        moves += [(str(p), str(t)) for s in steps for p, t in s.infos.get(self.player, {}).get("other_moves", ())]
        if run.faults:
            info.update(on_turn=False, end_reason=self.env.episode.end_reason,
                        faults={f["player"]: f["reason"] for f in run.faults})
        info["other_moves"] = moves
        st = self.env.episode
        terminated, truncated = (st.terminated, st.truncated) if run.done else (False, False)
        if run.faults:
            terminated, truncated = False, True
        return self._obs[self.player], reward, terminated, truncated, info

    def _seeds(self):
        if self._seed is None:
            return None
        base = self._seed + self._steps
        return lambda k: base + k

    # -- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return run_sync(self.areset(seed=seed, options=options))

    def step(self, action: str) -> tuple[Conversation, SupportsFloat, bool, bool, dict[str, Any]]:
        return run_sync(self.astep(action))

    def render(self):
        return self.env.render()

    @property
    def observation(self) -> Conversation:
        """The controlled player's latest observation (what the last reset or step returned)."""
        return self._obs[self.player]

    def clone(self) -> SingleAgentEnv:
        """An independent copy with the episode state (the env cloned, the other players'
        policies shared: a policy is a function of what it sees), e.g. to branch an episode."""
        import copy

        new = copy.copy(self)
        new.env = self.env.clone()
        new._obs, new._infos = dict(self._obs), {p: dict(i) for p, i in self._infos.items()}
        new._np_random = copy.deepcopy(self._np_random)
        return new

    def close(self) -> None:
        self.env.close()
        super().close()

    def __repr__(self) -> str:
        return f"<SingleAgentEnv player={self.player!r} of {self.env!r}>"
