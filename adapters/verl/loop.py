"""The verl agent loop that plays a collab_env env: the CollabLLM recipe on current verl.

:class:`CollabEnvAgentLoop` (registered as ``"collab_env"``) plays one episode per verl sample
through the one driver (:func:`~collab_env.rollout.arun_episode`): the trained player's turns come
from verl's rollout server through a :class:`~collab_env.adapters.verl.policy.ServerPolicy`, the
user simulator and every other player from their own policies (the env spec's defaults unless
configured). The same server policy is bound into a multiturn-aware reward's futures (the
recipe's "the policy plays the later assistant turns"). :func:`episode_output` turns the finished
episode into the fields of verl's ``AgentLoopOutput`` with
:func:`~collab_env.rollout.token_transcript`: one sequence, mask 0 on every user and env token,
the server's log-probs, the episode's reward as ``reward_score``.

It relies only on verl's ``AgentLoopBase.run``, ``AgentLoopOutput``, ``register`` and
``server_manager.generate``; the tokenisation is collab_env's own (the chat template).

Configuration (the YAML of ``actor_rollout_ref.rollout.agent.agent_loop_config_path``, whose
entries are passed to the constructor, or a row's ``collab_env`` column, which wins key by key):
``env_id``, ``env_kwargs`` (keywords of :func:`collab_env.make`: ``reward="mr"``,
``reward_kwargs``, overrides), ``player`` (the trained player; default: the env's only trainable
one), ``policies`` (player -> policy reference for the others), ``sampling`` (player -> sampling
keywords; the trained player's ``max_new_tokens`` bounds each of its turns), ``index`` and
``seed`` (the task item and the env seed of the row), ``system_prompt``, ``max_player_turns``
(the trained player's moves per sample: after that many the episode ends; ``1`` makes a sample
one reply scored by the multiturn-aware reward's futures, as in the CollabLLM recipe; default:
play to the env's own end, every reply scored and summed into ``reward_score``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from collab_env.adapters.verl.policy import ServerPolicy
from collab_env.errors import ConfigError, require
from collab_env.types import Episode

_agent_loop = require("verl.experimental.agent_loop", "verl", "The verl agent loop")
_agent_loop_module = require("verl.experimental.agent_loop.agent_loop", "verl", "The verl agent loop")
AgentLoopBase = _agent_loop.AgentLoopBase
AgentLoopOutput = _agent_loop.AgentLoopOutput
register = _agent_loop_module.register

__all__ = ["AGENT_NAME", "CONFIG_KEYS", "CollabEnvAgentLoop", "episode_output", "play_episode"]

#: The name rows select the loop by (their ``agent_name`` column).
AGENT_NAME = "collab_env"

#: The keys of the loop's configuration (constructor keywords and a row's ``collab_env`` column).
CONFIG_KEYS = ("env_id", "env_kwargs", "player", "policies", "sampling", "index", "seed", "system_prompt",
               "pass_seed", "max_player_turns")


def _plain(value: Any) -> Any:
    """OmegaConf containers (what Hydra passes from the YAML) as plain dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl always brings omegaconf
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def trained_player(env: Any, player: str | None) -> str:
    """``player``, checked, or the env's only trainable player."""
    players = list(env.possible_agents)
    if player is not None:
        if player not in players:
            raise ConfigError(f"player {player!r} is not a player of {env!r} (players: {players}).")
        return player
    trainable = [p for p in players if env.unwrapped.task.is_trainable(p)]
    if len(trainable) != 1:
        raise ConfigError(f"{env!r} has {len(trainable)} trainable players ({trainable}); name the one verl "
                          "trains with player=... in the agent loop config or the row's collab_env column.")
    return trainable[0]


async def play_episode(env: Any, policy: ServerPolicy, *, player: str, policies: Mapping[str, Any] | None = None,
                       sampling: Mapping[str, Mapping[str, Any]] | None = None, index: int | None = None,
                       seed: int | None = None, max_player_turns: int | None = None) -> Episode:
    """One episode of ``env`` with ``policy`` as ``player`` and the others' policies (the env spec's
    defaults with ``policies`` merged over them), through :func:`~collab_env.rollout.arun_episode`.
    ``policy`` is also bound into the env's learner slots (a multiturn-aware reward's futures).
    ``max_player_turns``: end the episode after ``player``'s that many moves (``None``: play on)."""
    from collab_env.policy import bind_learner, policies_for
    from collab_env.rollout import arun_episode

    table = policies_for(getattr(env, "spec", None), policies)
    table[player] = policy
    bind_learner(env, {player: policy}, sampling={player: dict((sampling or {}).get(player, {}))})
    # Every policy gets the episode's per-step seeds, as in collab_env's own rollouts (the user
    # simulator's replies stay reproducible); ``policy`` forwards them to the server only with
    # ``pass_seed`` (so the ``rollout.n`` samples of a row differ).
    return await arun_episode(env, table, seed=seed, index=index, sampling=sampling,
                              max_turns=None if max_player_turns is None else {player: int(max_player_turns)})


