"""What judges and the user simulator need around a backend call, in text.

* :func:`render_transcript`: a conversation as plain text for a rubric or simulator prompt, and
  :func:`fence_untrusted`: text quoted into a prompt as data, between markers it cannot close.
* :func:`check_batch`: what a backend's ``act`` must have returned; :func:`is_config_problem`:
  which errors propagate at once instead of being retried or counted as a fault;
  :func:`attempt_pending`: one attempt of a judge's or simulator's retry loop, built on both.
* :func:`extract_json_object`: the tolerant reader of the JSON object in a model reply, and
  :func:`salvage_string_field` for a field of a broken one.

Shared by :mod:`collab_env.agents.judges` and :mod:`collab_env.agents.users`.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from collab_env.errors import CollabEnvError, ConfigError, FatalPolicyError, PolicyError
from collab_env.policy import add_usage, describe
from collab_env.types import Completion, Conversation, Message

__all__ = [
    "strip_think",
    "strip_think_conversation",
    "extract_json_object",
    "salvage_string_field",
    "render_transcript",
    "fence_untrusted",
    "fence_markers",
    "FENCE_TAG_CHARS",
    "check_batch",
    "is_config_problem",
    "attempt_pending",
]


# ---------------------------------------------------------------------------------------------
# Tolerant JSON reading
# ---------------------------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_PY_LITERALS = ((re.compile(r"\btrue\b"), "True"), (re.compile(r"\bfalse\b"), "False"),
                (re.compile(r"\bnull\b"), "None"))


def _balanced_spans(text: str) -> list[str]:
    """Every top-level ``{...}`` span of ``text``, brace-matched outside quoted strings.

    Both quote characters open strings (models write Python-style dicts), but only where a
    string can start, so an apostrophe inside a double-quoted string does not derail matching.
    """
    spans, depth, start, quote, i = [], 0, -1, None, 0
    while i < len(text):
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'" and depth > 0 and (ch == '"' or re.search(r"[{\[,:]\s*$", text[start:i])):
            quote = ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start:i + 1])
        i += 1
    return spans


def _decode(span: str) -> Any:
    """Decode one ``{...}`` span, repairing the usual model mistakes step by step."""
    span = span.translate(_SMART_QUOTES)
    attempts = [span, _TRAILING_COMMA.sub(r"\1", span)]
    for s in attempts:
        try:
            return json.loads(s, strict=False)  # strict=False: raw newlines inside strings
        except ValueError:
            pass
    # Python-dict style: single quotes, True/False/None (or JSON's true/false/null).
    py = attempts[1]
    for pattern, repl in _PY_LITERALS:
        py = pattern.sub(repl, py)
    try:
        return ast.literal_eval(py)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a model reply, read tolerantly; ``None`` when there is none.

    Accepted: code fences (```` ```json ... ``` ````), text before or after the object,
    single-quoted (Python-style) dicts, ``True``/``None`` literals, trailing commas, curly
    quotes, raw newlines inside strings. Keys are returned lower-cased and stripped, so
    ``"Response"`` and ``"response"`` read the same.
    """
    if not isinstance(text, str):
        return None
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for cand in candidates:
        for span in _balanced_spans(cand):
            obj = _decode(span)
            if isinstance(obj, dict):
                return {str(k).strip().lower(): v for k, v in obj.items()}
    return None


def salvage_string_field(text: str, key: str) -> str | None:
    """The value of ``"key": "..."`` found by pattern when the object as a whole is broken
    (an unescaped quote in another field, a missing closing brace after the field)."""
    pat = re.compile(
        r"""["']?""" + re.escape(key) + r"""["']?\s*:\s*(?P<q>["'])(?P<v>(?:\\.|(?!(?P=q)).)*)(?P=q)\s*(?:[,}\n]|$)""",
        re.DOTALL | re.IGNORECASE,
    )
    m = pat.search(text.translate(_SMART_QUOTES))
    if m is None:
        return None
    raw = m.group("v")
    if m.group("q") == "'":  # a Python-style string: unescape \' and escape bare double quotes
        raw = raw.replace("\\'", "'").replace('"', '\\"')
    try:
        return json.loads('"' + raw + '"', strict=False)  # resolve \n, \" and friends
    except ValueError:
        return raw


