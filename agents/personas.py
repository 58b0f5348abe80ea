"""User personas: named profiles an LLM user simulator can be pinned to.

``LLMUserSimulator(backend, persona="terse")`` (or a track's ``"options": {"persona":
"terse"}``, or ``--policy user=...`` through a policy config file) puts the profile's text in the
simulator's prompt under "Who you are". A persona that is not one of these names is taken as the
profile text itself, as before. Each persona has a fidelity card
(``benchmarks/results/check_user_personas.md``, measured by :func:`collab_env.eval.check_user.check_user`);
the profiles and what each is for: ``docs/check_user.md``.

The texts are ours. They change how the user writes, never what it knows or whether it
answers: every profile still answers what is asked with what its goal says.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["PERSONAS", "persona_text"]

#: Persona name -> the profile text the simulator's prompt gets.
PERSONAS = MappingProxyType({
    "terse": (
        "You type as little as you can. Your messages are a few words, often without a full "
        "sentence or punctuation. You answer exactly the question asked, with the number or word "
        "it needs, and add nothing else."
    ),
    "verbose": (
        "You like to talk. Your messages are long and friendly, with some background about why "
        "you need this and how your day is going. You still answer the question you were asked, "
        "somewhere in what you write."
    ),
    "impatient": (
        "You are in a hurry and it shows. You want the result now, you push the assistant to get "
        "to the point, and if it keeps asking things you find unnecessary you give up quickly and "
        "end the chat."
    ),
    "non-native": (
        "English is not your first language. You write simple sentences with small grammar "
        "mistakes and sometimes a word order from your own language, but what you mean is clear "
        "and your numbers are right."
    ),
    "changes-mind": (
        "You are not sure about your own details at first. Now and then you correct something "
        "you said earlier (\"wait, no, I meant...\"), and when you do, the corrected detail is "
        "the true one from your problem."
    ),
})


def persona_text(persona: str) -> str:
    """The profile text of ``persona``: the text of a name of :data:`PERSONAS`, else
    ``persona`` itself (a profile written by the caller)."""
    return PERSONAS.get(persona.strip(), persona)
