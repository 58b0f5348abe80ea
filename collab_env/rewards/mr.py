"""The multiturn-aware reward (MR) of CollabLLM, and the conversation-level reward.

:class:`MultiturnAwareReward` rewards a reply by the conversations that *follow* it. After the
rewarded player (the assistant) moves, the wrapper forks the env ``num_rollouts`` times, rolls
every fork forward with the given policies (the assistant's own policy for future assistant
turns, the user simulator for the user) up to a window, scores each future with weighted
metrics (:mod:`collab_env.rewards.metrics`) and aggregates::

    from collab_env.rewards.mr import MultiturnAwareReward

    env = MultiturnAwareReward(  # stepped directly: the fixed policies below play the futures
        base_env,
        policies={"assistant": policy, "user": LLMUserSimulator("litellm:openai/gpt-4o-mini")},
        weights={"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
        metric_ctx={"judge_backend": "litellm:openai/gpt-4o-mini"},
    )

:class:`ConversationReward` scores the finished conversation once, at the end of an (evaluation)
episode, with the same metrics and rules. :func:`default_reward` builds either from an env's
spec (the ``collabllm-*`` envs' weights from the paper and the verl recipe), with the judge, the
user simulator and the future policy given as an API model string, ``"embedded"`` or a policy
object; ``collab_env.make(id, reward="mr", reward_kwargs={...})`` calls it.

Aggregation rules (``aggregation=``), for metric values ``v[m][r]`` of rollout ``r``, weights
``w[m]`` and ``n`` scored rollouts:

``"verl"`` (default; the CollabLLM recipe on verl: its ``collabllm`` reward manager, agent loop
and interaction)
    Per metric, the mean over rollouts times the weight, clamped to [-1, 1]; the reward is the
    sum: ``R = sum_m clamp(w[m] * mean_r v[m][r], -1, 1)``.
``"collabllm"`` (the collabllm package's ``multiturn_aware_reward``)
    Per rollout, the weighted sum of the metrics; the reward is the mean over rollouts:
    ``R = mean_r sum_m w[m] * v[m][r]``. Without the clamp it equals the verl rule whenever no
    weighted mean leaves [-1, 1].
``"paper"`` (the CollabLLM paper)
    Per rollout, task metric + judge score - ``min(lambda * tokens, 1)``, where ``lambda`` is
    ``-w[token_metric]`` (so the token weight must be negative) and every other metric counts
    with its weight: ``R = mean_r (sum_{m != tok} w[m] v[m][r] - min(lambda * v[tok][r], 1))``.

Every rule reports one *contribution* per metric, and the contributions sum to the reward
(``infos[player]["reward_components"]``). Each rule also brings its reference's edge cases:

=============================  ==============================  ======================  ==================
case                           ``"verl"``                      ``"collabllm"``         ``"paper"``
=============================  ==============================  ======================  ==================
invalid reply (empty or        reward 0, no future rolled      scored like any text    scored like any
blank; unbalanced, nested,     (``zero_reason:                 (the package checks     text (the paper
repeated or empty ``<think>``  "invalid_reply"``), see         nothing)                states no rule)
block; no visible text left)   :func:`is_valid_reply`
reply leaves no turn budget    reward 0, no future             scored as it stands,    as ``"collabllm"``
(``max_assistant_turns <= 1``  (``"turn_budget"``): verl       once (the package's
or the env truncated the       ends the sample before any      ``max_new_turns=0``
episode at the reply)          interaction                     scores the chat as is)
``<think>...</think>``         removed (and each message       kept                    kept
                               whitespace-trimmed) before the
                               user simulator and the
                               metrics read a transcript
last future assistant turn     dropped: verl generates it,     kept: the package's     as ``"collabllm"``
when the turn budget ends      sees the budget spent and       window counts messages
                               discards it, so futures end     of both sides
                               on a user turn (here it is      (``max_new_turns=N``
                               not generated: its text could   ~ ``max_user_turns=
                               not change the reward)          ceil(N/2)``,
                                                               ``max_assistant_turns=
                                                               floor(N/2)+1``)
``future_token_budget``        the reply and its future share  off by default; same    as ``"collabllm"``
(recipe: 2,048 =               it: a reply that reaches it     cut when set
``max_response_length``)       gets 0 (``"token_budget"``); a
                               future assistant turn that
                               reaches it is dropped and ends
                               the future; user turns count
                               but never cut
a judge / simulator fault in   metric 0 / empty user message   raises                  (no rule)
the reference                  after retries
here, by default               drop the future and count it    drop and count          drop and count
                               (``on_fault="zero"``            (``on_fault="raise"``
                               reproduces verl)                reproduces the package)
``max_user_turns=0``           the immediate reward here       the immediate reward    the immediate
                               (verl's 0 disables the limit)                           reward
=============================  ==============================  ======================  ==================

Choices made where the implementations disagree or leave a gap (stated here, tested in
``tests/rewards/test_mr.py``):

* **The window counts turns per side, and the candidate reply counts**, as in the verl agent
  loop: a future continues while the user has written fewer than ``max_user_turns`` messages
  and the assistant fewer than ``max_assistant_turns`` *including the reply being rewarded*.
  With the recipe's defaults (2 user, 3 assistant turns) a future is
  ``reply, user, assistant, user``: **the last future turn is the user's**. Under the
  ``"collabllm"`` and ``"paper"`` rules ``max_user_turns >= max_assistant_turns`` ends futures
  on an assistant turn instead; under ``"verl"`` a future never ends on an assistant turn the
  turn budget cut (see the table). Turns are messages of a side, not env steps.
* **Window 0 is the immediate reward**: ``max_user_turns=0`` (or, outside ``"verl"``,
  ``max_assistant_turns=1``) scores the conversation as it stands after the reply, once
  (``n = 1``; a deterministic env and temperature-0 judges gain nothing from repeats). The same
  happens when the reply *terminated* the episode (the task ended): there is no future.
* **Token counts start at the reply**: metrics get ``start`` = the index of the rewarded reply,
  so ``token_amount`` (scope ``"future"``) counts the reply and everything after it, as the
  verl metric counts every message after the prompt. The ``future_token_budget`` counts with
  ``token_counter`` (default: whitespace words, the recipe's own token estimate; pass the
  policy's tokenizer for verl's token ids; chat-template tokens are not counted).
* **Faults are never a silent score.** A future whose policy returns a fault completion or
  raises :class:`~collab_env.errors.PolicyError`, or whose scoring raises
  :class:`~collab_env.errors.JudgeError` / :class:`~collab_env.errors.SandboxError`, is
  dropped from the aggregate and reported in ``infos[player]["mr"]["faults"]``
  (``on_fault="drop"``, default); with ``on_fault="raise"`` the first fault raises; with
  ``on_fault="zero"`` (verl's numbers) a failed metric is 0 for that future, a failed user
  simulator writes an empty message and the future goes on, and a failed policy of another
  player raises (verl's rollout fails too). Every fault, zeroed or dropped, is in ``faults``
  (zeroed ones with ``"zeroed": True``) and in ``cost["faults"]``. When no future could be
  scored, :class:`~collab_env.errors.RewardError` is raised: the step fails loudly (a rollout
  engine counts the episode as failed) instead of getting a made-up reward.
* **The user simulator must be named** (``policies={"user": ...}`` or ``default_reward(user=...)``)
  when the env's default user *ignores the candidate*: a policy class with
  ``ignores_candidate = True``, such as the ``collabllm-*`` envs'
  :class:`~collab_env.tasks.collabllm.SessionReplayUser`, which replays recorded turns whatever
  the reply says. ``"replay"`` selects that default on purpose. Reactive scripted users (the
  hidden-facts user answers the reply's questions) stay the default.
* The standard deviation reported per metric is the population one over scored rollouts.

This module defines :class:`MRScorer`, the stage of the episode driver that rolls and scores
the futures (played by :func:`collab_env.rollout.driver.advance` with the driver's own policy
table), and :class:`MultiturnAwareReward`, the env wrapper that carries it. Nothing is bound into
an env: played through the episode driver, the futures' assistant is the policy that plays the
episode (a learner's live model, sampling as its rollouts do); stepped directly, the wrapper
plays the policies it was built with. The rest has one module a job, each its names' one import
path: :mod:`~collab_env.rewards.reply_rules` (the verl recipe's reply rules),
:mod:`~collab_env.rewards.aggregation` (:func:`~collab_env.rewards.aggregation.aggregate`,
:class:`~collab_env.rewards.aggregation.MetricSet`), :mod:`~collab_env.rewards.common` (the
rewarded player, the weights, the user-simulator rules), :mod:`~collab_env.rewards.conversation`
(:class:`~collab_env.rewards.conversation.ConversationReward`) and
:mod:`~collab_env.rewards.defaults` (:func:`~collab_env.rewards.defaults.default_reward`).

Version history of the reward (not of the envs):

* v1: the ``"verl"`` rule's edge cases (invalid reply, turn budget, ``<think>`` stripping, the
  dropped last assistant turn), ``future_token_budget``, ``on_fault="zero"``; MR refuses to
  roll futures with a user that ignores the candidate unless asked (``"replay"``).
* v0: aggregation only.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any, Literal

from collab_env.errors import ConfigError, PolicyError
from collab_env.policy import SamplingParams, add_usage, describe, fork_policy, policies_for, resolve_policy
from collab_env.rewards.aggregation import MetricSet, ScoredFutures
from collab_env.rewards.common import (
    check_explicit_user,
    is_replay,
    record_components,
    rewarded_player,
    weights_for,
)
from collab_env.rewards.reply_rules import is_valid_reply, strip_think_conversation, token_count_fn
from collab_env.rollout.driver import advance
from collab_env.types import Conversation
from collab_env.wrappers.base import EnvWrapper

__all__ = ["MRScorer", "MultiturnAwareReward", "rolls_futures"]


#: Seconds a rewarded step runs before its progress shows (a fast step shows nothing).
PROGRESS_DELAY_S = 2.0

#: The recipe's window: future user messages and assistant messages (the reply included) at most.
MAX_USER_TURNS = 2
MAX_ASSISTANT_TURNS = 3


def rolls_futures(max_user_turns: int = MAX_USER_TURNS, max_assistant_turns: int = MAX_ASSISTANT_TURNS) -> bool:
    """Whether an :class:`MRScorer` with this window samples future turns (``False``: the
    immediate reward)."""
    return max_user_turns != 0 and max_assistant_turns > 1


def _mix_seed(*parts: int) -> int:
    """A future's policy seed (31 bits) from the episode seed, the step, the rollout and the round."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % (2**31 - 1)


