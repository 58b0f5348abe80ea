"""``collab_env.make``: a registered env composed with a reward and a view.

The registry builds the base env (:func:`collab_env.registry.make_base_env`); this thin composer
sits above it and above the reward wrappers and the single-agent view, and applies them:

* ``reward=``: ``"mr"`` (the multiturn-aware reward) or ``"conversation"`` (scored at the
  episode's end), built from the spec's reward weights by
  :func:`collab_env.rewards.mr.default_reward`; or one of the spec's own ``reward_options``
  (e.g. ``"joint-shared"``: :class:`~collab_env.rewards.joint.JointReward` with the task's
  reward function);
* ``view=<player>``: the single-agent Gymnasium view of that player
  (:class:`collab_env.wrappers.single_agent.SingleAgentEnv`), the other players driven by
  ``policies=`` merged over the spec's default policies.

Both are imported when asked for, so ``import collab_env`` stays light. Gymnasium's
``collab_env/<id>`` ids build through :func:`make_gym_view`.

This is the one home of the id convenience: the registry below only builds base envs from their
factories, and nothing below this layer composes an env from an id (the package's face,
``collab_env.make``, is this :func:`make`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError, ZeroRewardWarning
from collab_env.policy import load_entry_point
from collab_env.registry import make_base_env, spec

__all__ = ["make", "make_gym_view", "REWARDS", "reward_options_note"]

#: The values of ``make(reward=...)``: ``None`` keeps the env's own reward.
REWARDS: tuple[str | None, ...] = (None, "mr", "conversation")


def make(
    env_id: str,
    *,
    view: str | None = None,
    policies: Mapping[str, Any] | None = None,
    render_mode: str | None = None,
    reward: str | None = None,
    reward_kwargs: Mapping[str, Any] | None = None,
    **overrides: Any,
):
    """Build a registered environment, with a reward wrapper and a view if asked.

    Args:
        env_id: Registered id; ``"name"`` means the latest version.
        view: A player id: return the single-agent Gymnasium view for that player instead of the
            ParallelEnv, the other players driven by ``policies`` or the spec's defaults.
        policies: Player -> policy object or ``"module:Class"`` spec (only with ``view``).
        render_mode: ``"ansi"`` or ``"human"``.
        reward: ``None`` (the env's own reward), ``"mr"`` (the multiturn-aware reward) or
            ``"conversation"`` (scored at the episode's end), built from the spec's reward
            weights by :func:`collab_env.rewards.mr.default_reward`; or an option of the spec's
            ``reward_options`` (``"joint-shared"``...: ``reward_kwargs`` go to ``JointReward``).
        reward_kwargs: Keywords for that builder: ``judge``, ``user``, ``policy`` (an API model
            string, ``"embedded"`` or a policy object), ``num_rollouts``, ``aggregation``...
            ``reward="mr"`` on an env whose default user ignores the reply (the ``collabllm-*``
            envs replay recorded turns) needs ``user`` (``"replay"`` keeps the recorded turns
            on purpose); without it :class:`~collab_env.errors.ConfigError` lists the choices.
        **overrides: Merged over the spec's kwargs; unknown keywords are an error that lists the
            valid ones.

    Warns:
        ZeroRewardWarning: ``reward=None`` on an env whose own reward is 0 at every step by
            construction (the ``collabllm-*`` and chat envs): the message
            (:func:`reward_options_note`) lists the reward options and what each needs.

    Raises:
        UnknownEnvError: ``env_id`` is not registered (with the closest ids).
        ConfigError: ``reward`` is not one of :data:`REWARDS`, ``reward_kwargs`` without a
            reward, ``policies`` without a view, or a bad keyword.
    """
    own = spec(env_id).reward_options
    if reward not in REWARDS and reward not in own:
        choices = ", ".join(repr(r) for r in (*REWARDS, *own))
        raise ConfigError(f"reward must be one of {choices} for {env_id}, got {reward!r}.")
    if reward is None and reward_kwargs:
        raise ConfigError("reward_kwargs= needs a reward (reward='mr', 'conversation' or an option of the spec).")
    env = make_base_env(env_id, render_mode=render_mode, **overrides)
    if reward is None:
        note = reward_options_note(env_id)
        if note is not None and spec(env_id).id not in _NOTED:  # once per env id and process
            _NOTED.add(spec(env_id).id)
            warnings.warn(note, ZeroRewardWarning, stacklevel=2)
    if reward is not None and reward in own:
        from collab_env.rewards.joint import JointReward

        how = own[reward]
        env = JointReward(env, load_entry_point(how["joint"]), mode=how.get("mode", "shared"),
                          **dict(reward_kwargs or {}))
    elif reward is not None:
        from collab_env.rewards.defaults import default_reward

        reward_kwargs = dict(reward_kwargs or {})
        if overrides.get("prompts") not in (None, "collab_env"):  # the env's reference prompts: its reward's too
            reward_kwargs.setdefault("prompts", overrides["prompts"])
        env = default_reward(env, "mr" if reward == "mr" else "conversation", **reward_kwargs)
    if view is None:
        if policies is not None:
            raise ConfigError("policies= only applies with view=<player>; drive players yourself otherwise.")
        return env
    from collab_env.wrappers.single_agent import SingleAgentEnv

    return SingleAgentEnv(env, player=view, policies=policies)


#: The env ids whose :class:`ZeroRewardWarning` was issued in this process (it is said once).
_NOTED: set[str] = set()


@functools.cache
def reward_options_note(env_id: str) -> str | None:
    """What to say when ``env_id`` is built without a reward option and its own reward is 0 at
    every step by construction (its spec's ``reward_range`` is ``(0, 0)``): the reward options
    that score it and what each needs (an LLM judge for the judged metrics, a user simulator for
    the multiturn-aware reward's futures when the env's own user replays recorded turns).
    ``None`` for an env whose own reward scores it."""
    from collab_env.rewards.common import ignores_candidate
    from collab_env.rewards.metrics import get_metric, list_metrics

    s = spec(env_id)
    if tuple(float(b) for b in s.reward_range) != (0.0, 0.0):
        return None
    metrics = [m for m in s.reward if m in list_metrics()]
    judged = [m for m in metrics if set(get_metric(m).needs) & {"judge", "extractor"}]
    replaying = [u for u, ref in (s.default_policies or {}).items() if ignores_candidate(ref)]
    judge = f", and needs an LLM judge for {', '.join(judged)} (judge=SPEC; CLI: --judge SPEC)" if judged else ""
    parts = [f"reward='conversation' scores the finished conversation by {', '.join(metrics)}{judge}"]
    mr = "reward='mr' (CollabLLM's multiturn-aware reward) scores each reply by sampled future conversations"
    needs = (["the judge"] if judged else []) + [
        f"a user simulator for the futures (user=SPEC; in collab-env eval, --policy {u}=llm-user:<backend> plays "
        "them)" for u in replaying]
    parts.append(mr + (f"; it needs {' and '.join(needs)}" if needs else ""))
    parts += [f"reward={k!r} (the env's own option)" for k in s.reward_options]
    return (f"{s.id}'s own reward is 0 at every step by construction: its score comes from a reward option. "
            + "; ".join(parts) + ". From the command line: collab-env eval ... --reward mr"
            + (" --judge SPEC." if judged else "."))


def make_gym_view(env_id: str, player: str | None = None, policies: Mapping[str, Any] | None = None,
                  render_mode: str | None = None, reward: str | None = None,
                  reward_kwargs: Mapping[str, Any] | None = None, **overrides: Any):
    """The entry point of ``gymnasium.make("collab_env/<id>")``: the single-agent view of
    ``player`` (default: the spec's first trainable player, else its first player)."""
    s = spec(env_id)
    player = player or (s.trainable[0] if s.trainable else s.players[0])
    return make(env_id, view=player, policies=policies, render_mode=render_mode, reward=reward,
                reward_kwargs=reward_kwargs, **overrides)

