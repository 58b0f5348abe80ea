"""The task source: where a learner's episodes come from.

Every learner that plays environments (MAGRPO, REINFORCE, IAC/MAAC, online DPO, MADPO, MARLHF)
builds one :class:`TaskSource` from its arguments instead of setting up envs itself. It owns:

* **the environments**: the dataset path (``formatters`` + ``reward_func`` + datasets, built
  with :func:`~collab_env.tasks.from_dataset`) or the env path (a registered id or an env
  object, its trained players, the other players' policies from the spec's defaults and the
  caller's ``policies``);
* **item counts**: how many items a split has (``None`` for an unlimited env or a streamed
  split), and how many of them an evaluation can play (:func:`eval_count`);
* **seeds**: the training generator (``seeds(n)``; checkpoints save its state) and one fresh
  generator per evaluation, so that evaluating never shifts the training samples;
* **sampling**: the untrained players' sampling keywords (:func:`untrained_sampling`); the
  learner's own settings go to the episode driver with its models
  (:func:`~collab_env.adapters.common.rollout.driver_table`), which hands both to a reward that
  rolls futures (nothing is bound into an env);
* **turn metrics**: :func:`turn_metrics`, the guide's ``turn_k/reward_mean`` and
  ``turn_k/expected_return``.

Importing this module imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collab_env.adapters.common.config import check_int, learner_sampling
from collab_env.adapters.common.loop import mean
from collab_env.errors import ConfigError
from collab_env.policy import SamplingParams

__all__ = [
    "TaskSource",
    "sampling_keywords",
    "turn_metrics",
    "dataset_items",
    "streamed_rows",
    "eval_count",
    "num_items",
    "ENV_METHODS",
]

#: What an environment object must have to be trained on.
ENV_METHODS: tuple[str, ...] = ("areset", "astep", "clone", "possible_agents")


# ---------------------------------------------------------------------------------------------
# Item counts
# ---------------------------------------------------------------------------------------------
def num_items(env: Any) -> int | None:
    """Items of ``env``'s task (through wrappers): ``task.num_items()``, ``None`` when the task
    does not say (an unlimited generator)."""
    for obj in (env, getattr(env, "unwrapped", None)):
        task = getattr(obj, "task", None) if obj is not None else None
        if task is not None and hasattr(task, "num_items"):
            return task.num_items()
    return None


def streamed_rows(env: Any) -> Any:
    """The :class:`~collab_env.tasks.dataset_env.StreamedRows` of a dataset-path env, or None."""
    from collab_env.tasks.streamed_rows import StreamedRows

    rows = getattr(getattr(getattr(env, "unwrapped", None), "task", None), "dataset", None)
    return rows if isinstance(rows, StreamedRows) else None


def dataset_items(env: Any, max_steps: int | None) -> int | None:
    """Items of a dataset-path env's split: its length; for a streamed split (an
    ``IterableDataset``) ``None`` when ``max_steps`` bounds training (rows are then read as
    needed), else the stream is read once to its end to count them. ``0`` without an env."""
    if env is None:
        return 0
    n = num_items(env)
    if n is not None:
        return n
    if max_steps is not None and max_steps > 0:
        return None
    if max_steps is None:  # evaluation split: counted lazily (``evaluate`` reads what it needs)
        return None
    return len(env.unwrapped.task.dataset)


def eval_count(env: Any, known_items: int | None, requested: int) -> int:
    """How many of the first ``requested`` evaluation items exist: at most ``known_items`` when
    the split's length is known, else (a streamed split) as many rows as the stream holds."""
    if known_items is not None:
        return min(requested, known_items)
    rows = streamed_rows(env)
    return rows.available(requested) if rows is not None else requested


