"""Metrics: named, async scoring functions that reward parts are built from.

A metric reads a finished (or partly simulated) conversation and the task item and returns a
:class:`MetricResult`::

    async def metric(conversation, item, *, start=0, **ctx) -> MetricResult

``start`` is the index of the first message of the *future* part of the conversation (the part
a multiturn-aware reward simulated after the turn being rewarded); metrics that only look at the
final answer ignore it. ``ctx`` carries the resources a metric needs (a judge, a tokenizer, a
sandbox pool...); each metric documents the keys it reads, and its :attr:`Metric.needs` says
which ones it cannot work without.

A metric returns the *raw* value (a word count, a 0/1 verdict, a BLEU score); weights are
applied by whoever combines metrics into a reward. A metric that cannot score raises: a judge
that gives no readable verdict raises :class:`~collab_env.errors.JudgeError`, a broken sandbox
:class:`~collab_env.errors.SandboxError`. A metric never turns an error into a silent 0. A 0 is
returned only for a real verdict ("the assistant gave no boxed answer", "the tests failed"), and
``detail`` says which.

Built-in metrics (see :func:`list_metrics`):

=================  ===============================================================================
``accuracy_rule``  1/0: the last ``\\boxed{}`` answer equals the reference (string, number, sympy).
``accuracy``       1/0: an LLM judge (preset ``"accuracy"``) compares the conversation with the
                   reference.
``interactivity``  0..1: an LLM judge rates the collaboration (``ctx["rubric"]``: ``"verl"`` or
                   ``"paper"``).
``token_amount``   Words (or tokenizer tokens) in a scope of the conversation (raw count).
``bleu_score``     Character-level BLEU of the final text vs the reference, the CollabLLM recipe's
                   metric (nltk's ``sentence_bleu([reference], text)`` on *strings*, as verl's
                   ``recipe/collabllm/metrics/bleu_score.py`` calls it). ``bleu_char`` is an alias.
``bleu_word``      Word-level sentence BLEU (sacrebleu) of the final text vs the reference.
``pass_rate``      1/0: the final Python code block passes the item's tests in the sandbox.
=================  ===============================================================================

``get_metric("extract->NAME")`` (or :func:`extract_then`) gives the CollabLLM "extract, then
score" form of a metric: an LLM extractor copies out the final artefact first.

The BLEU metrics score "the final text": the document an LLM extractor writes out of the whole
conversation when ``ctx["document_extractor"]`` is given (:func:`document_extractor`, the
recipe's extraction step: the final version of the document with every revision merged in), else
the text of ``ctx["extractor"]`` when given, else the last assistant message.
:func:`collab_env.rewards.mr.default_reward` builds the document extractor from ``judge=``.

Version history of the names
    * ``bleu_score`` was word-level sacrebleu BLEU before the ``collabllm-*-v1`` envs; it is now
      the recipe's character BLEU, and the word-level metric is ``bleu_word``. ``bleu_char``
      (the old name of the character BLEU) stays as an alias of ``bleu_score``. The character
      BLEU of a text that shares characters with the reference but no n-gram of some order
      now follows nltk exactly (a tiny positive value, ~1e-77, where it used to return 0.0).

Register your own with :func:`register_metric`.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from collab_env.errors import ConfigError, TaskFunctionError, did_you_mean, require
from collab_env.types import Conversation, Message

__all__ = [
    "Metric",
    "MetricResult",
    "MetricFn",
    "register_metric",
    "get_metric",
    "list_metrics",
    "extract_then",
    "extract_boxed_text",
    "extract_code_block",
    "answers_equal",
    "char_bleu",
    "document_extractor",
    "EXTRACT_DOCUMENT_PROMPT",
    "reference_of",
    "problem_of",
]

#: Signature of a metric function.
MetricFn = Callable[..., Awaitable["MetricResult"]]

#: Resources a metric can declare in ``needs`` (keys of ``ctx``, or ``"sandbox"`` for code runs).
KNOWN_NEEDS: tuple[str, ...] = ("judge", "extractor", "document_extractor", "tokenizer", "sandbox")


@dataclass(frozen=True)
class MetricResult:
    """What a metric returns.

    Args:
        value: The raw score (finite float). Weights are applied by the caller.
        detail: JSON-friendly explanation (the extracted answer, the sandbox status...).
        usage: Counters of what scoring cost (``judge_calls``, ``prompt_tokens``...).
    """

    value: float
    detail: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Metric:
    """A named metric: an async function plus what it needs.

    Calling it (``await metric(conversation, item, start=..., **ctx)``) runs the function and
    checks its result: anything but a :class:`MetricResult` with a finite value raises
    :class:`~collab_env.errors.TaskFunctionError`. Exceptions of the function propagate.

    Args:
        name: Registry name; results are logged under it.
        fn: ``async fn(conversation, item, *, start=0, **ctx) -> MetricResult`` (a plain
            function returning a ``MetricResult`` is accepted too).
        needs: ``ctx`` resources the metric cannot work without (documentation and checks for
            the caller that builds ``ctx``), a subset of :data:`KNOWN_NEEDS`.
        description: One line for listings.
    """

    name: str
    fn: Callable[..., Any]
    needs: tuple[str, ...] = ()
    description: str = ""

    async def __call__(self, conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                       **ctx: Any) -> MetricResult:
        if not isinstance(conversation, Conversation):
            raise ConfigError(
                f"metric {self.name!r} takes a Conversation, got {type(conversation).__name__}; "
                "use Conversation.from_chat() for role/content dicts."
            )
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= len(conversation):
            raise ConfigError(
                f"metric {self.name!r}: start must be an int in [0, {len(conversation)}] "
                f"(the index of the first future message), got {start!r}."
            )
        out = self.fn(conversation, item, start=start, **ctx)
        if inspect.isawaitable(out):
            out = await out
        if not isinstance(out, MetricResult):
            raise TaskFunctionError(
                f"metric {self.name!r} returned {type(out).__name__}, not a MetricResult; "
                "return MetricResult(value=..., detail={...})."
            )
        if isinstance(out.value, bool) or not isinstance(out.value, (int, float)) or not math.isfinite(out.value):
            raise TaskFunctionError(f"metric {self.name!r} returned the non-finite or non-numeric value {out.value!r}.")
        if not isinstance(out.value, float):
            out = MetricResult(float(out.value), out.detail, out.usage)
        return out


_REGISTRY: dict[str, Metric] = {}
_EXTRACT_PREFIX = "extract->"


def register_metric(name: str, fn: Callable[..., Any], *, needs: Iterable[str] = (),
                    description: str = "", overwrite: bool = False) -> Metric:
    """Register ``fn`` under ``name`` and return the :class:`Metric`.

    Raises:
        ConfigError: Bad name or needs, or the name is taken (pass ``overwrite=True``).
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", name):
        raise ConfigError(f"metric names are identifiers like 'my_metric' or 'my.metric-v1', got {name!r}.")
    if not callable(fn):
        raise ConfigError(f"metric {name!r}: fn must be callable, got {type(fn).__name__}.")
    needs = (needs,) if isinstance(needs, str) else tuple(needs)
    bad = [n for n in needs if n not in KNOWN_NEEDS]
    if bad:
        raise ConfigError(f"metric {name!r}: unknown needs {bad}; choose from {list(KNOWN_NEEDS)}.")
    if name in _REGISTRY and not overwrite:
        raise ConfigError(f"metric {name!r} is already registered; pass overwrite=True to replace it.")
    metric = Metric(name, fn, needs, description or (inspect.getdoc(fn) or "").split("\n")[0])
    _REGISTRY[name] = metric
    return metric


