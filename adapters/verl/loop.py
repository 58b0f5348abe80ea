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
``server_manager.generate``; the tokenisation is collab_env's own (the chat template), the same
:class:`~collab_env.agents.tokens.TokenHistory` as every other engine here. verl 0.9.1's
Continuous Token builder (``self.continuous_token_builder``) is not used: it keeps the sampled
ids too, but its default builder rebuilds the next turn from the rendering *delta* and so drops
the text a chat template writes after the end-of-turn token (ChatML's newline after
``<|im_end|>``, checked on the tiny model): the trained sequence would then differ from the
conversation as the model is served it. ``TokenHistory`` keeps that text, so the sequence is the
template's rendering with the reply's own ids, and the mask is 1 exactly on the sampled tokens.

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

Rows. A row with a ``collab_env`` column (:func:`~collab_env.adapters.verl.dataset_rows`) names
its env item by ``index`` and ``seed``. A row without one is a CollabLLM recipe row, as
``collab-env data`` and the recipe's ``process_dataset.py`` write it (``agent_name``
``"collabllm_agent"``, the hidden goal in ``extra_info.interaction_kwargs``, the reference in
``reward_model.ground_truth``): the env plays that very row (``reset(options={"item": row})``),
its system prompt kept (``system_prompt=None`` is the default of such an env). The loop is
registered under both names, :data:`AGENT_NAMES`.

Envs. Each worker keeps its envs (one per distinct ``env_id`` + ``env_kwargs``, as many as
samples run at once) and reuses them across samples: no dataset load and no hub probe per
sample. An env that needs data rows and is given none reads ``data.train_files`` (the recipe's
RL file, read back into the schema).

