"""The metric registry: :class:`Metric`, :class:`MetricResult` and the names they are found by.

:func:`register_metric` adds a metric, :func:`get_metric` finds one (``"extract->NAME"`` gives
:func:`extract_then` of it), :func:`list_metrics` lists them. The built-in metrics live in the
sibling modules and are registered by :mod:`collab_env.rewards.metrics`.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from collab_env.errors import ConfigError, TaskFunctionError, did_you_mean
from collab_env.policy import add_usage
from collab_env.rewards.metrics.context import judge_for, run_extractor
from collab_env.types import Conversation

__all__ = [
    "MetricFn",
    "KNOWN_NEEDS",
    "MetricResult",
    "Metric",
    "register_metric",
    "get_metric",
    "list_metrics",
    "extract_then",
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
        ex = extractor if extractor is not None else judge_for(name, "extract_answer", ctx, key="extractor")
        text, usage = await run_extractor(conversation, item, ex)
        inner_ctx = {k: v for k, v in ctx.items() if k != "extractor"}
        res = await inner(conversation, item, start=start, **{**inner_ctx, "extracted": text})
        add_usage(usage, res.usage)
        return MetricResult(res.value, {**res.detail, "extracted": text}, usage)

    needs = tuple(dict.fromkeys(("extractor",) * (extractor is None) + inner.needs))
    return Metric(name, fn, needs, f"{inner.name} of the LLM-extracted final artefact")
