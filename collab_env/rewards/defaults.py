"""The default rewards of the registered envs: :func:`default_reward`.

It wraps an env in a :class:`~collab_env.rewards.mr.MultiturnAwareReward` or a
:class:`~collab_env.rewards.conversation.ConversationReward` with the spec's metric weights,
and builds the judges, the user simulator and the future policy from an API model string,
``"embedded"`` or a policy object; ``collab_env.make(id, reward="mr", reward_kwargs={...})``
calls it (see :mod:`collab_env.rewards.mr`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from collab_env.errors import ConfigError
from collab_env.policy import PolicySpec, resolve_policy
from collab_env.rewards.common import (
    REPLAY,
    check_explicit_user,
    is_replay,
    rewarded_player,
    weights_for,
)
from collab_env.rewards.conversation import ConversationReward
from collab_env.rewards.metrics import get_metric
from collab_env.rewards.mr import MultiturnAwareReward, rolls_futures

__all__ = ["default_reward", "judges_for"]


def default_reward(
    env: Any,
    kind: Literal["mr", "conversation"] = "mr",
    *,
    judge: Any = None,
    user: Any = None,
    policy: Any = None,
    weights: Mapping[str, float] | None = None,
    rubric: Literal["verl", "paper"] = "verl",
    judge_prefill: bool | None = None,
    judge_kwargs: Mapping[str, Any] | None = None,
    metric_ctx: Mapping[str, Any] | None = None,
    user_kwargs: Mapping[str, Any] | None = None,
    prompts: Any = None,
    **kwargs: Any,
):
    """Wrap ``env`` in its default reward: the spec's metric weights (for ``collabllm-*``:
    math-hard accuracy + interactivity + token_amount, medium BLEU + token_amount,
    bigcodebench pass_rate + interactivity + token_amount) as a :class:`MultiturnAwareReward` (``kind="mr"``)
    or a :class:`ConversationReward` (``kind="conversation"``).

    Args:
        env: The env to wrap.
        kind: ``"mr"`` or ``"conversation"``.
        judge: The judge model of the judge metrics (accuracy, interactivity): an API model
            string (``"litellm:openai/gpt-4o-mini"``), ``"embedded"``, any policy, an
            ``LLMJudge`` (used for every judge metric) or a mapping metric -> judge. A model
            string or policy also extracts the final document before the BLEU metrics score it
            (the recipe's step, e.g. on ``collabllm-medium``); without ``judge=`` they score the
            last assistant message.
        user: The user simulator of the futures (``kind="mr"``): a model string or
            ``"embedded"`` (wrapped in :class:`~collab_env.agents.users.LLMUserSimulator`; the
            embedded model replies in plain text), a ready policy object (used as is), or
            :data:`REPLAY` (``"replay"``: the env's recorded-turn user, which ignores the
            candidate). Required when futures are rolled and the env's default user ignores the
            candidate (the ``collabllm-*`` envs); envs with a reactive default user (hidden-facts)
            use it when ``user`` is not given.
        policy: The rewarded player's policy for future turns (``kind="mr"``) when the env is
            stepped directly (``env.step``, Gymnasium, SB3): a model string, ``"embedded"`` or a
            policy object. Played through the episode driver (``run_episode``, eval, every
            learner), the futures use the driver's policy for that player instead, the one that
            wrote the reply, so a learner needs none.
        weights: Override the spec's weights.
        rubric: Interactivity rubric: ``"verl"`` or ``"paper"``.
        judge_prefill: Start judge replies with the score field (see
            ``LLMJudge.preset(prefill=...)``); default: on for the embedded model only.
        judge_kwargs: Extra ``LLMJudge`` settings for the judges built here
            (``max_new_tokens``, ``max_retries``...).
        metric_ctx: Extra metric resources (``tokenizer``, ``sandbox``, ``scope``...).
        user_kwargs: Extra :class:`~collab_env.agents.users.LLMUserSimulator` settings for a
            ``user=`` model string (``max_retries``, ``sampling``...; the recipe's simulator:
            ``{"max_retries": 5, "sampling": {"max_new_tokens": 512, "temperature": 1.0}}``).
        prompts: The reference's own templates for the user simulator and the judges built here
            (``"collabllm"``, a verl checkout path, or both as a tuple; see
            :mod:`collab_env.agents.reference_prompts`); ``None``: our own wording. With it, only
            the judges the weights use are built (no one source holds every template), and a
            judge whose template the source lacks is an error, never our wording in its place.
        **kwargs: Passed to the wrapper (``num_rollouts``, ``max_user_turns``,
            ``aggregation``, ``sampling``, ``return_futures``...).

    The same string given for several roles (e.g. ``"embedded"``) loads one model.
    """
    if kind not in ("mr", "conversation"):
        raise ConfigError(f"reward kind must be 'mr' or 'conversation', got {kind!r}.")
    window = {k: kwargs[k] for k in ("max_user_turns", "max_assistant_turns") if k in kwargs}
    if kind == "mr" and user is None and rolls_futures(**window):
        # before the judge check: this mistake is silent otherwise
        check_explicit_user(env, dict(kwargs.get("policies") or {}))
    loaded: dict[str, Any] = {}

    def backend(ref: Any) -> Any:
        if isinstance(ref, str):
            if ref not in loaded:
                loaded[ref] = resolve_policy(ref)
            return loaded[ref]
        return resolve_policy(ref)

    w = weights_for(env, weights)
    ctx: dict[str, Any] = {"rubric": rubric, **dict(metric_ctx or {})}
    needs_judge = [m for m in w if get_metric(m).needs and set(get_metric(m).needs) & {"judge", "extractor"}]
    if "judge" not in ctx and "judge_backend" not in ctx:
        if judge is not None:  # also the BLEU metrics' document extractor: the recipe extracts first
            kw = dict(judge_kwargs or {})
            if prompts is not None:
                kw.setdefault("prompts", prompts)
            ctx.update(judges_for(judge, rubric, judge_prefill, kw, backend,
                                  metrics=None if prompts is None else list(w)))
        elif needs_judge:
            raise ConfigError(
                f"the metrics {needs_judge} need an LLM judge: pass judge='litellm:<model>', "
                "judge='embedded' or a policy / LLMJudge (collab-env eval: --judge SPEC), or weights without them."
            )
    if user_kwargs and (kind != "mr" or not isinstance(user, (str, PolicySpec)) or is_replay(user)):
        raise ConfigError("user_kwargs= configures the simulator built from a user= model string; pass "
                          "user='litellm:...' (or 'embedded'), or configure your own simulator object.")
    if kind == "conversation":
        if user is not None or policy is not None:
            raise ConfigError("user= and policy= are for kind='mr' (futures); the conversation reward samples nothing.")
        return ConversationReward(env, weights=w, metric_ctx=ctx, **kwargs)
    policies = dict(kwargs.pop("policies", None) or {})
    if policy is not None:
        policies[rewarded_player(env, kwargs.get("player"))] = backend(policy)
    if user is not None:
        users = env.unwrapped.task.user_players
        if not users:
            raise ConfigError("user= was given but the env has no user player.")
        sim = user
        if is_replay(user):
            check_explicit_user(env, {u: REPLAY for u in users})
        elif isinstance(user, (str, PolicySpec)):
            extra = dict(user_kwargs or {})
            if prompts is not None:
                extra.setdefault("prompts", prompts)
            spec = user if isinstance(user, PolicySpec) else PolicySpec.parse(user)
            if spec.kind is not None:  # a whole simulator spec ("llm-user:litellm:..."): built as it says
                sim = resolve_policy(spec, **extra)
            else:  # a backend: the LLM user on it (plain-text replies on the embedded model)
                from collab_env.agents.users import LLMUserSimulator

                sim = LLMUserSimulator(backend(user) if isinstance(user, str) else resolve_policy(spec), **extra)
        for u in users:
            policies[u] = sim
    return MultiturnAwareReward(env, policies=policies, weights=w, metric_ctx=ctx, **kwargs)


def judges_for(judge: Any, rubric: str, prefill: bool | None, kw: dict[str, Any],
               backend: Callable[[Any], Any], metrics: Sequence[str] | None = None) -> dict[str, Any]:
    """The metric resources (``judge``, ``extractor``, ``document_extractor``) for the judge
    metrics from a ``judge=`` argument of :func:`default_reward`; ``backend`` turns a model
    string or policy into a loaded policy. ``metrics``: build only what these metrics use
    (``None``: every resource)."""
    from collab_env.agents.judges import ExtractThenScore, LLMJudge

    if isinstance(judge, Mapping):
        return {"judge": dict(judge)}
    if isinstance(judge, (LLMJudge, ExtractThenScore)):
        return {"judge": judge}
    b = backend(judge)
    if prefill is None:  # the embedded 135M model needs it to stay in the JSON format
        from collab_env.agents.base import EMBEDDED_NAMES

        prefill = judge in EMBEDDED_NAMES or any(c.__name__ == "EmbeddedPolicy" for c in type(b).__mro__)
    from collab_env.rewards.metrics import document_extractor

    def wanted(resource: str) -> bool:  # a judge by its metric's name, else a ctx resource
        if metrics is None:
            return True
        return any(m == resource or resource in get_metric(m).needs
                   or (resource == "document_extractor" and m.startswith("bleu")) for m in metrics)

    judges = {}
    if wanted("accuracy"):
        judges["accuracy"] = LLMJudge.preset("accuracy", b, prefill=prefill, **kw)
    if wanted("interactivity"):
        judges["interactivity"] = LLMJudge.preset("interactivity" if rubric == "verl" else "interactivity_paper", b,
                                                  prefill=prefill, **kw)
    out: dict[str, Any] = {"judge": judges}
    if wanted("extractor"):
        out["extractor"] = LLMJudge.preset("extract_answer", b, prefill=prefill, **kw)
    if wanted("document_extractor"):
        out["document_extractor"] = document_extractor(b, prefill=prefill, **kw)
    return out
