"""MADPO: multi-agent direct preference optimisation (CoMLRL's preference trainer).

Reference-free DPO on the agents' *joint* response, factorised over agents. The trainer surface
is CoMLRL's (and MAGRPO's here), so a CoMLRL script runs with only its import changed::

    from collab_env.adapters import MADPOConfig, MADPOTrainer

    trainer = MADPOTrainer(agent_model="embedded", num_agents=2, formatters=formatters,
                           reward_func=reward_func, train_dataset=train_dataset,
                           eval_dataset=eval_dataset, args=MADPOConfig(num_agents=2, ...))
    trainer.train()
    trainer.evaluate(num_eval_samples=len(eval_dataset))

or on a registered environment: ``MADPOTrainer(agent_model=..., env="length-ratio",
eval_env=collab_env.make("length-ratio", split="test"), args=...)``.

The algorithm (CoMLRL's ``MADPOTrainer``):

1. **Preference pairs**, collected once from the initial policies: for every training item each
   agent samples ``preference_num_candidates`` completions; the ``j``-th completions of the
   agents form joint response ``j`` (aligned), scored by the env's reward (``reward_func`` on the
   dataset path; the mean over the trained agents). Every ordered pair ``(w, l)`` with
   ``r_w > r_l`` is a candidate; ``pair_selection`` keeps the largest gaps first
   (``"reward_gap"``), all pairs in index order (``"all"``) or a random order (``"random"``),
   at most ``preference_pairs_per_sample`` per item. Ties make no pair.
2. **Updates**, ``num_train_epochs`` passes over the shuffled pairs in batches of
   ``train_batch_size``. Agent ``i``'s margin on a pair is
   ``Delta_i = log pi_i(w_i | x_i) - log pi_i(l_i | x_i)`` (summed completion log-probs of its
   own part of the joint responses). The joint loss is ``-log sigmoid(beta * sum_i Delta_i)``;
   in agent ``i``'s loss the other agents' margins are constants (detached), so each agent's
   gradient flows through its own margin only (:func:`madpo_losses`). No reference model.

**Collaboration modes** (CoMLRL's ``collaboration_mode``): ``"decentralized"`` (the default)
trains one policy per agent as above. ``"centralized"`` trains *one* policy that writes every
agent's part in one completion: its prompt lists each agent's prompt and asks for one
``<agent_i>...</agent_i>`` section per agent (:func:`tagged_joint_prompt`); the sections are
parsed out (:func:`parse_tagged_joint`; a completion without any section gives every agent the
empty string) and played as the agents' actions, so the env's reward scores them as usual. With
a single actor the factorised loss is plain reference-free DPO on the joint text
(``-log sigmoid(beta * Delta)``). Evaluation splits the joint completion the same way and reports
the task reward.

Evaluation (:meth:`MADPOTrainer.evaluate`) is MAGRPO's: one joint response per item, scored by
the env's (task) reward, ``eval/turn_1/reward_mean``. The automatic schedule follows the
preference updates (CoMLRL): before update ``u`` when ``u % eval_interval == 0``.

Logs (``<output_dir>/metrics.jsonl``, ``curves.png``): ``preference/*`` after collection,
then per update ``dpo/loss``, ``dpo/accuracy`` (fraction of pairs with ``sum_i Delta_i > 0``),
``dpo/joint_delta_mean``, ``dpo/reward_gap_mean``, ``dpo/num_pairs`` and
``turn_1/reward_mean`` (the mean candidate reward of the batch's items), against ``env_step``,
which grows by ``environment_steps_per_pair`` per pair trained on (CoMLRL's count).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from collab_env.adapters.common.config import (
    RolloutFields,
    SamplingFields,
    TrainerConfig,
    TreeFields,
    check_choice,
    check_float,
    check_int,
    learner_config,
    learner_sampling,
)
from collab_env.adapters.common.loop import (
    Schedule,
    epoch_over,
    evaluation_due,
    flush_log,
    log_due,
    mean,
    next_batch,
    next_epoch,
    progress,
    record_step,
    run_summary,
)
from collab_env.adapters.common.losses import pack_sequences, token_logprobs
from collab_env.adapters.common.models import make_scheduler
from collab_env.adapters.common.preference import sequence_logprobs
from collab_env.adapters.common.rollout import JointAction, TreeNode, start_roots
from collab_env.adapters.common.task import sampling_keywords
from collab_env.adapters.common.tree_learner import TreeBase, expand_trees
from collab_env.adapters.magrpo import MAGRPOConfig
from collab_env.errors import ConfigError
from collab_env.policy import SamplingParams

__all__ = [
    "MADPOConfig",
    "MADPOTrainer",
    "JointPreferencePair",
    "madpo_losses",
    "select_preference_pairs",
    "tagged_joint_prompt",
    "parse_tagged_joint",
]


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@learner_config
class MADPOConfig(SamplingFields, RolloutFields, TreeFields, TrainerConfig):
    """Configuration of :class:`MADPOTrainer`: CoMLRL's MADPO fields (and defaults) with the
    common, sampling, rollout and tree field groups of
    :class:`~collab_env.adapters.magrpo.MAGRPOConfig` (not its PPO group: MADPO takes one DPO
    step per batch of pairs). ``max_steps`` limits the training items used to collect pairs;
    the tree is one turn of aligned joint responses (``num_turns=1``, ``joint_mode="aligned"``,
    as in CoMLRL)."""

    preference_num_candidates: int = 80
    """Completions each agent samples per training item (joint responses per item)."""
    preference_pairs_per_sample: int | None = 16
    """Most pairs kept per item (``None``: every ordered pair with a positive reward gap); must
    be ``None`` with ``pair_selection="all"``."""
    pair_selection: Literal["reward_gap", "all", "random"] = "reward_gap"
    """Which pairs are kept: the largest reward gaps first, all of them, or a random sample."""
    dpo_beta: float = 0.1
    """``beta`` of the joint margin loss ``-log sigmoid(beta * sum_i Delta_i)``."""
    train_batch_size: int | None = None
    """Preference pairs per update (``None``: ``rollout_buffer_size`` when set, else
    ``per_device_train_batch_size``), as in CoMLRL's MADPO."""
    use_environment_step: bool = True
    """Advance ``env_step`` by ``environment_steps_per_pair`` per pair trained on (CoMLRL);
    ``False`` keeps it at 0 (training logs are then written at the end)."""
    environment_steps_per_pair: int = 2
    """``env_step`` added per pair (a pair is two joint responses)."""
    collaboration_mode: Literal["decentralized", "centralized"] = "decentralized"
    """One policy per agent, or one policy writing every agent's part (module docstring)."""

    # CoMLRL's MADPOConfig defaults (comlrl/trainers/preference/madpo.py) for preset="comlrl".
    COMLRL_DEFAULTS: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in MAGRPOConfig.COMLRL_DEFAULTS.items() if k != "num_iterations"},
        "num_turns": 1, "discount": 1.0, "early_termination_threshold": None, "rollout_buffer_size": 2,
        "train_batch_size": None, "preference_num_candidates": 80, "preference_pairs_per_sample": 16,
        "pair_selection": "reward_gap", "dpo_beta": 0.1, "use_environment_step": True,
        "environment_steps_per_pair": 2, "collaboration_mode": "decentralized",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_turns != 1:
            raise ConfigError(f"MADPO supports num_turns=1 only (as CoMLRL's), got {self.num_turns}.")
        if self.joint_mode != "aligned":
            raise ConfigError("MADPO pairs aligned joint responses: set joint_mode='aligned'.")
        check_int("preference_num_candidates", self.preference_num_candidates, 2)
        check_int("preference_pairs_per_sample", self.preference_pairs_per_sample, 1, allow_none=True)
        check_choice("pair_selection", self.pair_selection, ("reward_gap", "all", "random"))
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ConfigError("pair_selection='all' keeps every pair: set preference_pairs_per_sample=None.")
        check_float("dpo_beta", self.dpo_beta, 0.0, low_open=True)
        check_int("train_batch_size", self.train_batch_size, 1, allow_none=True)
        if self.use_environment_step not in (True, False):
            raise ConfigError(f"use_environment_step must be True or False, got {self.use_environment_step!r}.")
        check_int("environment_steps_per_pair", self.environment_steps_per_pair, 1)
        check_choice("collaboration_mode", self.collaboration_mode, ("decentralized", "centralized"))

    @property
    def pairs_per_update(self) -> int:
        """Preference pairs per update (``train_batch_size``, else ``rollout_buffer_size``, else
        ``per_device_train_batch_size``)."""
        if self.train_batch_size is not None:
            return self.train_batch_size
        buffer = getattr(self, "rollout_buffer_size", None)
        return buffer if buffer is not None else self.per_device_train_batch_size


