"""LLM judges: a model reads a filled-in rubric and answers with a typed score.

:class:`LLMJudge` wraps any :class:`~collab_env.agents.base.Policy` (a local model, an API model,
a cached or fake backend) and builds its prompt from named fields. It reaches a typed score
(``float``, ``int``, ``bool``, one of a set of ``"choice"`` strings, or ``"text"`` for extraction
steps) in one of two ways:

* **Generation** (every backend): it samples at temperature 0 and parses the score out of the
  reply. A reply it cannot read is retried, with the unreadable reply and a short correction
  added to the prompt; when the retries run out it raises :class:`JudgeError`.
* **Log-probs** (backends that score given continuations, the
  :class:`~collab_env.agents.base.ContinuationScorer` capability: the HF, embedded and vLLM
  backends). When the judgement has a finite set of allowed answers (``bool``: ``true`` /
  ``false``; ``"choice"``: the choices; a numeric rubric with ``anchors``), the judge starts
  the JSON reply and compares the model's probabilities of the allowed answers: nothing is
  generated, so nothing can be unreadable. This is the default where the backend supports it
  (``method="auto"``); small local judges, which copy the JSON template instead of filling it
  in, need it. See :meth:`LLMJudge.score_many` for the exact rule.

A judge never returns a default score: a silent 0 would be indistinguishable from a real verdict
in a reward. A request the backend's provider rejected (a missing API key, another 4xx:
:class:`~collab_env.errors.FatalPolicyError`) is not retried: it propagates at once.

The module also holds the tolerant JSON reader shared with the user simulator
(:func:`extract_json_object`) and the transcript renderer (:func:`render_transcript`), and the
rubric templates the CollabLLM rewards use (``ACCURACY_PROMPT``, ``INTERACTIVITY_PROMPT``,
``INTERACTIVITY_PAPER_PROMPT``, ``EXTRACT_ANSWER_PROMPT`` + ``ANSWER_MATCH_PROMPT``), with ready
configurations in :data:`JUDGE_PRESETS`.

Example::

    judge = LLMJudge.preset("accuracy", "litellm:gpt-4o-mini")
    result = await judge.score(problem=p, conversation=episode.conversation, reference=ref)
    result.score  # True / False
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collab_env.agents.base import (
    Policy,
    add_prefill,
    add_usage,
    can_score_continuations,
    check_prefix,
    describe,
    prefill_reply,
    prefill_sampling,
    resolve_policy,
    usable_prefill,
)
from collab_env.errors import CollabEnvError, ConfigError, FatalPolicyError, JudgeError, PolicyError
from collab_env.types import Completion, Conversation, Message

__all__ = [
    "LLMJudge",
    "JudgeResult",
    "JudgeError",
    "ExtractThenScore",
    "extract_json_object",
    "render_transcript",
    "parse_score",
    "check_batch",
    "is_config_problem",
    "JUDGE_METHODS",
    "ANCHOR_RULES",
    "VALUE_ENDS",
    "LOGPROB_PREFILL",
    "JUDGE_PRESETS",
    "JUDGE_PREFILLS",
    "ACCURACY_PROMPT",
    "INTERACTIVITY_PROMPT",
    "INTERACTIVITY_PAPER_PROMPT",
    "EXTRACT_ANSWER_PROMPT",
    "ANSWER_MATCH_PROMPT",
]


# ---------------------------------------------------------------------------------------------
# Tolerant JSON reading (shared with the user simulator)
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
def render_transcript(conversation: Conversation | Sequence[Message], *, me: str | None = None,
                      include_hidden: bool = False) -> str:
    """A conversation as plain text for a judge or simulator prompt.

    System messages are left out (they are instructions, not conversation). Each message is a
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
        blocks.append(f"**{label}**: {m.content}")
    return "\n\n".join(blocks) if blocks else "(no messages yet)"


# ---------------------------------------------------------------------------------------------
# Typed scores
# ---------------------------------------------------------------------------------------------
SCORE_TYPES = (float, int, bool, "choice", "text")
_TRUE_WORDS = {"true", "yes", "y", "correct", "1", "pass", "passed"}
_FALSE_WORDS = {"false", "no", "n", "incorrect", "wrong", "0", "fail", "failed"}
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


def _type_name(t: Any) -> str:
    return t if isinstance(t, str) else t.__name__