def get_metric(name: str) -> Metric:
    """The registered metric ``name``; ``"extract->NAME"`` gives :func:`extract_then` of it.

    Raises:
        ConfigError: No such metric (the message names the closest ones).
    """
    if isinstance(name, str) and name.startswith(_EXTRACT_PREFIX):
        return extract_then(name[len(_EXTRACT_PREFIX):])
    if name not in _REGISTRY:
        raise ConfigError(
            f"unknown metric {name!r}; registered metrics are {sorted(_REGISTRY)}."
            + did_you_mean(str(name), _REGISTRY)
            + " Register new ones with collab_env.rewards.metrics.register_metric()."
        )
    return _REGISTRY[name]


def list_metrics() -> list[str]:
    """Names of the registered metrics, sorted."""
    return sorted(_REGISTRY)


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------
def reference_of(item: Mapping[str, Any]) -> str:
    """The reference answer of an item: ``single_turn_completion``, ``answer`` or ``reference``."""
    for key in ("single_turn_completion", "answer", "reference"):
        if key in item and item[key] is not None:
            return str(item[key])
    raise ConfigError(
        f"the item has no reference answer: expected one of 'single_turn_completion', 'answer', "
        f"'reference' (it has {sorted(item)})."
    )


def problem_of(item: Mapping[str, Any]) -> str:
    """The problem statement of an item: ``single_turn_prompt``, ``problem``, ``question`` or
    ``prompt`` (a chat prompt is joined)."""
    for key in ("single_turn_prompt", "problem", "question", "prompt"):
        v = item.get(key)
        if v is None:
            continue
        if isinstance(v, str):
            return v
        if isinstance(v, list):
            return "\n\n".join(str(m.get("content", "")) if isinstance(m, Mapping) else str(m) for m in v)
        return str(v)
    raise ConfigError(
        f"a judge prompt needs the problem, but the item has none of 'single_turn_prompt', "
        f"'problem', 'question', 'prompt' (it has {sorted(item)})."
    )


