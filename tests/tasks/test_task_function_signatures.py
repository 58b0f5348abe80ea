"""collab_env.tasks.task_functions.signature_of keeps each function's signature while the function
lives, and only then: building an env reads them again, and a kept signature must not keep a
function (or what its closure holds) alive."""

from __future__ import annotations

import gc
import inspect
import weakref

from collab_env.tasks.task_functions import signature_of


def test_a_signature_is_kept_while_its_function_lives_and_never_keeps_it_alive():
    big = bytearray(1 << 20)

    def reward(prompt, completions, *, item=None):
        return [len(big)] * len(completions)

    first = signature_of(reward)
    assert first == inspect.signature(reward) and signature_of(reward) is first  # kept
    ref = weakref.ref(reward)
    del reward
    gc.collect()
    assert ref() is None  # the cache held it weakly


def test_callables_that_cannot_be_held_weakly_or_have_no_signature():
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, prompt, completions):
            return [0.0] * len(completions)

    assert list(signature_of(Unhashable()).parameters) == ["prompt", "completions"]
    assert signature_of(len) == inspect.signature(len)
    bound = Unhashable().__call__
    assert list(signature_of(bound).parameters) == ["prompt", "completions"]