class MRScorer:
    """CollabLLM's multiturn-aware reward as a stage of the episode driver: reward ``player``'s
    replies by sampled future conversations.

    The driver (:func:`~collab_env.rollout.driver.advance`) calls :meth:`score` after each round
    in which ``player`` moved, with its own policy table: the futures play ``player`` with the
    driver's policy for it (the policy that wrote the reply), and the other players with the
    policies named here (a user simulator), else the driver's, else the spec's defaults.

    Args:
        env: The env it scores (a ``CollabEnv`` or a wrapper of one): its spec, players and task.
        policies: Player -> policy (object, alias or ``"<backend>:<model>"``) for the future
            turns. A policy named here for another player always plays that player's future
            turns (the user simulator). A policy for ``player`` itself is used only when the
            driver has none for it (plain ``env.step`` through :class:`MultiturnAwareReward`, a
            single-agent view whose controlled player is the rewarded one). Other players
            default to the driver's policies, then the spec's defaults, except a default user
            that ignores the candidate (``SessionReplayUser`` of the ``collabllm-*`` envs): name
            the user simulator (an LLM user simulator, or
            :data:`~collab_env.rewards.common.REPLAY` to replay the recorded turns on purpose).
        weights: Metric -> weight (default: the env spec's ``reward`` weights, which must name
            registered metrics; :data:`~collab_env.rewards.aggregation.DEFAULT_WEIGHTS` for a
            spec with none).
        num_rollouts: Futures sampled per reply (recipe: 3).
        max_user_turns: Future user messages at most (recipe: 2). 0 = the immediate reward.
        max_assistant_turns: ``player`` messages at most, the rewarded reply included (recipe: 3).
        aggregation: ``"verl"`` (default), ``"collabllm"`` or ``"paper"``.
        player: The rewarded player (default: the only trainable player of the task).
        metric_ctx: Resources for the metrics (``judge``, ``judge_backend``, ``tokenizer``,
            ``sandbox``, ``rubric``, ``scope``...).
        sampling: Player -> sampling keywords for the future turns. For a player the driver
            plays, the driver's sampling keywords for it override these, key by key (a learner's
            futures sample as its rollouts do).
        token_metric: The metric the ``"paper"`` rule caps at 1.
        on_fault: ``"drop"`` (default), ``"raise"`` or ``"zero"`` (verl: a failed metric counts 0,
            a failed user simulator writes an empty message).
        return_futures: Put the sampled futures (message dicts) in the infos.
        future_token_budget: Tokens the reply and each of its futures may use together (verl's
            ``max_response_length``, 2,048 in the recipe); ``None`` (default): no budget.
        token_counter: How the budget counts: ``None`` (whitespace words), a tokenizer (its
            ``encode``) or a callable ``text -> int``.
        progress: Show the progress of each rewarded step on stderr (futures rolled, futures
            scored by their metrics and judges), once it has run :data:`PROGRESS_DELAY_S` seconds:
            ``None`` (default) draws a bar on a terminal only, ``True`` also prints lines when
            stderr is redirected, ``False`` never shows it.

    Rewards: ``player`` gets the MR at every step where it moved; other players (and
    ``player`` at steps where it did not move) keep the env's reward.

    Infos: at a rewarded step, ``infos[player]["mr"]`` holds ``reward``, ``aggregation``,
    ``num_rollouts``, ``scored`` (rollouts scored), ``metrics`` (per metric ``mean``, ``std``,
    ``weight``, ``contribution``, ``values``), ``cost`` (summed usage of the futures' policy
    calls and of the metrics: ``model_calls``, ``prompt_tokens``, ``completion_tokens``,
    ``judge_calls``, ``policy_calls``, ``faults``...), ``faults`` (one record per dropped
    future), ``future_turns`` (messages generated per future), ``dropped_turns`` (future
    assistant turns the verl rule or the token budget dropped, per future), ``zero_reason``
    (``None``, or why the verl rule gave 0 without futures: ``"invalid_reply"``,
    ``"turn_budget"``, ``"token_budget"``), ``window``, ``policies`` (who played each player's
    future turns) and, with ``return_futures``, ``futures``.
    ``infos[player]["reward_components"]`` adds each metric's contribution, ``"mr"`` (the
    reward) and ``"env"`` (the env's own reward).

    Cumulative counters are in :attr:`stats`.
    """

    def __init__(
        self,
        env: Any,
        *,
        policies: Mapping[str, Any] | None = None,
        weights: Mapping[str, float] | None = None,
        num_rollouts: int = 3,
        max_user_turns: int = MAX_USER_TURNS,
        max_assistant_turns: int = MAX_ASSISTANT_TURNS,
        aggregation: str = "verl",
        player: str | None = None,
        metric_ctx: Mapping[str, Any] | None = None,
        sampling: Mapping[str, Mapping[str, Any]] | None = None,
        token_metric: str = "token_amount",
        on_fault: Literal["drop", "raise", "zero"] = "drop",
        return_futures: bool = False,
        future_token_budget: int | None = None,
        token_counter: Any = None,
        progress: bool | None = None,
    ) -> None:
        for name, v, lo in (("num_rollouts", num_rollouts, 1), ("max_user_turns", max_user_turns, 0),
                            ("max_assistant_turns", max_assistant_turns, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name} must be an int >= {lo}, got {v!r}.")
        if future_token_budget is not None and (isinstance(future_token_budget, bool)
                                                or not isinstance(future_token_budget, int) or future_token_budget < 1):
            raise ConfigError("future_token_budget must be None or an int >= 1 (recipe: 2048), got "
                              f"{future_token_budget!r}.")
        task = env.unwrapped.task
        self.name = "mr"
        self.player = rewarded_player(env, player)
        self.players = tuple(env.possible_agents)
        self.user_players = tuple(task.user_players)
        self.num_rollouts = num_rollouts
        self.max_user_turns = max_user_turns
        self.max_assistant_turns = max_assistant_turns
        self.metric_set = MetricSet(weights_for(env, weights), aggregation=aggregation, ctx=metric_ctx,
                                    token_metric=token_metric, on_fault=on_fault)
        self.sampling = {p: dict(v) for p, v in (sampling or {}).items()}
        for p, kw in self.sampling.items():
            if p not in self.players:
                raise ConfigError(f"sampling for unknown player {p!r}; players are {list(self.players)}.")
            SamplingParams.from_kwargs(**kw)  # an unknown or invalid keyword fails here, not in a future
        self.return_futures = bool(return_futures)
        self.future_token_budget = future_token_budget
        self._count_tokens = token_count_fn(token_counter)
        self.progress = progress
        self.named = self._named_policies(env, policies)
        self.defaults = self._default_policies(env)
        self.stats: dict[str, float] = {"rewards": 0.0, "rollouts": 0.0, "scored": 0.0, "faults": 0.0}

    @property
    def window_is_zero(self) -> bool:
        """True when no future turn is ever sampled (the immediate reward)."""
        return not rolls_futures(self.max_user_turns, self.max_assistant_turns)

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.metric_set.weights)

    @property
    def aggregation(self) -> str:
        return self.metric_set.aggregation

    def _named_policies(self, env: Any, policies: Mapping[str, Any] | None) -> dict[str, Any]:
        """The policies named for the futures, resolved (``"replay"``: the spec's default user)."""
        given = dict(policies or {})
        unknown = [p for p in given if p not in self.players]
        if unknown:
            raise ConfigError(f"policies for unknown players {unknown}; players are {list(self.players)}.")
        defaults = policies_for(env.spec)
        if not self.window_is_zero:
            check_explicit_user(env, given)
        elif any(is_replay(v) and p not in defaults for p, v in given.items()):
            given = {p: v for p, v in given.items() if not (is_replay(v) and p not in defaults)}
        return {p: resolve_policy(defaults[p] if is_replay(v) else v) for p, v in given.items()}

    def _default_policies(self, env: Any) -> dict[str, Any]:
        """The spec's default policies of the players other than ``player`` that nobody named,
        resolved when futures are rolled (a default user that ignores the candidate was refused
        by :func:`~collab_env.rewards.common.check_explicit_user`)."""
        if self.window_is_zero:
            return {}
        defaults = policies_for(env.spec)
        return {p: resolve_policy(defaults[p]) for p in self.players
                if p != self.player and p not in self.named and p in defaults}

    def missing_policies(self, policies: Mapping[str, Any]) -> list[str]:
        """The players whose future turns would have no policy if the driver played with
        ``policies`` (empty at window 0, where nothing is rolled): a caller that cannot hand the
        driver a policy for them (TRL's tool route) refuses up front."""
        if self.window_is_zero:
            return []
        return [p for p in self.players if policies.get(p) is None and p not in self.named
                and (p == self.player or p not in self.defaults)]

    def future_policies(self, policies: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
        """Player -> the policy of its future turns, given the driver's table ``policies``, and
        the players that the driver's policies play (whose sampling keywords apply).

        Precedence: for ``player``, the driver's policy, then the one named here; for another
        player, the one named here, then the driver's, then the spec's default.

        Raises:
            ConfigError: A player has none of them.
        """
        table: dict[str, Any] = {}
        from_driver: set[str] = set()
        for p in self.players:
            own = p == self.player
            if not own and p in self.named:
                table[p] = self.named[p]
            elif policies.get(p) is not None:
                table[p] = fork_policy(policies[p])  # a per-episode policy plays forks through its fork()
                from_driver.add(p)
            elif own and p in self.named:
                table[p] = self.named[p]
            elif p in self.defaults:
                table[p] = self.defaults[p]
            else:
                raise ConfigError(
                    f"the multiturn-aware reward needs a policy for {p!r} to roll futures"
                    + (" (its own future turns: the policy that wrote the reply)" if own else "")
                    + ": play the env through the episode driver (run_episode, advance, the engine, eval or a "
                    f"learner), whose policy for {p!r} then plays its futures, or name one (policies={{{p!r}: ...}}"
                    + (", reward_kwargs={'policy': ...}" if own else "")
                    + "); max_user_turns=0 gives the immediate reward."
                )
        return table, from_driver

    def future_sampling(self, sampling: Mapping[str, Mapping[str, Any]],
                        from_driver: set[str]) -> dict[str, dict[str, Any]]:
        """Player -> sampling keywords of its future turns: the ones given here, overridden key by
        key by the driver's ``sampling`` for the players the driver's policies play (``None``
        values mean "not set")."""
        out = {p: dict(v) for p, v in self.sampling.items()}
        for p in from_driver:
            extra = {k: v for k, v in (sampling.get(p) or {}).items() if v is not None}
            if extra:
                out[p] = {**out.get(p, {}), **extra}
        return out

    def __repr__(self) -> str:
        return (f"<MRScorer {self.player} {self.aggregation} rollouts={self.num_rollouts} "
                f"window=({self.max_user_turns}u,{self.max_assistant_turns}a)>")

    async def score(self, env: Any, rewards: dict[str, float], infos: dict[str, dict[str, Any]], *,
                    policies: Mapping[str, Any], sampling: Mapping[str, Mapping[str, Any]],
                    start: int, step: int) -> None:
        """Score the reply at message ``start`` that ``player`` has just written in ``env``
        (the :class:`~collab_env.rollout.driver.Scorer` stage): sets ``rewards[player]`` and
        adds ``infos[player]["mr"]`` and the reward components."""
        result, extra = await self.score_reply(env, start=start, step=step, policies=policies, sampling=sampling)
        info = record_components(infos, self.player, rewards, result, "mr")
        info["mr"] = {
            "reward": result.reward,
            "aggregation": self.aggregation,
            "num_rollouts": extra["num_rollouts"],
            "scored": len(result.scored),
            "metrics": result.summary(self.metric_set.weights),
            "cost": result.cost,
            "faults": result.faults,
            "future_turns": extra["future_turns"],
            "dropped_turns": extra["dropped_turns"],
            "zero_reason": extra["zero_reason"],
            "window": {"max_user_turns": self.max_user_turns, "max_assistant_turns": self.max_assistant_turns,
                       "future_token_budget": self.future_token_budget, "immediate": extra["immediate"]},
            "policies": extra["policies"],
        }
        if self.return_futures:
            info["mr"]["futures"] = extra["futures"]
        rewards[self.player] = result.reward
        self.stats["rewards"] += 1
        self.stats["rollouts"] += extra["num_rollouts"]
        self.stats["scored"] += len(result.scored)
        self.stats["faults"] += len(result.faults)

    def zero_reason(self, reply: str, state: Any) -> str | None:
        """Why the ``"verl"`` rule rewards the reply just taken 0 without rolling futures, in
        verl's order (token budget, turn budget, validity), or ``None``. Other rules: ``None``
        unless the reply alone reaches ``future_token_budget``. ``state``: the episode state
        (``env.unwrapped.episode``) after the reply."""
        if self.future_token_budget is not None and self._count_tokens(reply) >= self.future_token_budget:
            return "token_budget"
        if self.aggregation != "verl":
            return None
        if self.max_assistant_turns <= 1 or (state.done and state.truncated):
            return "turn_budget"
        if not is_valid_reply(reply):
            return "invalid_reply"
        return None

    async def score_reply(self, env: Any, *, start: int, step: int, policies: Mapping[str, Any] | None = None,
                          sampling: Mapping[str, Mapping[str, Any]] | None = None,
                          ) -> tuple[ScoredFutures, dict[str, Any]]:
        """Sample and score the futures of the reply at message index ``start`` (``env`` has
        just taken it; it is forked, never stepped), with the driver's ``policies`` and
        ``sampling`` (see :meth:`future_policies`). Returns the scores and ``{num_rollouts,
        future_turns, dropped_turns, zero_reason, immediate, futures, policies}``."""
        state = env.unwrapped.episode
        reply = state.messages[start].content
        reason = self.zero_reason(reply, state)
        if reason is not None:  # verl: no interaction at all, the reward manager scores 0
            zero = ScoredFutures(0.0, {m: 0.0 for m in self.metric_set.metrics},
                                 {m: [] for m in self.metric_set.metrics}, [], [], [], {"faults": 0.0})
            return zero, {"num_rollouts": 0, "future_turns": [], "dropped_turns": [], "zero_reason": reason,
                          "immediate": False, "futures": [], "policies": {}}
        immediate = self.window_is_zero or state.done  # (verl gave 0 above to a truncating reply)
        played: dict[str, str] = {}
        if immediate:
            convs: list[Conversation | None] = [state.conversation]
            turns, dropped = [0], [0]
            result = await self.metric_set.score(convs, state.item, start=start, player=self.player)
        else:
            table, from_driver = self.future_policies(policies or {})
            future_sampling = self.future_sampling(sampling or {}, from_driver)
            played = {p: describe(pol) for p, pol in table.items()}
            reply_tokens = self._count_tokens(reply)
            bar = self._progress_bar()
            done = {"rolled": 0, "scored": 0, "faulted": 0}

            def advanced(stage: str, stages: int = 1) -> None:
                done[stage] += 1
                if bar is not None:
                    bar.set_postfix({k: v for k, v in done.items() if v or k != "faulted"}, refresh=False)
                    bar.update(stages)

            async def roll_and_evaluate(r: int, fork: Any) -> dict[str, Any]:
                out = await self.roll_future(fork, r, step, reply_tokens, policies=table, sampling=future_sampling)
                if out["fault"] is not None:  # nothing to score: both of its stages are over
                    out["metrics"] = None
                    advanced("faulted", 2)
                    return out
                advanced("rolled")
                # this future's metrics (its judge calls) start as soon as it ends, while the
                # others still play: a batching backend takes them with the others' turns
                out["metrics"] = await self.metric_set.evaluate(out["conversation"], state.item, start=start,
                                                                player=self.player)
                advanced("scored")
                return out

            forks = [env.clone() for _ in range(self.num_rollouts)]
            try:
                outs = await asyncio.gather(*(roll_and_evaluate(r, f) for r, f in enumerate(forks)))
            finally:
                if bar is not None:
                    bar.close()
            faults: list[Any]
            cost: dict[str, Any]
            convs, faults, cost, turns, dropped = [], [], {}, [], []
            for r, out in enumerate(outs):
                add_usage(cost, out["usage"])
                turns.append(out["generated"])
                dropped.append(out["dropped"])
                faults.extend({"rollout": r, **f} for f in out["zeroed"])
                if out["fault"] is not None:
                    faults.append({"rollout": r, **out["fault"]})
                    convs.append(None)
                else:
                    convs.append(out["conversation"])
            result = self.metric_set.combine([out["metrics"] for out in outs], faults=faults, cost=cost)
        futures = [None if c is None else [m.to_dict() for m in c.messages[start:]] for c in convs]
        return result, {"num_rollouts": len(convs), "future_turns": turns, "dropped_turns": dropped,
                        "zero_reason": None, "immediate": immediate, "futures": futures, "policies": played}

    def _progress_bar(self) -> Any:
        """The progress display of one rewarded step (see ``progress``), or ``None``: two stages
        per future (rolled, then scored)."""
        if self.progress is False:
            return None
        from collab_env._progress import progress_bar

        return progress_bar(2 * self.num_rollouts, f"MR {self.player} ({self.num_rollouts} futures)",
                            show=self.progress, lines=bool(self.progress), unit="stages",
                            delay=PROGRESS_DELAY_S, leave=False)

    async def roll_future(self, fork: Any, rollout: int, step: int, reply_tokens: int = 0, *,
                          policies: Mapping[str, Any], sampling: Mapping[str, Mapping[str, Any]] | None = None,
                          ) -> dict[str, Any]:
        """Play one future of the reply just taken on ``fork`` (a clone of the scored env)
        through the window, with the episode driver (:func:`~collab_env.rollout.driver.advance`).

        Args:
            fork: The clone to play; it is stepped in place.
            rollout: The future's index (in fault messages and its policies' seeds).
            step: The env step of the rewarded reply (in the policies' seeds).
            reply_tokens: What the reply counts toward ``future_token_budget``.
            policies: Player -> the policy of its future turns (:meth:`future_policies`).
            sampling: Player -> sampling keywords of its future turns.

        Returns:
            ``{conversation, fault (None, or the fault that dropped the future), zeroed (faults
            replaced by an empty user message), usage (the policies' usage, ``policy_calls``
            included), generated (messages written), dropped (assistant turns cut)}``.

        Raises:
            PolicyError: A policy failed with ``on_fault="raise"``, or a player other than a user
                failed with ``on_fault="zero"``; a :class:`~collab_env.errors.FatalPolicyError`
                always.
        """
        verl, on_fault, budget = self.aggregation == "verl", self.metric_set.on_fault, self.future_token_budget
        usage: dict[str, float] = {}
        out: dict[str, Any] = {"fault": None, "zeroed": [], "usage": usage, "dropped": 0}
        turns = {"user": 0, "assistant": 1, "tokens": reply_tokens}  # the reply is the first assistant turn

        def before_step(k: int, on_turn: list[str]) -> bool:
            if verl and self.player in on_turn and (turns["assistant"] + 1 >= self.max_assistant_turns
                                                    or turns["user"] >= self.max_user_turns):
                # verl generates this turn, then finds a turn budget spent and discards it: it
                # cannot reach the reward, so it is not generated here.
                out["dropped"] += 1
                return False
            return turns["user"] < self.max_user_turns and turns["assistant"] < self.max_assistant_turns

        def on_moves(k: int, moves: dict[str, Any]) -> dict[str, str] | None:
            texts: dict[str, str] = {}
            for p, move in moves.items():
                if isinstance(move, PolicyError):  # FatalPolicyError never reaches here: advance raises it
                    if on_fault == "raise":
                        raise move
                    fault = {"stage": "policy", "player": p, "error": str(move)[:500]}
                else:
                    add_usage(usage, move.usage)
                    usage["policy_calls"] = usage.get("policy_calls", 0.0) + 1
                    if not move.is_fault:
                        texts[p] = move.text
                        continue
                    fault = {"stage": "policy", "player": p,
                             "error": f"policy of {p!r} gave up: {move.meta.get('fault', '')}"}
                    if on_fault == "raise":
                        raise PolicyError(f"MultiturnAwareReward future {rollout}: {fault['error']}")
                if on_fault == "zero" and p in self.user_players:
                    out["zeroed"].append({**fault, "zeroed": True})  # verl: the interaction answers ""
                    texts[p] = ""
                elif on_fault == "zero":
                    raise PolicyError(f"MultiturnAwareReward future {rollout}: {fault['error']} (on_fault='zero' "
                                      "replaces only a failed user simulator's message, as verl does)")
                elif out["fault"] is None:
                    out["fault"] = fault
            if out["fault"] is not None:
                return None
            if budget is not None:
                if self.player in texts and turns["tokens"] + self._count_tokens(texts[self.player]) >= budget:
                    out["dropped"] += 1  # verl: the turn that reaches the budget is discarded
                    return None
                turns["tokens"] += sum(self._count_tokens(t) for t in texts.values())
            turns["user"] += sum(1 for p in texts if p in self.user_players)
            turns["assistant"] += int(self.player in texts)
            return texts

        base_seed = fork.unwrapped.episode.seed
        strip = self.metric_set.strip_think
        run = await advance(
            fork, policies,
            obs={a: fork.observe(a) for a in fork.agents},
            infos={a: {"on_turn": a in fork.on_turn} for a in fork.agents},
            sampling=sampling,
            seed=None if base_seed is None else (lambda k: _mix_seed(base_seed, step, rollout, k)),
            observe=(lambda p, o: strip_think_conversation(o) if p in self.user_players else o) if strip else None,
            before_step=before_step,
            on_moves=on_moves,
        )
        out.update(conversation=fork.unwrapped.episode.conversation,
                   generated=sum(len(s.actions) for s in run.steps))
        return out


class MultiturnAwareReward(EnvWrapper):
    """The env wrapper of the multiturn-aware reward: ``env`` with an :class:`MRScorer`
    (``collab_env.make(id, reward="mr")`` returns one).

    Played through the episode driver (``run_episode``, ``advance``, the engine, eval, every
    learner and integration), the driver lifts :attr:`scorer` off the env and runs it with its
    own policy table (:func:`~collab_env.rollout.driver.split_scorers`): the futures' assistant
    is the policy playing the episode. Stepped directly (``env.step``, a Gymnasium or SB3 loop),
    the wrapper runs the same scorer with the policies it was built with, so ``policies`` must
    then name the rewarded player's future policy (a window of 0 needs none).

    Args:
        env: The env to wrap (a ``CollabEnv`` or a wrapper of one; it must support ``clone()``).
        **kwargs: The :class:`MRScorer`'s arguments (``policies``, ``weights``,
            ``num_rollouts``, ``max_user_turns``, ``aggregation``, ``metric_ctx``...).

    Rewards and infos: as :class:`MRScorer` states. Cumulative counters: :attr:`stats`.
    """

    def __init__(self, env: Any, **kwargs: Any) -> None:
        super().__init__(env)
        self.scorer = MRScorer(env, **kwargs)

    @property
    def player(self) -> str:
        """The rewarded player."""
        return self.scorer.player

    @property
    def stats(self) -> dict[str, float]:
        """Cumulative counters of the scorer: ``rewards``, ``rollouts``, ``scored``, ``faults``."""
        return self.scorer.stats

    @property
    def weights(self) -> dict[str, float]:
        """Metric -> weight."""
        return self.scorer.weights

    @property
    def aggregation(self) -> str:
        """The aggregation rule."""
        return self.scorer.aggregation

    def clone(self) -> MultiturnAwareReward:
        new = super().clone()
        new.scorer = copy.copy(self.scorer)
        new.scorer.stats = dict(self.scorer.stats)
        return new

    def __repr__(self) -> str:
        sc = self.scorer
        return (f"<MultiturnAwareReward {sc.aggregation} rollouts={sc.num_rollouts} "
                f"window=({sc.max_user_turns}u,{sc.max_assistant_turns}a) {self.env!r}>")

    async def astep(self, actions: Mapping[str, str]):
        state = self.env.unwrapped.episode
        start, step = len(state.messages), state.step  # the rewarded reply will be message ``start``
        moved = self.scorer.player in state.on_turn
        obs, rewards, terms, truncs, infos = await self.env.astep(actions)
        if not moved or self.scorer.player not in rewards:
            return obs, rewards, terms, truncs, infos
        rewards, infos = dict(rewards), {p: dict(v) for p, v in infos.items()}
        await self.scorer.score(self.env, rewards, infos, policies={}, sampling={}, start=start, step=step)
        return obs, rewards, terms, truncs, infos