# ---------------------------------------------------------------------------------------------
# Transcripts
# ---------------------------------------------------------------------------------------------
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def strip_think(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks, whitespace-trimmed (what verl's user
    simulator and judges read; :func:`render_transcript` and the reference's chat history apply
    it to every message, so no simulated user or judge reads a player's private reasoning)."""
    return _THINK_BLOCK.sub("", text).strip()


def strip_think_conversation(conversation: Conversation) -> Conversation:
    """The conversation with :func:`strip_think` applied to every message (same length, so
    message indices such as a metric's ``start`` keep their meaning)."""
    from dataclasses import replace

    return Conversation(tuple(replace(m, content=strip_think(m.content)) for m in conversation.messages),
                        conversation.viewer)


def render_transcript(conversation: Conversation | Sequence[Message], *, me: str | None = None,
                      include_hidden: bool = False) -> str:
    """A conversation as plain text for a judge or simulator prompt.

    ``<think>...</think>`` blocks are removed from every message (:func:`strip_think`): this is
    the boundary where a simulated user or a judge reads the chat, and a player's private
    reasoning is not part of what it said. System messages are left out (they are instructions,
    not conversation). Each message is a
    block headed by its speaker: ``User`` / ``Assistant`` by chat role in the global transcript.
    With ``me`` (the player whose view this is) that player's messages are headed ``User`` and
    everybody else's ``Assistant``, since a player's own view renames roles. A speaker whose id
    is neither ``user`` nor ``assistant`` (cooperating agents) is named after the label.

    Args:
        conversation: The messages.
        me: Render from this player's side (the user simulator renders its own view).
        include_hidden: Keep messages with a restricted audience (default: public ones only).
    """
    blocks = []
    for m in conversation:
        if m.role == "system" or (m.audience is not None and not include_hidden and me is None):
            continue
        if me is not None:
            label = "User" if m.author == me else "Assistant"
        else:
            label = "User" if m.role == "user" else "Assistant"
        if m.author not in ("user", "assistant", "env", me):
            label += f" ({m.author})"
        blocks.append(f"**{label}**: {strip_think(m.content) if '<think>' in m.content else m.content}")
    return "\n\n".join(blocks) if blocks else "(no messages yet)"


#: Hex digits of a fence's boundary tag (48 bits: a text cannot guess the tag of its own fence).
FENCE_TAG_CHARS = 12


def fence_markers(label: str, tag: str) -> tuple[str, str]:
    """The opening and closing lines of the fence ``label``/``tag``:
    ``<<<label-tag>>>`` and ``<<<end label-tag>>>``."""
    return f"<<<{label}-{tag}>>>", f"<<<end {label}-{tag}>>>"


def fence_untrusted(text: str, label: str) -> str:
    """``text`` between fence lines, for quoting untrusted text (a transcript, a candidate's
    answer) into a prompt as data::

        <<<conversation-3f9a0c41d2b7>>>
        ...text...
        <<<end conversation-3f9a0c41d2b7>>>

    The boundary tag depends on the content: the first 12 hex digits of
    ``sha256(label, salt, text)``, with the smallest salt (0, 1, ...) whose tag does not occur
    anywhere in ``text``. So the text cannot close its fence early or open a fake one with the
    real tag: it would have to contain its own hash. A fence line it writes with another tag
    (``<<<end conversation>>>``, a guessed tag) is just more fenced text. The same text always
    gets the same fence (prompts stay cacheable and reproducible). ``text`` itself is kept
    verbatim (nothing is escaped), so the judge reads exactly what the participants wrote.

    Args:
        text: The untrusted text.
        label: What it is (``conversation``, ``answer``): a Python identifier, like a template
            field name.

    Raises:
        ConfigError: ``label`` is not an identifier.
    """
    if not isinstance(label, str) or not label.isidentifier():
        raise ConfigError(f"a fence label must be an identifier like 'conversation', got {label!r}.")
    text = str(text)
    salt = 0
    while True:
        digest = hashlib.sha256(f"{label}\0{salt}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()
        tag = digest[:FENCE_TAG_CHARS]
        if tag not in text:
            break
        salt += 1
    opening, closing = fence_markers(label, tag)
    return f"{opening}\n{text}\n{closing}"



# ---------------------------------------------------------------------------------------------
# Backend calls
# ---------------------------------------------------------------------------------------------
def check_batch(outs: Any, n: int, backend: Any) -> None:
    """Raise :class:`PolicyError` unless ``outs`` is a list of ``n`` Completions (what a
    backend's ``act`` must return for ``n`` observations)."""
    if not isinstance(outs, list) or len(outs) != n or not all(isinstance(c, Completion) for c in outs):
        raise PolicyError(
            f"backend {describe(backend)} must return a list of {n} Completion(s), got {outs!r:.200}."
        )


def is_config_problem(exc: BaseException) -> bool:
    """Errors that retrying cannot fix (a bad keyword, a replay-cache miss, a missing extra, a
    request the provider rejected: :class:`~collab_env.errors.FatalPolicyError`): they
    propagate at once instead of being retried or counted as a backend fault."""
    if isinstance(exc, FatalPolicyError):
        return True
    return isinstance(exc, CollabEnvError) and not isinstance(exc, PolicyError)


async def attempt_pending(
    backend: Any, pending: Sequence[int], observations: Sequence[Conversation],
    sampling: Mapping[str, Any], *, usage: Sequence[dict[str, float]], errors: Sequence[list[str]],
) -> tuple[list[tuple[int, Completion]], list[int]]:
    """One attempt of a retry loop over items: one ``backend.act(observations, **sampling)``
    call for the ``pending`` items (indices into ``usage`` and ``errors``, one observation each).

    Returns ``(replies, again)``: the items that got a reply to read, each with its completion,
    and the items to try again. A call that failed puts every pending item in ``again``, with
    ``"backend error: ..."`` added to its errors; a FAULT completion puts its item there with
    ``"backend fault: ..."``. Every completion's usage is added to its item's ``usage``.

    Raises:
        Exception: A configuration problem (:func:`is_config_problem`): it propagates at once.
    """
    try:
        outs = await backend.act(list(observations), **sampling)
        check_batch(outs, len(pending), backend)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if is_config_problem(exc):
            raise
        for i in pending:
            errors[i].append(f"backend error: {exc!r:.300}")
        return [], list(pending)
    replies, again = [], []
    for i, out in zip(pending, outs, strict=True):
        add_usage(usage[i], out.usage)
        if out.is_fault:
            errors[i].append(f"backend fault: {out.meta.get('fault', '')}")
            again.append(i)
        else:
            replies.append((i, out))
    return replies, again
