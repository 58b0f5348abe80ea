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

import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collab_env.env import CollabEnv, EpisodeState, Outcome, Start, Task, env_message
from collab_env.errors import ConfigError, DataSchemaError, TaskFunctionError
from collab_env.types import ENV_AUTHOR

__all__ = [
    "from_dataset", "DatasetTask", "TaskFunctionError", "TRANSITION_KEYWORDS", "REWARD_KEYWORDS",
    "prompt_formatter", "StreamedRows", "is_streamed",
]

#: Keywords an ``external_transition`` may declare (it gets exactly those it declares, or all of
#: them when it takes ``**kwargs``).
TRANSITION_KEYWORDS: tuple[str, ...] = (
    "prompt",
    "agent_completions",
    "num_agents",
    "prompt_history_per_agent",
    "response_history_per_agent",
    "item",
    "batch_items",
    "turn",
)
#: Keywords a ``reward_func`` may declare besides the per-agent completion lists.
REWARD_KEYWORDS: tuple[str, ...] = ("batch_items", "prompts")


# ---------------------------------------------------------------------------------------------
# Signature inspection (done once, at construction: calls in the step loop stay cheap)
# ---------------------------------------------------------------------------------------------
def _name(fn: Any) -> str:
    """A readable name for error messages: ``module.qualname`` where there is one."""
    qual = getattr(fn, "__qualname__", None) or getattr(type(fn), "__qualname__", None)
    mod = getattr(fn, "__module__", None)
    if qual is None:
        return repr(fn)
    return f"{mod}.{qual}" if mod and mod != "builtins" else qual


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none
        return None


def _declared_keywords(sig: inspect.Signature | None, names: Sequence[str]) -> tuple[str, ...]:
    """Which of ``names`` to pass to a function: those it declares as keyword-capable
    parameters, or all of them when it takes ``**kwargs``."""
    if sig is None:
        return ()
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return tuple(names)
    return tuple(
        n for n in names
        if n in params and params[n].kind is not inspect.Parameter.POSITIONAL_ONLY
    )


def _declares(sig: inspect.Signature | None, name: str) -> bool:
    """Whether the signature has an explicit parameter ``name`` that can be passed by keyword."""
    return (
        sig is not None
        and name in sig.parameters
        and sig.parameters[name].kind is not inspect.Parameter.POSITIONAL_ONLY
    )


def _check_bindable(sig: inspect.Signature | None, what: str, fn: Any, args: Sequence[Any],
                    kwargs: Mapping[str, Any], hint: str) -> None:
    """Fail at construction, not mid-training, when ``fn`` cannot take the call we will make."""
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"{what} {_name(fn)!r} has an incompatible signature {sig}: {exc}. {hint}") from exc


# ---------------------------------------------------------------------------------------------
# The default formatter and streamed task sets
# ---------------------------------------------------------------------------------------------
def prompt_formatter(item: Mapping[str, Any], external_prompts: str | None = None) -> str:
    """The default formatter (CoMLRL's): the item's ``prompt`` field on the first turn, the
    external prompt on later turns.

    Raises:
        DataSchemaError: The item has no ``prompt`` str (an empty prompt is never made up).
    """
    if external_prompts is not None:
        return external_prompts
    prompt = item.get("prompt") if isinstance(item, Mapping) else None
    if not isinstance(prompt, str):
        raise DataSchemaError(
            f"the default formatter reads the item's 'prompt' field, but this item has "
            f"{'no prompt' if prompt is None else 'a ' + type(prompt).__name__ + ' prompt'} (fields: "
            f"{sorted(item) if isinstance(item, Mapping) else type(item).__name__}); pass formatters=[...]."
        )
    return prompt


def is_streamed(dataset: Any) -> bool:
    """Whether ``dataset`` is an iterable task set without ``len``/indexing (a Hugging Face
    ``IterableDataset``, a generator...), which :class:`StreamedRows` reads in order."""
    if isinstance(dataset, (str, bytes, Mapping)):
        return False
    indexable = hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    return not indexable and hasattr(dataset, "__iter__")


