"""The reference solutions split as the task prescribes (:func:`canonical_split`), the program
HumanEval's own tests run on a joint answer (:func:`solution_program`), and the policy that plays
the split (:class:`CanonicalCoder`, the oracle baseline of both envs).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from collab_env.errors import ConfigError
from collab_env.policy import ScriptedPolicy
from collab_env.sandbox.pyparse import parse_python
from collab_env.tasks.coop_code.static import AUX, compose_solution, extract_function, prompt_imports
from collab_env.tasks.humaneval_data import HumanEvalProblem, load_humaneval
from collab_env.types import ENV_AUTHOR, Conversation

__all__ = ["canonical_split", "solution_program", "CanonicalCoder"]

def _entry_node(problem: HumanEvalProblem) -> ast.FunctionDef:
    tree = parse_python(problem.canonical_program())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == problem.entry_point:
            return node
    raise ConfigError(f"{problem.task_id}: the prompt defines no function {problem.entry_point!r}.")


def _call_args(args: ast.arguments) -> str:
    parts = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    parts += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    return ", ".join(parts)


@functools.cache
def canonical_split(problem: HumanEvalProblem) -> tuple[str, str]:
    """The reference solution of ``problem`` as the two agents' answers ``(aux, main)``.

    * The prompt defines a helper before the entry point (HumanEval/10, 32, 38, 50): that
      helper, renamed, is ``aux``; the main function is the canonical one calling ``aux`` where
      it called the helper.
    * The canonical body defines a nested helper (11 problems, e.g. ``is_prime``): it is
      lifted out as ``aux`` (with the body's own imports); the main function is the rest of the
      body, calling ``aux``. (Kept nested it would not survive :func:`cleanup_code`, which drops
      the outer function's lines after a nested ``def``, as the reference does.)
    * Otherwise ``aux`` is the canonical body under the entry point's parameters and the main
      function returns ``aux(...)`` of its arguments (a thin wrapper: no anti-wrapper bonus).
    """
    program = problem.canonical_program()
    lines = program.split("\n")
    tree = parse_python(program)
    entry = _entry_node(problem)
    params = ast.unparse(entry.args)
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != problem.entry_point]
    nested = [n for n in entry.body if isinstance(n, ast.FunctionDef)]
    if helpers or nested:
        helper = (helpers or nested)[-1]
        assert helper.end_lineno is not None and entry.end_lineno is not None  # set by the parser
        src = lines[helper.lineno - 1:helper.end_lineno]
        src = [ln[helper.col_offset:] for ln in src]
        if nested:
            imports = [ast.unparse(n) for n in entry.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            src = src[:1] + [f"    {i}" for i in imports] + src[1:]
        aux = re.sub(rf"^def\s+{re.escape(helper.name)}\s*\(", f"def {AUX}(", "\n".join(src)) + "\n"
        skip = set(range(helper.lineno, helper.end_lineno + 1)) if nested else set()
        main = "\n".join(lines[i - 1] for i in range(entry.lineno, entry.end_lineno + 1) if i not in skip)
        main = re.sub(rf"\b{re.escape(helper.name)}\b", AUX, main)
        return aux, main + "\n"
    aux = f"def {AUX}({params}):\n{problem.canonical_solution}"
    main = f"def {problem.entry_point}({params}):\n    return {AUX}({_call_args(entry.args)})\n"
    return aux, main


def solution_program(item: Mapping[str, Any], aux_text: str, main_text: str) -> str:
    """The program HumanEval's own ``check`` runs on a joint answer: the functions the problem's
    prompt itself defines before the entry point (the tests of HumanEval/32, 38 and 50 call
    them; the official harness runs ``prompt + completion``), then the solution composed as the
    reward composes it (:func:`compose_solution` of the extracted ``aux`` and entry point)."""
    entry = item["entry_point"]
    code = compose_solution(extract_function(aux_text, AUX), extract_function(main_text, entry),
                            prompt_imports(item.get("prompt", "")))
    program = item["prompt"] + item.get("canonical_solution", "")
    try:
        tree = parse_python(program)
    except SyntaxError:
        return code
    given = [ast.get_source_segment(program, n) for n in tree.body
             if isinstance(n, ast.FunctionDef) and n.name != entry]
    return "\n\n".join([*(g for g in given if g), code])


class CanonicalCoder(ScriptedPolicy):
    """Plays the canonical split (:func:`canonical_split`): as ``aux`` the helper, as
    coop-humaneval's ``main`` the main function, as humaneval's single agent (also ``main``, told
    apart by its prompt) the whole canonical program; the oracle baseline of both envs (and the default
    partner of the single-agent view). The problem is recognised from its prompt in the
    observation's first message; unknown text gets an empty reply."""

    name = "humaneval-canonical"

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def _by_prompt() -> dict[str, HumanEvalProblem]:
        return {p.prompt: p for p in load_humaneval()}

    def respond(self, observation: Conversation, rng: np.random.Generator) -> str:
        first = next((m for m in observation if m.author == ENV_AUTHOR and m.role == "user"), None)
        if first is None:
            return ""
        problem = next((p for prompt, p in self._by_prompt().items() if prompt in first.content), None)
        if problem is None:
            return ""
        aux, main = canonical_split(problem)
        if observation.viewer == "aux":
            return aux
        if observation.viewer == "main" and f"A helper function {AUX}(" in first.content:
            return main  # coop-humaneval's main (main_formatter's prompt): calls aux
        return problem.prompt + problem.canonical_solution  # the single agent (humaneval's "main")
