"""CoMLRL's coding tasks on HumanEval, offline: ``coop-humaneval`` (two agents write one solution:
a helper ``aux`` and the main function that may call it) and ``humaneval`` (one agent, the
single-agent baseline).

The reference is CoMLRL's code-generation experiments (OpenMLRL/LLM_Collab_Code_Generation:
``train_magrpo.py`` for the split and the prompts, ``rewards/code_rewards.py`` and
``rewards/code_utils.py`` for the reward, ``external/{level_feedback,passed,plain}.py`` for the
multi-turn feedback). Everything here is written anew from reading it; where a user asks for the
reference's behaviour by name (the reward, a feedback mode) they get its rules exactly, the odd
ones included (each is pointed out where it is reproduced).

The split
    ``aux`` (agent 0) is asked for a helper function named ``aux`` for the problem; ``main``
    (agent 1) for the problem's entry-point function, told that ``aux(...)`` exists and may be
    called but must not be redefined. The two agents answer at once and do not see each other's
    text (CoMLRL agents generate independently). The solution the tests run is composed as the
    reference composes it: the prompt's import lines, then the ``aux`` function extracted from
    agent 0's text, then the entry-point function extracted from agent 1's (see
    :func:`cleanup_code`, :func:`extract_function`, :func:`compose_solution`): any other text,
    and any other function, is dropped.

The reward (:func:`comlrl_code_reward`, CoMLRL's ``execution_reward_aux``), in ``[0, 4]``
    Level 1: +0.4 when ``aux`` is defined with a ``return`` (optional), +0.6 when the entry
    point is (required: without it the reward stops here). Level 2: +0.5 when the composed code
    parses (required). Level 3: + the fraction of the problem's asserts that pass, each assert of
    ``check(candidate)`` run on its own with ``candidate`` replaced by the entry point's name
    (in the sandbox, one process per assert, 10 s each; after 3 timeouts the remaining asserts
    count as failed, as in the reference); then, when at least one assert passed and ``aux`` was
    extracted: +0.5 if the main function calls ``aux``, and then +1.0 if it is not a thin wrapper
    (its body is not just ``return aux(...)`` or ``r = aux(...); return r``) and -0.5 if a line
    is a bare call of ``aux`` whose result is dropped. The single-agent ``humaneval`` env scores
    its one answer as the main function with an empty ``aux`` (CoMLRL's 1-agent rule), so its
    reward is in ``[0, 2.1]``.

Multi-turn feedback (``num_turns > 1``; ``feedback=``)
    ``"level_feedback"`` (default, CoMLRL's default mode): the static check (each definition
    found or missing, the syntax of the composed code with the error's line and column), then
    the tests run in the sandbox and every failing one shown with its error; by default only
    the first assert of ``check`` is run for feedback (CoMLRL's ``sandbox_slice=1``; pass
    ``sandbox_slice=0`` for all), so the agents get the first failing assert. The main agent
    also hears whether it calls ``aux``. ``"passed"``: the agent's previous function and one
    signal, all levels passed or not. ``"plain"``: the previous function and a request to
    revise. Each next prompt is the agent's next user message; the earlier turns stay in its
    conversation. Every turn is scored.

Faults: a sandbox that cannot run raises :class:`~collab_env.errors.SandboxError`, which the
env reports as a :class:`~collab_env.errors.TaskFunctionError` naming the reward: an
infrastructure failure is an error, never a zero.

The package, one module per job (import from ``collab_env.tasks.coop_code``; the modules import
each other directly)
    :mod:`~collab_env.tasks.coop_code.static` (reading the answers: extraction, Levels 1-2, the
    Level 3 checks), :mod:`~collab_env.tasks.coop_code.reward` (the asserts in the sandbox and the
    reward), :mod:`~collab_env.tasks.coop_code.prompts` (the first prompts),
    :mod:`~collab_env.tasks.coop_code.feedback` (the next prompts of multi-turn episodes),
    :mod:`~collab_env.tasks.coop_code.canonical` (the reference solutions split and the policy
    playing them), :mod:`~collab_env.tasks.coop_code.envs` (the envs and their options).
"""

from __future__ import annotations

from collab_env.tasks.cards import cards_section
from collab_env.tasks.code_cards import CODE_CARDS
from collab_env.tasks.coop_code.canonical import CanonicalCoder, canonical_split, solution_program
from collab_env.tasks.coop_code.envs import CodeConfig, make_coop_humaneval_env, make_humaneval_env
from collab_env.tasks.coop_code.feedback import (
    FEEDBACK_MODES,
    level_feedback,
    passed_feedback,
    plain_feedback,
    sliced_tests,
)
from collab_env.tasks.coop_code.prompts import aux_formatter, main_formatter, single_formatter
from collab_env.tasks.coop_code.reward import (
    MAX_TIMEOUTS,
    TEST_LIMITS,
    CodeReport,
    analyze,
    comlrl_code_reward,
    humaneval_reward,
    run_asserts,
    score,
)
from collab_env.tasks.coop_code.static import (
    AUX,
    calls_aux,
    check_definition,
    check_syntax,
    cleanup_code,
    compose_solution,
    extract_asserts,
    extract_function,
    ignored_aux_calls,
    is_thin_wrapper,
    prompt_imports,
)

__all__ = [
    "AUX",
    "FEEDBACK_MODES",
    "TEST_LIMITS",
    "MAX_TIMEOUTS",
    "cleanup_code",
    "extract_function",
    "check_definition",
    "check_syntax",
    "prompt_imports",
    "compose_solution",
    "extract_asserts",
    "calls_aux",
    "is_thin_wrapper",
    "ignored_aux_calls",
    "CodeReport",
    "analyze",
    "score",
    "run_asserts",
    "comlrl_code_reward",
    "humaneval_reward",
    "aux_formatter",
    "main_formatter",
    "single_formatter",
    "level_feedback",
    "passed_feedback",
    "plain_feedback",
    "sliced_tests",
    "canonical_split",
    "solution_program",
    "CanonicalCoder",
    "CodeConfig",
    "make_coop_humaneval_env",
    "make_humaneval_env",
]

__doc__ = (__doc__ or "") + cards_section(CODE_CARDS, "collab_env.tasks.code_cards")