# ---------------------------------------------------------------------------------------------
# Sampling, metrics
# ---------------------------------------------------------------------------------------------
def untrained_sampling(args: Any, others: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The sampling keywords of the untrained players ``others`` from ``args.untrained_sampling``
    (:class:`~collab_env.adapters.common.config.TrainerConfig`): none, the learner's own
    (``"learner"``, :func:`learner_sampling`) for each of them, or the mapping given.

    Raises:
        ConfigError: The mapping names a player that is not an untrained player.
    """
    choice = getattr(args, "untrained_sampling", None)
    if choice is None:
        return {}
    if choice == "learner":
        own = sampling_keywords(learner_sampling(args))
        return {p: dict(own) for p in others}
    unknown = [p for p in choice if p not in others]
    if unknown:
        raise ConfigError(f"untrained_sampling names {unknown}, which are not untrained players of the env "
                          f"(untrained: {sorted(others)}).")
    return {p: dict(v) for p, v in choice.items()}


def sampling_keywords(sampling: SamplingParams | Mapping[str, Any] | None) -> dict[str, Any]:
    """The learner's sampling as the keywords a policy call takes: ``temperature``, ``top_p``,
    ``top_k`` and ``max_new_tokens`` where set (a mapping: its entries that are not ``None``)."""
    if sampling is None:
        return {}
    if isinstance(sampling, SamplingParams):
        sampling = {k: getattr(sampling, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}
    return {k: v for k, v in sampling.items() if v is not None}


def turn_metrics(levels: Sequence[Sequence[Any]], prefix: str) -> dict[str, float]:
    """``turn_k/reward_mean`` and ``turn_k/expected_return``: means over the joint actions of
    depth ``k - 1`` (and over the trained agents)."""
    out: dict[str, float] = {}
    for d, nodes in enumerate(levels):
        joint = [ja for n in nodes for ja in n.joint]
        if not joint:
            continue
        out[f"{prefix}turn_{d + 1}/reward_mean"] = mean([mean(ja.rewards) for ja in joint])
        out[f"{prefix}turn_{d + 1}/expected_return"] = mean([mean(ja.returns) for ja in joint])
    return out


# ---------------------------------------------------------------------------------------------
# The task source
# ---------------------------------------------------------------------------------------------
@dataclass
class TaskSource:
    """A learner's environments, players, item counts, seeds and rollouts (module docstring).

    Build it with :meth:`build`; every field can also be given directly (tests, adapters)."""

    train_env: Any
    """The training environment (``None``: evaluation only)."""
    eval_env: Any
    """The evaluation environment (``None``: :meth:`begin_evaluation` plays nothing)."""
    players: tuple[str, ...]
    """The trained players; agent ``i`` is ``players[i]``."""
    others: dict[str, Any] = field(default_factory=dict)
    """Policies of the players that are not trained."""
    train_items: int | None = 0
    """Items of the training split (``None``: unlimited or streamed)."""
    eval_items: int | None = 0
    """Items of the evaluation split (``None``: unlimited or streamed)."""
    seed: int = 0
    """The run's seed."""
    rng: Any = None
    """The training generator (``numpy.random.Generator``); :meth:`seeds` draws from it."""
    others_sampling: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Player -> sampling keywords for the untrained players' policies in rollouts (empty: each
    policy's own defaults)."""

    def __post_init__(self) -> None:
        if self.rng is None:
            import numpy as np

            self.rng = np.random.default_rng(self.seed)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def build(cls, args: Any, *, num_agents: int | None = None, formatters: Any = None, reward_func: Any = None,
              reward_processor: Any = None, external_transition: Any = None, train_dataset: Any = None,
              eval_dataset: Any = None, env: Any = None, eval_env: Any = None,
              env_kwargs: Mapping[str, Any] | None = None, policies: Mapping[str, Any] | None = None,
              trained_players: Sequence[str] | None = None, env_methods: Sequence[str] = ENV_METHODS,
              dataset_path: bool = True) -> TaskSource:
        """The task source of a learner's arguments: the env path when ``env`` is given, else the
        dataset path (``dataset_path=False``: a learner that only trains on envs).

        Raises:
            ConfigError: Arguments of both paths, a missing reward function or split, unknown
                trained players, an env object without ``env_methods``, an unlimited env without
                ``max_steps``.
        """
        if env is not None:
            return cls._env_path(args, num_agents, env, eval_env, env_kwargs, policies, trained_players,
                                 (formatters, reward_func, train_dataset, eval_dataset), env_methods)
        if not dataset_path:
            raise ConfigError("env= is required: a registered id (e.g. 'hidden-facts') or an environment object.")
        if eval_env is not None or policies is not None or trained_players is not None:
            raise ConfigError("eval_env, policies and trained_players belong to the env path: pass env=... too.")
        return cls._dataset_path(args, num_agents, formatters, reward_func, reward_processor, external_transition,
                                 train_dataset, eval_dataset)

    @classmethod
    def _dataset_path(cls, args, num_agents, formatters, reward_func, reward_processor, external_transition,
                      train_dataset, eval_dataset) -> TaskSource:
        from collab_env.tasks.dataset_env import from_dataset
        from collab_env.tasks.task_functions import prompt_formatter

        if reward_func is None:
            raise ConfigError(
                "the dataset path needs reward_func= (and formatters=, one per agent, unless every "
                "agent reads the item's 'prompt' field); or pass env=<id> to train on a registered "
                "environment."
            )
        if train_dataset is None and eval_dataset is None:
            raise ConfigError("pass train_dataset= (and optionally eval_dataset=), or env=<id>.")
        n = args.num_agents if num_agents is None else num_agents
        if formatters is None:
            formatters = [prompt_formatter] * n  # CoMLRL's default formatter
        if callable(formatters) and not isinstance(formatters, (list, tuple)):
            formatters = [formatters] * n
        if len(formatters) != n:
            raise ConfigError(f"{len(formatters)} formatters for {n} agents: pass one formatter per agent.")

        def build(dataset):
            if dataset is None:
                return None
            return from_dataset(dataset, list(formatters), reward_func, num_turns=args.num_turns,
                                external_transition=external_transition, reward_processor=reward_processor,
                                external_prompt_passthrough=args.external_prompt_passthrough)

        train, evaluation = build(train_dataset), build(eval_dataset)
        return cls(train_env=train, eval_env=evaluation, players=tuple((train or evaluation).possible_agents),
                   others={}, train_items=dataset_items(train, args.max_steps),
                   eval_items=dataset_items(evaluation, None), seed=args.seed)

    @classmethod
    def _env_path(cls, args, num_agents, env, eval_env, env_kwargs, policies, trained_players, dataset_args,
                  env_methods) -> TaskSource:
        import collab_env

        if any(x is not None for x in dataset_args):
            raise ConfigError(
                "env= trains on an environment: its prompts and rewards replace formatters, reward_func "
                "and the datasets. Pass either env= or the dataset arguments, not both."
            )

        def build(e):
            if e is None:
                return None
            from collab_env.serve import served_url

            url = served_url(e)
            if url is not None:  # a served env (collab-env serve): its seat, configured where it is served
                if env_kwargs:
                    raise ConfigError("env_kwargs configure a registered env; a served env is configured where it is "
                                      "served (collab-env serve ID --env-arg KEY=VALUE).")
                from collab_env.serve import remote_env

                return remote_env(url)
            if isinstance(e, str):
                return collab_env.make(e, **dict(env_kwargs or {}))
            for attr in env_methods:
                if not hasattr(e, attr):
                    raise ConfigError(f"env must be a registered id or an environment object; "
                                      f"{type(e).__name__} has no {attr!r}.")
            return e

        train, evaluation = build(env), build(eval_env)
        spec = getattr(train, "spec", None)
        trainable = getattr(spec, "trainable", None) if spec is not None else None
        possible = list(train.possible_agents)
        if trained_players is not None:
            players = list(trained_players)
        elif trainable:
            players = list(trainable)
        else:
            players = possible
        unknown = [p for p in players if p not in possible]
        if unknown or not players:
            raise ConfigError(f"trained_players {unknown or players} must be players of the env: {possible}.")
        if num_agents is not None and num_agents != len(players):
            raise ConfigError(
                f"num_agents={num_agents} but the env trains {len(players)} player(s) {players}; pass "
                "trained_players=[...] to choose which."
            )
        others = _other_policies(spec, possible, players, policies)
        train_items = num_items(train)
        if train_items is None and args.max_steps < 0:
            raise ConfigError("this env generates unlimited items: set args.max_steps to the number of training items.")
        return cls(train_env=train, eval_env=evaluation, players=tuple(players), others=others,
                   train_items=train_items, eval_items=num_items(evaluation) if evaluation is not None else 0,
                   seed=args.seed, others_sampling=untrained_sampling(args, others))

    # -- counts and seeds -------------------------------------------------------------------------
    def items_per_epoch(self, max_steps: int) -> int:
        """Training items per epoch (an unlimited env: ``max_steps`` items make one epoch)."""
        return max_steps if self.train_items is None else self.train_items

    def planned_items(self, num_train_epochs: int, max_steps: int) -> int:
        """Training items of the whole run (``max_steps`` caps it when positive)."""
        items = self.items_per_epoch(max_steps) * num_train_epochs
        return min(items, max_steps) if max_steps > 0 else items

    def seeds(self, n: int) -> list[int]:
        """``n`` fresh seeds from the training generator."""
        return [int(s) for s in self.rng.integers(0, 2**62, size=n)]

    def begin_evaluation(self, requested: int, state: Any) -> tuple[int, Callable[[int], list[int]] | None]:
        """``(n, seeds)`` of one evaluation: how many of the first ``requested`` evaluation items
        exist (0 without an evaluation env) and a seed function from the evaluation's own
        generator (seeded by the run's seed and ``state.evaluations``, which this counts), so
        that evaluating never shifts the training run's samples."""
        import numpy as np

        if self.eval_env is None:
            return 0, None
        check_int("num_eval_samples", requested, 0)
        n = eval_count(self.eval_env, self.eval_items, requested)
        if n == 0:
            return 0, None
        rng = np.random.default_rng([self.seed, 1_000_003, state.evaluations])
        state.evaluations += 1

        def seeds(k: int) -> list[int]:
            return [int(s) for s in rng.integers(0, 2**62, size=k)]

        return n, seeds

    def config_record(self) -> dict[str, Any]:
        """``players`` and ``env`` (the training env's spec id) for the run's logged config."""
        return {"players": list(self.players), "env": getattr(getattr(self.train_env, "spec", None), "id", None)}


def _other_policies(spec: Any, possible: Sequence[str], players: Sequence[str],
                    policies: Mapping[str, Any] | None) -> dict[str, Any]:
    """The untrained players' policies: the spec's defaults merged with ``policies``
    (:func:`collab_env.policy.policies_for`), resolved."""
    from collab_env.policy import policies_for, resolve_policy

    chosen = policies_for(spec, policies)
    return {p: resolve_policy(chosen[p]) for p in possible if p not in players and p in chosen}
