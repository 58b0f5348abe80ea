"""The task behind :func:`~collab_env.tasks.dataset_env.from_dataset`: rows, one formatter per
agent and a CoMLRL ``reward_func`` as a :class:`~collab_env.env.Task`.

The contract (players, observations, rewards, multi-turn prompts, episode end) is documented on
:func:`~collab_env.tasks.dataset_env.from_dataset`; the calling conventions of the user's functions
are in :mod:`collab_env.tasks.task_functions`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collab_env.env import EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ConfigError, DataSchemaError, TaskFunctionError
from collab_env.tasks.streamed_rows import StreamedRows, is_streamed
from collab_env.tasks.task_functions import (
    TRANSITION_KEYWORDS,
    call_reward_func,
    callable_name,
    check_bindable,
    check_reward_callables,
    check_reward_func,
    declared_keywords,
    declares_keyword,
    one_reward,
    process_reward,
    prompt_formatter,
    signature_of,
)
from collab_env.types import ENV_AUTHOR

__all__ = ["DatasetTask"]


class DatasetTask(Task):
    """The :class:`~collab_env.env.Task` behind :func:`from_dataset` (see there for the
    arguments and the semantics). Immutable after construction; holds no per-episode state."""

    def __init__(
        self,
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
    ) -> None:
        self.dataset = self._check_dataset(dataset)
        if external_prompt_passthrough not in (None, True, False):
            raise ConfigError(
                f"external_prompt_passthrough must be True, False or None, got {external_prompt_passthrough!r}."
            )
        self.external_prompt_passthrough = external_prompt_passthrough
        if not isinstance(step_blocks, bool):
            raise ConfigError(f"step_blocks must be True or False, got {step_blocks!r}.")
        self.step_blocks = step_blocks
        formatters = self._check_formatters(formatters, agent_ids)
        players = self._check_agent_ids(agent_ids, len(formatters))
        if isinstance(num_turns, bool) or not isinstance(num_turns, int) or num_turns < 1:
            raise ConfigError(f"num_turns must be an int >= 1, got {num_turns!r}.")
        check_reward_callables(reward_func, reward_processor)
        if external_transition is not None and not callable(external_transition):
            raise ConfigError(
                f"external_transition must be callable or None, got {type(external_transition).__name__}."
            )
        if not isinstance(reward_name, str) or not reward_name:
            raise ConfigError(f"reward_name must be a non-empty str, got {reward_name!r}.")

        self.players = players
        self.turn_order = (players,)  # everybody answers every turn, simultaneously
        self.default_max_steps = num_turns
        self.num_turns = num_turns
        self.formatters = formatters
        self.reward_func = reward_func
        self.reward_processor = reward_processor
        self.external_transition = external_transition
        self.share_responses = bool(share_responses)
        self.reward_name = reward_name
        self.system_prompts = self._check_system_prompts(system_prompts, players)

        # Formatters: does each take the external prompt of later turns? Only an explicit
        # parameter counts (as in CoMLRL): a **kwargs formatter would silently drop the text.
        self._formatter_external: tuple[bool, ...] = tuple(
            declares_keyword(signature_of(f), "external_prompts") for f in formatters
        )
        for i, f in enumerate(formatters):
            kw = {"external_prompts": None} if self._formatter_external[i] else {}
            check_bindable(signature_of(f), f"formatter {i} (for {players[i]!r})", f, [{}], kw,
                           "A formatter takes the task item and, optionally, external_prompts=.")
        # Reward function: which of batch_items / prompts it declares.
        self._reward_keywords = check_reward_func(reward_func, players)
        # Transition: which CoMLRL keywords it declares (all of them when uninspectable).
        if external_transition is not None:
            tsig = signature_of(external_transition)
            self._transition_keywords = (
                TRANSITION_KEYWORDS if tsig is None else declared_keywords(tsig, TRANSITION_KEYWORDS)
            )
            check_bindable(
                tsig, "external_transition", external_transition, [],
                dict.fromkeys(self._transition_keywords),
                f"It is called with keywords only, those it declares among {list(TRANSITION_KEYWORDS)}.",
            )
        else:
            self._transition_keywords = ()

    # -- construction checks ---------------------------------------------------------------
    @staticmethod
    def _check_dataset(dataset: Any) -> Any:
        if isinstance(dataset, StreamedRows):
            if dataset.available(1) == 0:
                raise ConfigError("dataset is empty: an env needs at least one task item.")
            return dataset
        if is_streamed(dataset):
            rows = StreamedRows(dataset)
            if rows.available(1) == 0:
                raise ConfigError("dataset is empty: an env needs at least one task item.")
            return rows
        if isinstance(dataset, (str, bytes)) or isinstance(dataset, Mapping):
            hint = (
                " For columns, build a dataset with datasets.Dataset.from_dict(columns)."
                if isinstance(dataset, Mapping) else
                " To load a hub dataset, pass datasets.load_dataset(name, split=...)."
            )
            raise ConfigError(
                f"dataset must be a sequence of rows (dicts), got {type(dataset).__name__}.{hint}"
            )
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise ConfigError(
                f"dataset must be a sequence of rows (len() and integer indexing) or an iterable "
                f"of rows (an IterableDataset), got {type(dataset).__name__}."
            )
        if len(dataset) == 0:
            raise ConfigError("dataset is empty: an env needs at least one task item.")
        return dataset

    @staticmethod
    def _check_formatters(formatters: Any, agent_ids: Sequence[str] | None) -> tuple[Callable[..., str], ...]:
        if formatters is None:
            formatters = prompt_formatter  # CoMLRL's default: the item's "prompt" field
        if callable(formatters):
            # CoMLRL also takes one formatter shared by every agent; the agent count must then
            # come from somewhere.
            if agent_ids is None:
                raise ConfigError(
                    "a single formatter needs agent_ids= to know how many agents share it; or pass "
                    "a list with one formatter per agent."
                )
            formatters = [formatters] * len(agent_ids)
        if isinstance(formatters, (str, bytes)) or not isinstance(formatters, Sequence):
            raise ConfigError(
                f"formatters must be a list with one callable per agent, got {type(formatters).__name__}."
            )
        if not formatters:
            raise ConfigError("formatters is empty: pass one formatter per agent.")
        for i, f in enumerate(formatters):
            if not callable(f):
                raise ConfigError(
                    f"formatters[{i}] is a {type(f).__name__}, not a callable; a formatter maps a task "
                    "item to the agent's prompt text."
                )
        return tuple(formatters)

    @staticmethod
    def _check_agent_ids(agent_ids: Sequence[str] | None, n: int) -> tuple[str, ...]:
        if agent_ids is None:
            return tuple(f"agent_{i}" for i in range(n))
        if isinstance(agent_ids, str):
            raise ConfigError(f"agent_ids must be a list of ids, got the str {agent_ids!r}.")
        ids = tuple(agent_ids)
        if len(ids) != n:
            raise ConfigError(
                f"{n} formatters for {len(ids)} agent ids {list(ids)}: pass one formatter per agent."
            )
        for a in ids:
            if not isinstance(a, str) or not a:
                raise ConfigError(f"agent ids must be non-empty str, got {a!r}.")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"agent ids must be unique, got {list(ids)}.")
        if ENV_AUTHOR in ids:
            # The env authors prompts under this id; an agent with it would see them as its own.
            raise ConfigError(f"{ENV_AUTHOR!r} is reserved for the environment; choose another agent id.")
        return ids

    @staticmethod
    def _check_system_prompts(system_prompts: Any, players: tuple[str, ...]) -> tuple[str | None, ...]:
        n = len(players)
        if system_prompts is None:
            return (None,) * n
        if isinstance(system_prompts, str):
            return (system_prompts,) * n
        if isinstance(system_prompts, Mapping):
            unknown = set(system_prompts) - set(players)
            if unknown:
                raise ConfigError(f"system_prompts for unknown agents {sorted(unknown)}; agents are {list(players)}.")
            out = tuple(system_prompts.get(p) for p in players)
        elif isinstance(system_prompts, Sequence):
            if len(system_prompts) != n:
                raise ConfigError(f"system_prompts has {len(system_prompts)} entries for {n} agents.")
            out = tuple(system_prompts)
        else:
            raise ConfigError(
                "system_prompts must be a str (shared), a list (one per agent, None for none) or a "
                f"dict agent -> str, got {type(system_prompts).__name__}."
            )
        for p, s in zip(players, out):
            if s is not None and not isinstance(s, str):
                raise ConfigError(f"system prompt of {p!r} must be str or None, got {type(s).__name__}.")
        return out

    # -- items -----------------------------------------------------------------------------
    def num_items(self) -> int | None:
        if isinstance(self.dataset, StreamedRows) and not self.dataset.exhausted:
            return None  # not read to its end yet (perhaps endless)
        return len(self.dataset)

    def get_item(self, index: int) -> dict[str, Any]:
        row = self.dataset[int(index)]
        if not isinstance(row, Mapping):
            raise DataSchemaError(
                f"dataset row {index} is a {type(row).__name__}, not a dict; every row is a task item "
                "with named fields (e.g. {'prompt': ...})."
            )
        return dict(row)

    # -- visibility ------------------------------------------------------------------------
    def audience(self, player: str) -> tuple[str, ...] | None:
        # CoMLRL agents generate independently: a reply is private unless sharing is asked for.
        return None if self.share_responses else (player,)

    # -- episode ---------------------------------------------------------------------------
    def start(self, state: EpisodeState, options: Mapping[str, Any]) -> Start:
        prompts = [self._format(i, state, None) for i in range(len(self.players))]
        messages = []
        for p, system, prompt in zip(self.players, self.system_prompts, prompts):
            if system is not None:
                messages.append(env_message(system, role="system", audience=(p,)))
            messages.append(env_message(prompt, audience=(p,), meta={"turn": 1}))
        state.data["prompts"] = [[p] for p in prompts]
        state.data["responses"] = [[] for _ in self.players]
        state.data["turn"] = 1
        return Start(messages=messages, on_turn=self.players, info={"num_turns": self.num_turns})

    def step(self, state: EpisodeState, moves: Mapping[str, str], final: bool) -> Outcome:
        turn = state.data["turn"]
        replies = [moves[p] for p in self.players]
        for history, reply in zip(state.data["responses"], replies):
            history.append(reply)
        prompts = [h[-1] for h in state.data["prompts"]]
        raw, reward = self._reward(replies, prompts, state, turn)
        components = {p: {self.reward_name: raw, "processed": reward} for p in self.players}
        outcome = Outcome(
            rewards=dict.fromkeys(self.players, reward),
            components=components,
            info={"turn": turn},
        )
        if turn >= self.num_turns:
            outcome.terminated, outcome.reason = True, "num_turns"
            return outcome
        if final:  # an env budget ends the episode now: no next prompt to build
            return outcome
        external = self._transition(replies, state, turn)
        state.data["turn"] = turn + 1
        for i, p in enumerate(self.players):
            prompt = self._next_prompt(i, state, external[i])
            state.data["prompts"][i].append(prompt)
            outcome.messages.append(env_message(prompt, audience=(p,), meta={"turn": turn + 1}))
        return outcome

    # -- calling the user's functions --------------------------------------------------------
    def _next_prompt(self, i: int, state: EpisodeState, external: str) -> str:
        """Agent ``i``'s prompt for a later turn from its external prompt
        (``external_prompt_passthrough``: see :func:`from_dataset`)."""
        mode = self.external_prompt_passthrough
        if mode is True:
            return external
        if mode is False:  # CoMLRL: the external prompt stands in for the item's prompt
            return self._format(i, state, external, item={**state.item, "prompt": external})
        return self._format(i, state, external) if self._formatter_external[i] else external

    def _format(self, i: int, state: EpisodeState, external: str | None,
                item: Mapping[str, Any] | None = None) -> str:
        f = self.formatters[i]
        item = state.item if item is None else item
        try:
            # CoMLRL passes external_prompts=None on the first turn to formatters that declare it.
            text = f(item, external_prompts=external) if self._formatter_external[i] else f(item)
        except Exception as exc:
            raise TaskFunctionError(
                f"formatter {i} ({callable_name(f)!r}, for {self.players[i]!r}) raised "
                f"{type(exc).__name__}: {exc} on item {state.index}."
            ) from exc
        if not isinstance(text, str):
            raise TaskFunctionError(
                f"formatter {i} ({callable_name(f)!r}, for {self.players[i]!r}) returned a "
                f"{type(text).__name__} on item {state.index}; a formatter returns the prompt text (str)."
            )
        return text

    def _reward(self, replies: list[str], prompts: list[str], state: EpisodeState, turn: int) -> tuple[float, float]:
        fn = self.reward_func
        where = f"on item {state.index}, turn {turn}"
        out = call_reward_func(fn, self._reward_keywords, replies, state.item, prompts, where)
        raw = one_reward(out, f"reward_func {callable_name(fn)!r}", where)
        return raw, process_reward(self.reward_processor, raw, where)

    def _transition(self, replies: list[str], state: EpisodeState, turn: int) -> list[str]:
        """Per-agent external prompts for turn ``turn + 1``."""
        fn = self.external_transition
        if fn is None:
            return self._default_transition(replies)
        available = {
            "prompt": state.item.get("prompt", ""),
            "agent_completions": list(replies),
            "num_agents": len(self.players),
            "prompt_history_per_agent": [list(h) for h in state.data["prompts"]],
            "response_history_per_agent": [list(h) for h in state.data["responses"]],
            "item": state.item,
            "batch_items": [state.item],
            "turn": turn,
        }
        try:
            out = fn(**{k: available[k] for k in self._transition_keywords})
        except Exception as exc:
            raise TaskFunctionError(
                f"external_transition {callable_name(fn)!r} raised {type(exc).__name__}: {exc} after turn "
                f"{turn} of item {state.index}."
            ) from exc
        n = len(self.players)
        if isinstance(out, str):
            out = [out] * n  # one prompt for everybody
        if not isinstance(out, (list, tuple)) or len(out) != n or not all(isinstance(s, str) for s in out):
            got = f"{type(out).__name__} of length {len(out)}" if isinstance(out, (list, tuple)) else type(out).__name__
            raise TaskFunctionError(
                f"external_transition {callable_name(fn)!r} returned a {got}; it must return a list of {n} "
                f"str (one next prompt per agent, in the order {list(self.players)}) or one str for all."
            )
        return list(out)

    def _default_transition(self, replies: list[str]) -> list[str]:
        """The next prompt when no ``external_transition`` is given: show each agent the other
        agents' latest answers (unless it already sees them) and ask for a revised answer."""
        out = []
        for i in range(len(self.players)):
            others = [(p, r) for j, (p, r) in enumerate(zip(self.players, replies)) if j != i]
            if not others:
                out.append(
                    "Revise your answer to the same task: keep what works, fix what does not, and "
                    "reply with your complete new answer."
                )
            elif self.share_responses:
                out.append(
                    "The other agents' answers are above. Revise your answer to the same task in "
                    "light of theirs, and reply with your complete new answer."
                )
            else:
                shown = "\n\n".join(f"[{p}]\n{r}" for p, r in others)
                out.append(
                    "Here are the other agents' answers to the same task:\n\n"
                    f"{shown}\n\n"
                    "Revise your answer in light of theirs, and reply with your complete new answer."
                )
        return out