class StreamedRows:
    """The rows of an iterable task set (``datasets.IterableDataset``), read in order as they
    are first needed and kept, so row ``i`` is the same row every time it is asked for.

    An endless stream works as long as nobody asks for its length: a trainer then needs
    ``max_steps``. Pickling keeps the rows read so far and the source, and reads on from where
    it stopped.
    """

    def __init__(self, source: Any) -> None:
        self.source = source
        self._rows: list[Any] = []
        self._it: Any = None
        self._done = False

    def _read_to(self, n: int) -> None:
        if self._it is None and not self._done:
            self._it = iter(self.source)
            for _ in range(len(self._rows)):  # after unpickling: skip the rows already kept
                next(self._it)
        while len(self._rows) < n and not self._done:
            try:
                self._rows.append(next(self._it))
            except StopIteration:
                self._done, self._it = True, None

    def available(self, n: int) -> int:
        """How many of the first ``n`` rows exist (reads at most ``n`` rows)."""
        self._read_to(n)
        return min(n, len(self._rows))

    @property
    def exhausted(self) -> bool:
        """Whether the stream's end has been reached (its length is known)."""
        return self._done

    def __len__(self) -> int:
        """Reads the stream to its end (never returns for an endless stream)."""
        while not self._done:
            self._read_to(len(self._rows) + 1024)
        return len(self._rows)

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        self._read_to(index + 1)
        if index < 0 or index >= len(self._rows):
            raise ConfigError(
                f"row {index} of a streamed task set that has only {len(self._rows)} rows; pass an "
                "index below that (reset(options={'index': i}))."
            )
        return self._rows[index]

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "rows": list(self._rows), "done": self._done}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.source, self._rows, self._done, self._it = state["source"], state["rows"], state["done"], None


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------
def call_reward_func(fn: Callable[..., Any], keywords: Sequence[str], completions: Sequence[str],
                     item: Mapping[str, Any], prompts: Sequence[str] | None, where: str) -> Any:
    """Call a CoMLRL ``reward_func`` on one joint response: one single-completion list per agent,
    positionally, plus the declared ``keywords`` (``batch_items`` / ``prompts``). Its exception
    becomes a :class:`TaskFunctionError` naming the function and ``where``."""
    available = {"batch_items": [item], "prompts": list(prompts or [])}
    try:
        return fn(*[[c] for c in completions], **{k: available[k] for k in keywords})
    except Exception as exc:
        raise TaskFunctionError(
            f"reward_func {_name(fn)!r} raised {type(exc).__name__}: {exc} {where}. A failing "
            "reward is an error, never a silent 0: fix the function."
        ) from exc