def episode_output(episode: Episode, player: str, *, response_length: int | None = None) -> dict[str, Any]:
    """The fields of verl's ``AgentLoopOutput`` for ``player``'s side of ``episode``.

    ``prompt_ids``/``response_ids``/``response_mask``/``response_logprobs`` are
    :func:`~collab_env.rollout.token_transcript` (mask 1 exactly on the tokens the policy
    generated), cut to ``response_length`` tokens when longer (verl pads every response to it);
    ``reward_score`` is the player's return; ``num_turns`` the messages of the conversation;
    ``extra_fields["collab_env"]`` the reward, its components, the end reason, costs and whether
    the response was cut.
    """
    from collab_env.rollout import token_transcript

    tr = token_transcript(episode, player)
    ids, mask, lps = tr.response_ids, tr.mask, tr.logprobs
    cut = response_length is not None and len(ids) > response_length
    if cut:
        ids, mask, lps = ids[:response_length], mask[:response_length], lps[:response_length]
    reward = float(episode.returns[player])
    info = {
        "env_id": episode.env_id, "seed": episode.seed, "index": episode.index, "player": player,
        "reward": reward, "components": {k: float(v) for k, v in episode.components.get(player, {}).items()},
        "end_reason": episode.end_reason, "player_turns": tr.turns, "truncated_response": bool(cut),
        "costs": {k: float(v) for k, v in episode.costs.items()},
    }
    return {
        "prompt_ids": list(tr.prompt_ids), "response_ids": list(ids), "response_mask": list(mask),
        "response_logprobs": [float(x) for x in lps], "reward_score": reward,
        "num_turns": len(episode.conversation), "extra_fields": {"collab_env": info},
    }


@register(AGENT_NAME)
class CollabEnvAgentLoop(AgentLoopBase):
    """verl agent loop over any collab_env env (see the module docstring for its configuration).

    verl builds it per sample with its own constructor arguments (passed through unchanged) and
    the entries of its agent-loop YAML (the keys of :data:`CONFIG_KEYS`; ``name`` and
    ``_target_`` are verl's own).
    """

    def __init__(self, *args: Any, name: str | None = None, **kwargs: Any):
        self.loop_config = {k: _plain(kwargs.pop(k)) for k in list(kwargs) if k in CONFIG_KEYS}
        super().__init__(*args, **kwargs)
        trainer_config = kwargs.get("trainer_config", args[0] if args else None)
        rollout = trainer_config.config.actor_rollout_ref.rollout
        self.response_length = int(rollout.response_length)

    def settings(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The loop's configuration with the row's ``collab_env`` column merged over it."""
        column = _plain(row.get("collab_env")) or {}
        if not isinstance(column, Mapping):
            raise ConfigError(f"the row's collab_env column must be a mapping, got {type(column).__name__}.")
        unknown = sorted(set(column) - set(CONFIG_KEYS))
        if unknown:
            raise ConfigError(f"unknown keys {unknown} in the row's collab_env column (known: {list(CONFIG_KEYS)}).")
        out = {**self.loop_config, **column}
        if isinstance(out.get("env_kwargs"), str):  # write_dataset stores them as JSON text
            out["env_kwargs"] = json.loads(out["env_kwargs"])
        for key in ("index", "seed"):
            if out.get(key) is not None:
                out[key] = int(out[key])
        if not out.get("env_id"):
            raise ConfigError("the collab_env agent loop needs env_id: set it in the agent loop YAML entry "
                              "or in the rows' collab_env column (collab_env.adapters.verl.dataset_rows).")
        return out

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """Play one episode (see the module docstring) and return its ``AgentLoopOutput``."""
        import collab_env

        start = time.perf_counter()
        cfg = self.settings(kwargs)
        env = collab_env.make(cfg["env_id"], **dict(cfg.get("env_kwargs") or {}))
        try:
            player = trained_player(env, cfg.get("player"))
            policy = ServerPolicy(self.server_manager, self.tokenizer, sampling_params,
                                  system_prompt=cfg.get("system_prompt"), pass_seed=bool(cfg.get("pass_seed", False)))
            episode = await play_episode(env, policy, player=player, policies=cfg.get("policies"),
                                         sampling=cfg.get("sampling"), index=cfg.get("index"), seed=cfg.get("seed"),
                                         max_player_turns=cfg.get("max_player_turns"))
        finally:
            env.close()
        fields = episode_output(episode, player, response_length=self.response_length)
        # verl's AgentLoopMetrics: the wall time of the episode (every player's turns and the
        # reward's futures) counts as generation time
        return AgentLoopOutput(metrics={"generate_sequences": time.perf_counter() - start}, **fields)
