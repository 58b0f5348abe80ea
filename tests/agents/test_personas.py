"""Personas: a name pins its profile text in the LLM user simulator's prompt; other text is the profile."""

from __future__ import annotations

import pytest

import collab_env
from collab_env.agents.personas import PERSONAS, persona_text
from collab_env.agents.users import LLMUserSimulator
from collab_env.policy import FixedTextPolicy, resolve_policy


def _user_prompt(sim: LLMUserSimulator) -> str:
    env = collab_env.make("hidden-facts-v3")
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step({"assistant": "How many pears do you need?"})
    return sim.build_prompt(obs["user"])[-1].content


def test_the_documented_personas_are_there():
    assert set(PERSONAS) == {"terse", "verbose", "impatient", "non-native", "changes-mind"}
    assert len(set(PERSONAS.values())) == len(PERSONAS)


@pytest.mark.parametrize("name", sorted(PERSONAS))
def test_a_persona_name_puts_its_profile_in_the_prompt(name):
    prompt = _user_prompt(LLMUserSimulator(FixedTextPolicy("hi"), persona=name))
    assert "## Who you are\n" + PERSONAS[name] in prompt
    others = [t for n, t in PERSONAS.items() if n != name]
    assert not any(t in prompt for t in others)


def test_free_text_is_still_the_profile_and_no_persona_adds_none():
    assert persona_text("a retired sailor") == "a retired sailor"
    assert "## Who you are\na retired sailor" in _user_prompt(LLMUserSimulator(FixedTextPolicy("hi"),
                                                                               persona="a retired sailor"))
    assert "## Who you are" not in _user_prompt(LLMUserSimulator(FixedTextPolicy("hi")))


def test_a_spec_pins_a_persona_as_a_track_does():
    sim = resolve_policy({"kind": "llm-user", "backend": "collab_env.policy:FixedTextPolicy",
                          "options": {"persona": "terse"}})
    assert PERSONAS["terse"] in _user_prompt(sim)  # type: ignore[arg-type]