# ---------------------------------------------------------------------------------------------
# The math
# ---------------------------------------------------------------------------------------------
def madpo_losses(margins, beta: float):
    """Per-agent MADPO losses of a batch of joint pairs.

    ``margins[b, i]`` is agent ``i``'s log-prob margin ``Delta_i`` (chosen minus rejected) on
    pair ``b``. Agent ``i``'s loss is
    ``mean_b -log sigmoid(beta * (Delta_{b,i} + sum_{k != i} stopgrad(Delta_{b,k})))``: its value
    is the joint loss ``mean_b -log sigmoid(beta * sum_k Delta_{b,k})`` for every agent, and its
    gradient reaches ``margins[:, i]`` only. ``losses.sum().backward()`` therefore gives every
    agent exactly its own gradient.

    Example (``beta = 0.5``): margins ``[[1, 2], [-1, 0]]`` give joint logits ``1.5`` and
    ``-0.5``, losses ``log(1 + e^-1.5) = 0.2014133`` and ``log(1 + e^0.5) = 0.9740770``, so each
    agent's loss is their mean ``0.5877452``; ``d loss_0 / d margins[0, 0] =
    -0.5 * sigmoid(-1.5) / 2 = -0.0456064`` and ``d loss_0 / d margins[:, 1] = 0``.

    Args:
        margins: ``[B, N]`` tensor (with gradient) of per-agent margins.
        beta: Temperature (``> 0``).

    Returns:
        ``[N]`` tensor of per-agent losses.
    """
    import torch.nn.functional as F

    if not beta > 0:
        raise ConfigError(f"beta must be > 0, got {beta}.")
    if margins.dim() != 2 or margins.shape[0] == 0:
        raise ConfigError(f"margins must be a non-empty [pairs, agents] tensor, got shape {tuple(margins.shape)}.")
    fixed = margins.detach()
    others = fixed.sum(-1, keepdim=True) - fixed  # the other agents' margins, as constants
    return -F.logsigmoid(beta * (margins + others)).mean(0)