def parse_score(value: Any, score_type: Any, *, choices: Sequence[str] | None = None,
                score_range: tuple[float, float] | None = None) -> Any:
    """Convert one raw JSON value to the judge's score type, or raise ``ValueError``.

    * ``float``: a number or a numeric string (``"0.7"``); booleans are refused.
    * ``int``: an integral number (``3`` or ``3.0``) or string (``"3"``).
    * ``bool``: ``true``/``false``, ``1``/``0``, ``"yes"``/``"no"``, ``"correct"``/``"incorrect"``.
    * ``"choice"``: one of ``choices``, matched case-insensitively; the canonical spelling is
      returned.
    * ``"text"``: a non-empty string (extraction steps).

    Numbers outside ``score_range`` (inclusive) are refused, not clipped: an out-of-scale score
    means the judge misread the rubric.
    """
    if score_type == "text":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"expected a non-empty string, got {value!r:.80}")
        return value.strip()
    if score_type == "choice":
        if not isinstance(value, str):
            raise ValueError(f"expected one of {list(choices or ())}, got {value!r:.80}")
        for c in choices or ():
            if value.strip().strip(".").lower() == c.lower():
                return c
        raise ValueError(f"expected one of {list(choices or ())}, got {value!r:.80}")
    if score_type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().strip(".").lower()
            if word in _TRUE_WORDS:
                return True
            if word in _FALSE_WORDS:
                return False
        raise ValueError(f"expected true or false, got {value!r:.80}")
    # Numbers.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {value!r}")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(" + _NUM + r")\s*", value)
        if m is None:
            raise ValueError(f"expected a number, got {value!r:.80}")
        value = float(m.group(1))
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r:.80}")
    if score_type is int:
        if float(value) != int(value):
            raise ValueError(f"expected an integer, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if score_range is not None and not score_range[0] <= value <= score_range[1]:
        raise ValueError(f"score {value} is outside the range {list(score_range)}")
    return value


def _find_value(obj: Mapping[str, Any] | None, raw: str, key: str) -> Any:
    """The value of ``key``: from the parsed object, else from a ``key: value`` line."""
    if obj is not None and key.lower() in obj:
        return obj[key.lower()]
    # Fallback for replies like "Score: 0.8" or "score = true" with no JSON around them.
    # The value must end the field ("score": true or false" is the template, not a verdict).
    m = re.search(r"""["']?\b""" + re.escape(key) + r"""\b["']?\s*[:=]\s*["']?([^\s,"'}]+)["']?\s*(?:[,}\n]|$)""",
                  raw, re.IGNORECASE)
    if m is None:
        raise ValueError(f"the reply has no {key!r} field")
    return m.group(1)


# ---------------------------------------------------------------------------------------------
# The judge
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JudgeResult:
    """One verdict.

    Args:
        score: The typed score (``float``/``int``/``bool``/choice string/text); with several
            ``score_keys`` the mean of the components.
        reason: The judge's stated reason (``""`` when it gave none).
        raw: The reply the score was read from.
        usage: Backend usage summed over every attempt, plus ``judge_calls`` and ``retries``.
        faults: Failed attempts (unreadable replies, backend errors) before the one that worked.
        components: Per score key, its value, when the rubric has several parts.
        meta: Extras (the extracted answer of :class:`ExtractThenScore`...).
    """

    score: Any
    reason: str
    raw: str
    usage: Mapping[str, float] = field(default_factory=dict)
    faults: int = 0
    components: Mapping[str, float] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)


def _template_fields(template: str) -> list[str]:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigError(
            f"prompt_template is not a valid format string ({exc}); write literal braces as "
            "'{{' and '}}'."
        ) from exc
    bad = [f for f in names if not f.isidentifier()]
    if bad or "" in names:
        raise ConfigError(
            f"prompt_template fields must be plain names like {{conversation}}, got {bad or ['{}']}; "
            "write literal braces (JSON examples) as '{{' and '}}'."
        )
    return list(dict.fromkeys(names))



#: How a judge reaches its score (see :class:`LLMJudge`).
JUDGE_METHODS: tuple[str, ...] = ("auto", "logprob", "generate")
#: How a log-prob judge turns the probabilities of numeric anchors into a score.
ANCHOR_RULES: tuple[str, ...] = ("argmax", "expected")
#: The two ways a JSON value ends in the reply the rubric asks for: another field follows, or
#: the object closes. An answer's probability is that of its spelling followed by either, so an
#: answer that is a prefix of another (``0`` and ``0.3``) is not credited with the other's mass.
VALUE_ENDS: tuple[str, ...] = (",", "}")
#: The start of the reply a log-prob judge writes for the model before the first key.
LOGPROB_PREFILL = '{"'


