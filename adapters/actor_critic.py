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

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from collab_env.adapters import comlrl_path_error
from collab_env.adapters.common.config import (
    RolloutFields,
    SamplingFields,
    TrainerConfig,
    as_bool,
    check_choice,
    check_float,
    check_int,
    learner_config,
)
from collab_env.adapters.common.critic_learner import (
    CriticInput,
    CriticLearner,
    Transition,
)
from collab_env.adapters.common.critics import actor_loss, clipped_value_loss, gae, td_targets
from collab_env.adapters.common.loop import mean
from collab_env.adapters.common.losses import clipped_surrogate, masked_aggregate, token_logprobs
from collab_env.adapters.common.task import turn_metrics
from collab_env.errors import ConfigError

__all__ = ["ActorCriticConfig", "IACConfig", "MAACConfig", "IACTrainer", "MAACTrainer"]


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@learner_config
class ActorCriticConfig(SamplingFields, RolloutFields, TrainerConfig):
    """Fields shared by :class:`IACConfig` and :class:`MAACConfig` (the CoMLRL guide's names plus
    the learner's options): the common, sampling and rollout field groups of
    :mod:`~collab_env.adapters.common.config` (learning rate, schedule, LoRA, evaluation and
    logging, sampling, turns, prompt format, reference KL...) and the critic's fields.
    ``early_termination_threshold`` ends an episode's rollout at a turn whose reward (mean over
    agents) exceeds it; ``reference_kl_*`` take the KL off each turn's reward."""

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
    the advantage is ``Q - V``."""
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
    rollout_buffer_size: int | None = None
    """CoMLRL's: agent turns each agent collects before an update. Updates here happen on whole
    items, so it sets ``per_device_train_batch_size`` to ``ceil(rollout_buffer_size /
    num_turns)`` items (the same count when every episode runs all its turns)."""
    train_batch_size: int | None = None
    """CoMLRL's mini-batch within a buffer; only the whole buffer (``None`` or
    ``rollout_buffer_size``) is supported: one optimiser step per update."""

    ALIASES: ClassVar[dict[str, tuple[str, Any]]] = {
        "use_separate_critic": ("critic_placement",
                                lambda v: "separate" if as_bool("use_separate_critic")(v) else "head"),
    }

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
        check_choice("advantage_estimator", self.advantage_estimator, ("gae", "td"))
        check_float("gae_lambda", self.gae_lambda, 0.0, 1.0)
        check_choice("critic_type", self.critic_type, ("v", "q"))
        check_choice("critic_placement", self.critic_placement, ("separate", "head"))
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

    @property
    def lam(self) -> float:
        """The lambda actually used (0 for ``advantage_estimator="td"``)."""
        return 0.0 if self.advantage_estimator == "td" else self.gae_lambda


@learner_config
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
        "discount": 1.0, "eval_interval": 16, "eval_num_samples": 4, "eval_batch_size": 1,
        "early_termination_threshold": -0.2, "logging_steps": 1, "reference_kl_enabled": False,
        "reference_kl_coef": 0.1, "advantage_estimator": "td", "weight_decay": 0.01, "max_grad_norm": None,
        "num_iterations": 1, "logprob_temperature": 1.0, "prompt_format": "raw",
        "lr_scheduler_type": "constant", "warmup_steps": 0,
    }


@learner_config
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
# The algorithm (the rest of the trainer, shared with any actor-critic learner, is
# collab_env.adapters.common.critic_learner.CriticLearner)
# ---------------------------------------------------------------------------------------------
class _ActorCriticTrainer(CriticLearner):
    """IAC and MAAC's algorithm (``centralised`` differs): what each critic reads, the
    advantages and targets, and the update of actors and critics."""

    config_class: type = ActorCriticConfig

    def critic_inputs(self, node: Any, ja: Any) -> dict[int, CriticInput]:
        """What each critic reads (step 2 of the module docstring): IAC, each agent its own view
        (:meth:`_own_view_ids`); MAAC, one input per node for every agent (:meth:`_joint_ids`)."""
        if not self.centralised:
            return {agent: ((node.root, node.depth, agent),
                            *self._own_view_ids(node, agent, node.completions[agent][ja.choice[agent]]))
                    for agent in node.acting}
        joint = self._joint_ids(node, ja, node.env.state())
        return {agent: ((node.root, node.depth), *joint) for agent in node.acting}

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

    # -- advantages ------------------------------------------------------------------------------
    def _advantages(self, transitions: Sequence[Transition], v_old: Sequence[float],
                    q_old: Sequence[float] | None) -> tuple[list[float], list[float], list[float] | None]:
        """Per transition: advantage, V target and (``"q"``) Q target, trajectory by trajectory."""

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
    def train_step(self, indices: Sequence[int]) -> dict[str, float]:
        """Roll out ``indices``, compute advantages and targets, update actors and critics."""
        import torch

        a = self.args
        temp = a.logprob_temperature or a.temperature
        transitions, levels = self.collect(indices)
        metrics = turn_metrics(levels, "")
        metrics["env_steps"] = float(sum(len(n.joint) for nodes in levels for n in nodes))
        if a.reference_kl_enabled:
            self.shape_with_reference_kl(transitions, metrics)
        custom = self.callback_metrics([t.sample for t in transitions])
        if custom:  # logged at rollout time, outside the logging_steps gate
            self.logger.log(custom, env_step=self.state.env_step + int(metrics["env_steps"]),
                            epoch=self.state.epoch, item=self.state.items_done)
        if not transitions:
            return metrics
        for c in self.critics:
            c.eval()
        v0, q0 = self.critic_values(transitions, grad=False)
        v_old = [float(v) for v in v0]
        q_old = [float(q) for q in q0] if a.critic_type == "q" else None
        adv, v_tgt, q_tgt = self._advantages(transitions, v_old, q_old)

        owners, packed = self.actor_batches(transitions)  # micro-batches per distinct model
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
            v_new, q_new = self.critic_values(transitions, grad=True)
            n = len(transitions)
            dev = v_new[0].device
            vl, v_clipped = clipped_value_loss(torch.stack(v_new), v_old_t.to(dev), v_tgt_t.to(dev), a.value_clip_range)
            critic_loss = vl / n
            clipped_count = float(v_clipped.sum())
            if q_old_t is not None and q_tgt_t is not None:
                ql, q_clipped = clipped_value_loss(torch.stack(q_new), q_old_t.to(dev), q_tgt_t.to(dev),
                                                   a.value_clip_range)
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
        from collab_env.agents.tokens import chat_prompt_text

        return chat_prompt_text(tokenizer, observation)  # the policies' rendering: tool calls and tools= too
    return observation.render()


def __getattr__(name: str) -> Any:
    # A CoMLRL import path (comlrl.trainers.<this module>) naming a class defined elsewhere here
    # gets an error that names the import that works.

    raise comlrl_path_error(__name__, name)