def select_preference_pairs(rewards: Sequence[float], mode: str = "reward_gap", limit: int | None = None,
                            rng: Any = None) -> list[tuple[int, int]]:
    """CoMLRL's pair selection: ``(winner, loser)`` indices among scored joint responses.

    Every ordered pair with a positive reward gap is a candidate. ``"reward_gap"`` sorts them by
    gap, largest first (ties keep index order); ``"all"`` keeps index order; ``"random"``
    shuffles them with ``rng`` (a ``numpy.random.Generator``). At most ``limit`` are kept
    (``None``: all).

    Example: rewards ``[0.2, 1.0, 0.5]`` give candidates ``(1, 0)`` gap 0.8, ``(1, 2)`` gap 0.5,
    ``(2, 0)`` gap 0.3; ``"reward_gap"`` with limit 2 keeps ``[(1, 0), (1, 2)]``.
    """
    check_choice("pair_selection", mode, ("reward_gap", "all", "random"))
    check_int("limit", limit, 1, allow_none=True)
    cands = [(float(rw) - float(rl), w, lo) for w, rw in enumerate(rewards) for lo, rl in enumerate(rewards)
             if w != lo and float(rw) - float(rl) > 0]
    if mode == "random":
        if rng is None:
            raise ConfigError("pair_selection='random' needs rng= (a numpy Generator).")
        cands = [cands[int(i)] for i in rng.permutation(len(cands))]
    elif mode == "reward_gap":
        cands.sort(key=lambda c: -c[0])  # stable: equal gaps stay in index order
    if limit is not None:
        cands = cands[:limit]
    return [(w, lo) for _, w, lo in cands]


# ---------------------------------------------------------------------------------------------
# Centralised collaboration: one completion holds every agent's part
# ---------------------------------------------------------------------------------------------
def tagged_joint_prompt(agent_prompts: Sequence[str]) -> str:
    """The centralised policy's prompt: every agent's prompt, and the request to answer each in
    its own ``<agent_i>...</agent_i>`` section (``i`` 0-based, as in CoMLRL)."""
    parts = "\n\n".join(f"Agent {i} prompt:\n{p}" for i, p in enumerate(agent_prompts))
    tags = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(len(agent_prompts)))
    return (f"You write the separate answers of {len(agent_prompts)} agents. Each answer must satisfy its "
            f"agent's prompt; keep them separate and write nothing outside the sections.\n\n{parts}\n\n"
            f"Answer with exactly one section per agent:\n{tags}")