def _is_public(m: Message) -> bool:
    return m.audience is None


def _assistant_messages(conversation: Conversation, ctx: Mapping[str, Any]) -> list[Message]:
    """Public assistant messages: by ``ctx["player"]`` when given, else by chat role."""
    player = ctx.get("player")
    return [m for m in conversation if _is_public(m)
            and (m.author == player if player is not None else m.role == "assistant")]


def _add_usage(total: dict[str, float], part: Mapping[str, Any]) -> None:
    for k, v in part.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            total[k] = total.get(k, 0.0) + float(v)


def _judge_for(metric: str, preset: str, ctx: Mapping[str, Any], key: str = "judge"):
    """``ctx[key]`` (a judge, or a mapping metric name -> judge), else a preset judge on
    ``ctx[key + "_backend"]``."""
    judge = ctx.get(key)
    if isinstance(judge, Mapping):
        judge = judge.get(metric)
    if judge is not None:
        return judge
    backend = ctx.get(f"{key}_backend")
    if backend is None:
        raise ConfigError(
            f"metric {metric!r} needs an LLM judge: pass ctx[{key!r}] (an LLMJudge, e.g. "
            f"LLMJudge.preset({preset!r}, backend)) or ctx['{key}_backend'] (a policy or backend id)."
        )
    from collab_env.agents.judges import LLMJudge  # lazy: keeps `import collab_env` light

    return LLMJudge.preset(preset, backend)


async def _extract(conversation: Conversation, item: Mapping[str, Any], extractor: Any) -> tuple[str, dict]:
    fields = getattr(extractor, "fields", None)
    kw: dict[str, Any] = {"conversation": conversation}
    if fields is None or "problem" in fields:  # a document extractor reads the chat only
        kw["problem"] = problem_of(item)
    result = await extractor.score(**kw)
    return str(result.score), dict(result.usage)


