"""The conversation-level reward: the finished conversation scored once, at the episode's end.

:class:`ConversationReward` applies the weighted metrics and aggregation rules of the
multiturn-aware reward (:mod:`collab_env.rewards.mr`) to the whole conversation, for evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab_env.rewards.aggregation import MetricSet
from collab_env.rewards.common import record_components, rewarded_player, weights_for
from collab_env.wrappers.base import EnvWrapper

__all__ = ["ConversationReward"]


class ConversationReward(EnvWrapper):
    """Score the finished conversation with weighted metrics, at the end of the episode.

    For evaluation: the same metrics and aggregation rules as
    :class:`~collab_env.rewards.mr.MultiturnAwareReward`,
    applied once to the whole conversation when the episode ends (terminated or truncated by
    the env). ``player`` gets the conversation reward at the final step (its other steps keep
    the env's reward); ``infos[player]["conversation_reward"]`` holds the reward and, per metric,
    the raw value, weight and contribution; ``reward_components`` adds the contributions,
    ``"conversation"`` and ``"env"``. ``start`` for future-scoped metrics is the first message
    written after the reset (the whole episode counts; a dataset prefix does not).

    Args:
        env: The env to wrap.
        weights: Metric -> weight (default: the spec's reward weights, which must name registered
            metrics; :data:`~collab_env.rewards.aggregation.DEFAULT_WEIGHTS` for a spec with none).
        aggregation: ``"verl"``, ``"collabllm"`` (default: the plain weighted sum) or ``"paper"``.
        player: The rewarded player (default: the only trainable player).
        metric_ctx: Resources for the metrics.
        token_metric: The metric the ``"paper"`` rule caps.

    A metric fault (judge, sandbox) raises :class:`~collab_env.errors.RewardError`: an
    evaluation episode without its score is a failed episode, reported as such.
    """

    def __init__(self, env: Any, *, weights: Mapping[str, float] | None = None, aggregation: str = "collabllm",
                 player: str | None = None, metric_ctx: Mapping[str, Any] | None = None,
                 token_metric: str = "token_amount") -> None:
        super().__init__(env)
        self.player = rewarded_player(env, player)
        self.metric_set = MetricSet(weights_for(env, weights), aggregation=aggregation, ctx=metric_ctx,
                                    token_metric=token_metric, on_fault="drop")
        self._start = 0

    async def areset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        out = await self.env.areset(seed=seed, options=options)
        state = self.env.unwrapped.episode
        # A dataset prefix is not the episode's own text: start after it.
        prefix = [i for i, m in enumerate(state.messages) if m.meta.get("from_data")]
        self._start = (prefix[-1] + 1) if prefix else len(state.messages)
        return out

    async def astep(self, actions: Mapping[str, str]):
        obs, rewards, terms, truncs, infos = await self.env.astep(actions)
        state = self.env.unwrapped.episode
        if not state.done or self.player not in rewards:
            return obs, rewards, terms, truncs, infos
        result = await self.metric_set.score([state.conversation], state.item, start=self._start,
                                             player=self.player)
        info = record_components(infos, self.player, rewards, result, "conversation")
        info["conversation_reward"] = {
            "reward": result.reward,
            "aggregation": self.metric_set.aggregation,
            "metrics": {m: {"value": result.values[m][0], "weight": self.metric_set.weights[m],
                            "contribution": result.contributions[m], "detail": result.details[0][m]}
                        for m in result.values},
            "cost": result.cost,
        }
        rewards = dict(rewards)
        rewards[self.player] = result.reward
        return obs, rewards, terms, truncs, infos