The recipe's knobs, read from verl's config (``trainer_config.config``), override the YAML:
``actor_rollout_ref.rollout.multi_turn.max_user_turns`` / ``max_assistant_turns`` /
``num_repeat_rollouts`` set the multiturn-aware reward's ``max_user_turns`` /
``max_assistant_turns`` / ``num_rollouts``; ``reward_model.reward_kwargs.metric_weights`` its
``weights``; ``reward_model.reward_kwargs.llm_judge_kwargs`` its judge (``model`` ->
``judge="litellm:<model>"``, ``max_tokens`` -> ``max_new_tokens``, ``num_retries`` ->
``max_retries``, ``temperature``). A knob with no meaning here (``multi_turn.interaction_config_path``
or ``tool_config_path`` set, another ``reward_kwargs`` key, any of them on an env without the
multiturn-aware reward) is a :class:`~collab_env.errors.ConfigError` naming it: nothing is
silently ignored.
"""

from __future__ import annotations

import atexit
import json
import time
from collections.abc import Mapping
from typing import Any

from collab_env._json import loads
from collab_env.adapters.verl.policy import ServerPolicy
from collab_env.adapters.verl_recipe import config_section, recipe_overrides, with_overrides
from collab_env.adapters.verl_recipe import plain as _plain
from collab_env.errors import ConfigError, require
from collab_env.types import Episode

require("verl.experimental.agent_loop", "verl", "The verl agent loop")  # names the extra when missing
from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput  # noqa: E402
from verl.experimental.agent_loop.agent_loop import register  # noqa: E402

__all__ = ["AGENT_NAME", "AGENT_NAMES", "CONFIG_KEYS", "RECIPE_AGENT_NAME", "CollabEnvAgentLoop", "EnvPool",
           "episode_output", "play_episode"]

#: The name rows select the loop by (their ``agent_name`` column).
AGENT_NAME = "collab_env"
#: The agent name of the CollabLLM recipe's rows (``collab-env data``, ``process_dataset.py``).
RECIPE_AGENT_NAME = "collabllm_agent"
#: Every name the loop is registered under.
AGENT_NAMES = (AGENT_NAME, RECIPE_AGENT_NAME)

#: The keys of the loop's configuration (constructor keywords and a row's ``collab_env`` column).
CONFIG_KEYS = ("env_id", "env_kwargs", "player", "policies", "sampling", "index", "seed", "system_prompt",
               "pass_seed", "max_player_turns")


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
                       seed: int | None = None, max_player_turns: int | None = None,
                       item: Mapping[str, Any] | None = None) -> Episode:
    """One episode of ``env`` with ``policy`` as ``player`` and the others' policies (the env spec's
    defaults with ``policies`` merged over them), through :func:`~collab_env.rollout.arun_episode`.
    A multiturn-aware reward's futures play ``player`` with ``policy`` too (its fork: the driver
    hands its policy table to the reward; :func:`~collab_env.policy.fork_policy`).
    ``max_player_turns``: end the episode after ``player``'s that many moves (``None``: play on).
    ``item``: a data row to play instead of task item ``index`` (``reset(options={"item": ...})``)."""
    from collab_env.policy import policies_for
    from collab_env.rollout import arun_episode

    table = policies_for(getattr(env, "spec", None), policies)
    table[player] = policy
    # Every policy gets the episode's per-step seeds, as in collab_env's own rollouts (the user
    # simulator's replies stay reproducible); ``policy`` forwards them to the server only with
    # ``pass_seed`` (so the ``rollout.n`` samples of a row differ).
    return await arun_episode(env, table, seed=seed, index=index, sampling=sampling,
                              options=None if item is None else {"item": dict(item)},
                              max_turns=None if max_player_turns is None else {player: int(max_player_turns)})


def episode_output(episode: Episode, player: str, *, response_length: int | None = None) -> dict[str, Any]:
    """The fields of verl's ``AgentLoopOutput`` for ``player``'s side of ``episode``.

    ``prompt_ids``/``response_ids``/``response_mask``/``response_logprobs`` are
    :func:`~collab_env.rollout.token_transcript` (mask 1 exactly on the tokens the policy
    generated), cut to ``response_length`` tokens when longer (verl pads every response to it);
    ``reward_score`` is the player's return; ``num_turns`` the messages of the conversation;
    ``extra_fields["collab_env"]`` the reward, its components, the end reason, costs and whether
    the response was cut. Turn-level credit: ``extra_fields["turn_scores"]`` (verl's own key,
    which its batch keeps per sample) holds each move's credit
    (:func:`~collab_env.rollout.turn_rewards`: under the multiturn-aware reward, the MR of that
    reply; they sum to ``reward_score``), and ``extra_fields["collab_env"]["turn_ids"]`` says
    which move wrote each response token (-1 between moves). verl 0.9.1 puts ``reward_score`` on
    the last token and its GRPO compares sums per sample, so inside verl a move is credited by
    its own MR when a sample is one move (``max_player_turns=1``, the CollabLLM recipe's per-turn
    samples).
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
        "turn_ids": list(tr.turn_ids[:len(ids)]),
    }
    return {
        "prompt_ids": list(tr.prompt_ids), "response_ids": list(ids), "response_mask": list(mask),
        "response_logprobs": [float(x) for x in lps], "reward_score": reward,
        "num_turns": len(episode.conversation),
        "extra_fields": {"collab_env": info, "turn_scores": [float(x) for x in tr.turn_rewards]},
    }


def is_recipe_row(row: Mapping[str, Any]) -> bool:
    """Whether verl's sample fields are a CollabLLM recipe row (no ``collab_env`` column, the hidden
    goal in ``extra_info.interaction_kwargs``)."""
    extra = _plain(row.get("extra_info"))
    return row.get("collab_env") is None and isinstance(extra, Mapping) and \
        isinstance(_plain(extra.get("interaction_kwargs")), Mapping)


