"""Core data types: messages, conversations, completions and episodes.

Everything a player sees or produces is one of these plain, picklable dataclasses:

* :class:`Message` — one chat message with its provenance (who wrote it, who may see it,
  whether a learner may train on it).
* :class:`Conversation` — an immutable sequence of messages; ``view(player)`` gives the
  conversation as one player sees it, ``to_chat()`` the ``[{"role", "content"}]`` list that
  chat templates and API clients take.
* :class:`Completion` — what a policy returns: text plus, where the backend gives them, the
  exact token ids and log-probs a learner needs.
* :class:`Episode` — a finished (or interrupted) episode: the transcript, every completion with
  its player and step, rewards per player and step, reward components, costs and how it ended.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, overload

from collab_env.errors import ConfigError

__all__ = ["ROLES", "ENV_AUTHOR", "FAULT", "Message", "Conversation", "Completion", "TurnRecord", "Episode"]

Role = Literal["system", "user", "assistant"]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
#: Author id of messages the environment itself writes (task prompts, feedback, hidden goals).
ENV_AUTHOR = "env"
#: ``Completion.finish_reason`` of a policy that could not produce a valid message after its own
#: retries and whose fault policy is to end the episode: the runner then truncates the episode
#: (``end_reason="fault:<player>"``) and counts the fault; the text is never used as a message.
FAULT = "fault"


@dataclass(frozen=True)
class Message:
    """One chat message with provenance.

    Args:
        role: Chat role in the canonical transcript: ``"system"``, ``"user"`` or
            ``"assistant"``. A player's own view remaps it (see :meth:`Conversation.view`).
        content: The text. Any ``str`` is valid, including the empty string.
        author: Player id that wrote it, or ``"env"`` for text the environment wrote.
        trainable: Whether a learner may put this message's tokens in its loss. Text written by
            a simulated user or by the environment never is.
        audience: Player ids allowed to see the message; ``None`` means every player. Hidden
            goals and per-player system prompts use it.
        meta: Free-form, JSON-friendly extras (e.g. the structured hidden facts a scripted user
            reads). Compared for equality, ignored for hashing.
    """

    role: str
    content: str
    author: str = ENV_AUTHOR
    trainable: bool = False
    audience: tuple[str, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"Message role must be one of {ROLES}, got {self.role!r}.")
        if not isinstance(self.content, str):
            raise ConfigError(
                f"Message content must be str, got {type(self.content).__name__}. "
                "Pass the text of a completion (completion.text)."
            )
        if self.audience is not None and not isinstance(self.audience, tuple):
            object.__setattr__(self, "audience", tuple(self.audience))

    def visible_to(self, player: str) -> bool:
        """Whether ``player`` may see this message."""
        return self.audience is None or player in self.audience

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict with every field."""
        d = asdict(self)
        d["audience"] = list(self.audience) if self.audience is not None else None
        d["meta"] = dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        """Inverse of :meth:`to_dict`; also accepts plain ``{"role", "content"}`` dicts."""
        audience = d.get("audience")
        return cls(
            role=d["role"],
            content=d["content"] if d.get("content") is not None else "",
            author=d.get("author", d["role"] if d["role"] != "system" else ENV_AUTHOR),
            trainable=bool(d.get("trainable", False)),
            audience=tuple(audience) if audience is not None else None,
            meta=dict(d.get("meta") or {}),
        )