def parse_tagged_joint(text: str, num_agents: int) -> list[str]:
    """The agents' parts of a centralised completion: the stripped content of each
    ``<agent_i>...</agent_i>`` section (case-insensitive; a missing section is ``""``). A
    completion with no section at all gives every agent ``""`` (CoMLRL scores it so)."""
    out = []
    for i in range(num_agents):
        m = re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", text, flags=re.IGNORECASE | re.DOTALL)
        out.append(m.group(1).strip() if m else "")
    return out


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------
@dataclass
class CentralNode(TreeNode):
    """A first-turn node of ``collaboration_mode="centralized"``: one model writes every agent's
    part from one tagged prompt."""

    agent_prompts: list[str] = field(default_factory=list)
    """Per agent, the text of the latest message addressed to it."""
    central_prompt_ids: list[int] = field(default_factory=list)
    """The token ids of the one tagged prompt the model completes."""
    meta_joint: list[Any] = field(default_factory=list)
    """The model's ``k`` tagged :class:`~collab_env.types.Completion` objects."""
    parts: list[list[str]] = field(default_factory=list)
    """Per completion, the agents' parts parsed from it (:func:`parse_tagged_joint`)."""

    @classmethod
    def of(cls, node: TreeNode) -> CentralNode:
        """``node``'s fields (shared, not copied) in a central node."""
        return cls(**{f.name: getattr(node, f.name) for f in fields(TreeNode)})


@dataclass
class JointPreferencePair:
    """One preference pair of joint responses, with each actor's token ids."""

    prompt_ids: list[list[int]]
    """Per actor (agent, or the one centralised policy), its prompt's token ids."""
    chosen_ids: list[list[int]]
    """Per actor, the token ids of its part of the preferred joint response."""
    rejected_ids: list[list[int]]
    """Per actor, the token ids of its part of the other joint response."""
    prompts: list[str]
    """Per agent, the text of its prompt."""
    chosen: list[str]
    """Per agent, its completion in the preferred joint response."""
    rejected: list[str]
    """Per agent, its completion in the other joint response."""
    chosen_reward: float
    """Env reward of the preferred joint response."""
    rejected_reward: float
    """Env reward of the other one (strictly lower)."""
    candidate_reward_mean: float
    """Mean reward of every candidate joint response of the item."""
    item: int = 0
    """Index of the training item."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else (unused by the loss)."""