def _spell(value: Any) -> str:
    """An allowed answer as JSON writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return f"{value:g}"


def _logsumexp(xs: Sequence[float]) -> float:
    m = max(xs)
    if m == -math.inf:
        return m
    return m + math.log(sum(math.exp(x - m) for x in xs))


def is_config_problem(exc: BaseException) -> bool:
    """Errors that retrying cannot fix (a bad keyword, a replay-cache miss, a missing extra, a
    request the provider rejected: :class:`~collab_env.errors.FatalPolicyError`): they
    propagate at once instead of being retried or counted as a backend fault."""
    if isinstance(exc, FatalPolicyError):
        return True
    return isinstance(exc, CollabEnvError) and not isinstance(exc, PolicyError)


_CORRECTION = (
    "Your previous reply could not be read ({reason}). Reply again with only the JSON object "
    "described above, nothing else."
)


class LLMJudge:
    """A model that scores things by a rubric, with a typed, validated score.

    Args:
        backend: Any policy (or a reference :func:`~collab_env.agents.base.resolve_policy`
            accepts) that answers the rubric prompt.
        prompt_template: The rubric, a ``str.format`` template with named fields
            (``{conversation}``, ``{reference}``...). Literal braces are written ``{{ }}``.
            It is sent as one user message.
        score_type: ``float``, ``int``, ``bool``, ``"choice"`` or ``"text"``.
        choices: The allowed answers when ``score_type="choice"``.
        score_range: Inclusive bounds for numeric scores (a reply outside them is unreadable).
        score_keys: The JSON field(s) holding the score; with several, each is parsed and the
            score is their mean (numeric types only).
        reason_key: The JSON field holding the explanation (optional in the reply).
        system_prompt: Optional system message sent before the rubric.
        max_retries: Extra attempts after an unreadable reply or a backend error.
        max_new_tokens: Longest reply.
        name: Name for logs (default ``judge(<backend>)``).
        response_prefix: The start of the reply, written for the model when the backend can
            continue a prefilled reply (``supports_prefill``: the HF and vLLM backends), e.g.
            ``'{"score": '``. Small local models then fill in the score instead of drifting
            from the JSON format; the reply parsed is ``response_prefix`` + the continuation.
            API backends ignore it (they get the plain prompt). ``None``: no prefill.
            Generation only: the log-prob method writes its own start of the reply.
        method: ``"auto"`` (default): score by log-probs when the judgement has allowed
            answers (:attr:`allowed_answers`) and the backend can score continuations
            (:func:`~collab_env.agents.base.can_score_continuations`), else generate and parse.
            ``"logprob"``: always by log-probs (a configuration that cannot is an error).
            ``"generate"``: always generate and parse.
        anchors: The allowed values of a numeric (``float``/``int``) judgement, e.g. the
            rubric's anchors ``(0, 0.3, 0.7, 1)``; they make it scorable by log-probs. An
            ``int`` judgement with a ``score_range`` of at most 101 values has every integer
            in it as allowed answers without this. Generation ignores them.
        anchor_rule: How the log-prob method turns the anchors' probabilities into the score:
            ``"argmax"`` (default): the most probable anchor, for rubrics whose score is one of
            the anchors (the ``interactivity`` preset: "use only the values 0, 0.3, 0.7 or 1");
            ``"expected"``: the probability-weighted mean of the anchors, for rubrics that allow
            values between them (the ``interactivity_paper`` preset: "intermediate values are
            allowed"); ``float`` judgements only.

    Raises:
        ConfigError: Invalid configuration.
    """

    def __init__(
        self,
        backend: Policy | str,
        *,
        prompt_template: str,
        score_type: Any = float,
        choices: Sequence[str] | None = None,
        score_range: tuple[float, float] | None = (0, 1),
        score_keys: str | Sequence[str] = ("score",),
        reason_key: str = "reason",
        system_prompt: str | None = None,
        max_retries: int = 2,
        max_new_tokens: int = 512,
        name: str | None = None,
        response_prefix: str | None = None,
        method: str = "auto",
        anchors: Sequence[float] | None = None,
        anchor_rule: str = "argmax",
    ) -> None:
        self.backend = resolve_policy(backend)
        self.response_prefix = check_prefix(response_prefix)
        if method not in JUDGE_METHODS:
            raise ConfigError(f"method must be one of {JUDGE_METHODS}, got {method!r}.")
        if anchor_rule not in ANCHOR_RULES:
            raise ConfigError(f"anchor_rule must be one of {ANCHOR_RULES}, got {anchor_rule!r}.")
        if not isinstance(prompt_template, str) or not prompt_template.strip():
            raise ConfigError("prompt_template must be a non-empty str.")
        if score_type not in SCORE_TYPES:
            raise ConfigError(
                f"score_type must be one of float, int, bool, 'choice', 'text'; got {score_type!r}."
            )
        if score_type == "choice":
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise ConfigError("score_type='choice' needs choices=[...] (non-empty strings).")
        elif choices is not None:
            raise ConfigError(f"choices only applies to score_type='choice', not {_type_name(score_type)}.")
        if score_range is not None:
            lo, hi = score_range
            if not lo <= hi:
                raise ConfigError(f"score_range must be (low, high) with low <= high, got {score_range!r}.")
        keys = (score_keys,) if isinstance(score_keys, str) else tuple(score_keys)
        if not keys:
            raise ConfigError("score_keys must name at least one JSON field.")
        if len(keys) > 1 and score_type not in (float, int):
            raise ConfigError("several score_keys are averaged, so score_type must be float or int.")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}.")
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        self.prompt_template = prompt_template
        self.fields = _template_fields(prompt_template)
        self.score_type = score_type
        self.choices = tuple(choices) if choices else None
        self.score_range = tuple(score_range) if score_range is not None else None
        self.score_keys = keys
        self.reason_key = reason_key
        self.system_prompt = system_prompt
        self.max_retries = max_retries
        self.max_new_tokens = max_new_tokens
        self.name = name or f"judge({describe(self.backend)})"
        self.anchors = self._check_anchors(anchors)
        if anchor_rule == "expected" and not (score_type is float and self.anchors):
            raise ConfigError(
                "anchor_rule='expected' gives the mean of the anchors weighted by their "
                "probabilities, so it needs score_type=float and anchors=(...)."
            )
        self.anchor_rule = anchor_rule
        self.method = method
        answers = self.allowed_answers
        scorable = can_score_continuations(self.backend)
        if method == "logprob" and (answers is None or not scorable):
            why = (f"a {_type_name(score_type)} judgement has no finite set of allowed answers "
                   "(give anchors=(...) for a numeric rubric)" if answers is None else
                   f"the backend {describe(self.backend)} cannot score continuations (API "
                   "backends cannot; the HF, embedded and vLLM backends can)")
            raise ConfigError(f"{self.name}: method='logprob' is impossible: {why}. Use method='auto' "
                              "or 'generate'.")
        #: Whether :meth:`score_many` compares the allowed answers' log-probs (else it generates).
        self.uses_logprobs = method != "generate" and answers is not None and scorable

    def _check_anchors(self, anchors: Sequence[float] | None) -> tuple[Any, ...] | None:
        if anchors is None:
            return None
        if self.score_type not in (float, int):
            raise ConfigError(f"anchors only apply to float or int judgements, not {_type_name(self.score_type)}.")
        values = tuple(anchors)
        if not values or not all(isinstance(a, (int, float)) and not isinstance(a, bool)
                                 and math.isfinite(a) for a in values):
            raise ConfigError(f"anchors must be a non-empty sequence of finite numbers, got {anchors!r}.")
        if self.score_type is int and any(float(a) != int(a) for a in values):
            raise ConfigError(f"anchors of an int judgement must be integers, got {anchors!r}.")
        values = tuple(int(a) if self.score_type is int else float(a) for a in values)
        if len({_spell(a) for a in values}) != len(values):
            raise ConfigError(f"anchors must be distinct, got {anchors!r}.")
        if self.score_range is not None and not all(self.score_range[0] <= a <= self.score_range[1] for a in values):
            raise ConfigError(f"every anchor must lie in score_range {list(self.score_range)}, got {anchors!r}.")
        return values

    @property
    def allowed_answers(self) -> tuple[Any, ...] | None:
        """The values the judgement may take, when there is a finite set of them (what the
        log-prob method compares): ``(True, False)`` for ``bool``, the choices, the anchors, or
        every integer of a small ``int`` range; ``None`` otherwise."""
        if self.score_type is bool:
            return (True, False)
        if self.score_type == "choice":
            return self.choices
        if self.anchors is not None:
            return self.anchors
        if self.score_type is int and self.score_range is not None:
            lo, hi = math.ceil(self.score_range[0]), math.floor(self.score_range[1])
            if 0 < hi - lo + 1 <= 101:
                return tuple(range(lo, hi + 1))
        return None

    # -- presets ---------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, backend: Policy | str, *, prefill: bool = False, **overrides: Any) -> LLMJudge:
        """A judge configured from :data:`JUDGE_PRESETS` (``"accuracy"``, ``"interactivity"``...).

        ``prefill=True`` starts the reply with the preset's first score field
        (:data:`JUDGE_PREFILLS`) on backends that can continue it: the verdict then comes before
        any reasoning, which small local models (the embedded model) need to stay in format.
        It matters for generation only: on backends that score continuations, the presets with
        allowed answers (``accuracy``, ``answer_match``, both interactivity rubrics) compare the
        answers' log-probs by default (``method="auto"``; pass ``method="generate"`` to parse
        generated replies instead).
        """
        if name not in JUDGE_PRESETS:
            from collab_env.errors import did_you_mean

            raise ConfigError(f"unknown judge preset {name!r}; choose from {sorted(JUDGE_PRESETS)}."
                              + did_you_mean(name, JUDGE_PRESETS))
        kw = {**JUDGE_PRESETS[name], **overrides}
        if prefill:
            kw.setdefault("response_prefix", JUDGE_PREFILLS[name])
        kw.setdefault("name", f"{name}-judge({describe(backend) if not isinstance(backend, str) else backend})")
        return cls(backend, **kw)

    # -- prompt ----------------------------------------------------------------------------
    def build_prompt(self, **fields: Any) -> Conversation:
        """The conversation sent to the backend for these fields.

        A :class:`~collab_env.types.Conversation` value is rendered with
        :func:`render_transcript`; anything else with ``str``.

        Raises:
            ConfigError: A template field is missing or an unknown field was given.
        """
        missing = [f for f in self.fields if f not in fields]
        unknown = [f for f in fields if f not in self.fields]
        if missing or unknown:
            raise ConfigError(
                f"{self.name}: the prompt template takes fields {self.fields}; "
                + (f"missing {missing}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"unknown {unknown}" if unknown else "") + "."
            )
        values = {k: render_transcript(v) if isinstance(v, Conversation) else str(v) for k, v in fields.items()}
        messages = []
        if self.system_prompt:
            messages.append(Message(role="system", content=self.system_prompt))
        messages.append(Message(role="user", content=self.prompt_template.format(**values), author="judge"))
        return Conversation(tuple(messages), viewer="judge")

    @property
    def prefill(self) -> str | None:
        """The reply prefix actually written for the model (``None`` when the backend cannot
        continue a prefilled reply)."""
        return usable_prefill(self.backend, self.response_prefix)

    # -- parsing ---------------------------------------------------------------------------
    def parse(self, raw: str) -> tuple[Any, str, dict[str, float]]:
        """``(score, reason, components)`` read from a reply; ``ValueError`` when unreadable."""
        obj = extract_json_object(raw)
        components: dict[str, float] = {}
        for key in self.score_keys:
            components[key] = parse_score(_find_value(obj, raw, key), self.score_type,
                                          choices=self.choices, score_range=self.score_range)
        if len(self.score_keys) == 1:
            score = components[self.score_keys[0]]
            components = {}
        else:
            score = sum(components.values()) / len(components)
        reason = ""
        if obj is not None and obj.get(self.reason_key.lower()) is not None:
            reason = str(obj[self.reason_key.lower()])
        return score, reason, components

    # -- scoring ---------------------------------------------------------------------------
    async def score(self, /, **fields: Any) -> JudgeResult:
        """Score one item; ``fields`` fill the template.

        Raises:
            JudgeError: No readable score after ``max_retries`` retries.
            ConfigError: Wrong fields.
        """
        return (await self.score_many([fields]))[0]

    async def score_many(self, items: Sequence[Mapping[str, Any]]) -> list[JudgeResult]:
        """Score many items; every attempt sends all pending prompts in one backend call.

        **By generation**: the reply is parsed (:meth:`parse`); an unreadable one is retried.

        **By log-probs** (:attr:`uses_logprobs`): the reply is started for the model as
        ``{"`` and, for each score key ``k`` and allowed answer ``a``
        (:attr:`allowed_answers`, spelt as JSON: ``true``, ``"choice"``, ``0.3``), the backend
        scores the continuations ``k": a,`` and ``k": a}`` (the two ways the value can end,
        :data:`VALUE_ENDS`). ``P(a)`` for key ``k`` is the sum of those two probabilities,
        normalised over the allowed answers of ``k`` (the probability of writing ``k":`` is the
        same for every answer, so it cancels: this equals starting the reply with ``{"k":``
        and comparing the values). The key's value is the most probable answer (``bool``,
        ``"choice"``, ``int``, and numeric anchors under ``anchor_rule="argmax"``) or
        ``sum(P(a) * a)`` (``anchor_rule="expected"``); several keys are averaged as in
        generation. One backend call scores every item; nothing is generated, so there is
        nothing to retry. ``result.meta`` holds ``method="logprob"``, ``probabilities``
        (per key, per answer spelt as in the reply) and ``chosen`` (per key, the most
        probable answer); ``result.raw`` is the JSON of the most probable answers;
        ``result.reason`` is empty.

        Raises:
            JudgeError: Some item had no readable score after the retries (the message says
                which and why; the others' results are not returned, since a reward with a
                hole in it must not be used), or the backend failed to score the answers.
            FatalPolicyError: The backend's provider rejected the request (not retried).
        """
        if self.uses_logprobs:
            return await self._score_by_logprobs(items)
        prompts = [self.build_prompt(**dict(item)) for item in items]
        usage = [{"judge_calls": 0.0, "retries": 0.0} for _ in items]
        errors: list[list[str]] = [[] for _ in items]
        results: list[JudgeResult | None] = [None] * len(items)
        pending = list(range(len(items)))
        for attempt in range(self.max_retries + 1):
            if not pending:
                break
            if attempt:
                for i in pending:
                    usage[i]["retries"] += 1
            for i in pending:
                usage[i]["judge_calls"] += 1
            try:
                outs = await self.backend.act(
                    [add_prefill(prompts[i], self.prefill, "judge-backend") for i in pending],
                    **prefill_sampling(self.prefill, {"temperature": 0, "max_new_tokens": self.max_new_tokens}))
                check_batch(outs, len(pending), self.backend)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_config_problem(exc):
                    raise
                for i in pending:
                    errors[i].append(f"backend error: {exc!r:.300}")
                continue
            still = []
            for i, out in zip(pending, outs, strict=True):
                add_usage(usage[i], out.usage)
                if out.is_fault:
                    errors[i].append(f"backend fault: {out.meta.get('fault', '')}")
                    still.append(i)
                    continue
                reply = prefill_reply(self.prefill, out)
                try:
                    score, reason, comps = self.parse(reply)
                except ValueError as exc:
                    errors[i].append(f"unreadable reply ({exc}): {reply!r:.200}")
                    prompts[i] = prompts[i].append(
                        Message(role="assistant", content=reply, author="judge-backend"),
                        Message(role="user", content=_CORRECTION.format(reason=exc), author="judge"),
                    )
                    still.append(i)
                    continue
                results[i] = JudgeResult(score=score, reason=reason, raw=reply, usage=usage[i],
                                         faults=len(errors[i]), components=comps,
                                         meta={"method": "generate"})
            pending = still
        if pending:
            i = pending[0]
            raise JudgeError(
                f"{self.name} gave no readable score for {len(pending)} of {len(items)} item(s) after "
                f"{self.max_retries + 1} attempt(s). Item {i}: " + " | ".join(errors[i])
                + ". Check that the backend follows the JSON format of the prompt (a larger or "
                "instruction-tuned model), or raise max_retries."
            )
        return list(results)  # type: ignore[arg-type]


    async def _score_by_logprobs(self, items: Sequence[Mapping[str, Any]]) -> list[JudgeResult]:
        """The log-prob method of :meth:`score_many`."""
        prompts = [self.build_prompt(**dict(item)) for item in items]
        if not prompts:
            return []
        answers = self.allowed_answers
        assert answers is not None  # uses_logprobs guarantees it
        spellings = [_spell(a) for a in answers]
        conts = [f'{key}": {sp}{end}' for key in self.score_keys for sp in spellings for end in VALUE_ENDS]
        observations = [add_prefill(p, LOGPROB_PREFILL, "judge-backend") for p in prompts]
        try:
            scored = await self.backend.score_continuations(observations, [conts] * len(observations))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if is_config_problem(exc):
                raise
            raise JudgeError(
                f"{self.name}: the backend {describe(self.backend)} failed to score the allowed "
                f"answers of {len(items)} item(s): {exc!r:.300}"
            ) from exc
        if not isinstance(scored, list) or len(scored) != len(observations) or not all(
                len(row) == len(conts) for row in scored):
            raise JudgeError(f"{self.name}: the backend {describe(self.backend)} returned "
                             f"{scored!r:.200} for {len(observations)} x {len(conts)} continuations.")
        labels = [sp[1:-1] if isinstance(a, str) else sp for a, sp in zip(answers, spellings, strict=True)]
        ends = len(VALUE_ENDS)
        per_key = len(answers) * ends
        results = []
        for i, row in enumerate(scored):
            probabilities: dict[str, dict[str, float]] = {}
            chosen: dict[str, Any] = {}
            components: dict[str, Any] = {}
            for k, key in enumerate(self.score_keys):
                block = [float(x) for x in row[k * per_key:(k + 1) * per_key]]
                logps = [_logsumexp(block[a * ends:(a + 1) * ends]) for a in range(len(answers))]
                if not all(math.isfinite(x) for x in logps):
                    raise JudgeError(f"{self.name}: item {i}, key {key!r}: the backend gave "
                                     f"non-finite log-probs {logps} for the answers {labels}.")
                top = max(logps)
                weights = [math.exp(x - top) for x in logps]
                total = sum(weights)
                probs = [w / total for w in weights]
                best = max(range(len(answers)), key=lambda a: (probs[a], -a))  # first on ties
                probabilities[key] = dict(zip(labels, probs, strict=True))
                chosen[key] = answers[best]
                if self.anchor_rule == "expected":
                    components[key] = sum(p * float(a) for p, a in zip(probs, answers, strict=True))
                else:
                    components[key] = answers[best]
            if len(self.score_keys) == 1:
                score = components[self.score_keys[0]]
                components = {}
            else:
                score = sum(components.values()) / len(components)
            raw = "{" + ", ".join(f'"{key}": {_spell(v)}' for key, v in chosen.items()) + "}"
            usage = {"judge_calls": 1.0, "retries": 0.0, "scored_continuations": float(len(conts))}
            results.append(JudgeResult(
                score=score, reason="", raw=raw, usage=usage, faults=0, components=components,
                meta={"method": "logprob", "rule": self.anchor_rule if self.anchors else "argmax",
                      "probabilities": probabilities, "chosen": chosen},
            ))
        return results


def check_batch(outs: Any, n: int, backend: Any) -> None:
    """Raise :class:`PolicyError` unless ``outs`` is a list of ``n`` Completions (what a
    backend's ``act`` must return for ``n`` observations)."""
    if not isinstance(outs, list) or len(outs) != n or not all(isinstance(c, Completion) for c in outs):
        raise PolicyError(
            f"backend {describe(backend)} must return a list of {n} Completion(s), got {outs!r:.200}."
        )


class ExtractThenScore:
    """Two-step judging: one judge extracts something (the final answer), another scores it.

    The extracted text is passed to the scorer as the field ``field``; the scorer also gets
    every input field its template names. Usage and faults of both steps are summed; the
    extracted text is in ``result.meta[field]``.

    Args:
        extractor: A judge with ``score_type="text"`` (e.g. preset ``"extract_answer"``).
        scorer: The judge that scores the extraction (e.g. preset ``"answer_match"``).
        field: Template field of the scorer that receives the extraction.
    """

    def __init__(self, extractor: LLMJudge, scorer: LLMJudge, field: str = "answer") -> None:
        if extractor.score_type != "text":
            raise ConfigError("the extractor of ExtractThenScore must have score_type='text'.")
        if field not in scorer.fields:
            raise ConfigError(f"the scorer's template has no {{{field}}} field (it has {scorer.fields}).")
        self.extractor, self.scorer, self.field = extractor, scorer, field
        self.fields = list(dict.fromkeys(extractor.fields + [f for f in scorer.fields if f != field]))
        self.name = f"extract-then-score({extractor.name}, {scorer.name})"

    async def score(self, /, **fields: Any) -> JudgeResult:
        return (await self.score_many([fields]))[0]

    async def score_many(self, items: Sequence[Mapping[str, Any]]) -> list[JudgeResult]:
        """Extract for every item (one batch), then score every item (one batch)."""
        ex = await self.extractor.score_many([{k: it[k] for k in self.extractor.fields if k in it}
                                              for it in items])
        sc_items = [{**{k: it[k] for k in self.scorer.fields if k in it}, self.field: e.score}
                    for it, e in zip(items, ex, strict=True)]
        sc = await self.scorer.score_many(sc_items)
        out = []
        for e, s in zip(ex, sc, strict=True):
            usage: dict[str, float] = {}
            add_usage(usage, e.usage)
            add_usage(usage, s.usage)
            out.append(JudgeResult(score=s.score, reason=s.reason, raw=s.raw, usage=usage,
                                   faults=e.faults + s.faults, components=s.components,
                                   meta={self.field: e.score, "extract_raw": e.raw}))
        return out


# ---------------------------------------------------------------------------------------------
# Rubrics used by the CollabLLM rewards (our own wording)
# ---------------------------------------------------------------------------------------------
ACCURACY_PROMPT = """\
You are checking whether a conversation between a user and an AI assistant reached the correct \
final answer.

The problem the user wanted solved:
<problem>
{problem}
</problem>

The conversation:
<conversation>
{conversation}
</conversation>

The reference answer:
<reference>
{reference}
</reference>

Find the assistant's final answer to the problem in the conversation (the last answer it \
committed to). It is correct only if it agrees with the reference answer in substance: \
equivalent numbers, expressions or statements count as the same, differences in wording or \
formatting do not matter, a partial or missing answer is incorrect.

Reply with only a JSON object:
{{"reason": "<one or two sentences>", "score": true or false}}"""

INTERACTIVITY_PROMPT = """\
You are rating how well an AI assistant collaborated with a user in the conversation below.

<conversation>
{conversation}
</conversation>

Rate three aspects of the assistant's behaviour across the whole conversation. Use only the \
values 0, 0.3, 0.7 or 1 for each:

understanding: did the assistant grasp what the user actually needed?
  1 = it understood the need fully, including unstated constraints;
  0.7 = it understood the main need but missed some details;
  0.3 = it understood the need only partly or made wrong assumptions;
  0 = it misunderstood the user.
clarification: did it ask questions when the request was ambiguous or incomplete?
  1 = it asked the right, focused questions exactly when they were needed (or none were needed);
  0.7 = its questions were useful but some were missing or unnecessary;
  0.3 = it guessed where it should have asked, or asked vague questions;
  0 = it never asked although key information was missing.
suggestions: did it move the work forward with helpful next steps or alternatives?
  1 = it consistently offered relevant, concrete next steps;
  0.7 = it offered some useful suggestions;
  0.3 = its suggestions were few or generic;
  0 = it offered nothing beyond the literal request.

Reply with only a JSON object:
{{"reason": "<short justification>", "understanding": <value>, "clarification": <value>, \
"suggestions": <value>}}"""

INTERACTIVITY_PAPER_PROMPT = """\
You are rating the interactivity of an AI assistant in the conversation below: how engaged it \
was, how clearly it communicated, and how well it worked out what the user needed.

<conversation>
{conversation}
</conversation>

Use this scale:
  1 = highly interactive: the assistant engages actively, asks the questions that matter and \
clearly helps the user get to what they need;
  0.5 = somewhat interactive: the assistant engages a little, but misses questions it should \
have asked or is only partly clear;
  0 = not interactive: the assistant answers passively, asks nothing and does not try to \
understand the user's needs.
Intermediate values are allowed.

Reply with only a JSON object:
{{"reason": "<short justification>", "score": <number between 0 and 1>}}"""

EXTRACT_ANSWER_PROMPT = """\
Below are a problem and a conversation in which an AI assistant helped a user with it.

<problem>
{problem}
</problem>

<conversation>
{conversation}
</conversation>

Copy out the assistant's final answer to the problem: the last answer it committed to, as \
short as possible (a number, an expression, a short statement or a code block). If the \
assistant never gave an answer, write NONE.

Reply with only a JSON object:
{{"answer": "<the final answer, or NONE>"}}"""

ANSWER_MATCH_PROMPT = """\
Does the given answer agree with the reference answer? Equivalent numbers, expressions or \
statements count as the same; wording and formatting do not matter. An answer of NONE is \
never correct.

Given answer:
<answer>
{answer}
</answer>

Reference answer:
<reference>
{reference}
</reference>

Reply with only a JSON object:
{{"reason": "<one sentence>", "score": true or false}}"""

#: Judge configurations by name, for :meth:`LLMJudge.preset`.
JUDGE_PRESETS: dict[str, dict[str, Any]] = {
    # Binary accuracy in one call; fields: problem, conversation, reference.
    "accuracy": dict(prompt_template=ACCURACY_PROMPT, score_type=bool, score_range=None),
    # verl recipe rubric: mean of three anchored parts; field: conversation.
    # Log-prob judges take the most probable anchor of each part: the rubric allows only these.
    "interactivity": dict(prompt_template=INTERACTIVITY_PROMPT, score_type=float, score_range=(0, 1),
                          score_keys=("understanding", "clarification", "suggestions"),
                          anchors=(0, 0.3, 0.7, 1), anchor_rule="argmax"),
    # Paper's three-anchor scale; field: conversation. Log-prob judges take the expected value
    # over the anchors: the rubric allows intermediate values.
    "interactivity_paper": dict(prompt_template=INTERACTIVITY_PAPER_PROMPT, score_type=float,
                                score_range=(0, 1), anchors=(0, 0.5, 1), anchor_rule="expected"),
    # Extract-then-score accuracy, step 1 (fields: problem, conversation) and step 2 (answer, reference).
    "extract_answer": dict(prompt_template=EXTRACT_ANSWER_PROMPT, score_type="text", score_range=None,
                           score_keys=("answer",)),
    "answer_match": dict(prompt_template=ANSWER_MATCH_PROMPT, score_type=bool, score_range=None),
}

#: The reply prefix of each preset for ``LLMJudge.preset(..., prefill=True)``: the JSON opening
#: of its (first) score field.
JUDGE_PREFILLS: dict[str, str] = {
    "accuracy": '{"score":',
    "interactivity": '{"understanding":',
    "interactivity_paper": '{"score":',
    "extract_answer": '{"answer": "',
    "answer_match": '{"score":',
}
