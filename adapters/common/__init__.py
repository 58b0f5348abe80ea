"""The learners' shared toolkit (``collab_env.adapters.common``).

Small modules that every torch learner in :mod:`collab_env.adapters` builds on, so that each
algorithm file reads top to bottom:

* :mod:`~collab_env.adapters.common.config`: the config field groups (common
  :class:`TrainerConfig`, sampling, rollout, tree, PPO), :func:`learner_config`, the one
  ``SamplingParams`` of a config (:func:`learner_sampling`) and the evaluation schedule.
* :mod:`~collab_env.adapters.common.models`: loading the agents' models (a folder, a hub id,
  ``"embedded"``, a loaded model), one per agent or shared, LoRA through ``peft``, device and
  dtype, gradient checkpointing, reference models, batched generation with exact token ids.
* :mod:`~collab_env.adapters.common.losses`: per-token log-probs under masks, group-relative
  advantages, the clipped surrogate and the k3 estimator of the KL to a reference model.
* :mod:`~collab_env.adapters.common.baselines`: REINFORCE baselines (mean, leave-one-out,
  greedy rollout) as advantages.
* :mod:`~collab_env.adapters.common.critics`: TD targets, GAE, clipped value loss and the
  value-head critic of the actor-critic learners.
* :mod:`~collab_env.adapters.common.rollout`: rollout trees on any collab_env environment
  (the CoMLRL multi-turn tree: a group of joint actions per node, returns from children).
* :mod:`~collab_env.adapters.common.task`: the task source (dataset or env path, item counts,
  seeds, turn metrics, the untrained players' sampling).
* :mod:`~collab_env.adapters.common.loop`: one run state, one schedule, the steps of a training
  loop as plain functions (the tree learners' loops call them) and :func:`~collab_env.adapters.common.loop.run`,
  the same loop for the learners that hand it their step (the public
  :class:`~collab_env.adapters.common.loop.Learner` protocol).
* :mod:`~collab_env.adapters.common.learner`: set-up every learner shares (models with
  optimisers, views of the task source, the item schedule, the epoch order).
* :mod:`~collab_env.adapters.common.tree_learner`: the toolkit of MAGRPO, REINFORCE and MADPO
  (plain functions: expand the trees, group the nodes, one policy update; the set-up
  ``TreeBase``, with no loop: each of them writes its own).
* :mod:`~collab_env.adapters.common.critic_learner`: the scaffolding of IAC and MAAC (critics
  built, run and saved; one-path episodes as per-agent transitions).
* :mod:`~collab_env.adapters.common.chat`: chat-template token spans (SFT, DPO).
* :mod:`~collab_env.adapters.common.pairs`: preference-pair datasets (joint pairs of a reward
  model, chat pairs of DPO split by agent), their encoding and the log-probs of a pair batch.
* :mod:`~collab_env.adapters.common.joint_reward`: the joint reward model (template, LM + head,
  scoring, saving, as a ``reward_func``) that the reward-model learner trains.
* :mod:`~collab_env.adapters.common.logging`: JSONL log, PNG curves, optional Weights & Biases,
  and the summary every run ends with.
* :mod:`~collab_env.adapters.common.checkpoint`: saving and resuming (weights, optimizers,
  schedulers, data position, RNG states).

The modules import each other at module level; importing this package imports none of them,
and nothing heavy (the modules that need torch import it inside their functions).
"""
