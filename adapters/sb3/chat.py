"""What the stable-baselines3 adapter reads from a visible chat, shared by its modules."""

from __future__ import annotations

import re
from typing import Any

from collab_env.types import Conversation

__all__ = ["ENV_AUTHOR", "NUMBER", "read_facts"]

#: The author of the env's own messages (rules, instructions): neither the player nor another.
ENV_AUTHOR = "env"
#: A number written in a message (integer or decimal).
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def read_facts(observation: Conversation) -> dict[str, Any] | None:
    """What a ``hidden-facts*`` assistant's visible chat tells
    (:func:`collab_env.tasks.hidden_facts.visible_facts`), or ``None`` for any other chat."""
    from collab_env.tasks.hidden_facts import visible_facts

    return visible_facts(observation)
