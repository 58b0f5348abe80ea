"""Any dataset + one formatter per agent + a reward function = an environment.

This is the CoMLRL workflow as a PettingZoo env. A *task set* is a sequence of rows (a Hugging
Face ``datasets.Dataset``, a list of dicts, anything with ``len`` and integer indexing); a
*formatter* per agent turns a row into that agent's prompt; a CoMLRL-style ``reward_func``
scores the agents' joint response::

    from datasets import Dataset
    from collab_env.tasks import from_dataset

    def brief(item):
        return f"Answer in one sentence: {item['prompt']}"

    def detailed(item):
        return f"Answer in detail: {item['prompt']}"

    def reward_func(brief_completions, detailed_completions, *, batch_items):
        return [float(len(d) > len(b)) for b, d in zip(brief_completions, detailed_completions)]

    env = from_dataset(Dataset.from_list([{"prompt": "Describe a kite."}]),
                       [brief, detailed], reward_func)
    obs, infos = env.reset(seed=0)
    obs, rewards, terms, truncs, infos = env.step({"agent_0": "A kite flies.",
                                                   "agent_1": "A kite is a framed sail..."})

The calling conventions (which keywords a reward function, a transition or a formatter gets) are
CoMLRL's, so the functions of a CoMLRL training script work here unchanged; see
:func:`from_dataset` for the details.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collab_env.env import CollabEnv
from collab_env.tasks.dataset_task import DatasetTask

__all__ = ["from_dataset"]


# ---------------------------------------------------------------------------------------------
# Public constructor
# ---------------------------------------------------------------------------------------------
def from_dataset(
    dataset: Any,
    formatters: Sequence[Callable[..., str]] | Callable[..., str] | None,
    reward_func: Callable[..., Any],
    *,
    num_turns: int = 1,
    agent_ids: Sequence[str] | None = None,
    external_transition: Callable[..., Any] | None = None,
    reward_processor: Callable[[float], float] | None = None,
    share_responses: bool = False,
    system_prompts: str | Sequence[str | None] | Mapping[str, str] | None = None,
    reward_name: str = "reward_func",
    external_prompt_passthrough: bool | None = None,
    step_blocks: bool = False,
    render_mode: str | None = None,
    max_message_chars: int = 100_000,
    max_total_chars: int | None = None,
    max_steps: int | None = None,
) -> CollabEnv:
    """A cooperative environment from a task set, one formatter per agent and a reward function
    (the CoMLRL workflow).

    Players
        ``agent_0 .. agent_{n-1}`` (``n = len(formatters)``), or ``agent_ids``. All of them are
        on turn every step: they answer simultaneously (``turn_order = ((all agents),)``).

    Observations
        Each agent's own conversation: its system prompt (if any), then per turn the env's
        ``"user"`` prompt and its own reply (``"assistant"``). Turn 1's prompt is
        ``formatter(item)``. Replies are private to their author unless ``share_responses=True``,
        in which case every agent sees every reply (authored by its agent, role ``"user"``).
        The latest ``"user"`` message is the CoMLRL prompt of the turn.

    Actions
        The agent's reply text.

    Rewards
        Every turn, ``reward_func`` is called with one completion list per agent, positionally,
        in agent order (each list holds this turn's reply), plus ``batch_items=[item]`` and/or
        ``prompts=[this turn's prompt of each agent]`` if its signature declares those keywords
        (both when it takes ``**kwargs``). It returns a list with one float, the joint reward
        (a bare number is accepted too); ``reward_processor`` (default: identity) maps it and
        every agent gets the result. ``infos[agent]["reward_components"]`` holds
        ``{reward_name: raw, "processed": processed}`` and ``infos[agent]["turn"]`` the 1-based
        turn scored, for per-turn logging (CoMLRL's ``turn_k/reward_mean``). A reward function
        that raises, returns the wrong number of values, or a non-finite / non-numeric value
        raises :class:`TaskFunctionError`; it is never turned into 0.

    Multi-turn
        After turn ``k < num_turns`` each agent's next prompt comes from
        ``external_transition``, called with the keywords it declares among ``prompt``
        (``item["prompt"]`` or ``""``), ``agent_completions`` (this turn's replies, one per
        agent), ``num_agents``, ``prompt_history_per_agent`` and ``response_history_per_agent``
        (per agent, every prompt it got and every reply it gave so far, this turn included),
        ``item``, ``batch_items`` (``[item]``) and ``turn`` (``k``); all of them if it takes
        ``**kwargs``. It returns one str per agent (or one str for all). A formatter that
        declares ``external_prompts`` then builds the prompt as
        ``formatter(item, external_prompts=<that agent's external prompt>)`` (and gets
        ``external_prompts=None`` on turn 1, as in CoMLRL); for other formatters the external
        prompt itself is the next ``"user"`` message. ``external_prompt_passthrough`` gives
        CoMLRL's rule instead: ``True`` sends the external prompt as it is to every agent;
        ``False`` calls the formatter on the item with its ``prompt`` replaced by the external
        prompt (``formatter({**item, "prompt": external}[, external_prompts=external])``).
        Without ``external_transition`` the
        default transition shows each agent the other agents' latest answers (only a
        reminder when ``share_responses`` already shows them) and asks for a complete revised
        answer.

    Episode end
        ``terminated`` after ``num_turns`` turns (``end_reason == "num_turns"``); ``truncated``
        only if an env budget (``max_steps`` < ``num_turns``, ``max_total_chars``) runs out first.

    Items
        ``reset(options={"index": i})`` picks row ``i``; otherwise a row is drawn from the
        seeded generator. ``env.task.get_item(i)`` returns the row as a dict. A streamed task
        set (``IterableDataset``) is read in order as rows are first needed
        (:class:`StreamedRows`); until its end is reached ``task.num_items()`` is ``None``, so
        pass ``options={"index": i}``.

    Args:
        dataset: A ``datasets.Dataset``, a list of dicts, anything with ``len`` and integer
            indexing that yields dicts, or an iterable of dicts (a ``datasets.IterableDataset``).
        formatters: One callable per agent, ``item -> prompt str``; or a single callable shared
            by all agents when ``agent_ids`` is given; or ``None`` (with ``agent_ids``): every
            agent gets :func:`prompt_formatter`, the item's ``prompt`` field.
        reward_func: CoMLRL-style joint reward function (see Rewards).
        num_turns: Turns per episode.
        agent_ids: Player ids, one per formatter (default ``agent_0`` ...).
        external_transition: CoMLRL-style transition building the next turn's prompts.
        reward_processor: ``float -> float`` applied to every reward (e.g. scaling).
        share_responses: Let every agent see every reply (default: replies are private).
        system_prompts: A system prompt for all agents (str), one per agent (list, ``None``
            for none) or a dict agent -> str.
        reward_name: Key of the raw reward in ``reward_components``.
        external_prompt_passthrough: ``None`` (collab_env's rule), ``True`` or ``False``
            (CoMLRL's), see Multi-turn.
        step_blocks: The reward function or the transition blocks for long (it runs programs
            and waits for them, or calls a service): each step then runs in a worker thread, so
            the other episodes of a rollout go on meanwhile (``Task.step_blocks``).
        render_mode: ``"ansi"``, ``"human"`` or ``None``.
        max_message_chars: Longest reply kept (longer ones are cut and flagged).
        max_total_chars: Truncate once the agents together wrote this many characters.
        max_steps: Env step budget (default ``num_turns``).

    Returns:
        A :class:`~collab_env.env.CollabEnv` running a :class:`DatasetTask`.

    Raises:
        ConfigError: Invalid arguments (empty dataset, formatter count vs agents, a callable
            whose signature cannot take the call it will get...).

    Pickling and cloning: the env pickles when the dataset and every function do; define them
    at module level (lambdas and closures make the env unpicklable by ``pickle``, fine with
    ``cloudpickle``). ``clone()`` forks the episode and shares the immutable task.

    Version history: envs built here are not registered; version the id yourself if you
    register one (``collab_env.register``).
    """
    task = DatasetTask(
        dataset,
        formatters,
        reward_func,
        num_turns=num_turns,
        agent_ids=agent_ids,
        external_transition=external_transition,
        reward_processor=reward_processor,
        share_responses=share_responses,
        system_prompts=system_prompts,
        reward_name=reward_name,
        external_prompt_passthrough=external_prompt_passthrough,
        step_blocks=step_blocks,
    )
    return CollabEnv(
        task,
        max_steps=max_steps,
        max_message_chars=max_message_chars,
        max_total_chars=max_total_chars,
        render_mode=render_mode,
    )