@dataclass(frozen=True)
class Conversation(Sequence[Message]):
    """An immutable sequence of :class:`Message`.

    ``viewer`` is the player this conversation was rendered for (``None`` for the global
    transcript). Conversations compare equal when their messages and viewer are equal.
    """

    messages: tuple[Message, ...] = ()
    viewer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))
        for m in self.messages:
            if not isinstance(m, Message):
                raise ConfigError(
                    f"Conversation holds Message objects, got {type(m).__name__}; "
                    "use Conversation.from_chat() for role/content dicts."
                )

    # -- sequence protocol ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, i: int) -> Message: ...
    @overload
    def __getitem__(self, i: slice) -> Conversation: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return Conversation(self.messages[i], self.viewer)
        return self.messages[i]

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    # -- building ------------------------------------------------------------------------
    def append(self, *messages: Message) -> Conversation:
        """Return a new conversation with ``messages`` added at the end."""
        return Conversation(self.messages + tuple(messages), self.viewer)

    @classmethod
    def from_chat(cls, chat: Iterable[Mapping[str, Any]], viewer: str | None = None) -> Conversation:
        """Build from ``[{"role": ..., "content": ...}, ...]`` (extra keys are kept if known)."""
        return cls(tuple(Message.from_dict(m) for m in chat), viewer)

    # -- views ---------------------------------------------------------------------------
    def view(self, player: str) -> Conversation:
        """The conversation as ``player`` sees it.

        Messages whose audience excludes ``player`` are dropped. Roles are remapped to the
        player's side: its own messages become ``"assistant"``, everything written by anyone
        else becomes ``"user"``, system messages stay ``"system"``. Authors are kept, so a
        policy that talks to several others can still tell them apart.
        """
        out = []
        for m in self.messages:
            if not m.visible_to(player):
                continue
            if m.role == "system":
                role = "system"
            elif m.author == player:
                role = "assistant"
            else:
                role = "user"
            out.append(m if role == m.role else replace(m, role=role))
        return Conversation._of_messages(tuple(out), player)

    @classmethod
    def _of_messages(cls, messages: tuple[Message, ...], viewer: str | None) -> Conversation:
        """A conversation of messages already checked (a view of one): skips the per-message
        checks of ``__post_init__``, which the env's observations would otherwise repeat for
        every message on every step."""
        conv = object.__new__(cls)
        object.__setattr__(conv, "messages", messages)
        object.__setattr__(conv, "viewer", viewer)
        return conv

    def to_chat(self) -> list[dict[str, str]]:
        """``[{"role", "content"}]`` for chat templates and OpenAI-style clients."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    # -- queries -------------------------------------------------------------------------
    def last(self, *, author: str | None = None, role: str | None = None) -> Message | None:
        """The last message by ``author`` and/or with ``role``, or ``None``."""
        for m in reversed(self.messages):
            if (author is None or m.author == author) and (role is None or m.role == role):
                return m
        return None

    def by(self, author: str) -> list[Message]:
        """All messages written by ``author``."""
        return [m for m in self.messages if m.author == author]

    @property
    def system_prompt(self) -> str | None:
        """Content of the system messages, joined, or ``None`` when there are none."""
        parts = [m.content for m in self.messages if m.role == "system"]
        return "\n\n".join(parts) if parts else None

    def render(self, *, show_hidden: bool = True) -> str:
        """A readable transcript, one block per message, labelled ``[author/role]``."""
        blocks = []
        for m in self.messages:
            if not show_hidden and m.audience is not None:
                continue
            label = f"[{m.author}/{m.role}]"
            if m.audience is not None:
                label += " (visible to " + ", ".join(m.audience) + ")"
            blocks.append(f"{label}\n{m.content}")
        return "\n\n".join(blocks)

    def to_dict(self) -> dict[str, Any]:
        return {"viewer": self.viewer, "messages": [m.to_dict() for m in self.messages]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Conversation:
        return cls(tuple(Message.from_dict(m) for m in d["messages"]), d.get("viewer"))


@dataclass(frozen=True)
class Completion:
    """What a policy returns for one observation.

    Args:
        text: The generated text.
        token_ids: The exact generated token ids, where the backend gives them.
        logprobs: Log-probability of each generated token under the sampling policy.
        prompt_token_ids: The token ids of the prompt the completion was generated from.
        finish_reason: ``"stop"``, ``"length"``... as the backend reports it, or :data:`FAULT`
            (the policy gave up; ``meta["fault"]`` says why).
        usage: Counts such as ``prompt_tokens``, ``completion_tokens``, ``model_calls``, ``cost``,
            ``retries``, ``faults``; the rollout sums every numeric entry into ``Episode.costs``.
        meta: Backend-specific extras (model name, latency, cache hit...).
    """

    text: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    finish_reason: str | None = None
    usage: Mapping[str, float] = field(default_factory=dict, hash=False)
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise ConfigError(f"Completion.text must be str, got {type(self.text).__name__}.")
        for name in ("token_ids", "logprobs", "prompt_token_ids"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(v))
        if (
            self.token_ids is not None
            and self.logprobs is not None
            and len(self.token_ids) != len(self.logprobs)
        ):
            raise ConfigError(
                f"Completion has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs."
            )

    @property
    def is_fault(self) -> bool:
        """The policy gave up on this message (see :data:`FAULT`)."""
        return self.finish_reason == FAULT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("token_ids", "logprobs", "prompt_token_ids"):
            if d[name] is not None:
                d[name] = list(d[name])
        d["usage"], d["meta"] = dict(self.usage), dict(self.meta)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Completion:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class TurnRecord:
    """One move of one player inside an :class:`Episode`.

    ``step`` is the env step the move belonged to; ``reward`` what the env returned to that
    player for the step; ``completion`` is ``None`` when the move did not come from a policy
    (typed by a person, replayed from data).
    """

    step: int
    player: str
    text: str
    reward: float = 0.0
    completion: Completion | None = None
    trainable: bool = False
    components: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("step", "player", "text", "reward", "trainable")}
        d["components"] = dict(self.components)
        d["completion"] = self.completion.to_dict() if self.completion is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TurnRecord:
        comp = d.get("completion")
        return cls(
            step=d["step"],
            player=d["player"],
            text=d["text"],
            reward=d.get("reward", 0.0),
            completion=Completion.from_dict(comp) if comp else None,
            trainable=d.get("trainable", False),
            components=dict(d.get("components") or {}),
        )


@dataclass
class Episode:
    """A whole episode, as learners and evaluations consume it.

    Args:
        env_id: Registered id the episode ran on (``None`` for unregistered envs).
        seed: Seed passed to ``reset``.
        index: Index of the task item.
        conversation: The global transcript, hidden messages included.
        turns: Every move, in order.
        rewards: Per player, the reward of every env step (same length for all players).
        returns: Per player, the sum of its rewards.
        components: Per player, reward components summed over the episode.
        terminated: Ended by protocol (answer given, user ended the chat...).
        truncated: Ended by a budget (turns, characters, cost).
        end_reason: Short machine-readable reason (``"user_terminated"``, ``"max_steps"``...).
        costs: Counters: ``model_calls``, ``prompt_tokens``, ``completion_tokens``,
            ``policy_failures``, ``simulator_faults``...
        info: Extra JSON-friendly data (task metadata, policy names, timings); ``info["task"]``
            is the task's record of the finished state (``Task.episode_info``), where it keeps one.
    """

    env_id: str | None
    seed: int | None
    index: int | None
    conversation: Conversation
    turns: list[TurnRecord] = field(default_factory=list)
    rewards: dict[str, list[float]] = field(default_factory=dict)
    returns: dict[str, float] = field(default_factory=dict)
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    end_reason: str | None = None
    costs: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return max((len(v) for v in self.rewards.values()), default=0)

    def completions(self, player: str | None = None) -> list[TurnRecord]:
        """Moves that came from a policy, optionally for one player."""
        return [
            t for t in self.turns
            if t.completion is not None and (player is None or t.player == player)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "seed": self.seed,
            "index": self.index,
            "conversation": self.conversation.to_dict(),
            "turns": [t.to_dict() for t in self.turns],
            "rewards": {k: list(v) for k, v in self.rewards.items()},
            "returns": dict(self.returns),
            "components": {k: dict(v) for k, v in self.components.items()},
            "terminated": self.terminated,
            "truncated": self.truncated,
            "end_reason": self.end_reason,
            "costs": dict(self.costs),
            "info": dict(self.info),
        }

    def to_json(self) -> str:
        """One line of JSON (ASCII-escaped, so any text, even lone surrogates, round-trips)."""
        return json.dumps(self.to_dict(), ensure_ascii=True, sort_keys=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Episode:
        return cls(
            env_id=d.get("env_id"),
            seed=d.get("seed"),
            index=d.get("index"),
            conversation=Conversation.from_dict(d["conversation"]),
            turns=[TurnRecord.from_dict(t) for t in d.get("turns", [])],
            rewards={k: list(v) for k, v in d.get("rewards", {}).items()},
            returns=dict(d.get("returns", {})),
            components={k: dict(v) for k, v in d.get("components", {}).items()},
            terminated=d.get("terminated", False),
            truncated=d.get("truncated", False),
            end_reason=d.get("end_reason"),
            costs=dict(d.get("costs", {})),
            info=dict(d.get("info", {})),
        )

    @classmethod
    def from_json(cls, line: str) -> Episode:
        """The episode of one JSON line (``to_json``); a line that is not JSON, or nests deeper
        than :data:`collab_env._json.MAX_DEPTH`, is a :class:`ConfigError`."""
        from collab_env._json import loads

        return cls.from_dict(loads(line, "an episode's JSON line"))