class MADPOTrainer(TreeBase):
    """Train agents with MADPO on a dataset (CoMLRL style) or on a registered environment.

    Takes MAGRPO's arguments (``agent_model``, ``num_agents``, ``formatters``, ``reward_func``,
    ``train_dataset``, ``eval_dataset``, ``args``, ``wandb_config``, ``env``, ``eval_env``, ...;
    see :class:`~collab_env.adapters.magrpo.MAGRPOTrainer`) with ``args`` a
    :class:`MADPOConfig`. With ``collaboration_mode="centralized"`` one model is trained
    (``agent_model`` must be one model; ``share_model`` is implied).
    """

    config_class = MADPOConfig
    overlaps_rollouts = False  # it collects every pair before it trains

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from dataclasses import replace

        config = kwargs.get("args")
        if config is None:
            if len(args) >= 8:
                config = args[7]
            else:
                config = kwargs["args"] = MADPOConfig()
        if not isinstance(config, MADPOConfig):
            raise ConfigError(f"args must be a {MADPOConfig.__name__}, got {type(config).__name__}.")
        self.centralized = config.collaboration_mode == "centralized"
        if self.centralized:
            model = kwargs.get("agent_model", args[0] if args else None)
            if isinstance(model, (list, tuple)) and len(model) != 1:
                raise ConfigError("collaboration_mode='centralized' trains exactly one policy: pass one agent_model.")
            # One policy plays every agent; its parts are parsed out of one completion.
            shared = replace(config, share_model=True)
            if "args" in kwargs:
                kwargs["args"] = shared
            else:
                args = (*args[:7], shared, *args[8:])
        super().__init__(*args, **kwargs)
        self.pairs: list[JointPreferencePair] = []

    # -- collection -------------------------------------------------------------------------------
    def _collect_nodes(self, indices: Sequence[int], k: int, sampling: Any, seeds) -> list[Any]:
        """Root nodes of ``indices`` with ``k`` aligned joint responses each (their env rewards
        in ``joint[j].returns``)."""
        if self.centralized:
            return self._centralized_nodes(self.train_env, indices, k, sampling, seeds)
        _, levels = expand_trees(self.task, self.train_env, indices, self.models, self.args, branching=lambda d: k,
                                 joint_mode="aligned", sampling=sampling, seeds=seeds)
        return list(levels[0]) if levels else []

    def collect_pairs(self) -> list[JointPreferencePair]:
        """Sample candidates on every training item (``max_steps`` items at most) and keep the
        selected pairs (module docstring, step 1). Logs ``preference/*``."""
        import numpy as np

        a = self.args
        n_items = self.task.items_per_epoch(a.max_steps)
        if a.max_steps > 0:
            n_items = min(n_items, a.max_steps)
        pair_rng = np.random.default_rng([a.seed, 5_150])
        pairs: list[JointPreferencePair] = []
        evaluations = 0
        for start in range(0, n_items, a.per_device_train_batch_size):
            indices = list(range(start, min(n_items, start + a.per_device_train_batch_size)))
            for node in self._collect_nodes(indices, a.preference_num_candidates, learner_sampling(self.args),
                                            self.task.seeds):
                rewards = [mean(ja.returns) for ja in node.joint]
                evaluations += len(rewards)
                picked = select_preference_pairs(rewards, a.pair_selection, a.preference_pairs_per_sample,
                                                 rng=pair_rng)
                for w, lo in picked:
                    pairs.append(self._make_pair(node, w, lo, rewards, indices[node.root]))
        self.state.items_done = n_items
        self.pairs = pairs
        metrics = {"preference/num_pairs": float(len(pairs)),
                   "preference/pairs_per_sample_mean": len(pairs) / n_items if n_items else 0.0,
                   "preference/reward_evaluations": float(evaluations)}
        if pairs:
            metrics["preference/winner_reward_mean"] = mean([p.chosen_reward for p in pairs])
            metrics["preference/loser_reward_mean"] = mean([p.rejected_reward for p in pairs])
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch, item=self.state.items_done)
        return pairs

    def _make_pair(self, node: Any, w: int, lo: int, rewards: Sequence[float], item: int) -> JointPreferencePair:
        if self.centralized:
            c = node.meta_joint
            return JointPreferencePair(
                prompt_ids=[list(node.central_prompt_ids)], chosen_ids=[list(c[w].token_ids or ())],
                rejected_ids=[list(c[lo].token_ids or ())], prompts=list(node.agent_prompts),
                chosen=list(node.parts[w]), rejected=list(node.parts[lo]), chosen_reward=float(rewards[w]),
                rejected_reward=float(rewards[lo]), candidate_reward_mean=mean(rewards), item=item,
                meta={"chosen_text": c[w].text, "rejected_text": c[lo].text})
        agents = range(len(self.players))
        comps = node.completions
        return JointPreferencePair(
            prompt_ids=[list(node.prompt_ids[i]) for i in agents],
            chosen_ids=[list(comps[i][w].token_ids or ()) for i in agents],
            rejected_ids=[list(comps[i][lo].token_ids or ()) for i in agents],
            prompts=[node.prompts[i] for i in agents], chosen=[comps[i][w].text for i in agents],
            rejected=[comps[i][lo].text for i in agents], chosen_reward=float(rewards[w]),
            rejected_reward=float(rewards[lo]), candidate_reward_mean=mean(rewards), item=item)

    # -- centralised rollouts -------------------------------------------------------------------
    def _centralized_nodes(self, env: Any, indices: Sequence[int], k: int, sampling: SamplingParams,
                           seeds) -> list[CentralNode]:
        """Like a one-turn rollout tree, with one policy writing all agents' parts: per item,
        ``k`` tagged completions, parsed and stepped on clones of the env."""
        import asyncio

        from collab_env._async import run_sync
        from collab_env.types import Conversation, Message

        pm = self.models[0]
        players = self.players

        async def go():
            roots = [CentralNode.of(node) for node in await start_roots(env, indices, players, self.others, seeds)]
            for node in roots:
                if sorted(node.acting) != list(range(len(players))):
                    raise ConfigError("collaboration_mode='centralized' needs every trained agent on turn together "
                                      f"at the first turn; here {[players[i] for i in node.acting]} are.")
                node.agent_prompts = [_latest_user_text(node.obs[p]) for p in players]
                prompt = Conversation((Message(role="user", content=tagged_joint_prompt(node.agent_prompts)),))
                node.central_prompt_ids = pm.prompt_ids(prompt)
            flat = [node.central_prompt_ids for node in roots for _ in range(k)]
            outs = pm.generate(flat, seeds(len(flat)), **sampling_keywords(sampling)) if flat else []
            steps = []
            for r, node in enumerate(roots):
                node.meta_joint = outs[r * k:(r + 1) * k]
                node.parts = [parse_tagged_joint(c.text, len(players)) for c in node.meta_joint]
                for j in range(k):
                    ja = JointAction(choice={}, rewards=[0.0] * len(players))
                    node.joint.append(ja)
                    steps.append(self._step_parts(node, ja, node.parts[j], seeds))
            await asyncio.gather(*steps)
            for node in roots:
                for ja in node.joint:
                    ja.returns = list(ja.rewards)
            return roots

        return run_sync(go())

    async def _step_parts(self, node: Any, ja: Any, parts: Sequence[str], seeds) -> None:
        """One round on a clone of the node's env: the parsed parts as the trained players'
        moves, the untrained players on turn through their policies (the episode driver)."""
        from collab_env.adapters.common.config import learner_sampling
        from collab_env.adapters.common.rollout import driver_table
        from collab_env.rollout import advance

        # the trained models in the table: a multiturn-aware reward's futures play them
        table, sampling = driver_table(self.players, self.models, self.others, learner_sampling(self.args))
        run = await advance(node.env.clone(), table, obs=node.obs, infos=node.infos,
                            actions=dict(zip(self.players, parts, strict=True)), max_steps=1,
                            sampling=sampling, seed=lambda k: seeds(1)[0])
        for i, p in enumerate(self.players):
            ja.rewards[i] += run.reward(p)

    # -- training ---------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Collect the preference pairs, then ``num_train_epochs`` passes of updates (module
        docstring); evaluates on CoMLRL's schedule. Returns the last logged training metrics
        (``{}`` when the rewards gave no pair)."""
        if self.train_env is None:
            raise ConfigError("train() needs train_dataset= (or env=).")
        if not self.collect_pairs():
            return {}
        s, st = self.schedule(), self.state  # one optimiser step per unit, over the pairs
        for pm in self._unique:  # the number of updates is known only now
            pm.scheduler = make_scheduler(pm.optimizer, self.args, s.limit)
        bar = progress(s, st, self.logger)
        last: dict[str, Any] = {}
        while (batch := next_batch(s, st)) is not None:
            if evaluation_due(s, st, len(batch)):
                self.evaluate()
            record_step(s, st, self.train_step(batch), len(batch))
            if log_due(s, st):
                last = flush_log(self, s.summed, s.log_item)
            if epoch_over(s, st):
                next_epoch(st, self.end_epoch())
            if bar is not None:
                bar.update(len(batch))
        if bar is not None:
            bar.close()
        if st.pending:
            last = flush_log(self, s.summed, s.log_item)
        if self.args.plot:
            self.logger.plot()
        self.logger.summary(s.desc, run_summary(s, st))
        return last

    def schedule(self) -> Schedule:
        """Updates of ``pairs_per_update`` pairs, ``num_train_epochs`` passes over the pairs;
        evaluation before update ``u`` when ``u % eval_interval == 0``; logs every
        ``logging_steps`` env steps; no checkpoints."""
        a = self.args
        per_epoch = math.ceil(len(self.pairs) / a.pairs_per_update)
        return Schedule(unit="step", per_epoch=per_epoch, limit=per_epoch * a.num_train_epochs,
                        epochs=a.num_train_epochs, eval_every=a.eval_interval, eval_rule="done",
                        can_evaluate=self.eval_env is not None, log_every=a.logging_steps, log_rule="env_step",
                        desc="MADPO")

    def end_epoch(self) -> dict[str, float]:
        """Nothing is buffered across updates: ``{}``."""
        return {}

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """One update on the ``batch[0]``-th slice of this epoch's shuffled pairs; ``env_step``
        grows by ``environment_steps_per_pair`` per pair (CoMLRL's count)."""
        import numpy as np

        a = self.args
        bs = a.pairs_per_update
        order = np.random.default_rng([a.seed, 31_337, self.state.epoch]).permutation(len(self.pairs))
        pairs = [self.pairs[int(i)] for b in batch for i in order[b * bs:(b + 1) * bs]]
        metrics = self.update(pairs)
        metrics["env_steps"] = a.environment_steps_per_pair * len(pairs) if a.use_environment_step else 0
        return metrics

    def _margins(self, pm: Any, actor: int, batch: Sequence[JointPreferencePair]):
        """``[B]`` margins ``log pi(chosen) - log pi(rejected)`` of ``actor``'s parts, one
        forward pass of ``pm`` (with gradient)."""

        prompts = [p.prompt_ids[actor] for p in batch] * 2
        comps = [p.chosen_ids[actor] for p in batch] + [p.rejected_ids[actor] for p in batch]
        tb = pack_sequences(prompts, comps, pm.pad_id).to(pm.device)
        seq = sequence_logprobs(token_logprobs(pm.model, tb), tb.completion_mask)
        return seq[:len(batch)] - seq[len(batch):]

    def update(self, batch: Sequence[JointPreferencePair]) -> dict[str, float]:
        """One MADPO update on ``batch``: every actor's margins (with gradient), the per-agent
        losses of :func:`madpo_losses`, one backward pass (each model receives only its own
        agents' gradients), then per model gradient clipping, an AdamW step and the schedule.
        Returns the update's metrics."""
        import torch

        a = self.args
        actors = 1 if self.centralized else len(self.players)
        owner = [self.models[i] for i in range(actors)]
        for pm in self._unique:
            pm.model.train()
            pm.optimizer.zero_grad(set_to_none=True)
        margins = torch.stack([self._margins(owner[i], i, batch).to(owner[0].device) for i in range(actors)], -1)
        losses = madpo_losses(margins, a.dpo_beta)
        losses.sum().backward()
        grad_norms = []
        for pm in self._unique:
            params = [p for _, p in pm.trainable_parameters()]
            clip = a.max_grad_norm if a.max_grad_norm is not None else float("inf")
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
            pm.optimizer.step()
            pm.scheduler.step()
            pm.version += 1
            pm.model.eval()
        self.state.optimizer_steps += 1
        joint = margins.detach().sum(-1)
        return {"dpo/loss": float(losses.detach()[0]),
                "dpo/accuracy": float((joint > 0).float().mean()),
                "dpo/joint_delta_mean": float(joint.mean()),
                "dpo/reward_gap_mean": mean([p.chosen_reward - p.rejected_reward for p in batch]),
                "dpo/num_pairs": float(len(batch)),
                "turn_1/reward_mean": mean([p.candidate_reward_mean for p in batch]),
                "turn_1/expected_return": mean([p.candidate_reward_mean for p in batch]),
                "grad_norm": mean(grad_norms),
                "learning_rate": float(self._unique[0].scheduler.get_last_lr()[0])}

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """MAGRPO's evaluation (task reward, ``eval/turn_1/reward_mean``); in centralised mode
        one tagged completion per item, split into the agents' parts and scored by the env."""
        if not self.centralized:
            return super().evaluate(num_eval_samples)
        n, seeds = self.task.begin_evaluation(
            self.args.eval_num_samples if num_eval_samples is None else num_eval_samples, self.state)
        if n == 0:
            return {}
        a = self.args
        rewards, parsed = [], []
        for start in range(0, n, a.eval_batch_size):
            idx = list(range(start, min(n, start + a.eval_batch_size)))
            for node in self._centralized_nodes(self.eval_env, idx, 1, learner_sampling(self.args, True), seeds):
                rewards.append(mean(node.joint[0].returns))
                parsed.append(float(any(node.parts[0])))
        metrics = {"eval/turn_1/reward_mean": mean(rewards), "eval/turn_1/expected_return": mean(rewards),
                   "eval/parsed_fraction": mean(parsed)}
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch, item=self.state.items_done)
        return metrics


def _latest_user_text(observation: Any) -> str:
    for m in reversed(list(observation)):
        if getattr(m, "role", None) == "user":
            return str(m.content)
    return ""