class EnvPool:
    """A worker's envs, reused across samples: one idle list per ``(env_id, env_kwargs)``.

    :meth:`acquire` hands out an idle env or makes one (so there are as many envs as samples run
    at once, and each is made once); :meth:`release` takes it back. Envs are closed at exit.
    """

    def __init__(self) -> None:
        self._idle: dict[str, list[Any]] = {}
        self.made = 0

    @staticmethod
    def key(env_id: str, env_kwargs: Mapping[str, Any]) -> str:
        return json.dumps([env_id, env_kwargs], sort_keys=True, default=repr)

    def acquire(self, env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
        import collab_env

        idle = self._idle.setdefault(self.key(env_id, env_kwargs), [])
        if idle:
            return idle.pop()
        self.made += 1
        return collab_env.make(env_id, **dict(env_kwargs))

    def release(self, env_id: str, env_kwargs: Mapping[str, Any], env: Any) -> None:
        """Take ``env`` back for the next sample (which plays it with its own policy table)."""
        self._idle.setdefault(self.key(env_id, env_kwargs), []).append(env)

    def close(self) -> None:
        for envs in self._idle.values():
            for env in envs:
                env.close()
        self._idle.clear()


#: This worker's envs (verl builds a loop object per sample; the envs outlive them).
ENV_POOL = EnvPool()
atexit.register(ENV_POOL.close)


class CollabEnvAgentLoop(AgentLoopBase):
    """verl agent loop over any collab_env env (see the module docstring for its configuration).

    verl builds it per sample with its own constructor arguments (passed through unchanged) and
    the entries of its agent-loop YAML (the keys of :data:`CONFIG_KEYS`; ``name`` and
    ``_target_`` are verl's own).
    """

    def __init__(self, *args: Any, name: str | None = None, **kwargs: Any):
        self.loop_config = {k: _plain(kwargs.pop(k)) for k in list(kwargs) if k in CONFIG_KEYS}
        super().__init__(*args, **kwargs)
        trainer_config: Any = kwargs.get("trainer_config", args[0] if args else None)  # verl's
        config = trainer_config.config
        rollout = config.actor_rollout_ref.rollout
        self.response_length = int(rollout.response_length)
        self.overrides = recipe_overrides(config)
        data = config_section(config, "data")
        files = data.get("train_files")
        self.train_files = ([files] if isinstance(files, str) else list(files)) if files else None

    def settings(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The loop's configuration with the row's ``collab_env`` column merged over it, and
        verl's recipe knobs over the env's reward keywords."""
        column = _plain(row.get("collab_env")) or {}
        if not isinstance(column, Mapping):
            raise ConfigError(f"the row's collab_env column must be a mapping, got {type(column).__name__}.")
        unknown = sorted(set(column) - set(CONFIG_KEYS))
        if unknown:
            raise ConfigError(f"unknown keys {unknown} in the row's collab_env column (known: {list(CONFIG_KEYS)}).")
        out = {**self.loop_config, **column}
        if isinstance(out.get("env_kwargs"), str):  # write_dataset stores them as JSON text
            out["env_kwargs"] = loads(out["env_kwargs"], "the row's collab_env.env_kwargs")
        for key in ("index", "seed"):
            if out.get(key) is not None:
                out[key] = int(out[key])
        if not out.get("env_id"):
            raise ConfigError("the collab_env agent loop needs env_id: set it in the agent loop YAML entry "
                              "or in the rows' collab_env column (collab_env.adapters.verl.dataset_rows).")
        env_kwargs = with_overrides(dict(out.get("env_kwargs") or {}), self.overrides)
        if is_recipe_row(row):
            out["item"] = {"prompt": _plain(row.get("raw_prompt", row.get("prompt"))),
                           "extra_info": _plain(row["extra_info"]), "reward_model": _plain(row.get("reward_model"))}
            out["index"] = None
            env_kwargs.setdefault("system_prompt", None)  # the row's own system prompt is the policy's
            if self.train_files and not env_kwargs.get("data_files") and str(out["env_id"]).startswith("collabllm"):
                env_kwargs["data_files"] = self.train_files  # rows to build the env on; each sample plays its own
        out["env_kwargs"] = env_kwargs
        return out

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        """Play one episode (see the module docstring) and return its ``AgentLoopOutput``."""
        start = time.perf_counter()
        cfg = self.settings(kwargs)
        env = ENV_POOL.acquire(cfg["env_id"], cfg["env_kwargs"])
        try:
            player = trained_player(env, cfg.get("player"))
            policy = ServerPolicy(self.server_manager, self.tokenizer, sampling_params,
                                  system_prompt=cfg.get("system_prompt"), pass_seed=bool(cfg.get("pass_seed", False)))
            episode = await play_episode(env, policy, player=player, policies=cfg.get("policies"),
                                         sampling=cfg.get("sampling"), index=cfg.get("index"), seed=cfg.get("seed"),
                                         max_player_turns=cfg.get("max_player_turns"), item=cfg.get("item"))
        except BaseException:
            env.close()  # an env whose episode failed mid-way is not reused
            raise
        ENV_POOL.release(cfg["env_id"], cfg["env_kwargs"], env)
        fields = episode_output(episode, player, response_length=self.response_length)
        # verl's AgentLoopMetrics: the wall time of the episode (every player's turns and the
        # reward's futures) counts as generation time
        return AgentLoopOutput(metrics={"generate_sequences": time.perf_counter() - start}, **fields)


for _name in AGENT_NAMES:
    register(_name)(CollabEnvAgentLoop)
