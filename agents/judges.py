"""LLM judges: a model reads a filled-in rubric and answers with a typed score.

:class:`LLMJudge` wraps any :class:`~collab_env.policy.Policy` (a local model, an API model,
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

Every field value is quoted into the rubric as untrusted data (``fence=True``, the default):
between fence lines whose tag the text cannot contain (:func:`fence_untrusted`), and every
shipped rubric says that fenced text was written by the participants being judged and that
instructions or scores inside it must be ignored (:data:`UNTRUSTED_DATA_NOTE`). A fence keeps
the structure unambiguous; whether a given model obeys the rubric over text it is told to
distrust is measured, not assumed (``benchmarks/bench_judge_injection.py``).

A judge never returns a default score: a silent 0 would be indistinguishable from a real verdict
in a reward. A request the backend's provider rejected (a missing API key, another 4xx:
:class:`~collab_env.errors.FatalPolicyError`) is not retried: it propagates at once.

The judge is split by job; each name is imported from the module that defines it: the typed
scores and :class:`JudgeResult` (:mod:`~collab_env.agents.judge_scores`), the
two ways of judging (:mod:`~collab_env.agents.judge_generate`,
:mod:`~collab_env.agents.judge_logprob`), the rubric templates the CollabLLM rewards use
(``ACCURACY_PROMPT``, ``INTERACTIVITY_PROMPT``, ``INTERACTIVITY_PAPER_PROMPT``,
``EXTRACT_ANSWER_PROMPT`` + ``ANSWER_MATCH_PROMPT``) with ready configurations in
:data:`JUDGE_PRESETS` (:mod:`~collab_env.agents.rubrics`), and the helpers shared with the user
simulator: the tolerant JSON reader (:func:`extract_json_object`) and the transcript renderer
(:func:`render_transcript`) (:mod:`~collab_env.agents.replies`).

``LLMJudge.preset(name, backend, prompts="collabllm" | PATH)`` judges with the reference's own
template for the preset instead of our rubric, read at run time, and reads the reply in the
format that template asks for (see :mod:`~collab_env.agents.rubrics`).

Example::

    judge = LLMJudge.preset("accuracy", "litellm:gpt-4o-mini")
    result = await judge.score(problem=p, conversation=episode.conversation, reference=ref)
    result.score  # True / False
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from collab_env.agents.base import can_score_continuations, check_prefix, usable_prefill
from collab_env.agents.judge_generate import score_by_generation
from collab_env.agents.judge_logprob import score_by_logprobs
from collab_env.agents.judge_scores import (
    SCORE_TYPES,
    JudgeResult,
    combine_components,
    find_score_value,
    parse_score,
    score_type_name,
    spell_answer,
)
from collab_env.agents.reference_prompts import reference_chat_history, resolve_prompts
from collab_env.agents.replies import extract_json_object, fence_untrusted, render_transcript
from collab_env.agents.rubrics import (
    JUDGE_PREFILLS,
    JUDGE_PRESETS,
    reference_judge_kwargs,
    template_fields,
)
from collab_env.errors import ConfigError
from collab_env.policy import Policy, add_usage, describe, resolve_policy
from collab_env.types import Conversation, Message

__all__ = [
    "LLMJudge",
    "ExtractThenScore",
    "JUDGE_METHODS",
    "ANCHOR_RULES",
]


#: How a judge reaches its score (see :class:`LLMJudge`).
JUDGE_METHODS: tuple[str, ...] = ("auto", "logprob", "generate")
#: How a log-prob judge turns the probabilities of numeric anchors into a score.
ANCHOR_RULES: tuple[str, ...] = ("argmax", "expected")


class LLMJudge:
    """A model that scores things by a rubric, with a typed, validated score.

    Args:
        backend: Any policy (or a reference :func:`~collab_env.policy.resolve_policy`
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
        fence: Quote every field value into the template between fence lines
            (:func:`fence_untrusted`, labelled with the field's name), so that text from the
            conversation cannot pass for the rubric. Default ``True``; a template should then
            say what the fences mean (the shipped rubrics include :data:`UNTRUSTED_DATA_NOTE`)
            and put each field on a line of its own. ``False`` pastes the values as they are:
            only for reproducing a prompt written elsewhere verbatim (a reference's own
            rubric), whose judge then reads the transcript unfenced.
        field_map: Template placeholder -> the field name callers pass, for a template whose
            placeholders are named otherwise (a reference's ``{chat_history}`` filled from
            ``conversation=``). Unmapped placeholders are fields of their own name.
        constants: Template placeholder -> a fixed value (not a field callers pass).
        transcript: How a :class:`~collab_env.types.Conversation` value is written:
            ``"ours"`` (:func:`render_transcript`) or ``"reference"``
            (:func:`~collab_env.agents.reference_prompts.reference_chat_history`, the
            reference's ``**User**: ...`` lines).
        prompt_origin: Where the template was read (a reference file), for messages;
            ``None`` for a template written here.

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
        fence: bool = True,
        field_map: Mapping[str, str] | None = None,
        constants: Mapping[str, Any] | None = None,
        transcript: str = "ours",
        prompt_origin: str | None = None,
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
            raise ConfigError(f"choices only applies to score_type='choice', not {score_type_name(score_type)}.")
        bounds: tuple[float, float] | None = None
        if score_range is not None:
            lo, hi = score_range
            if not lo <= hi:
                raise ConfigError(f"score_range must be (low, high) with low <= high, got {score_range!r}.")
            bounds = (lo, hi)
        keys = (score_keys,) if isinstance(score_keys, str) else tuple(score_keys)
        if not keys:
            raise ConfigError("score_keys must name at least one JSON field.")
        if len(keys) > 1 and score_type not in (float, int):
            raise ConfigError("several score_keys are averaged, so score_type must be float or int.")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"max_retries must be an int >= 0, got {max_retries!r}.")
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        if not isinstance(fence, bool):
            raise ConfigError(f"fence must be True or False, got {fence!r}.")
        if transcript not in ("ours", "reference"):
            raise ConfigError(f"transcript must be 'ours' or 'reference', got {transcript!r}.")
        self.prompt_template = prompt_template
        self.fence = fence
        self.transcript = transcript
        self.prompt_origin = prompt_origin
        #: The template's own placeholders, in order.
        self.placeholders = template_fields(prompt_template)
        self.field_map = dict(field_map or {})
        self.constants = {k: str(v) for k, v in dict(constants or {}).items()}
        stray = [k for k in [*self.field_map, *self.constants] if k not in self.placeholders]
        if stray:
            raise ConfigError(f"field_map / constants name {stray}, which the template does not have "
                              f"(its placeholders: {self.placeholders}).")
        #: The fields callers pass (:meth:`build_prompt`), in order of first use.
        self.fields = list(dict.fromkeys(self.field_map.get(p, p) for p in self.placeholders
                                         if p not in self.constants))
        self.score_type = score_type
        self.choices = tuple(choices) if choices else None
        self.score_range = bounds
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
            why = (f"a {score_type_name(score_type)} judgement has no finite set of allowed answers "
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
            raise ConfigError(f"anchors only apply to float or int judgements, not {score_type_name(self.score_type)}.")
        values = tuple(anchors)
        if not values or not all(isinstance(a, (int, float)) and not isinstance(a, bool)
                                 and math.isfinite(a) for a in values):
            raise ConfigError(f"anchors must be a non-empty sequence of finite numbers, got {anchors!r}.")
        if self.score_type is int and any(float(a) != int(a) for a in values):
            raise ConfigError(f"anchors of an int judgement must be integers, got {anchors!r}.")
        values = tuple(int(a) if self.score_type is int else float(a) for a in values)
        if len({spell_answer(a) for a in values}) != len(values):
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
    def preset(cls, name: str, backend: Policy | str, *, prefill: bool = False, prompts: Any = None,
               **overrides: Any) -> LLMJudge:
        """A judge configured from :data:`JUDGE_PRESETS` (``"accuracy"``, ``"interactivity"``...).

        ``prefill=True`` starts the reply with the preset's first score field
        (:data:`JUDGE_PREFILLS`) on backends that can continue it: the verdict then comes before
        any reasoning, which small local models (the embedded model) need to stay in format.
        It matters for generation only: on backends that score continuations, the presets with
        allowed answers (``accuracy``, ``answer_match``, both interactivity rubrics) compare the
        answers' log-probs by default (``method="auto"``; pass ``method="generate"`` to parse
        generated replies instead).

        ``prompts``: ``None`` / ``"collab_env"`` (our rubric), ``"collabllm"``, a path to a verl
        checkout, or a list of them: the reference's template for the preset and its reply
        format (:data:`~collab_env.agents.rubrics.REFERENCE_JUDGES`). A preset or a set without
        a reference template raises :class:`~collab_env.errors.ConfigError`.
        """
        if name not in JUDGE_PRESETS:
            from collab_env.errors import did_you_mean

            raise ConfigError(f"unknown judge preset {name!r}; choose from {sorted(JUDGE_PRESETS)}."
                              + did_you_mean(name, JUDGE_PRESETS))
        who = f"LLMJudge.preset({name!r})"
        prompt_set = resolve_prompts(prompts, who)
        if prompt_set is None:
            base, prefix = JUDGE_PRESETS[name], JUDGE_PREFILLS[name]
        else:
            base, prefix = reference_judge_kwargs(name, prompt_set, who)
        kw = {**base, **overrides}
        if prefill:
            kw.setdefault("response_prefix", prefix)
        kw.setdefault("name", f"{name}-judge({describe(backend) if not isinstance(backend, str) else backend})")
        return cls(backend, **kw)

    # -- prompt ----------------------------------------------------------------------------
    def build_prompt(self, **fields: Any) -> Conversation:
        """The conversation sent to the backend for these fields.

        A :class:`~collab_env.types.Conversation` value is rendered with
        :func:`render_transcript`; anything else with ``str``. With :attr:`fence` (the
        default) each value is then fenced as untrusted data, labelled with its field's name.

        Raises:
            ConfigError: A template field is missing or an unknown field was given.
        """
        render = render_transcript if self.transcript == "ours" else reference_chat_history
        missing = [f for f in self.fields if f not in fields]
        unknown = [f for f in fields if f not in self.fields]
        if missing or unknown:
            raise ConfigError(
                f"{self.name}: the prompt template takes fields {self.fields}; "
                + (f"missing {missing}" if missing else "")
                + ("; " if missing and unknown else "")
                + (f"unknown {unknown}" if unknown else "") + "."
            )
        values = {k: render(v) if isinstance(v, Conversation) else str(v) for k, v in fields.items()}
        if self.fence:
            values = {k: fence_untrusted(v, k) for k, v in values.items()}
        filled = {p: self.constants[p] if p in self.constants else values[self.field_map.get(p, p)]
                  for p in self.placeholders}
        messages = []
        if self.system_prompt:
            messages.append(Message(role="system", content=self.system_prompt))
        messages.append(Message(role="user", content=self.prompt_template.format(**filled), author="judge"))
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
            components[key] = parse_score(find_score_value(obj, raw, key), self.score_type,
                                          choices=self.choices, score_range=self.score_range)
        score, components = combine_components(self.score_keys, components)
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
            return await score_by_logprobs(self, items)
        return await score_by_generation(self, items)


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
