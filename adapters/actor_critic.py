"""IAC and MAAC: actor-critic learners for LLM agents (independent and centralised critics).

The trainer surface is CoMLRL's, so a CoMLRL script runs with only its import changed::

    from collab_env.adapters.actor_critic import IACConfig, IACTrainer

    trainer = IACTrainer(agent_model="embedded", num_agents=2, formatters=formatters,
                         reward_func=reward_func, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, args=IACConfig(num_agents=2, ...),
                         metrics_callback=metrics_callback)
    trainer.train()
    trainer.args.eval_num_samples = len(eval_dataset)
    metrics = trainer.evaluate()

Like :class:`~collab_env.adapters.magrpo.MAGRPOTrainer` it also trains on a registered
environment (``env="length-ratio"``); the rewards are the env's per-agent rewards.

The algorithm, per batch of training items:

1. **Rollout**: one episode of up to ``num_turns`` turns per item, one completion per agent on
   turn (:mod:`~collab_env.adapters.common.rollout` with a branching of 1). Agent ``i``'s
   trajectory is its turns; the rewards it gets while others act are credited to its latest
   turn. The episode is cut at ``num_turns`` and nothing is bootstrapped past it.
2. **Critic** (:class:`~collab_env.adapters.common.critics.ValueCritic`): IAC gives each agent
   its own critic, reading only that agent's view (its chat prompt, and its completion);
   MAAC has one centralised critic reading the env's ``state()`` (the global transcript, every
   agent's messages, hidden ones included) with one output per agent. ``critic_type="v"``
   estimates ``V(s)`` at the last token of the state; ``"q"`` also reads, in the same forward
   pass, ``Q(s, a)`` at the last token of the completion (MAAC: of the joint action).
3. **Advantages and targets**: ``"v"``: ``delta_t = r_t + discount * V_{t+1} - V_t``, the
   advantage is GAE(``gae_lambda``) of the deltas (``advantage_estimator="td"``: the delta
   itself) and the critic's target is advantage + ``V_t``. ``"q"``: the advantage is
   ``Q_t - V_t``; ``Q_t`` regresses on ``r_t + discount * V_{t+1}`` and ``V_t`` on the same
   targets as ``"v"``.
4. **Update**, ``num_iterations`` times: actor loss ``-(A * sum log pi(completion tokens))``
   per sequence (completion tokens only; from the second iteration the PPO ratio clip keeps the
   policy near the one that sampled), critic loss the clipped MSE (``value_clip_range``), each
   model stepped by its own AdamW with gradient clipping.

``metrics_callback(rollouts)`` receives :class:`RolloutSample` objects (``agent_idx``,
``prompt``, ``completion``, ``metadata``) of every training batch (logged at once) and of every
evaluation item (averaged over items, prefixed ``eval/``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from collab_env.adapters.common.config import (
    TrainerConfig,
    as_bool,
    check_choice,
    check_comlrl_rollout_fields,
    check_float,
    check_int,
)
from collab_env.adapters.common.learner import TaskLearner, build_models
from collab_env.adapters.common.loop import RunState, Schedule, mean
from collab_env.adapters.common.task import ENV_METHODS, TaskSource, turn_metrics
from collab_env.errors import ConfigError, TaskFunctionError

__all__ = [
    "ActorCriticConfig",
    "IACConfig",
    "MAACConfig",
    "RolloutSample",
    "Transition",
    "IACTrainer",
    "MAACTrainer",
]


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@dataclass
class ActorCriticConfig(TrainerConfig):
    """Fields shared by :class:`IACConfig` and :class:`MAACConfig` (the CoMLRL guide's names plus
    the learner's options). Every :class:`~collab_env.adapters.common.config.TrainerConfig`
    field applies too (learning rate, schedule, LoRA, evaluation and logging schedule...)."""

    num_agents: int = 2
    """Number of agents."""
    num_turns: int = 1
    """Turns per episode (the horizon of the TD targets)."""
    max_new_tokens: int = 256
    """Longest completion, in tokens."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts; log-probs are computed at it too."""
    top_p: float = 1.0
    """Nucleus sampling mass of training rollouts."""
    top_k: int | None = None
    """Top-k sampling of training rollouts (``None``: off)."""
    discount: float = 0.9
    """Discount of the next turn's value in TD targets and GAE."""
    advantage_estimator: Literal["gae", "td"] = "gae"
    """``"gae"``: generalised advantage estimation with ``gae_lambda``; ``"td"``: the one-step
    TD error (GAE with lambda 0)."""
    gae_lambda: float = 0.95
    """GAE lambda (0: one-step TD, 1: Monte-Carlo return minus the value)."""
    critic_type: Literal["v", "q"] = "v"
    """CoMLRL's: ``"v"``, the critic estimates ``V(h)``, the value before the completion (last
    prompt token); ``"q"``, also ``Q(h, a)``, the value after it (last completion token), and
    the advantage is ``Q - V``. (Its former name ``critic_estimate`` is still accepted.)"""
    critic_placement: Literal["separate", "head"] = "separate"
    """``"separate"``: the critic is its own model (a copy of the agent's initial model, or
    ``critic_model``) with a value head; ``"head"`` (IAC only): a value head on the actor,
    whose weights then also learn from the critic loss (scaled by ``value_loss_coef``).
    CoMLRL's ``use_separate_critic=True/False`` sets it."""
    critic_learning_rate: float | None = None
    """AdamW learning rate of the critics (``None``: ``learning_rate``)."""
    value_loss_coef: float = 1.0
    """Weight of the critic loss (matters where it shares weights with the actor)."""
    value_clip_range: float | None = 0.2
    """PPO value clipping: a new value may move at most this far from its rollout-time value
    before the loss stops rewarding the move (``None``: plain MSE)."""
    num_iterations: int = 1
    """Optimisation epochs over each rollout batch (value and ratio clipping act from the
    second)."""
    clip_range: float = 0.2
    """Ratio clip of the actor loss from the second iteration on."""
    normalize_advantages: bool = False
    """Centre and scale each batch's advantages (over all agents' samples) before the actor loss."""
    train_micro_batch_size: int = 8
    """Sequences per forward/backward pass (gradients accumulate to the full-batch gradient)."""
    eval_greedy: bool = False
    """Evaluate with greedy decoding instead of the training sampling settings."""
    eval_max_new_tokens: int | None = None
    """Longest completion in evaluation (``None``: ``max_new_tokens``)."""
    logprob_temperature: float | None = None
    """Temperature of the actor's log-probs in the loss (``None``: ``temperature``; CoMLRL uses
    the raw logits, 1.0)."""
    prompt_format: Literal["chat", "raw"] = "chat"
    """``"chat"``: the agent's whole conversation through the chat template; ``"raw"``
    (CoMLRL): the turn's prompt string tokenised as it is, one prompt per turn, no history."""
    early_termination_threshold: float | None = None
    """CoMLRL's: an episode whose turn reward (mean over agents) exceeds this value ends its
    rollout there. ``None``: never."""
    external_prompt_passthrough: bool | None = None
    """Dataset path: CoMLRL's rule for later turns' prompts (``True``: the external prompt as it
    is; ``False``: the formatter on the item with its prompt replaced); ``None``: collab_env's
    (see :func:`~collab_env.tasks.from_dataset`)."""
    reference_kl_enabled: bool = False
    """CoMLRL's reference KL: each turn's reward minus ``reference_kl_coef`` times the
    completion's KL to the initial policy (k3 summed over its tokens, raw logits, no gradient)."""
    reference_kl_coef: float = 0.1
    """Weight of the reference KL penalty (``reference_kl_enabled``)."""
    rollout_buffer_size: int | None = None
    """CoMLRL's: agent turns each agent collects before an update. Updates here happen on whole
    items, so it sets ``per_device_train_batch_size`` to ``ceil(rollout_buffer_size /
    num_turns)`` items (the same count when every episode runs all its turns)."""
    train_batch_size: int | None = None
    """CoMLRL's mini-batch within a buffer; only the whole buffer (``None`` or
    ``rollout_buffer_size``) is supported: one optimiser step per update."""

    ALIASES: ClassVar[dict[str, tuple[str, Any]]] = {
        "advantage_normalization": ("normalize_advantages", as_bool("advantage_normalization")),
        "use_separate_critic": ("critic_placement",
                                lambda v: "separate" if as_bool("use_separate_critic")(v) else "head"),
        "critic_estimate": ("critic_type", lambda v: v),
    }

    @property
    def advantage_normalization(self) -> bool:
        """CoMLRL's name of :attr:`normalize_advantages`."""
        return self.normalize_advantages

    @property
    def use_separate_critic(self) -> bool:
        """CoMLRL's name: ``critic_placement == "separate"``."""
        return self.critic_placement == "separate"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_type in ("separate", "head"):
            raise ConfigError(
                f"critic_type={self.critic_type!r}: critic_type now means CoMLRL's 'v' (V(h)) or 'q' "
                f"(Q(h, a)); where the critic lives is critic_placement={self.critic_type!r} "
                f"(or use_separate_critic={self.critic_type == 'separate'})."
            )
        check_int("num_agents", self.num_agents, 1)
        check_int("num_turns", self.num_turns, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_float("temperature", self.temperature, 0.0, low_open=True)
        check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_int("top_k", self.top_k, 1, allow_none=True)
        check_float("discount", self.discount, 0.0, 1.0)
        check_choice("advantage_estimator", self.advantage_estimator, ("gae", "td"))
        check_float("gae_lambda", self.gae_lambda, 0.0, 1.0)
        check_choice("critic_type", self.critic_type, ("v", "q"))
        check_choice("critic_placement", self.critic_placement, ("separate", "head"))
        check_comlrl_rollout_fields(self)
        if self.train_batch_size is not None and self.train_batch_size != self.rollout_buffer_size:
            raise ConfigError(
                f"train_batch_size={self.train_batch_size}: IAC/MAAC take one optimiser step per update "
                "on the whole buffer; remove train_batch_size (or set it to rollout_buffer_size)."
            )
        if self.rollout_buffer_size is not None:
            items = max(1, math.ceil(self.rollout_buffer_size / self.num_turns))
            if self.per_device_train_batch_size not in (1, items):
                raise ConfigError(
                    f"rollout_buffer_size={self.rollout_buffer_size} means {items} item(s) per update, but "
                    f"per_device_train_batch_size={self.per_device_train_batch_size}: pass one of them."
                )
            self.per_device_train_batch_size = items
            self.train_batch_size = self.rollout_buffer_size
        check_float("critic_learning_rate", self.critic_learning_rate, 0.0, allow_none=True)
        check_float("value_loss_coef", self.value_loss_coef, 0.0)
        check_float("value_clip_range", self.value_clip_range, 0.0, low_open=True, allow_none=True)
        check_int("num_iterations", self.num_iterations, 1)
        check_float("clip_range", self.clip_range, 0.0, 1.0, low_open=True)
        check_int("train_micro_batch_size", self.train_micro_batch_size, 1)
        check_int("eval_max_new_tokens", self.eval_max_new_tokens, 1, allow_none=True)

    @property
    def lam(self) -> float:
        """The lambda actually used (0 for ``advantage_estimator="td"``)."""
        return 0.0 if self.advantage_estimator == "td" else self.gae_lambda


@dataclass
class IACConfig(ActorCriticConfig):
    """Configuration of :class:`IACTrainer`: one critic per agent, reading only its view."""

    # CoMLRL's IACConfig defaults (comlrl/trainers/actor_critic/iac.py), plus what its trainer
    # hard-codes: torch's AdamW (weight decay 0.01, no gradient clipping), the one-step TD error,
    # raw-logit log-probs, one on-policy pass and the formatter's string tokenised as it is.
    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {
        "learning_rate": 5e-6, "critic_learning_rate": 5e-6, "rollout_buffer_size": 8, "train_batch_size": None,
        "value_clip_range": 0.2, "value_loss_coef": 0.6, "normalize_advantages": True, "max_new_tokens": 256,
        "temperature": 0.6, "top_p": 0.6, "top_k": None, "num_train_epochs": 40, "critic_placement": "separate",
        "critic_type": "v", "num_agents": 2, "num_turns": 2, "external_prompt_passthrough": False,
        "discount": 0.9, "eval_interval": 16, "eval_num_samples": 4, "eval_batch_size": 1,
        "early_termination_threshold": -0.2, "logging_steps": 1, "reference_kl_enabled": False,
        "reference_kl_coef": 0.1, "advantage_estimator": "td", "weight_decay": 0.01, "max_grad_norm": None,
        "num_iterations": 1, "logprob_temperature": 1.0, "prompt_format": "raw",
        "lr_scheduler_type": "constant", "warmup_steps": 0,
    }


@dataclass
class MAACConfig(ActorCriticConfig):
    """Configuration of :class:`MAACTrainer`: one centralised critic reading ``env.state()``."""

    # CoMLRL's MAACConfig defaults (comlrl/trainers/actor_critic/maac.py): IAC's, except that the
    # shared critic's loss is the plain MSE (no value clipping) and it is always separate.
    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {
        **IACConfig.COMLRL_DEFAULTS, "value_clip_range": None,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_placement != "separate":
            raise ConfigError(
                "MAAC's centralised critic reads the global transcript, which no actor sees, so it "
                "cannot be a head on an actor: use critic_placement='separate' (or IAC for a value head)."
            )


# ---------------------------------------------------------------------------------------------
# Rollout records
# ---------------------------------------------------------------------------------------------
@dataclass
class RolloutSample:
    """What ``metrics_callback(rollouts)`` receives: one completion of one agent."""

    agent_idx: int
    """Index of the agent (its position in ``formatters`` / the trained players)."""
    prompt: str
    """The latest message addressed to the agent (the turn's prompt)."""
    completion: str
    """The agent's completion text."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """``turn`` (1-based), ``reward`` (the agent's reward for this turn), ``player``,
    ``item_index`` (position in the split) and ``item`` (the task item)."""


@dataclass
class Transition:
    """One agent's turn, as the learner uses it."""

    root: int
    """Index of the episode in the batch."""
    turn: int
    """0-based turn (depth of the rollout tree)."""
    agent: int
    """Agent index."""
    prompt_ids: list[int]
    """The actor's prompt token ids."""
    completion_ids: tuple[int, ...]
    """The sampled completion token ids."""
    reward: float
    """The agent's reward for this turn (plus rewards earned until its next turn)."""
    critic_key: tuple[int, ...]
    """Transitions with the same key share one critic input (MAAC: every agent of a node)."""
    critic_prefix: list[int]
    """Critic token ids of the state (IAC: the agent's prompt; MAAC: ``env.state()``)."""
    critic_suffix: list[int]
    """Critic token ids of the action (IAC: the completion; MAAC: the joint action)."""
    sample: RolloutSample
    """The record handed to ``metrics_callback``."""


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------
class _ActorCriticTrainer(TaskLearner):
    """Shared body of :class:`IACTrainer` and :class:`MAACTrainer` (``centralised`` differs)."""

    centralised: bool = False
    config_class: type = ActorCriticConfig
    name: str = "AC"

    def __init__(
        self,
        agent_model: Any = None,
        num_agents: int | None = None,
        formatters: Sequence[Callable[..., str]] | Callable[..., str] | None = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        args: ActorCriticConfig | None = None,
        wandb_config: Mapping[str, Any] | None = None,
        metrics_callback: Callable[[list[RolloutSample]], Mapping[str, float]] | None = None,
        *,
        external_transition: Callable[..., Any] | None = None,
        tokenizer: Any = None,
        critic_model: Any = None,
        critic_tokenizer: Any = None,
        env: Any = None,
        eval_env: Any = None,
        env_kwargs: Mapping[str, Any] | None = None,
        policies: Mapping[str, Any] | None = None,
        trained_players: Sequence[str] | None = None,
    ) -> None:
        import torch

        from collab_env.adapters.common.logging import MetricsLogger
        from collab_env.adapters.common.models import make_scheduler

        args = self.config_class() if args is None else args
        if not isinstance(args, self.config_class):
            raise ConfigError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}.")
        if agent_model is None:
            raise ConfigError("agent_model is required: a model folder, a hub id, 'embedded' or a loaded model.")
        if metrics_callback is not None and not callable(metrics_callback):
            raise ConfigError(f"metrics_callback must be callable or None, got {type(metrics_callback).__name__}.")
        if num_agents is not None and num_agents != args.num_agents:
            raise ConfigError(f"num_agents={num_agents} but args.num_agents={args.num_agents}: set both to the same value.")
        if args.critic_placement == "head" and critic_model is not None:
            raise ConfigError("critic_model= gives the critic its own model; it contradicts critic_placement='head' "
                              "(use_separate_critic=False).")
        self.task = TaskSource.build(
            args, num_agents=num_agents, formatters=formatters, reward_func=reward_func,
            reward_processor=reward_processor, external_transition=external_transition,
            train_dataset=train_dataset, eval_dataset=eval_dataset, env=env, eval_env=eval_env,
            env_kwargs=env_kwargs, policies=policies, trained_players=trained_players,
            env_methods=(*ENV_METHODS, "state"))
        if env is not None and num_agents is None:
            args = replace(args, num_agents=len(self.players))
        if len(self.players) != args.num_agents:
            raise ConfigError(
                f"the environment trains {len(self.players)} player(s) {list(self.players)} but "
                f"args.num_agents={args.num_agents}; set num_agents={len(self.players)}."
            )
        self.args = args
        self.metrics_callback = metrics_callback
        torch.manual_seed(args.seed)
        steps = self._planned_optimizer_steps()
        self.models, self._unique = build_models(agent_model, tokenizer, args.num_agents, args,
                                                 need_reference=args.reference_kl_enabled, steps=steps)
        # Rewards that roll futures (the multiturn-aware reward) play the trained players' future
        # turns with the policy being trained, sampling as the learner does.
        self.task.bind_learner(self.models, self.sampling(False))
        self.critics = self._build_critics(critic_model, critic_tokenizer)
        critic_lr = args.critic_learning_rate if args.critic_learning_rate is not None else args.learning_rate
        for c in self.critics:
            c.optimizer = torch.optim.AdamW(c.parameters(), lr=critic_lr, weight_decay=args.weight_decay,
                                            betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
            c.scheduler = make_scheduler(c.optimizer, args, steps)
        self.state = RunState()
        config = {**args.to_dict(), "algorithm": self.name, **self.task.config_record()}
        self.logger = MetricsLogger(args.output_dir, config, wandb_config)

    def _build_critics(self, critic_model: Any, critic_tokenizer: Any) -> list[Any]:
        """IAC: one critic per agent; MAAC: one critic with an output per agent."""
        from collab_env.adapters.common.critics import ValueCritic

        a = self.args
        n_critics = 1 if self.centralised else a.num_agents
        outputs = a.num_agents if self.centralised else 1
        critics = []
        for k in range(n_critics):
            actor = self.models[k]
            if a.critic_placement == "head":
                critics.append(ValueCritic(actor.model, actor.tokenizer, outputs, shares_actor=True, seed=a.seed + k))
                continue
            if critic_model is None:  # a copy of the agent's initial model
                backbone, tok = copy.deepcopy(actor.model), actor.tokenizer
            else:
                backbone, tok = _load_critic_model(critic_model, critic_tokenizer, actor.device)
                if k > 0:
                    backbone = copy.deepcopy(backbone)
            critics.append(ValueCritic(backbone, tok, outputs, seed=a.seed + k))
        return critics

    def _planned_optimizer_steps(self) -> int:
        items = self.task.planned_items(self.args.num_train_epochs, self.args.max_steps)
        return max(1, math.ceil(items / self.args.per_device_train_batch_size) * self.args.num_iterations)

    def schedule(self) -> Schedule:
        """Training items in batches of ``per_device_train_batch_size``, CoMLRL's evaluation
        schedule, logs every ``logging_steps`` reward evaluations, checkpoints every
        ``save_steps`` items."""
        return self.item_schedule(self.args.per_device_train_batch_size, self.name)

    # -- rollouts -------------------------------------------------------------------------------
    def collect(self, indices: Sequence[int], *, evaluation: bool = False,
                seeds: Callable[[int], list[int]] | None = None):
        """Roll out one episode per item index of the training (or evaluation) split.

        Returns:
            ``(transitions, levels)``: every agent turn as a :class:`Transition` (ordered by
            episode, turn, agent), and the rollout tree's nodes per depth.
        """
        from collab_env.adapters.common.rollout import episode_item

        a = self.args
        env = self.eval_env if evaluation else self.train_env
        roots, levels = self.task.rollout(
            env, indices, self.models, branching=lambda d: 1, max_depth=a.num_turns,
            sampling=self.sampling(evaluation), seeds=seeds or self.task.seeds, prompt_format=a.prompt_format,
            stop_above=None if evaluation else a.early_termination_threshold,  # CoMLRL: training only
            discount=a.discount)
        out: list[Transition] = []
        for root in roots:
            item = dict(episode_item(root.env))
            latest: dict[int, Transition] = {}  # the agent's last turn: where its later rewards go
            node = root
            while node is not None and node.joint:
                ja = node.joint[0]
                state = node.env.state() if self.centralised else None
                joint_ids = self._joint_ids(node, ja, state) if self.centralised else None
                for agent in node.acting:
                    comp = node.completions[agent][ja.choice[agent]]
                    prefix, suffix = (joint_ids if self.centralised
                                      else self._own_view_ids(node, agent, comp))
                    key = (root.root, node.depth) if self.centralised else (root.root, node.depth, agent)
                    sample = RolloutSample(agent_idx=agent, prompt=node.prompts.get(agent, ""), completion=comp.text,
                                           metadata={"turn": node.depth + 1, "reward": 0.0,
                                                     "player": self.players[agent],
                                                     "item_index": int(indices[root.root]), "item": item})
                    tr = Transition(root=root.root, turn=node.depth, agent=agent, prompt_ids=list(node.prompt_ids[agent]),
                                    completion_ids=tuple(comp.token_ids or ()), reward=0.0, critic_key=key,
                                    critic_prefix=prefix, critic_suffix=suffix, sample=sample)
                    out.append(tr)
                    latest[agent] = tr
                for agent, tr in latest.items():
                    tr.reward += float(ja.rewards[agent])
                    tr.sample.metadata["reward"] = tr.reward
                node = ja.child
        return out, levels

    def _shape_with_reference_kl(self, transitions: Sequence[Transition], metrics: dict[str, float]) -> None:
        """CoMLRL's reference KL: each transition's reward minus ``reference_kl_coef`` times its
        completion's k3 KL to the initial policy, summed over tokens (raw logits, no gradient)."""
        import torch

        from collab_env.adapters.common.losses import kl_k3, pack_sequences, token_logprobs

        a = self.args
        by_turn: dict[int, list[float]] = {}
        for tr in transitions:
            pm = self.models[tr.agent]
            batch = pack_sequences([tr.prompt_ids], [tr.completion_ids], pm.pad_id).to(pm.device)
            pm.model.eval()
            with torch.no_grad():
                logp = token_logprobs(pm.model, batch, 1.0)
                with pm.as_reference() as reference:
                    reference.eval()
                    ref = token_logprobs(reference, batch, 1.0)
            kl = float(kl_k3(logp, ref, batch.completion_mask).sum())
            tr.reward -= a.reference_kl_coef * kl
            tr.sample.metadata.update(reward=tr.reward, reference_kl=kl, reference_kl_penalty=a.reference_kl_coef * kl)
            by_turn.setdefault(tr.turn, []).append(kl)
        for d, kls in by_turn.items():
            metrics[f"turn_{d + 1}/reference_kl_mean"] = mean(kls)
            metrics[f"turn_{d + 1}/reference_kl_penalty_mean"] = a.reference_kl_coef * mean(kls)

    def _own_view_ids(self, node: Any, agent: int, comp: Any) -> tuple[list[int], list[int]]:
        """IAC critic input: the agent's own prompt and completion (its view only)."""
        critic = self.critics[agent]
        if critic.tokenizer is self.models[agent].tokenizer:
            return list(node.prompt_ids[agent]), list(comp.token_ids or ())
        obs = node.obs[self.players[agent]]
        prefix = _encode(critic.tokenizer, _chat_text(critic.tokenizer, obs))
        return prefix, _encode(critic.tokenizer, comp.text)

    def _joint_ids(self, node: Any, ja: Any, state: Any) -> tuple[list[int], list[int]]:
        """MAAC critic input: the global transcript ``env.state()`` and, after it, every acting
        agent's completion of the joint action (as messages by their authors)."""
        from collab_env.types import Message

        tok = self.critics[0].tokenizer
        before = state.render()
        moves = [Message(role="assistant", content=node.completions[a][j].text, author=self.players[a])
                 for a, j in sorted(ja.choice.items())]
        after = state.append(*moves).render()
        return _encode(tok, before), _encode(tok, after[len(before):])

    def critic_text(self, transition: Transition) -> str:
        """The text the critic reads for ``transition`` (state, then action), decoded."""
        tok = self.critics[0 if self.centralised else transition.agent].tokenizer
        return tok.decode(list(transition.critic_prefix) + list(transition.critic_suffix))

    # -- advantages ------------------------------------------------------------------------------
    def _critic_values(self, transitions: Sequence[Transition], *, grad: bool):
        """Per transition, ``(V, Q)`` tensors ``[len]`` (Q is None for ``critic_type="v"``),
        one critic forward per distinct critic input, in micro-batches."""
        import torch

        a = self.args
        want_q = a.critic_type == "q"
        v_out: list[Any] = [None] * len(transitions)
        q_out: list[Any] = [None] * len(transitions)
        by_critic: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for i, tr in enumerate(transitions):
            c = 0 if self.centralised else tr.agent
            by_critic.setdefault(c, {}).setdefault(tr.critic_key, []).append(i)
        ctx = torch.enable_grad() if grad else torch.no_grad()
        with ctx:
            for c, groups in by_critic.items():
                critic = self.critics[c]
                keys = list(groups)
                for s in range(0, len(keys), a.train_micro_batch_size):
                    chunk = keys[s:s + a.train_micro_batch_size]
                    first = [transitions[groups[k][0]] for k in chunk]
                    suffixes = [t.critic_suffix if want_q else [] for t in first]
                    v, q = critic.values([t.critic_prefix for t in first], suffixes)
                    for row, k in enumerate(chunk):
                        for i in groups[k]:
                            col = transitions[i].agent if self.centralised else 0
                            v_out[i] = v[row, col]
                            q_out[i] = q[row, col] if want_q else None
        return v_out, q_out

    def _advantages(self, transitions: Sequence[Transition], v_old: Sequence[float],
                    q_old: Sequence[float] | None) -> tuple[list[float], list[float], list[float] | None]:
        """Per transition: advantage, V target and (``"q"``) Q target, trajectory by trajectory."""
        from collab_env.adapters.common.critics import gae, td_targets

        a = self.args
        adv, v_tgt = [0.0] * len(transitions), [0.0] * len(transitions)
        q_tgt = [0.0] * len(transitions) if q_old is not None else None
        trajectories: dict[tuple[int, int], list[int]] = {}
        for i, tr in enumerate(transitions):
            trajectories.setdefault((tr.root, tr.agent), []).append(i)
        for idx in trajectories.values():
            idx.sort(key=lambda i: transitions[i].turn)
            rewards = [transitions[i].reward for i in idx]
            values = [v_old[i] for i in idx]
            a_gae, targets = gae(rewards, values, a.discount, a.lam)
            for i, at, yt in zip(idx, a_gae, targets, strict=True):
                adv[i], v_tgt[i] = at, yt
            if q_old is not None and q_tgt is not None:
                for i, yq in zip(idx, td_targets(rewards, values, a.discount), strict=True):
                    q_tgt[i] = yq
                    adv[i] = q_old[i] - v_old[i]
        if a.normalize_advantages and len(adv) > 1:
            m = mean(adv)
            sd = math.sqrt(mean([(x - m) ** 2 for x in adv]))
            adv = [(x - m) / (sd + 1e-6) for x in adv]
        return adv, v_tgt, q_tgt

    # -- training ---------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` items), evaluating on the guide's
        schedule. Returns the last logged training metrics."""
        from collab_env.adapters.common.loop import run

        if self.train_env is None:
            raise ConfigError("train() needs train_dataset= (or env=).")
        return run(self)

    def end_epoch(self) -> dict[str, float]:
        """Nothing is buffered across batches: ``{}``."""
        return {}

    def _callback(self, samples: list[RolloutSample]) -> dict[str, float]:
        if self.metrics_callback is None:
            return {}
        out = self.metrics_callback(samples)
        if out is None:
            return {}
        if not isinstance(out, Mapping):
            raise TaskFunctionError(f"metrics_callback must return a dict of numbers, got {type(out).__name__}.")
        try:
            return {str(k): float(v) for k, v in out.items()}
        except (TypeError, ValueError) as exc:
            raise TaskFunctionError(f"metrics_callback must return numeric values: {exc}") from exc

    def train_step(self, indices: Sequence[int]) -> dict[str, float]:
        """Roll out ``indices``, compute advantages and targets, update actors and critics."""
        import torch

        from collab_env.adapters.common.critics import actor_loss, clipped_value_loss
        from collab_env.adapters.common.losses import (
            clipped_surrogate,
            masked_aggregate,
            pack_sequences,
            token_logprobs,
        )

        a = self.args
        temp = a.logprob_temperature or a.temperature
        transitions, levels = self.collect(indices)
        metrics = turn_metrics(levels, "")
        metrics["env_steps"] = float(sum(len(n.joint) for nodes in levels for n in nodes))
        if a.reference_kl_enabled:
            self._shape_with_reference_kl(transitions, metrics)
        custom = self._callback([t.sample for t in transitions])
        if custom:  # logged at rollout time, outside the logging_steps gate
            self.logger.log(custom, env_step=self.state.env_step + int(metrics["env_steps"]),
                            epoch=self.state.epoch, item=self.state.items_done)
        if not transitions:
            return metrics
        for c in self.critics:
            c.eval()
        v0, q0 = self._critic_values(transitions, grad=False)
        v_old = [float(v) for v in v0]
        q_old = [float(q) for q in q0] if a.critic_type == "q" else None
        adv, v_tgt, q_tgt = self._advantages(transitions, v_old, q_old)

        # Actor micro-batches per distinct model.
        owners: dict[int, list[int]] = {}
        for i, tr in enumerate(transitions):
            owner = next(k for k, u in enumerate(self._unique) if u is self.models[tr.agent])
            owners.setdefault(owner, []).append(i)
        packed: dict[int, list[tuple[list[int], Any]]] = {}
        for owner, idx in owners.items():
            pm = self._unique[owner]
            chunks = [idx[s:s + a.train_micro_batch_size] for s in range(0, len(idx), a.train_micro_batch_size)]
            packed[owner] = [(ch, pack_sequences([transitions[i].prompt_ids for i in ch],
                                                 [transitions[i].completion_ids for i in ch], pm.pad_id).to(pm.device))
                             for ch in chunks]
        old_logp: dict[tuple[int, int], Any] = {}
        if a.num_iterations > 1:
            with torch.no_grad():
                for owner, chunks in packed.items():
                    self._unique[owner].model.eval()
                    for k, (_, b) in enumerate(chunks):
                        old_logp[(owner, k)] = token_logprobs(self._unique[owner].model, b, temp)

        v_old_t = torch.tensor(v_old, dtype=torch.float32)
        v_tgt_t = torch.tensor(v_tgt, dtype=torch.float32)
        q_old_t = torch.tensor(q_old, dtype=torch.float32) if q_old is not None else None
        q_tgt_t = torch.tensor(q_tgt, dtype=torch.float32) if q_tgt is not None else None
        stats: dict[str, float] = {}
        for it in range(a.num_iterations):
            for pm in self._unique:
                pm.optimizer.zero_grad(set_to_none=True)
                pm.model.train()
            for c in self.critics:
                c.optimizer.zero_grad(set_to_none=True)
                c.train()
            pg_total, clip_frac, n_tok = 0.0, 0.0, 0
            for owner, chunks in packed.items():
                pm = self._unique[owner]
                n_seq = len(owners[owner])
                for k, (ch, b) in enumerate(chunks):
                    logp = token_logprobs(pm.model, b, temp)
                    adv_t = torch.tensor([adv[i] for i in ch], dtype=torch.float32, device=logp.device)
                    if it == 0:
                        loss = actor_loss(logp, adv_t, b.completion_mask, num_sequences=n_seq)
                    else:  # off-policy after the first step: the PPO ratio clip
                        per_tok, active = clipped_surrogate(logp, old_logp[(owner, k)], adv_t, b.completion_mask,
                                                            a.clip_range)
                        loss = masked_aggregate(per_tok, b.completion_mask, "token", n_seq, n_seq)
                        clip_frac += float(active.sum())
                    n_tok += int(b.completion_mask.sum())
                    loss.backward()
                    pg_total += float(loss.detach())
            # Critic: the clipped value loss, a mean over the batch's transitions.
            v_new, q_new = self._critic_values(transitions, grad=True)
            n = len(transitions)
            dev = v_new[0].device
            vl, v_clipped = clipped_value_loss(torch.stack(v_new), v_old_t.to(dev), v_tgt_t.to(dev), a.value_clip_range)
            critic_loss = vl / n
            clipped_count = float(v_clipped.sum())
            if q_old_t is not None and q_tgt_t is not None:
                ql, q_clipped = clipped_value_loss(torch.stack(q_new), q_old_t.to(dev), q_tgt_t.to(dev), a.value_clip_range)
                critic_loss = critic_loss + ql / n
                clipped_count += float(q_clipped.sum())
            (a.value_loss_coef * critic_loss).backward()
            norms = []
            for pm in self._unique:
                params = [p for _, p in pm.trainable_parameters()]
                norms.append(float(torch.nn.utils.clip_grad_norm_(params, _max_norm(a))))
                pm.optimizer.step()
                pm.scheduler.step()
            c_norms = []
            for c in self.critics:
                c_norms.append(float(torch.nn.utils.clip_grad_norm_(c.parameters(), _max_norm(a))))
                c.optimizer.step()
                c.scheduler.step()
            if it == 0:
                stats = {"actor_loss": pg_total, "critic_loss": float(critic_loss.detach()),
                         "value_clip_fraction": clipped_count / (n * (2 if q_old is not None else 1)),
                         "grad_norm": mean(norms), "critic_grad_norm": mean(c_norms)}
            else:
                stats["actor_loss_last_iteration"] = pg_total
                stats["critic_loss_last_iteration"] = float(critic_loss.detach())
                stats["clip_fraction_last_iteration"] = clip_frac / max(n_tok, 1)
        for pm in self._unique:
            pm.model.eval()
        for c in self.critics:
            c.eval()
        self.state.optimizer_steps += a.num_iterations
        metrics.update(stats)
        metrics["value_mean"] = mean(v_old)
        metrics["value_target_mean"] = mean(v_tgt)
        metrics["advantage_mean"] = mean(adv)
        if q_old is not None:
            metrics["q_value_mean"] = mean(q_old)
        metrics["completion_length"] = mean([len(t.completion_ids) for t in transitions])
        metrics["learning_rate"] = float(self._unique[0].scheduler.get_last_lr()[0])
        return metrics

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Evaluate on the first ``args.eval_num_samples`` evaluation items, one joint response
        per turn, without updating weights. Logs and returns ``eval/turn_k/reward_mean``,
        ``eval/turn_k/expected_return`` and the ``metrics_callback`` values averaged over the
        items (prefixed ``eval/``); ``{}`` without an evaluation split."""
        a = self.args
        n, seeds = self.task.begin_evaluation(a.eval_num_samples, self.state)
        if n == 0:
            return {}
        all_levels: list[list[Any]] = [[] for _ in range(a.num_turns)]
        per_item: list[dict[str, float]] = []
        for start in range(0, n, a.eval_batch_size):
            indices = list(range(start, min(n, start + a.eval_batch_size)))
            transitions, levels = self.collect(indices, evaluation=True, seeds=seeds)
            for d, nodes in enumerate(levels):
                all_levels[d].extend(nodes)
            if self.metrics_callback is not None:
                for root in sorted({t.root for t in transitions}):
                    per_item.append(self._callback([t.sample for t in transitions if t.root == root]))
        metrics = turn_metrics([lv for lv in all_levels if lv], "eval/")
        for key in sorted({k for row in per_item for k in row}):
            metrics[f"eval/{key}"] = mean([row[key] for row in per_item if key in row])
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch, item=self.state.items_done)
        if a.plot:
            self.logger.plot()
        return metrics

    # -- saving -----------------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Save the actors (``model_<k>/`` and the trainer state, as the shared checkpoint format
        writes them) and the critics (``critic_<k>.json`` + ``critic_<k>.safetensors``: head,
        optimiser and scheduler states and, for a separate critic, trainable backbone weights).
        Default folder: ``<output_dir>/checkpoint-<items done>``; continue the run with
        :meth:`load_checkpoint` then :meth:`train`."""
        from collab_env.adapters.common.checkpoint import save_checkpoint, save_safe

        path = Path(path) if path is not None else Path(self.args.output_dir) / f"checkpoint-{self.state.items_done}"
        save_checkpoint(path, self._unique, asdict(self.state), self._rng)
        for k, c in enumerate(self.critics):
            save_safe(path, f"critic_{k}", {
                "head": dict(c.head.state_dict()), "shares_actor": c.shares_actor,
                "backbone": None if c.shares_actor else
                {n: p.detach() for n, p in c.backbone.named_parameters() if p.requires_grad},
                "optimizer": c.optimizer.state_dict() if c.optimizer is not None else None,
                "scheduler": c.scheduler.state_dict() if c.scheduler is not None else None,
            })
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote (actors, critics, optimisers, schedulers,
        RNG states, position) into this trainer, built with the same models and config;
        :meth:`train` then continues the run. Only safetensors and JSON are read: an old pickle
        (``critic_<k>.pt``) is refused with how to convert it.

        Raises:
            ConfigError: Not a checkpoint of this trainer's shape (critics, parameters).
        """
        import torch

        from collab_env.adapters.common.checkpoint import load_checkpoint, load_safe, refuse_legacy

        path = Path(path)
        blobs = []
        for k, c in enumerate(self.critics):  # every critic checked before anything is changed
            if not (path / f"critic_{k}.json").is_file():
                refuse_legacy(path / f"critic_{k}.pt")
                raise ConfigError(f"{path} holds no critic_{k}.json: pass a folder this trainer's save_checkpoint() "
                                  f"wrote (it saves {len(self.critics)} critic(s)).")
            blob = load_safe(path, f"critic_{k}")
            own = {n for n, p in c.backbone.named_parameters() if p.requires_grad} if not c.shares_actor else None
            if (not isinstance(blob, dict) or blob.get("shares_actor") != c.shares_actor
                    or (own is not None and set(blob.get("backbone") or {}) != own)):
                raise ConfigError(f"{path / f'critic_{k}.json'} does not fit critic {k} (another critic_type, "
                                  "critic model or LoRA setting?); build the trainer as the saving run did.")
            blobs.append(blob)
        if (path / f"critic_{len(self.critics)}.json").exists():
            raise ConfigError(f"{path} holds more critics than this trainer's {len(self.critics)}; build the "
                              "trainer with the same agents and critic setting as the saving run.")
        self.state = RunState.from_dict(load_checkpoint(path, self._unique, self._rng))
        for c, blob in zip(self.critics, blobs, strict=True):
            c.head.load_state_dict(blob["head"])
            if blob["backbone"] is not None:
                with torch.no_grad():
                    for n, p in c.backbone.named_parameters():
                        if p.requires_grad:
                            p.copy_(blob["backbone"][n].to(p.device, p.dtype))
            if blob["optimizer"] is not None:
                c.optimizer.load_state_dict(blob["optimizer"])
            if blob["scheduler"] is not None:
                c.scheduler.load_state_dict(blob["scheduler"])
        self.logger.resume()

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()


class IACTrainer(_ActorCriticTrainer):
    """Independent actor-critic: each agent has its own critic, which reads only that agent's
    view (its chat prompt, and its completion for ``critic_type="q"``).

    Args:
        agent_model: The agents' model: a folder, a hub id, ``"embedded"``, a loaded model, or
            one per agent. Each agent trains its own copy unless ``args.share_model``.
        num_agents: Number of agents (must agree with ``args.num_agents``).
        formatters: Dataset path: one callable per agent, ``item -> prompt``.
        reward_func: Dataset path: CoMLRL reward function returning one joint reward per
            aligned set of completions.
        reward_processor: ``float -> float`` applied to every reward.
        train_dataset: Training items (``datasets.Dataset`` or list of dicts), in order.
        eval_dataset: Evaluation items; ``None``: :meth:`evaluate` returns ``{}``.
        args: An :class:`IACConfig`.
        wandb_config: ``None`` or the guide's Weights & Biases settings.
        metrics_callback: ``metrics_callback(rollouts) -> dict`` of numbers, called with the
            :class:`RolloutSample` list of every training batch and of every evaluation item.
        external_transition: Dataset path: builds later turns' prompts.
        tokenizer: A tokenizer (or one per agent); default: the model folder's.
        critic_model: The critics' model (folder, hub id, ``"embedded"`` or loaded model) for
            ``critic_placement="separate"``; default: a copy of each agent's initial model.
        critic_tokenizer: Its tokenizer (default: its folder's).
        env: Env path: a registered id or an environment object.
        eval_env: Env path: the environment to evaluate on.
        env_kwargs: Keywords for ``collab_env.make`` when ``env``/``eval_env`` are ids.
        policies: Env path: policies of the players that are not trained.
        trained_players: Env path: the players to train.

    Raises:
        ConfigError: Inconsistent arguments (the message says which and how to fix it).
    """

    centralised = False
    config_class = IACConfig
    name = "IAC"


class MAACTrainer(_ActorCriticTrainer):
    """Multi-agent actor-critic with one centralised critic: it reads the env's ``state()``
    (the global transcript with every agent's messages, hidden ones included; and the joint
    action for ``critic_type="q"``) and has one output per agent (each agent's own reward).
    Arguments as :class:`IACTrainer`, with ``args`` a :class:`MAACConfig`; ``critic_model``
    defaults to a copy of agent 0's initial model."""

    centralised = True
    config_class = MAACConfig
    name = "MAAC"


# -- helpers ------------------------------------------------------------------------------------
def _max_norm(a: ActorCriticConfig) -> float:
    return a.max_grad_norm if a.max_grad_norm is not None else float("inf")


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chat_text(tokenizer: Any, observation: Any) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(observation.to_chat(), tokenize=False, add_generation_prompt=True)
    return observation.render()


def _load_critic_model(spec: Any, tokenizer: Any, device: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a separate critic from a folder, hub id, ``"embedded"`` or a
    loaded model, in float32 on ``device``: the agents' loader
    (:func:`~collab_env.adapters.common.models.load_model_and_tokenizer`), with the critic named
    in its errors."""
    import torch

    from collab_env.adapters.common.models import load_model_and_tokenizer

    try:
        return load_model_and_tokenizer(spec, tokenizer, str(device), torch.float32)
    except ConfigError as exc:
        raise ConfigError(f"critic_model: {exc} (critic_tokenizer= names the critic's tokenizer).") from exc