async def _final_text(conversation: Conversation, item: Mapping[str, Any], ctx: Mapping[str, Any],
                      *, use_extractor: bool, metric: str = "") -> tuple[str | None, str, dict[str, float]]:
    """The final artefact: (text or None, where it came from, usage). An extractor given as a
    mapping is looked up by ``metric``."""
    if ctx.get("extracted") is not None:
        return str(ctx["extracted"]), "extracted", {}
    if use_extractor:
        for key in ("document_extractor", "extractor"):
            ex = ctx.get(key)
            if isinstance(ex, Mapping):  # {metric name: extractor}, like ctx["judge"]
                ex = ex.get(metric)
            if ex is not None:
                text, usage = await _extract(conversation, item, ex)
                return text, key, usage
    msgs = _assistant_messages(conversation, ctx)
    return (msgs[-1].content if msgs else None), "last_assistant_message", {}


# ---------------------------------------------------------------------------------------------
# accuracy_rule
# ---------------------------------------------------------------------------------------------
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed_text(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text``, braces balanced;
    ``None`` when there is none (or the last one is never closed)."""
    last = None
    for m in _BOX_OPEN.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            last = text[m.end():i - 1]
    return last


_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox|mathbf)\s*\{([^{}]*)\}")


def _normalise(s: str) -> str:
    """Canonical spelling of an answer for exact comparison."""
    s = s.strip()
    s = _TEXT_CMD.sub(r"\1", s)
    for a, b in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
                 ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""), ("$", ""), ("^\\circ", ""),
                 ("^{\\circ}", ""), ("\\%", ""), ("%", "")):
        s = s.replace(a, b)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d*)?", s):  # 1,000 -> 1000
        s = s.replace(",", "")
    return s


def _as_number(s: str) -> float | None:
    """``s`` as a float when it is a plain number or a simple fraction."""
    m = re.fullmatch(r"([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}", s) or \
        re.fullmatch(r"([-+]?)(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", s)
    try:
        if m:
            v = float(m.group(2)) / float(m.group(3))
            return -v if m.group(1) == "-" else v
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def _latex_to_sympy_text(s: str) -> str:
    """A best-effort rewrite of simple LaTeX into a string ``sympy.sympify`` reads."""
    prev = None
    while prev != s:  # innermost first, until nothing changes
        prev = s
        s = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        s = re.sub(r"\\sqrt\[([^{}\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", s)
        s = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", s)
    for a, b in (("\\cdot", "*"), ("\\times", "*"), ("\\pi", "pi"), ("^", "**"), ("{", "("),
                 ("}", ")"), ("\\", "")):
        s = s.replace(a, b)
    return s


_SAFE_NAMES = frozenset({"sqrt", "pi", "E", "I", "oo", "log", "ln", "exp", "sin", "cos", "tan"})


def _unsafe_for_sympify(t: str) -> str | None:
    """Why ``t`` must not reach ``sympify`` (which evaluates Python), or ``None``.

    Model text is untrusted: only arithmetic on numbers, one-letter symbols and a few math
    functions is allowed, and no power towers (``9**9**9`` would take forever to evaluate).
    """
    if not re.fullmatch(r"[0-9A-Za-z+\-*/().,\s]*", t):
        return "characters outside arithmetic"
    names = set(re.findall(r"[A-Za-z]{2,}", t)) - _SAFE_NAMES
    if names:
        return f"unknown names {sorted(names)}"
    if t.count("**") > 1 or any(len(x) > 3 for x in re.findall(r"\*\*\s*\(*\s*(\d+)", t)):
        return "a large power"
    return None


def _sympy_equal(a: str, b: str) -> tuple[bool, str | None]:
    """Whether two answers are symbolically equal; (False, error) when either cannot be parsed."""
    if len(a) > 200 or len(b) > 200:  # simplify can take very long on large inputs
        return False, "answer too long for a symbolic comparison"
    sympy = require("sympy", "rewards", "the accuracy_rule metric's symbolic comparison")
    try:
        try:
            import antlr4  # noqa: F401
            from sympy.parsing.latex import parse_latex  # needs antlr4; usually absent
        except ImportError:
            parse_latex = None
        if parse_latex is not None:
            ea, eb = parse_latex(a), parse_latex(b)
        else:
            ta, tb = _latex_to_sympy_text(a), _latex_to_sympy_text(b)
            for t in (ta, tb):
                unsafe = _unsafe_for_sympify(t)
                if unsafe:
                    return False, f"not compared symbolically: {unsafe} in {t!r:.80}"
            ea, eb = sympy.sympify(ta), sympy.sympify(tb)
        return bool(sympy.simplify(ea - eb) == 0), None
    except Exception as exc:  # noqa: BLE001 - unparseable answers are "not equal", recorded
        return False, f"{type(exc).__name__}: {exc}"[:300]


def answers_equal(answer: str, reference: str) -> tuple[bool, dict[str, Any]]:
    """Whether ``answer`` equals ``reference``: exact after normalisation, numerically, or
    symbolically (sympy). Returns the verdict and how it was reached."""
    a, r = _normalise(answer), _normalise(reference)
    if a == r:
        return True, {"match": "exact"}
    na, nr = _as_number(a), _as_number(r)
    if na is not None and nr is not None:
        return math.isclose(na, nr, rel_tol=1e-9, abs_tol=1e-12), {"match": "numeric"}
    ok, err = _sympy_equal(a, r)
    detail: dict[str, Any] = {"match": "sympy"}
    if err is not None:
        detail["parse_error"] = err
    return ok, detail


async def accuracy_rule(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                        **ctx: Any) -> MetricResult:
    """1.0 when the last ``\\boxed{}`` answer of the assistant equals the reference, else 0.0.

    The answer is the last box in the last assistant message that has one (whole conversation;
    with :func:`extract_then`, the extracted text: its last box, or all of it). The reference is
    ``item["single_turn_completion"]`` (or ``answer`` / ``reference``), its last box if boxed.
    Equality: exact after normalisation, numeric, or sympy; unparseable means unequal and is
    recorded in ``detail["parse_error"]``.
    """
    reference = reference_of(item)
    ref = extract_boxed_text(reference)
    ref = ref if ref is not None else reference.strip()
    if ctx.get("extracted") is not None:
        text = str(ctx["extracted"])
        box = extract_boxed_text(text)
        answer = box if box is not None else text.strip()
    else:
        answer = None
        for m in reversed(_assistant_messages(conversation, ctx)):
            answer = extract_boxed_text(m.content)
            if answer is not None:
                break
    if answer is None:
        return MetricResult(0.0, {"answer": None, "reference": ref, "reason": "no boxed answer"})
    ok, how = answers_equal(answer, ref)
    return MetricResult(1.0 if ok else 0.0, {"answer": answer, "reference": ref, **how})


# ---------------------------------------------------------------------------------------------
# Judge metrics
# ---------------------------------------------------------------------------------------------
async def accuracy(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                   **ctx: Any) -> MetricResult:
    """1.0/0.0: an LLM judge (preset ``"accuracy"``) decides whether the conversation reached
    the reference answer.

    ctx: ``judge`` (an LLMJudge, or ``{"accuracy": judge}``) or ``judge_backend``. The judge
    sees the whole public conversation. A judge with no readable verdict raises ``JudgeError``.
    """
    judge = _judge_for("accuracy", "accuracy", ctx)
    res = await judge.score(problem=problem_of(item), conversation=conversation, reference=reference_of(item))
    return MetricResult(1.0 if res.score else 0.0, {"reason": res.reason, "judge": judge.name}, dict(res.usage))


async def interactivity(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                        **ctx: Any) -> MetricResult:
    """0..1: an LLM judge rates how well the assistant collaborated.

    ctx: ``rubric``: ``"verl"`` (default; mean of understanding, clarification, suggestions)
    or ``"paper"`` (the paper's three-anchor scale); ``judge`` (an LLMJudge, or
    ``{"interactivity": judge}``) or ``judge_backend``.
    """
    rubric = ctx.get("rubric", "verl")
    presets = {"verl": "interactivity", "paper": "interactivity_paper"}
    if rubric not in presets:
        raise ConfigError(f"interactivity: rubric must be one of {list(presets)}, got {rubric!r}.")
    judge = _judge_for("interactivity", presets[rubric], ctx)
    res = await judge.score(conversation=conversation)
    detail = {"reason": res.reason, "rubric": rubric, "judge": judge.name, **{k: float(v) for k, v in res.components.items()}}
    return MetricResult(float(res.score), detail, dict(res.usage))


# ---------------------------------------------------------------------------------------------
# token_amount
# ---------------------------------------------------------------------------------------------
def _count(text: str, tokenizer: Any) -> int:
    if tokenizer is None:
        return len(text.split())
    if not hasattr(tokenizer, "encode"):
        raise ConfigError(f"ctx['tokenizer'] must have .encode(text), got {type(tokenizer).__name__}.")
    try:
        params = inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        params = {}
    takes_kw = "add_special_tokens" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    ids = tokenizer.encode(text, add_special_tokens=False) if takes_kw else tokenizer.encode(text)
    return len(ids)


async def token_amount(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                       **ctx: Any) -> MetricResult:
    """Raw count of words (whitespace-split) or, with ``ctx["tokenizer"]``, tokens.

    ctx ``scope``: ``"future"`` (default, as the verl recipe: every message from ``start``),
    ``"assistant"`` (assistant messages of the whole conversation) or ``"all"``. System
    messages and messages with a restricted audience (hidden goals) are never counted.
    The weight (e.g. ``-1e-4``) is applied by the caller.
    """
    scope: Literal["future", "assistant", "all"] = ctx.get("scope", "future")
    public = [m for m in conversation if _is_public(m) and m.role != "system"]
    if scope == "future":
        msgs = [m for m in conversation[start:] if _is_public(m) and m.role != "system"]
    elif scope == "assistant":
        msgs = _assistant_messages(conversation, ctx)
    elif scope == "all":
        msgs = public
    else:
        raise ConfigError(f"token_amount: scope must be 'future', 'assistant' or 'all', got {scope!r}.")
    tokenizer = ctx.get("tokenizer")
    n = sum(_count(m.content, tokenizer) for m in msgs)
    return MetricResult(float(n), {"scope": scope, "unit": "tokens" if tokenizer is not None else "words",
                                   "messages": len(msgs)})


# ---------------------------------------------------------------------------------------------
# BLEU
# ---------------------------------------------------------------------------------------------
def char_bleu(reference: str, hypothesis: str, max_n: int = 4) -> float:
    """The CollabLLM recipe's BLEU: nltk's ``sentence_bleu([reference], hypothesis)`` called on
    *strings*, so its tokens are characters. Computed here without nltk, step for step:

    * ``p_n`` (``n = 1..max_n``): clipped character n-gram matches over the hypothesis' n-gram
      count (the count is at least 1, so a hypothesis shorter than ``n`` has ``p_n = 0/1``);
    * no unigram match (or an empty hypothesis): ``0.0``;
    * a ``p_n`` of 0 otherwise becomes the smallest positive float (nltk's ``method0``, no
      smoothing), which leaves a tiny positive score (~1e-77) instead of 0;
    * ``BLEU = BP * exp(sum_n log(p_n) / max_n)`` with ``BP = 1`` when the hypothesis is longer
      than the reference, else ``exp(1 - len(reference) / len(hypothesis))``.
    """
    if max_n < 1:
        raise ConfigError(f"char_bleu: max_n must be >= 1, got {max_n!r}.")
    precisions = []
    for n in range(1, max_n + 1):
        hyp = Counter(hypothesis[i:i + n] for i in range(len(hypothesis) - n + 1))
        ref = Counter(reference[i:i + n] for i in range(len(reference) - n + 1))
        clipped = sum(min(c, ref[g]) for g, c in hyp.items())
        precisions.append((clipped, max(1, sum(hyp.values()))))
    if precisions[0][0] == 0:
        return 0.0
    weight = 1.0 / max_n
    logs = [weight * (math.log(num / den) if num else math.log(sys.float_info.min)) for num, den in precisions]
    c, r = len(hypothesis), len(reference)
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return bp * math.exp(math.fsum(logs))


#: The document-extraction rubric of the BLEU metrics (our wording of the recipe's step: write
#: out the final document, every revision merged in). Field: ``conversation``.
EXTRACT_DOCUMENT_PROMPT = """\
Below is a conversation in which an AI assistant wrote or edited a document (an article, an \
essay, a report...) for a user.

<conversation>
{conversation}
</conversation>

Write out the document as it stands at the end of the conversation: the latest version of every \
part the assistant wrote, with all later revisions and additions merged in, and nothing else \
(no comments, no questions, no text that is not part of the document). If the assistant never \
wrote any of the document, write NONE.

Reply with only a JSON object:
{{"document": "<the final document>"}}"""


def document_extractor(backend: Any, *, prefill: bool = False, **overrides: Any):
    """An LLM judge that writes out the final document of a conversation
    (:data:`EXTRACT_DOCUMENT_PROMPT`, ``score_type="text"``), for ``ctx["document_extractor"]``
    of the BLEU metrics: the recipe extracts the document before it computes BLEU.

    Args:
        backend: A policy (or a reference ``resolve_policy`` accepts) that answers the prompt.
        prefill: Start the reply with ``{"document": "`` on backends that can continue a reply
            (small local models need it to stay in the JSON format).
        **overrides: Other ``LLMJudge`` settings (``max_new_tokens``, ``max_retries``...).
    """
    from collab_env.agents.judges import LLMJudge  # lazy: keeps `import collab_env` light

    kw: dict[str, Any] = dict(prompt_template=EXTRACT_DOCUMENT_PROMPT, score_type="text", score_range=None,
                              score_keys=("document",), max_new_tokens=2048)
    kw.update(overrides)
    if prefill:
        kw.setdefault("response_prefix", '{"document": "')
    kw.setdefault("name", "extract_document")
    return LLMJudge(backend, **kw)


async def _bleu(conversation, item, ctx, kind: str, metric: str) -> MetricResult:
    text, source, usage = await _final_text(conversation, item, ctx, use_extractor=True, metric=metric)
    reference = reference_of(item)
    if text is None:
        return MetricResult(0.0, {"source": source, "reason": "no assistant message"}, usage)
    if kind == "word":
        sacrebleu = require("sacrebleu", "rewards", "the bleu_word metric")
        value = sacrebleu.sentence_bleu(text, [reference]).score / 100.0
    else:
        value = char_bleu(reference, text)
    return MetricResult(float(value), {"source": source, "unit": kind, "hypothesis_chars": len(text)}, usage)


async def bleu_score(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                     **ctx: Any) -> MetricResult:
    """Character-level BLEU in [0, 1] (:func:`char_bleu`), the CollabLLM recipe's ``bleu_score``,
    of the final text (the extracted document with ``ctx["document_extractor"]``, see the module
    docstring) against the reference."""
    return await _bleu(conversation, item, ctx, "char", "bleu_score")


async def bleu_word(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                    **ctx: Any) -> MetricResult:
    """Word-level sentence BLEU in [0, 1] (``sacrebleu.sentence_bleu(text, [ref]).score / 100``)
    of the same final text as ``bleu_score``."""
    return await _bleu(conversation, item, ctx, "word", "bleu_word")


# ---------------------------------------------------------------------------------------------
# pass_rate
# ---------------------------------------------------------------------------------------------
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code_block(text: str) -> str | None:
    """The last fenced code block (```` ```python ```` or untagged) of ``text``, or ``None``."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else None


def _tests_of(item: Mapping[str, Any]) -> str:
    meta = item.get("single_turn_metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            meta = None
    if isinstance(meta, Mapping) and isinstance(meta.get("test"), str):
        return meta["test"]
    if isinstance(item.get("tests"), str):
        return item["tests"]
    raise ConfigError(
        "pass_rate needs the item's tests: item['single_turn_metadata']['test'] or item['tests'] "
        f"(a string of Python that raises on failure); the item has {sorted(item)}."
    )


async def pass_rate(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0,
                    **ctx: Any) -> MetricResult:
    """1.0 when the final Python code block passes the item's tests in the sandbox, else 0.0.

    The code is the last fenced block of the last assistant message that has one (with
    :func:`extract_then`: of the extracted text, or the whole text). ctx: ``sandbox`` (a
    :class:`~collab_env.rewards.sandbox.SandboxPool`, optional), ``sandbox_limits``.
    ``detail["status"]`` is the sandbox status; a broken sandbox raises ``SandboxError``.
    """
    from collab_env.rewards.sandbox import SandboxLimits, arun_python

    tests = _tests_of(item)
    if ctx.get("extracted") is not None:
        text = str(ctx["extracted"])
        code = extract_code_block(text)
        code = code if code is not None else text
    else:
        code = None
        for m in reversed(_assistant_messages(conversation, ctx)):
            code = extract_code_block(m.content)
            if code is not None:
                break
    if code is None:
        return MetricResult(0.0, {"status": "no_code"})
    pool = ctx.get("sandbox")
    limits = ctx.get("sandbox_limits")
    if pool is not None:
        res = await pool.run(code, tests=tests, limits=limits)
    else:
        res = await arun_python(code, tests=tests, limits=limits or SandboxLimits())
    return MetricResult(1.0 if res.status == "passed" else 0.0,
                        {"status": res.status, "detail": res.detail, "duration_s": res.duration_s})


# ---------------------------------------------------------------------------------------------
# extract -> metric
# ---------------------------------------------------------------------------------------------
def extract_then(metric_name: str, extractor: Any = None) -> Metric:
    """The CollabLLM "extract -> metric" form: an LLM extractor copies out the final artefact
    (judge preset ``"extract_answer"``), then ``metric_name`` scores that text.

    Args:
        metric_name: A registered metric that scores the final artefact (``accuracy_rule``,
            ``bleu_score``, ``bleu_word``, ``pass_rate``...).
        extractor: An ``LLMJudge`` with ``score_type="text"``; ``None`` reads ``ctx["extractor"]``
            (a judge, ``{metric_name: judge}``) or builds one from ``ctx["extractor_backend"]``.
    """
    inner = get_metric(metric_name)
    name = _EXTRACT_PREFIX + metric_name

    async def fn(conversation: Conversation, item: Mapping[str, Any], *, start: int = 0, **ctx: Any) -> MetricResult:
        ex = extractor if extractor is not None else _judge_for(name, "extract_answer", ctx, key="extractor")
        text, usage = await _extract(conversation, item, ex)
        inner_ctx = {k: v for k, v in ctx.items() if k != "extractor"}
        res = await inner(conversation, item, start=start, **{**inner_ctx, "extracted": text})
        _add_usage(usage, res.usage)
        return MetricResult(res.value, {**res.detail, "extracted": text}, usage)

    needs = tuple(dict.fromkeys(("extractor",) * (extractor is None) + inner.needs))
    return Metric(name, fn, needs, f"{inner.name} of the LLM-extracted final artefact")


register_metric("accuracy_rule", accuracy_rule)
register_metric("accuracy", accuracy, needs=("judge",))
register_metric("interactivity", interactivity, needs=("judge",))
register_metric("token_amount", token_amount)
register_metric("bleu_score", bleu_score)
register_metric("bleu_word", bleu_word)
# The old name of the character BLEU, kept so that configs written for it keep their meaning.
register_metric("bleu_char", bleu_score, description="Alias of bleu_score (character-level BLEU).")
register_metric("pass_rate", pass_rate, needs=("sandbox",))
