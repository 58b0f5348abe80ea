"""Train on collab_env envs with TRL's ``GRPOTrainer`` (installed as ``collab_env.adapters.trl``).

Two routes, both thin layers over the one episode driver (:func:`collab_env.rollout.arun_episode`
and :func:`~collab_env.rollout.advance`):

``rollout_func`` (multi-turn GRPO on whole episodes)::

    from trl import GRPOConfig, GRPOTrainer
    from collab_env.adapters import trl as ce_trl

    trainer = GRPOTrainer(model, reward_funcs=ce_trl.episode_reward,
                          train_dataset=ce_trl.dataset("hidden-facts", n=64),
                          rollout_func=ce_trl.rollout_func("hidden-facts"),
                          args=GRPOConfig(num_generations=4, max_completion_length=128))

    TRL 1.16 calls ``rollout_func(prompts, trainer)`` with the prompts of the batch, each already
    repeated ``num_generations`` times. For every prompt received the function plays one episode
    (all of a batch concurrently, so the trained model's calls are batched) with the trainer's
    model as the trained player and every other player through its own policy, and returns one
    sequence per prompt: ``prompt_ids`` (the player's first prompt), ``completion_ids`` (its
    turns and everything between them), ``logprobs`` and ``env_mask`` (1 on the tokens the model
    wrote, 0 on user and env tokens: TRL's loss mask), from
    :func:`collab_env.rollout.token_transcript`. Extra keys reach the reward functions as
    keywords: ``episode_reward`` (the trained player's return), ``reward_components``,
    ``mr`` (the multiturn-aware reward's details of each rewarded turn, ``[]`` without one),
    ``end_reason``, ``num_turns``, ``index`` and ``seed``. :func:`episode_reward` is a ready reward
    function that returns ``episode_reward``.

    TRL passes ``rollout_func`` only the prompts, not the other dataset columns. So the dataset
    built by :func:`dataset` tags the first message of each prompt with the item it came from
    (key :data:`TAG`: ``{"index": i, "seed": s}``); the rollout function resets the env with that
    item and seed. A prompt without the tag is an error that names :func:`dataset`.

    Generation. The trained player's prompts are its exact token history (token in, token out):
    the first prompt is the chat template of its first observation; each later prompt is the
    previous prompt, the ids the model generated, the template's end-of-turn tokens and the
    other players' new messages rendered by the chat template. So the episode is one token
    sequence whose model tokens are exactly the generated ids (what ``env_mask`` marks), with no
    re-tokenisation of the model's own text. Without vLLM the model is the trainer's model,
    sampled with ``temperature``, ``top_p``, ``top_k`` and, per turn, ``max_completion_length``
    (or ``max_turn_tokens``) of the trainer's config; with ``use_vllm=True`` the trainer's
    ``vllm_generation.generate`` serves the token ids (TRL's own sampling settings apply). The
    vLLM route is tested here against a stand-in that serves a tiny model's tokens; real vLLM
    needs a GPU, and in TRL's server mode every process must make the same number of calls
    (episodes of one batch may differ in turns), so use it with one training process.

Turn-level credit: :class:`~collab_env.adapters.trl.credit.TurnCreditGRPOTrainer` is the same
trainer with per-token advantages: each move of the episode is compared with the same move of
the other episodes of its prompt, by its own credit (under the multiturn-aware reward, that
reply's MR), instead of every token sharing the episode's scalar.

``environment_factory`` (TRL's tool route)::

    trainer = GRPOTrainer(model, train_dataset=ce_trl.dataset("hidden-facts", n=64),
                          environment_factory=ce_trl.environment_factory("hidden-facts"), ...)

    :class:`CollabToolEnv` is the env as a tool: ``reset(**row)`` starts the row's item;
    ``send_message(message)`` is the one tool (the player's move; it returns what the other
    players said until the player is on turn again); ``get_reward()`` is the player's return so
    far. It is the single-agent view (:class:`~collab_env.wrappers.single_agent.SingleAgentEnv`)
    behind TRL's tool calling, which needs a chat template that supports tools.

Modules: :mod:`~collab_env.adapters.trl.data` (:func:`dataset`, :func:`item_of`),
:mod:`~collab_env.adapters.trl.generation` (the generators, :class:`ChatPolicy`, :class:`TranscriptPolicy`),
:mod:`~collab_env.adapters.trl.rollout` (:func:`rollout_func`, :func:`episode_output`),
:mod:`~collab_env.adapters.trl.credit` (:class:`TurnCreditGRPOTrainer`),
:mod:`~collab_env.adapters.trl.reward` (:func:`episode_reward`), :mod:`~collab_env.adapters.trl.tools`
(:func:`environment_factory`) and :mod:`~collab_env.adapters.trl.envs` (the helpers they share).

Importing this package needs ``trl`` (``pip install 'collab_env[trl]'``).
"""

# ruff: noqa: E402 (the submodules need trl: they come after the check)
from __future__ import annotations

from collab_env.errors import require

require("trl", "trl", "collab_env.adapters.trl")

from collab_env.adapters.trl.credit import TurnCreditGRPOTrainer
from collab_env.adapters.trl.data import TAG, dataset, dataset_rows, item_of
from collab_env.adapters.trl.generation import (
    ChatPolicy,
    TrainerGenerator,
    TranscriptPolicy,
    VLLMGenerationGenerator,
)
from collab_env.adapters.trl.reward import episode_reward
from collab_env.adapters.trl.rollout import (
    RolloutFunc,
    episode_output,
    rollout_func,
    scored_moves,
)
from collab_env.adapters.trl.tools import CollabToolEnv, environment_factory

__all__ = [
    "TAG",
    "rollout_func",
    "RolloutFunc",
    "episode_reward",
    "dataset",
    "dataset_rows",
    "item_of",
    "TrainerGenerator",
    "VLLMGenerationGenerator",
    "TranscriptPolicy",
    "ChatPolicy",
    "scored_moves",
    "episode_output",
    "CollabToolEnv",
    "environment_factory",
    "TurnCreditGRPOTrainer",
]
