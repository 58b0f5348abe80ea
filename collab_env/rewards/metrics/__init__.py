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

The package, one job a module: :mod:`~collab_env.rewards.metrics.registry` (:class:`Metric`,
:class:`MetricResult`, the registry, :func:`extract_then`), :mod:`~collab_env.rewards.metrics.context`
(what metrics read: reference, problem, messages, judges, final text) and the built-in metrics:
:mod:`~collab_env.rewards.metrics.answers` (``accuracy_rule``), :mod:`~collab_env.rewards.metrics.judged`
(``accuracy``, ``interactivity``), :mod:`~collab_env.rewards.metrics.tokens` (``token_amount``),
:mod:`~collab_env.rewards.metrics.bleu` (``bleu_score``, ``bleu_word``) and
:mod:`~collab_env.rewards.metrics.programs` (``pass_rate``). This module registers them.
"""

from __future__ import annotations

from collab_env.rewards.metrics.answers import accuracy_rule, answers_equal, extract_boxed_text
from collab_env.rewards.metrics.bleu import (
    EXTRACT_DOCUMENT_PROMPT,
    bleu_score,
    bleu_word,
    char_bleu,
    document_extractor,
)
from collab_env.rewards.metrics.context import problem_of, reference_of
from collab_env.rewards.metrics.judged import accuracy, interactivity
from collab_env.rewards.metrics.programs import pass_rate
from collab_env.rewards.metrics.registry import KNOWN_NEEDS as KNOWN_NEEDS
from collab_env.rewards.metrics.registry import (
    Metric,
    MetricFn,
    MetricResult,
    extract_then,
    get_metric,
    list_metrics,
    register_metric,
)
from collab_env.rewards.metrics.tokens import token_amount

__all__ = [
    "Metric",
    "MetricResult",
    "MetricFn",
    "register_metric",
    "get_metric",
    "list_metrics",
    "extract_then",
    "extract_boxed_text",
    "answers_equal",
    "char_bleu",
    "document_extractor",
    "EXTRACT_DOCUMENT_PROMPT",
    "reference_of",
    "problem_of",
]


register_metric("accuracy_rule", accuracy_rule)
register_metric("accuracy", accuracy, needs=("judge",))
register_metric("interactivity", interactivity, needs=("judge",))
register_metric("token_amount", token_amount)
register_metric("bleu_score", bleu_score)
register_metric("bleu_word", bleu_word)
# The old name of the character BLEU, kept so that configs written for it keep their meaning.
register_metric("bleu_char", bleu_score, description="Alias of bleu_score (character-level BLEU).")
register_metric("pass_rate", pass_rate, needs=("sandbox",))
