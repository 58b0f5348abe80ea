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
* :class:`Tool` and :class:`ToolCall` — a tool an env declares for a player (name, description,
  JSON-schema parameters) and one call of it. An assistant message may carry ``tool_calls``; a
  message of role ``"tool"`` carries one result and the ``tool_call_id`` it answers, as
  OpenAI-style APIs and Hugging Face chat templates represent them (:meth:`Conversation.to_chat`).
  :func:`parse_tool_call` reads a reply in the one documented tool-call format;
  :func:`template_chat` and :func:`api_chat` are the one rule for giving a call to a chat
  template (the text as the model wrote it, rendered once) or to an OpenAI-style API (the
  ``tool_calls`` fields); see ``docs/tool_calls.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, overload

from collab_env.errors import ConfigError

__all__ = ["ROLES", "ENV_AUTHOR", "FAULT", "Message", "Conversation", "Completion", "TurnRecord", "Episode",
           "Tool", "ToolCall", "ToolCallError", "parse_tool_call", "template_chat", "api_chat"]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
#: Author id of messages the environment itself writes (task prompts, feedback, hidden goals).
ENV_AUTHOR = "env"
#: ``Completion.finish_reason`` of a policy that could not produce a valid message after its own
#: retries and whose fault policy is to end the episode: the runner then truncates the episode
#: (``end_reason="fault:<player>"``) and counts the fault; the text is never used as a message.
FAULT = "fault"


#: The JSON-Schema keywords a :class:`Tool`'s parameters may use (checked by :meth:`Tool.check`).
SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "enum", "description", "items",
                             "additionalProperties"})
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list, tuple), "object": (dict, Mapping), "null": (type(None),),
}
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _check_schema(schema: Any, where: str) -> None:
    if not isinstance(schema, Mapping):
        raise ConfigError(f"{where} must be a JSON-schema object (a mapping), got {type(schema).__name__}.")
    unknown = set(schema) - SCHEMA_KEYWORDS
    if unknown:
        raise ConfigError(f"{where} uses JSON-schema keyword(s) {sorted(unknown)} that tool calls are not "
                          f"checked against; use only {sorted(SCHEMA_KEYWORDS)}.")
    kind = schema.get("type")
    if kind is not None and kind not in _JSON_TYPES:
        raise ConfigError(f"{where}: type {kind!r} is not one of {sorted(_JSON_TYPES)}.")
    for name, sub in dict(schema.get("properties") or {}).items():
        _check_schema(sub, f"{where}.properties.{name}")
    if "items" in schema:
        _check_schema(schema["items"], f"{where}.items")