def check_reward_callables(reward_func: Any, reward_processor: Any) -> None:
    """Validate a CoMLRL ``reward_func`` and optional ``reward_processor`` (shared with
    :class:`~collab_env.rewards.joint.JointReward`)."""
    if not callable(reward_func):
        raise ConfigError(
            f"reward_func must be callable, got {type(reward_func).__name__}. It takes one list "
            "of completions per agent and returns a list with one reward."
        )
    if reward_processor is not None and not callable(reward_processor):
        raise ConfigError(
            f"reward_processor must be a callable float -> float or None, got "
            f"{type(reward_processor).__name__}."
        )


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
    ) -> None:
        self.dataset = self._check_dataset(dataset)
        if external_prompt_passthrough not in (None, True, False):
            raise ConfigError(
                f"external_prompt_passthrough must be True, False or None, got {external_prompt_passthrough!r}."
            )
        self.external_prompt_passthrough = external_prompt_passthrough
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

        n = len(players)
        # Formatters: does each take the external prompt of later turns? Only an explicit
        # parameter counts (as in CoMLRL): a **kwargs formatter would silently drop the text.
        self._formatter_external: tuple[bool, ...] = tuple(
            _declares(_signature(f), "external_prompts") for f in formatters
        )
        for i, f in enumerate(formatters):
            kw = {"external_prompts": None} if self._formatter_external[i] else {}
            _check_bindable(_signature(f), f"formatter {i} (for {players[i]!r})", f, [{}], kw,
                            "A formatter takes the task item and, optionally, external_prompts=.")
        # Reward function: which of batch_items / prompts it declares.
        sig = _signature(reward_func)
        self._reward_keywords = _declared_keywords(sig, REWARD_KEYWORDS)
        _check_bindable(
            sig, "reward_func", reward_func, [[""]] * n, dict.fromkeys(self._reward_keywords),
            f"It is called with one list of completions per agent ({n} positional arguments, in the "
            f"order {list(players)}) and may declare the keywords {list(REWARD_KEYWORDS)}.",
        )
        # Transition: which CoMLRL keywords it declares (all of them when uninspectable).
        if external_transition is not None:
            tsig = _signature(external_transition)
            self._transition_keywords = (
                TRANSITION_KEYWORDS if tsig is None else _declared_keywords(tsig, TRANSITION_KEYWORDS)
            )
            _check_bindable(
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
                f"formatter {i} ({_name(f)!r}, for {self.players[i]!r}) raised "
                f"{type(exc).__name__}: {exc} on item {state.index}."
            ) from exc
        if not isinstance(text, str):
            raise TaskFunctionError(
                f"formatter {i} ({_name(f)!r}, for {self.players[i]!r}) returned a "
                f"{type(text).__name__} on item {state.index}; a formatter returns the prompt text (str)."
            )
        return text

    def _reward(self, replies: list[str], prompts: list[str], state: EpisodeState, turn: int) -> tuple[float, float]:
        fn = self.reward_func
        where = f"on item {state.index}, turn {turn}"
        out = call_reward_func(fn, self._reward_keywords, replies, state.item, prompts, where)
        raw = _one_reward(out, f"reward_func {_name(fn)!r}", where)
        if self.reward_processor is None:
            return raw, raw
        try:
            processed = self.reward_processor(raw)
        except Exception as exc:
            raise TaskFunctionError(
                f"reward_processor {_name(self.reward_processor)!r} raised {type(exc).__name__}: {exc} "
                f"on reward {raw} {where}."
            ) from exc
        return raw, _as_reward(processed, f"reward_processor {_name(self.reward_processor)!r}", where)

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
                f"external_transition {_name(fn)!r} raised {type(exc).__name__}: {exc} after turn "
                f"{turn} of item {state.index}."
            ) from exc
        n = len(self.players)
        if isinstance(out, str):
            out = [out] * n  # one prompt for everybody
        if not isinstance(out, (list, tuple)) or len(out) != n or not all(isinstance(s, str) for s in out):
            got = f"{type(out).__name__} of length {len(out)}" if isinstance(out, (list, tuple)) else type(out).__name__
            raise TaskFunctionError(
                f"external_transition {_name(fn)!r} returned a {got}; it must return a list of {n} "
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


def _as_reward(value: Any, who: str, where: str) -> float:
    """``value`` as a finite float, or a :class:`TaskFunctionError` naming ``who``."""
    if not isinstance(value, numbers.Real) and hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()  # 0-d numpy arrays and torch tensors
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TaskFunctionError(
            f"{who} gave a {type(value).__name__} ({value!r}) {where}; a reward is a number "
            "(return float(...))."
        )
    value = float(value)
    if not math.isfinite(value):
        raise TaskFunctionError(f"{who} gave the non-finite reward {value} {where}.")
    return value


def _one_reward(out: Any, who: str, where: str) -> float:
    """The single joint reward of a reward function's return value."""
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()  # numpy arrays, torch tensors
    if isinstance(out, numbers.Real) and not isinstance(out, bool):
        out = [out]  # CoMLRL also accepts a bare number
    if not isinstance(out, (list, tuple)):
        raise TaskFunctionError(
            f"{who} returned a {type(out).__name__} {where}; it must return a list with one reward "
            "(the joint reward of the agents' responses)."
        )
    if len(out) != 1:
        raise TaskFunctionError(
            f"{who} returned {len(out)} values {where}; it got one completion per agent and must "
            "return a list with exactly one reward."
        )
    return _as_reward(out[0], who, where)


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
    )
    return CollabEnv(
        task,
        max_steps=max_steps,
        max_message_chars=max_message_chars,
        max_total_chars=max_total_chars,
        render_mode=render_mode,
    )
