"""What the conversation rewards share: the rewarded player, the weights, the reward components
they record, and the rules for naming the user simulator of the futures.

Used by :class:`~collab_env.rewards.mr.MultiturnAwareReward`,
:class:`~collab_env.rewards.conversation.ConversationReward` and
:func:`~collab_env.rewards.defaults.default_reward` (all importable from
:mod:`collab_env.rewards.mr`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.errors import ConfigError
from collab_env.policy import load_entry_point, policies_for
from collab_env.rewards.aggregation import DEFAULT_WEIGHTS, ScoredFutures

__all__ = [
    "REPLAY",
    "USER_CHOICES",
    "is_replay",
    "ignores_candidate",
    "check_explicit_user",
    "rewarded_player",
    "weights_for",
    "record_components",
]

#: ``user="replay"`` (or ``policies={user: "replay"}``): roll futures with the env's default user
#: even though it ignores the candidate (``SessionReplayUser`` replays recorded turns).
REPLAY = "replay"

#: The ways to name the user simulator of MR futures, for error messages.
USER_CHOICES = ("'embedded' (the local SmolLM2 model)", "an API model string such as 'litellm:openai/gpt-4o-mini'",
                "a policy object (e.g. collab_env.agents.users.LLMUserSimulator(...))",
                "'replay' (replay the dataset's recorded user turns; they ignore the candidate reply)")


def is_replay(ref: Any) -> bool:
    """Whether a policy reference is :data:`REPLAY`."""
    return isinstance(ref, str) and ref == REPLAY


def ignores_candidate(policy: Any) -> bool:
    """Whether ``policy`` (an object, or a ``"module:Class"`` spec) declares that its messages
    do not depend on the conversation (``ignores_candidate = True``, e.g. a user replaying
    recorded turns): futures rolled with it cannot tell one candidate reply from another."""
    if isinstance(policy, str):
        if ":" not in policy:
            return False
        try:
            policy = load_entry_point(policy)
        except (ImportError, AttributeError):
            return False
    return bool(getattr(policy, "ignores_candidate", False))


def check_explicit_user(env: Any, given: Mapping[str, Any]) -> None:
    """Refuse to roll futures with a default user that ignores the candidate.

    Args:
        env: The env whose futures will be rolled.
        given: Player -> future policy the caller named (``"replay"`` allowed).

    Raises:
        ConfigError: A user player has no policy in ``given`` and the spec's default for it
            ignores the candidate, or ``"replay"`` names a player whose default does not replay.
    """
    defaults = policies_for(env.spec)
    env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    for u in env.unwrapped.task.user_players:
        ref = given.get(u)
        if is_replay(ref):
            if u not in defaults or not ignores_candidate(defaults[u]):
                raise ConfigError(
                    f"user={REPLAY!r} replays a dataset's recorded user turns, but the default user of {env_id} "
                    f"({defaults.get(u)!r}) is not a replaying one: pass the simulator itself (or leave user unset "
                    "to use the env's reactive default)."
                )
        elif ref is None and u in defaults and ignores_candidate(defaults[u]):
            raise ConfigError(
                f"the multiturn-aware reward on {env_id} needs an explicit user simulator for {u!r}: the env's "
                f"default user ({defaults[u]}) replays recorded turns and ignores the reply being rewarded, so "
                "every candidate would get the same futures. Name the user simulator with "
                "collab_env.make(..., reward='mr', reward_kwargs={'user': ...}) or default_reward(..., user=...) "
                f"(collab-env eval: --policy {u}=llm-user:<backend spec> plays the episode's and the futures' user), "
                "as one of: " + "; ".join(USER_CHOICES) + " (MultiturnAwareReward itself takes a simulator policy "
                "or 'replay' in policies={'user': ...})."
            )


def rewarded_player(env: Any, player: str | None) -> str:
    """``player`` checked against the env's players, or (``None``) the task's only trainable
    player.

    Raises:
        ConfigError: ``player`` is not a player of the env, or it is ``None`` and the task does
            not have exactly one trainable player.
    """
    task = env.unwrapped.task
    if player is None:
        trainable = [p for p in env.possible_agents if task.is_trainable(p)]
        if len(trainable) != 1:
            raise ConfigError(
                f"the env has {len(trainable)} trainable players {trainable}; pass player=... to say "
                "whose replies are rewarded."
            )
        return trainable[0]
    if player not in env.possible_agents:
        raise ConfigError(f"player {player!r} is not a player of the env {list(env.possible_agents)}.")
    return player


def weights_for(env: Any, weights: Mapping[str, float] | None) -> dict[str, float]:
    """``weights`` as given, else the env spec's ``reward`` weights, else (a spec with none)
    :data:`~collab_env.rewards.aggregation.DEFAULT_WEIGHTS`.

    Raises:
        ConfigError: The spec's weights name a metric that is not registered (the env's own
            reward, e.g. length-ratio's ``length_ratio``, is no metric of these rewards): pass
            ``weights`` with registered metrics instead of scoring something else silently.
    """
    if weights is not None:
        return dict(weights)
    from collab_env.rewards.metrics import list_metrics

    spec_w = dict(env.spec.reward) if env.spec is not None else {}
    if not spec_w:
        return dict(DEFAULT_WEIGHTS)
    unknown = [m for m in spec_w if m not in list_metrics() and not m.startswith("extract->")]
    if unknown:
        raise ConfigError(
            f"{env.spec.id}'s reward weights {spec_w} name {unknown}, which are not registered metrics, so "
            "reward='mr'/'conversation' cannot score them; pass reward_kwargs={'weights': {...}} with registered "
            f"metrics ({', '.join(sorted(list_metrics()))}), or register the metric first (register_metric)."
        )
    return spec_w


def record_components(infos: dict, player: str, rewards: Mapping[str, float], result: ScoredFutures,
                      name: str) -> dict:
    """Add the env's reward (``"env"``), each metric's contribution and the reward (``name``) to
    ``player``'s reward components; return its info dict."""
    info = infos.setdefault(player, {})
    components = dict(info.get("reward_components", {}))
    components["env"] = float(rewards[player])
    components.update(result.contributions)
    components[name] = result.reward
    info["reward_components"] = components
    return info