def _schema_errors(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (the :data:`SCHEMA_KEYWORDS` subset), or ``None``."""
    kind = schema.get("type")
    if kind is not None:
        ok = isinstance(value, _JSON_TYPES[kind]) and not (kind in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return f"{path} must be of type {kind}, got {json.dumps(value)[:60]}"
    if "enum" in schema and value not in list(schema["enum"]):
        return f"{path} must be one of {json.dumps(list(schema['enum']))}, got {json.dumps(value)[:60]}"
    if isinstance(value, Mapping):
        props = dict(schema.get("properties") or {})
        missing = [k for k in schema.get("required") or () if k not in value]
        if missing:
            return f"{path} is missing the required argument(s) {missing}"
        if schema.get("additionalProperties", True) is False:
            extra = sorted(set(value) - set(props))
            if extra:
                return f"{path} has unknown argument(s) {extra}; the arguments are {sorted(props)}"
        for k, v in value.items():
            if k in props:
                err = _schema_errors(v, props[k], f"{path}.{k}")
                if err:
                    return err
    if isinstance(value, (list, tuple)) and "items" in schema:
        for i, v in enumerate(value):
            err = _schema_errors(v, schema["items"], f"{path}[{i}]")
            if err:
                return err
    return None


@dataclass(frozen=True)
class Tool:
    """A tool an environment declares for a player: what a function-calling model is shown.

    Args:
        name: The name a call gives (letters, digits, ``_`` and ``-``, at most 64: OpenAI's rule).
        description: What the tool does, for the model.
        parameters: A JSON-schema object for the arguments, in the subset :data:`SCHEMA_KEYWORDS`
            (calls are checked against it before the env runs them; any other keyword is refused
            here rather than silently unchecked). Tools declare ``"additionalProperties": False``
            to refuse unknown arguments.
    """

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}},
                                          hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOOL_NAME.fullmatch(self.name):
            raise ConfigError(f"a tool name is 1-64 letters, digits, '_' or '-', got {self.name!r}.")
        if not isinstance(self.description, str):
            raise ConfigError(f"the description of tool {self.name!r} must be str.")
        _check_schema(self.parameters, f"the parameters of tool {self.name!r}")
        if self.parameters.get("type") != "object":
            raise ConfigError(f"the parameters of tool {self.name!r} must have type 'object'.")

    def check(self, arguments: Any) -> str | None:
        """Why ``arguments`` do not fit :attr:`parameters`, or ``None`` when they do."""
        return _schema_errors(arguments, self.parameters, "arguments")

    def to_openai(self) -> dict[str, Any]:
        """``{"type": "function", "function": {name, description, parameters}}``: an entry of the
        ``tools=`` list of OpenAI-style APIs and of ``tokenizer.apply_chat_template``."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": json.loads(json.dumps(self.parameters))}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Tool:
        """Inverse of :meth:`to_openai`; also takes the bare ``{name, description, parameters}``."""
        f = d["function"] if d.get("type") == "function" and "function" in d else d
        return cls(name=f["name"], description=f.get("description", ""),
                   parameters=f.get("parameters") or {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolCall:
    """One call of a :class:`Tool`, as an assistant message carries it.

    Args:
        id: The call's id; the ``"tool"`` message with its result gives the same ``tool_call_id``.
        name: The tool called.
        arguments: The arguments (a JSON object). Compared for equality, ignored for hashing.
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": dict(self.arguments)}

    def to_chat(self) -> dict[str, Any]:
        """The OpenAI-style entry ``{"id", "type": "function", "function": {"name", "arguments"}}``
        with the arguments as a dict (what Hugging Face chat templates read; an OpenAI API client
        takes them as a JSON string, which :meth:`from_dict` also reads)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": dict(self.arguments)}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        """Inverse of :meth:`to_dict` and of :meth:`to_chat` (arguments as a dict or a JSON string)."""
        f = d["function"] if "function" in d else d
        args = f.get("arguments") or {}
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if not isinstance(args, Mapping):
            raise ConfigError(f"tool call arguments must be a JSON object, got {type(args).__name__}.")
        return cls(id=str(d.get("id") or ""), name=str(f["name"]), arguments=dict(args))


@dataclass(frozen=True)
class ToolCallError:
    """A reply that tried to call a tool and could not (:func:`parse_tool_call`): ``reason`` is
    the one-line error the caller gets back as the tool's result; ``call`` is the call as far as
    it could be read (name ``"invalid_tool_call"`` when none), so the result has a call to answer."""

    reason: str
    call: ToolCall


#: The one tool-call format (:func:`parse_tool_call`), as the envs' prompts state it.
TOOL_CALL_FORMAT = '{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}'


def parse_tool_call(text: str, tools: Sequence[Tool], call_id: str) -> ToolCall | ToolCallError | None:
    """Read a reply as a tool call, in the one documented format: the whole reply (surrounding
    whitespace aside) is one OpenAI-style JSON call ``{"name": ..., "arguments": {...}}``
    (:data:`TOOL_CALL_FORMAT`; ``arguments`` may also be a JSON string, as OpenAI's API writes
    it, or left out when the tool takes none).

    Returns:
        ``None`` when the reply does not start with ``{`` (a plain message); the
        :class:`ToolCall` (id ``call_id``) when it is a valid call of one of ``tools``; else a
        :class:`ToolCallError` saying what is wrong and how to write the call.
    """
    raw = text.strip()
    if not raw.startswith("{"):
        return None
    names = [t.name for t in tools]
    how = f" Write one JSON object: {TOOL_CALL_FORMAT}; tools: {', '.join(names) or 'none'}."

    def bad(reason: str, name: str = "invalid_tool_call", arguments: Any = None) -> ToolCallError:
        args = dict(arguments) if isinstance(arguments, Mapping) else {}
        return ToolCallError(reason + how, ToolCall(call_id, name, args))

    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return bad(f"error: the tool call is not valid JSON ({str(exc).splitlines()[0][:80]}).")
    if not isinstance(obj, dict):
        return bad("error: the tool call must be a JSON object.")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return bad("error: the tool call has no \"name\".")
    shown = name if _TOOL_NAME.fullmatch(name) else "invalid_tool_call"
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        return bad(f"error: the tool call has unknown key(s) {extra}.", shown)
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return bad(f"error: the arguments of {name!r} are a string that is not JSON.", shown)
    if not isinstance(args, dict):
        return bad(f"error: the arguments of {name!r} must be a JSON object.", shown)
    tool = next((t for t in tools if t.name == name), None)
    if tool is None:
        return bad(f"error: there is no tool {name!r}.", shown, args)
    problem = tool.check(args)
    if problem is not None:
        return bad(f"error: {name}: {problem}.", shown, args)
    return ToolCall(call_id, name, args)


def _carries(content: str | None, calls: Sequence[Any]) -> bool:
    """Whether ``content`` is nothing but the one call in ``calls`` as :func:`parse_tool_call`
    reads it (the ``"tool_calls"`` entries of a chat dict)."""
    if not content or len(calls) != 1:
        return False
    try:
        call = ToolCall.from_dict(calls[0])
        obj = json.loads(content)
    except (ValueError, KeyError, TypeError, RecursionError, ConfigError):
        return False
    if not isinstance(obj, dict) or set(obj) - {"name", "arguments"} or obj.get("name") != call.name:
        return False
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return False
    return args == dict(call.arguments)


def template_chat(chat: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``chat`` (:meth:`Conversation.to_chat` dicts) as a chat template or a Tinker renderer is
    given it: a message whose ``content`` is not empty keeps its text and loses its
    ``"tool_calls"``. The text is what the model wrote (the call included), so the template
    renders the call once, from those very tokens, and a learner's token ids stay exactly the
    ones generated; a template that also renders ``tool_calls`` (Qwen2.5's, Qwen3's) would
    otherwise write the call a second time. A call with no text (as an API returns it) keeps its
    ``tool_calls`` for the template to render. ``"tool"`` results keep their ``tool_call_id``."""
    out = []
    for m in chat:
        d = dict(m)
        if d.get("tool_calls") and d.get("content"):
            del d["tool_calls"]
        out.append(d)
    return out


def api_chat(chat: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``chat`` as an OpenAI-style API is sent it: a message that makes tool calls keeps its
    ``"tool_calls"`` (which the API needs before the ``"tool"`` results that answer them), and
    its ``content`` becomes ``None`` when it is nothing but that call as written in the one
    format (:func:`parse_tool_call`); the server's own template then renders the call once.
    Arguments are sent as JSON strings, as OpenAI's API takes them."""
    out = []
    for m in chat:
        d = dict(m)
        calls = d.get("tool_calls")
        if calls:
            if _carries(d.get("content"), calls):
                d["content"] = None
            d["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                               if isinstance(c.get("function", {}).get("arguments"), Mapping) else dict(c)
                               for c in calls]
        out.append(d)
    return out


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
        tool_calls: The tool calls this message makes (a player's move that is a call; see
            :func:`parse_tool_call`). ``content`` keeps the reply's text exactly as written, so
            the token ids of the move still match it.
        tool_call_id: On a ``"tool"`` message (a tool's result, written by the env), the id of
            the call it answers.
    """

    role: str
    content: str
    author: str = ENV_AUTHOR
    trainable: bool = False
    audience: tuple[str, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

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
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if self.tool_calls:
            if self.role in ("system", "tool"):
                raise ConfigError(f"a {self.role!r} message cannot make tool calls.")
            if not all(isinstance(c, ToolCall) for c in self.tool_calls):
                raise ConfigError("Message.tool_calls holds ToolCall objects (ToolCall.from_dict reads dicts).")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ConfigError("a 'tool' message (a tool's result) needs the tool_call_id of the call it answers, "
                              f"and only a 'tool' message has one (role {self.role!r}, "
                              f"tool_call_id {self.tool_call_id!r}).")

    def visible_to(self, player: str) -> bool:
        """Whether ``player`` may see this message."""
        return self.audience is None or player in self.audience

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict with every field."""
        # Field by field (dataclasses.asdict deep-copied every field, then most were replaced:
        # a third of an evaluation's time went there).
        d: dict[str, Any] = {"role": self.role, "content": self.content, "author": self.author,
                             "trainable": self.trainable,
                             "audience": list(self.audience) if self.audience is not None else None,
                             "meta": dict(self.meta)}
        # Written only when set, so messages without tools read and write as they always did.
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    def to_chat(self) -> dict[str, Any]:
        """This message as chat templates and OpenAI-style clients take it: ``{"role",
        "content"}``, plus ``"tool_calls"`` (:meth:`ToolCall.to_chat`) and ``"tool_call_id"``
        where set."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_chat() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        """Inverse of :meth:`to_dict` and of :meth:`to_chat`; also accepts plain ``{"role",
        "content"}`` dicts (a ``None`` content, as an API writes beside tool calls, is ``""``)."""
        audience = d.get("audience")
        role = d["role"]
        return cls(
            role=role,
            content=d["content"] if d.get("content") is not None else "",
            author=d.get("author", role if role not in ("system", "tool") else ENV_AUTHOR),
            trainable=bool(d.get("trainable", False)),
            audience=tuple(audience) if audience is not None else None,
            meta=dict(d.get("meta") or {}),
            tool_calls=tuple(ToolCall.from_dict(c) for c in d.get("tool_calls") or ()),
            tool_call_id=d.get("tool_call_id"),
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
        else becomes ``"user"``, system and tool-result messages keep their role. Authors are
        kept, so a policy that talks to several others can still tell them apart. Tool calls
        stay on the caller's own messages only (another player's message reads as its text).
        """
        out = []
        for m in self.messages:
            if not m.visible_to(player):
                continue
            if m.role in ("system", "tool"):
                role = m.role
            elif m.author == player:
                role = "assistant"
            else:
                role = "user"
            if role == "user" and m.tool_calls:
                out.append(replace(m, role=role, tool_calls=()))
            else:
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

    def to_chat(self) -> list[dict[str, Any]]:
        """``[{"role", "content"}]`` for chat templates and OpenAI-style clients, with
        ``tool_calls`` and ``tool_call_id`` where a message has them (:meth:`Message.to_chat`);
        :meth:`from_chat` reads it back."""
        return [m.to_chat() for m in self.messages]

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools the viewer may call, as the ``tools=`` list of chat templates and
        OpenAI-style APIs (:meth:`Tool.to_openai`): an env declares them in the ``"tools"`` meta
        of the player's system message; empty when there are none."""
        out: list[dict[str, Any]] = []
        for m in self.messages:
            if m.role == "system" and m.meta.get("tools"):
                out.extend(dict(t) for t in m.meta["tools"])
        return out

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
        def listed(v: tuple[Any, ...] | None) -> list[Any] | None:
            return list(v) if v is not None else None

        return {"text": self.text, "token_ids": listed(self.token_ids), "logprobs": listed(self.logprobs),
                "prompt_token_ids": listed(self.prompt_token_ids), "finish_reason": self.finish_reason,
                "usage": dict(self.usage), "meta": dict(self.meta)}

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

