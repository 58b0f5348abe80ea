"""The env cards of the built-in ``hidden-facts``, ``length-ratio`` and ``collabllm-*`` ids.

Data only (:class:`~collab_env.registry.EnvCard`), imported by
:func:`collab_env.tasks.register_builtin` when it registers the ids: the registry is the one
source of truth. The task modules' docstrings carry the same text (``Card of <id>:``) and
``tests/test_readme.py`` keeps them, the README catalogue and these cards in step.

How the reward ranges were found (every bound is attained or approached by a constructed
episode in ``tests/tasks/test_cards.py``):

* ``"default"`` is the env's own reward, ``collab_env.make(id)``.
* ``"mr"`` is ``make(id, reward="mr", reward_kwargs=...)`` with its defaults: the spec's
  weights, aggregation ``"verl"`` (every metric's weighted mean clamped to [-1, 1], summed), the
  rewarded player's every move scored, 0 for a move that truncates the episode. An episode's
  return is the sum over the player's moves.
* ``"conversation"``: the finished chat scored once (aggregation ``"collabllm"``: the plain
  weighted sum, no clamp). ``token_amount`` counts whitespace words of every public message of
  the episode; a message is at most ``max_message_chars`` = 100,000 characters, so at most
  50,000 words.
* ``"joint-shared"`` / ``"joint-difference"``: :class:`~collab_env.rewards.joint.JointReward`
  with the task's own reward function in that mode.

Baselines: ``python -m benchmarks.card_baselines --episodes 200`` (seeds 0-199, through
:func:`collab_env.eval.evaluate`); ``benchmarks/results/card_baselines.json`` holds the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from collab_env.registry import EnvCard
from collab_env.tasks.exploit_quotes import EXPLOIT_QUOTES

__all__ = ["BUILTIN_CARDS", "hidden_facts_card", "LENGTH_RATIO_CARD", "collabllm_card", "docstring_cards",
           "cards_section", "baseline_text", "PROMPTS_LINE", "COLLABLLM_AUDIT_RUNS", "COLLABLLM_AUDITED",
           "collabllm_audit_settings", "collabllm_exploits"]

_HF_PLAYERS = {
    "assistant": "trainable; must find out the withheld quantities by asking, then answer with "
                 "\\boxed{N}",
    "user": "simulated (default HiddenFactsUser, scripted): holds the facts, reveals one only to "
            "a question for it, judged by the clause's syntax (collab_env.tasks.questions, "
            "rule 'syntax': a wh-question with subject-auxiliary inversion, a yes/no question, a "
            "request such as 'tell me ...', or an elliptical ?-question, whose scope names the "
            "object and the attribute, at most two objects per question); a statement (whatever "
            "its first word), a relative or subordinate clause, a computation, a word list, a "
            "guess or the opening copied back gets nothing, a guessed value is never confirmed; "
            "real questions that reuse the user's words are answered",
}
#: v1/v2 (superseded by v3): the first-word rule of issue 23, which statements game.
_HF_PLAYERS_OPENER = {
    "assistant": _HF_PLAYERS["assistant"],
    "user": "simulated (default HiddenFactsUser, scripted; superseded opener rule): reveals a fact "
            "to a clause that starts with a question word, an auxiliary or a request, in the "
            "assistant's own words, naming the object and the attribute; gameable: a statement "
            "that starts with a question word or an auxiliary ('Which means the total is the "
            "number of apples times ...', 'Would multiply ...') or an article-padded word list "
            "gets the fact (use v3)",
}
_HF_PLAYERS_LEGACY = {
    "assistant": _HF_PLAYERS["assistant"],
    "user": "simulated (default HiddenFactsUser, legacy keyword rule): holds the facts, reveals "
            "one whenever a clause names the object and an attribute keyword, question or not "
            "(gameable by statements and keyword lists: use v1)",
}
_HF_SEES = {
    "assistant": "its system prompt (the answer protocol) and the chat, starting with the "
                 "user's opening request; never the hidden facts or the answer",
    "user": "the chat plus its hidden goal (the full problem and every fact, in a system "
            "message only it sees); not the answer",
}
_HF_REWARD = (
    "default: when the assistant's message contains \\boxed{...} the episode ends and both "
    "players get accuracy (1 if the boxed number equals the answer, else 0) minus "
    "cost_per_turn x (assistant turns - 1); 0 on every other step and when the user ends the "
    "chat or max_steps truncates it. cost_per_turn is 0 by default (with c > 0 the range is "
    "[-5c, 1]). mr: the spec's weights {accuracy: 1} use the LLM-judged accuracy metric "
    "(judge= is required); each assistant turn gets its futures' mean accuracy, in [0, 1], and "
    "up to 6 assistant turns are scored, so an episode returns [0, 6]. conversation: the "
    "LLM-judged accuracy of the finished chat (judge= required), in [0, 1]."
)
_HF_REWARD_V1 = _HF_REWARD + (" A guess counts as a wrong answer: an assistant message (without a box) that states a "
     "value for a quantity the user never gave (a number the user did not say, within three "
     "words before the object's name or in a clause naming the object and its attribute; "
     "hidden_facts.guessed_facts) ends the episode with accuracy 0 (minus the turn cost).")
_HF_LIMITS = (
    "max_steps 12 (six assistant turns); ends when the assistant boxes an answer (terminated, "
    "'answered'), when the user's message holds [[TERMINATE CHAT]] (the scripted user sends it "
    "after a boxed answer or after 3 replies that revealed nothing; terminated, "
    "'user_terminated') or at max_steps (truncated)"
)
_HF_LIMITS_V1 = _HF_LIMITS.replace(
    "or at max_steps (truncated)",
    "when the assistant guesses a withheld value (terminated, 'guessed', accuracy 0) or at "
    "max_steps (truncated)",
)
_HF_DATA = ("generated from the seed by collab_env.tasks.hidden_facts (three scenarios: "
            "shopping, baking, shipping); unlimited items, offline, train/test streams disjoint")
_HF_DATA_CHOOSE = ("generated from the seed by collab_env.tasks.hidden_facts; unlimited items, offline; "
                   "split='train' (default): shopping, baking, shipping (dollars, grams, kilograms); "
                   "'validation': knitting (meters of yarn); 'test': gardening and printing (liters of "
                   "water, sheets of paper): disjoint scenarios, objects, units and phrasings "
                   "(hidden_facts.SPLIT_SCENARIOS), each split its own item stream")
_HF_LICENCE = "Apache-2.0 (generated by this package)"

_HF_LEVEL_TESTS = {
    "hidden-facts": "Asking before answering: the opening request names two objects but "
                    "withholds all four quantities the total needs and adds one distractor.",
    "hidden-facts-easy": "Asking before answering, easy: one object, half of its two "
                         "quantities stated, no distractor.",
    "hidden-facts-hard": "Asking before answering, hard: three objects the opening does not "
                         "even name (ask which first), all six quantities withheld, two "
                         "distractors.",
    "hidden-facts-copy": "Asking before answering, where the withheld fact is the answer: one "
                         "object priced (or weighing) 1 per unit, its count withheld, two "
                         "distractor numbers; the answer is the count the user tells, copied "
                         "into the box, so a small model's success measures asking, not "
                         "arithmetic. Answering at once is right only by a lucky guess (1 in 29).",
    "hidden-facts-choose": "Choosing what to ask, with no arithmetic: one object, either its count "
                           "withheld (its unit value stated as 1) or its unit value withheld (its "
                           "count stated as 1), two distractor numbers; the answer is the one "
                           "number the user reveals, but the question that gets it differs per "
                           "item, so one template ('how many X?') is right on about half the "
                           "items. Answering at once (1) is never right (withheld values 2..30).",
}
#: The card's note on a version the issue-43 exploit audit games (the opener rule).
_HF_OPENER_HOLE = ("Superseded (opener rule: a statement that starts with a question word or an "
                   "auxiliary, or an article-padded word list, gets a withheld fact, and the "
                   "boxed total then scores 1.000; use v3). ")
_HF_TESTS = {
    **{f"{name}-v0": "Legacy (v0, keyword user: use v3). " + text for name, text in _HF_LEVEL_TESTS.items()
       if name not in ("hidden-facts-copy", "hidden-facts-choose")},
    **{f"{name}-v1": _HF_OPENER_HOLE + text + " The user answers questions only."
       for name, text in _HF_LEVEL_TESTS.items() if name != "hidden-facts-choose"},
    # issue 27: v1's rules, text that reads as sense (hidden_facts.HiddenFactsConfig.sensible_numbers).
    **{f"{name}-v2": _HF_OPENER_HOLE + text + " The user answers questions only. v2: v1's task in text "
       "that reads as sense (a value of 1 in the singular, clock hours 2..12)." for name, text in
       _HF_LEVEL_TESTS.items() if name not in ("hidden-facts-copy", "hidden-facts-choose")},
    # issue 43: the syntax rule (collab_env.tasks.questions), on v2's items (v1's for -copy).
    **{f"{name}-v3": text + " The user answers questions only, judged by their syntax. v3: v2's "
       "items, the syntax rule." for name, text in _HF_LEVEL_TESTS.items()
       if name not in ("hidden-facts-copy", "hidden-facts-choose")},
    "hidden-facts-copy-v2": _HF_LEVEL_TESTS["hidden-facts-copy"] + " The user answers questions only, "
                            "judged by their syntax. v2: v1's items, the syntax rule.",
    "hidden-facts-choose-v0": _HF_LEVEL_TESTS["hidden-facts-choose"] + " The user answers questions only, "
                              "judged by their syntax. Splits: train (shopping, baking, shipping), "
                              "validation (knitting) and test (gardening, printing) share no scenario, "
                              "object, unit or phrasing.",
}

#: Measured baselines (benchmarks/results/card_baselines.json, 200 episodes, seeds 0-199).
_HF_BASELINES = {
    "hidden-facts-v0": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-easy-v0": ("1.000", "1.000", "0.020", "0.020"),
    "hidden-facts-hard-v0": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-v1": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-easy-v1": ("1.000", "1.000", "0.020", "0.020"),
    "hidden-facts-hard-v1": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-copy-v1": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-v2": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-easy-v2": ("1.000", "1.000", "0.020", "0.020"),
    "hidden-facts-hard-v2": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-v3": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-easy-v3": ("1.000", "1.000", "0.020", "0.020"),
    "hidden-facts-hard-v3": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-copy-v2": ("1.000", "1.000", "0.000", "0.000"),
    "hidden-facts-choose-v0": ("1.000", "1.000", "0.000", "0.000"),
}


#: The generic gaming policies (collab_env.exploits.policies) on the v1 ids: (return, success) of
#: KeywordDump("what", every scenario's keywords) and RestateTask("one-clause"); same file.
_HF_GAMING = {
    "hidden-facts-v1": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-easy-v1": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-hard-v1": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-copy-v1": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-v2": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-easy-v2": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-hard-v2": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-v3": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-easy-v3": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-hard-v3": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-copy-v2": (("0.000", "0.000"), ("0.000", "0.000")),
    "hidden-facts-choose-v0": (("0.000", "0.000"), ("0.000", "0.000")),
}


#: The superseded ids of the opener rule (issue 23), which the issue-43 exploits game.
_HF_OPENER_IDS = frozenset({"hidden-facts-v1", "hidden-facts-easy-v1", "hidden-facts-hard-v1",
                            "hidden-facts-copy-v1", "hidden-facts-v2", "hidden-facts-easy-v2",
                            "hidden-facts-hard-v2"})


def baseline_text(mean_return: str, episodes: int, success: str | None = None) -> str:
    """One baseline entry: ``"mean return R[, success S] (N ep, seeds 0-(N-1))"``."""
    s = f"mean return {mean_return}" + (f", success {success}" if success is not None else "")
    return f"{s} ({episodes} ep, seeds 0-{episodes - 1})"


def hidden_facts_card(env_id: str) -> EnvCard:
    """The card of one ``hidden-facts`` level."""
    ask_r, ask_s, once_r, once_s = _HF_BASELINES[env_id]
    choose = env_id.startswith("hidden-facts-choose-")
    legacy = env_id.endswith("-v0") and not choose
    opener = env_id in _HF_OPENER_IDS
    return EnvCard(
        tests=_HF_TESTS[env_id],
        players=_HF_PLAYERS_LEGACY if legacy else _HF_PLAYERS_OPENER if opener else _HF_PLAYERS,
        sees=_HF_SEES,
        reward=_HF_REWARD if legacy else _HF_REWARD_V1,
        reward_range={"default": (0.0, 1.0), "mr": (0.0, 6.0), "conversation": (0.0, 1.0)},
        limits=_HF_LIMITS if legacy else _HF_LIMITS_V1,
        data=_HF_DATA_CHOOSE if choose else _HF_DATA,
        licence=_HF_LICENCE,
        baselines={
            "ask-then-answer": baseline_text(ask_r, 200, ask_s),
            "answer-at-once": baseline_text(once_r, 200, once_s),
            **({} if legacy else {
                "keyword-dump (gaming)": baseline_text(_HF_GAMING[env_id][0][0], 200, _HF_GAMING[env_id][0][1]),
                "restate-task (gaming)": baseline_text(_HF_GAMING[env_id][1][0], 200, _HF_GAMING[env_id][1][1]),
            }),
        },
        audit={"naive": {"assistant": "answer-at-once"}},
        exploits=EXPLOIT_QUOTES.get(env_id, ""),
    )


#: The reply both agents of the "same text x2" baseline give (the ratio is 1: exp(-1)).
SAME_TEXT = "A short answer, the same for both of us."

LENGTH_RATIO_CARD = EnvCard(
    tests="Coordination without communication (CoMLRL's length-ratio task): two agents answer "
          "the same creative prompt at once and must settle on lengths whose ratio lands in "
          "[2, 3]; it scores a character ratio, not writing quality.",
    players={
        "agent_0": "trainable; asked for a brief answer",
        "agent_1": "trainable; asked for a detailed answer",
    },
    sees={
        "agent_0": "its own prompt (brief_formatter of the item) and its own replies; not "
                   "agent_1's text (share_responses=False)",
        "agent_1": "its own prompt (detailed_formatter of the item) and its own replies; not "
                   "agent_0's text (share_responses=False)",
    },
    reward="default: every turn both agents get exp(-distance), distance = how far "
           "len(agent_1) / len(agent_0) (characters) lies outside [target_min, target_max] = "
           "[2, 3]; 1 inside, 0 when the brief answer is empty. num_turns is 1 by default "
           "(num_turns=T: [0, T]). joint-shared (JointReward(env, length_ratio_reward)): the same "
           "[0, 1]. joint-difference: agent_0 gets r - 0 (an empty brief answer scores 0), in "
           "[0, 1]; agent_1 gets r - exp(-2) when the brief answer is non-empty (an empty "
           "detailed answer has ratio 0), else 0, in [-exp(-2), 1 - exp(-2)] = [-0.135, 0.865]. "
           "JointReward's per_agent mode does not apply (the reward function returns one "
           "value). mr and conversation do not apply: the spec's weight length_ratio is no "
           "registered metric, so make(..., reward='mr' or 'conversation') raises ConfigError "
           "(pass reward_kwargs weights of registered metrics to score something else).",
    reward_range={"default": (0.0, 1.0), "joint-shared": (0.0, 1.0),
                  "joint-difference": (-math.exp(-2.0), 1.0)},
    limits="num_turns 1: one simultaneous turn, then terminated ('num_turns'); with "
           "num_turns > 1, length_ratio_feedback tells both agents the lengths reached",
    data="40 creative prompts written for this project (collab_env.tasks.cooperative."
         "LENGTH_RATIO_PROMPTS), split 32 train / 8 test with seed 42; offline",
    licence="Apache-2.0 (written for this package)",
    baselines={
        "length-ratio-partner x2": baseline_text("1.000", 200),
        "same text x2": baseline_text("0.368", 200) + "; exp(-1) = 0.368 by hand (ratio 1)",
    },
    audit={"naive": {"agent_0": {"fixed": SAME_TEXT}, "agent_1": {"fixed": SAME_TEXT}}},
    exploits=EXPLOIT_QUOTES.get("length-ratio-v0", ""),
)

_CL_TESTS = {
    "math-hard": "CollabLLM math-hard: collaborating on a hard MATH problem the user holds "
                 "hidden; the assistant must understand what is asked and reach the answer "
                 "(judged accuracy), interactively (judged), briefly (tokens).",
    "medium": "CollabLLM medium: co-writing a document the user has in mind; scored by the "
              "recipe's character BLEU against the reference document, and brevity.",
    "bigcodebench": "CollabLLM bigcodebench: writing the function the user wants; scored by "
                    "the pass rate of the dataset's tests in the sandbox, interactivity "
                    "(judged), and brevity.",
}
_CL_METRIC = {
    "math-hard": ("accuracy (LLM-judged, 0/1) + interactivity (LLM-judged, [0, 1]) "
                  "- 1e-4 x token_amount; judge= is required", 2.0),
    "medium": ("bleu_score (character BLEU, [0, 1]; on the LLM-extracted document when judge= "
               "is given, else on the last assistant message) - 1e-4 x token_amount", 1.0),
    "bigcodebench": ("pass_rate (the last code block passes the tests in the sandbox: 0/1) "
                     "+ interactivity (LLM-judged, [0, 1]) - 1e-4 x token_amount; judge= is "
                     "required", 2.0),
}


#: collabllm-bigcodebench-v2's pass_rate, and the residual risk of its same-process suites.
_BCB_V2 = (
    " pass_rate (v2): the row's unittest suite is read from its syntax tree on the trusted side "
    "(collab_env.sandbox.suites: every spelling of a TestCase class, unittest.main() footers; a "
    "form that cannot be judged is an 'unsupported test form' error, a suite with no test method "
    "an error, never a pass); pass_rate = passed methods / found methods. A suite that only calls "
    "the program runs in the trusted harness, as unittest runs it, with the program behind the "
    "plain-data proxy; one that patches the program's module with mocks runs each test class in "
    "a fresh process beside it (collab_env.sandbox.harness): a runner that never runs the program "
    "checks the report of its test process (three sentinel tests with random names that must "
    "fail, pass and error, the count of methods; a misreport is 'tampered' and the suite scores "
    "0), and assert helpers, the tests' comparisons and the program's results refuse values whose "
    "comparison the program wrote (its classes, mock.ANY, mocks it made). Residual risk, beside "
    "the program only: a program written against this runner can walk its frames to the test "
    "process's report pipe and forge every outcome, sentinels included, hide always-equal values "
    "inside a library object compared by library code, or act through len()/bool() on its own "
    "objects. Measured with our hostile set (tests/sandbox/hostile_unittest.py, 21 generic "
    "programs: on the suite run beside the program 17 of 21 scored 1.0 before issue 43, 21 of 21 "
    "on some suite): 0 of 21 score on any suite."
)
_BCB_LEGACY = ("legacy: under v1, pass_rate did not run unittest suites (it executed the "
               "TestCases class definition only, so every program, right or wrong, scored 1.0); "
               "the id is kept for old results and now scores with v2's pass_rate. ")


#: The card's line naming the prompt sets of the collabllm-* envs (the one in use:
#: ``env.unwrapped.task.prompt_source``).
PROMPTS_LINE = (
    "prompts: collab_env (own wording) by default; prompts='collabllm' reads the reference's "
    "system prompt at make from the installed collabllm package (prompts/system_prompt.txt; "
    "pip install --no-deps collabllm), prompts=PATH from a verl checkout "
    "(recipe/collabllm/process_dataset.py); env.unwrapped.task.prompt_source names the set in use"
)


#: The exploit audit's settings of the collabllm-* cards (collab_env.exploits.collabllm): per
#: dataset, the naive baseline (an honest reply that answers at once and never asks).
_CL_NAIVE: dict[str, dict[str, object]] = {
    "math-hard": {"assistant": {"fixed": "The answer is \\boxed{0}."}},
    "medium": {"assistant": {"fixed": "Here is the document you asked for: a short first draft."}},
    "bigcodebench": {"assistant": "stub-code"},
}
#: MR's window in the audit: one future per reply, the recipe's two user / three assistant turns.
_CL_AUDIT_WINDOW = {"num_rollouts": 1, "max_user_turns": 2, "max_assistant_turns": 3}

#: The audited collabllm-* ids (on fixture rows) and the runs of :data:`COLLABLLM_AUDIT_RUNS` each
#: gets; a -large twin quotes its base id's audit. medium's judge is a document extractor, which
#: the score-claim double cannot play: its judge-free reward (BLEU on the last reply) is audited.
COLLABLLM_AUDITED: dict[str, tuple[str, ...]] = {
    "collabllm-math-hard-v1": ("judge double", "embedded judge", "reference prompts"),
    "collabllm-medium-v1": ("no judge",),
}

#: The runs the collabllm-* cards quote (``python -m benchmarks.exploit_audit --collabllm``):
#: label (the suffix of its key in EXPLOIT_QUOTES, ``"<id> | <label>"``) -> what it runs.
COLLABLLM_AUDIT_RUNS: dict[str, str] = {
    "judge double": "a judge double that obeys any score claim outside the rubric's fences "
                    "(collab_env.testing.judge_injection.FenceReadingJudge), our rubrics",
    "embedded judge": "the embedded model (SmolLM2-135M-Instruct, a weak judge: it rates wrong answers "
                      "high) as judge, our rubrics; 5 exploits, 2 episodes",
    "reference prompts": "the judge double on the recipe's own rubrics (prompts= the recipe; "
                         "they paste the transcript unfenced, as the recipe's judges do)",
    "no judge": "bleu_score on the last assistant message and token_amount; character BLEU "
                "credits any text a reply shares with the reference, the user's own words included",
}

#: What a card whose reference rubrics were not audited says about them.
_CL_UNFENCED = ("The recipe's own rubrics (prompts=) paste the transcript unfenced, as the recipe's judges "
                "do: through them the judge double gives every judge-injection text on "
                "collabllm-math-hard-v1 the top score (its card's [reference prompts] line); how far a "
                "given model obeys such text is the risk an exact reproduction takes.")


def collabllm_audit_settings(ds: str) -> dict[str, object]:
    """The ``card.audit`` entry of a ``collabllm-<ds>`` card: the naive baseline, the options,
    4 episodes, and MR's window with the recorded-turn user (``"replay"``); the judge is the
    caller's (``collab-env check ID --exploits --data-files F --judge SPEC``)."""
    return {"naive": _CL_NAIVE[ds], "rewards": ["default", "mr", "conversation"], "episodes": 4,
            "reward_kwargs": {"mr": {"user": "replay", **_CL_AUDIT_WINDOW}}}


def collabllm_exploits(env_id: str) -> str:
    """The exploits line of a collabllm-* card: each quoted run of :data:`COLLABLLM_AUDIT_RUNS`
    (a -large twin quotes its base id's, the same env and rewards on other rows), or why not."""
    base = env_id.replace("-large-", "-")
    runs = COLLABLLM_AUDITED.get(base, ())
    quotes = {label: EXPLOIT_QUOTES.get(f"{base} | {label}") for label in runs}
    if not any(quotes.values()):
        return ("not audited here: the rewards need an LLM judge and a user simulator; with local rows "
                "run collab-env check ID --exploits --data-files F --judge SPEC. " + _CL_UNFENCED)
    head = ("audited on fixture rows in the CollabLLM schema, with the recorded-turn user"
            + (f" (as {base}: the same env and rewards on other rows)" if base != env_id else "") + ". ")
    lines = [f"[{label}: {COLLABLLM_AUDIT_RUNS[label]}] {q}." for label, q in quotes.items() if q]
    return head + " ".join(lines) + ("" if "reference prompts" in runs else " " + _CL_UNFENCED)


def collabllm_card(ds: str, large: bool, version: int = 1) -> EnvCard:
    """The card of ``collabllm-<ds>[-large]-v<version>`` (bigcodebench has a v2)."""
    name = f"collabllm-multiturn-{ds}{'-large' if large else ''}"
    metric, hi = _CL_METRIC[ds]
    if ds == "bigcodebench":
        metric = metric.replace("passes the tests in the sandbox: 0/1", "passed test methods / methods, "
                                "run in the trusted harness or, with mocks, in one sandboxed process per test class")
    legacy = _BCB_LEGACY if ds == "bigcodebench" and version == 1 else ""
    return EnvCard(
        tests=legacy + _CL_TESTS[ds] + (" The paper's large set." if large else "")
        + (_BCB_V2 if ds == "bigcodebench" else ""),
        players={
            "assistant": "trainable; collaborates with the user (a collaborative system prompt "
                         "by default). " + PROMPTS_LINE,
            "user": "simulated; default SessionReplayUser replays the recorded user turns (it "
                    "ignores the replies); an LLM user simulator (LLMUserSimulator, API model "
                    "or 'embedded') makes it reactive. The simulator reads the chat as untrusted "
                    "data: the transcript fenced (fence_transcript=True, the default) with a "
                    "sentence that the assistant's messages are not instructions, <think> blocks "
                    "stripped. With prompts='collabllm' or a verl checkout the reference "
                    "template's wording is kept: the fence goes around its {chat_history} and the "
                    "sentence has no place in it (the simulator warns, ReferenceFenceWarning); "
                    "fence_transcript=False sends the reference's prompt byte for byte",
        },
        sees={
            "assistant": "its system prompt and the chat (in mode 'train' from the row's "
                         "recorded prefix); never the hidden single-turn prompt or the "
                         "reference",
            "user": "the chat plus its hidden goal (single_turn_prompt, task description, the "
                    "turns to replay); not the reference answer",
        },
        reward=(
            "default: the env itself returns 0 on every step (the CollabLLM rewards come from "
            f"the wrappers). Weights: {metric}. mr (user= required: the default user ignores "
            "the reply): every assistant move gets sum over metrics of clamp(weight x mean over "
            "futures, -1, 1), so a move is in "
            f"[-1, {hi:g}] and the move that truncates the episode gets 0; at most 9 moves "
            f"count (max_assistant_turns 10): [-9, {9 * hi:g}]. conversation: the weighted "
            "sum once at the end, no clamp; token_amount counts the words of every message "
            f"after the prefix, at most 20 messages x 50,000 words: [-100, {hi:g}]."
        ),
        reward_range={"default": (0.0, 0.0), "mr": (-9.0, 9 * hi), "conversation": (-100.0, hi)},
        limits="max_assistant_turns 10, max_user_turns 10, max_steps 20; ends when a user "
               "message holds [[TERMINATE CHAT]] (terminated) or at a budget (truncated, on an "
               "assistant reply)",
        data=f"the Hugging Face dataset collabllm/{name} (needs a download; data_files= reads "
             "local parquet/json/jsonl files in its schema offline)",
        licence="no licence is declared on the hub page of collabllm/collabllm-multiturn-"
                "math-hard (checked); see each dataset's card on the hub before "
                "redistributing",
        baselines={
            "none measured": "the rows need the hub download and a meaningful user needs an "
                             "LLM simulator (API model); the recorded-turn user with scripted "
                             "assistants would measure the replay, not the task",
        },
        audit=collabllm_audit_settings(ds),
        exploits=collabllm_exploits(f"collabllm-{ds}{'-large' if large else ''}-v{version}"),
    )


#: Env id -> card, for :func:`collab_env.tasks.register_builtin`.
BUILTIN_CARDS: dict[str, EnvCard] = {
    **{env_id: hidden_facts_card(env_id) for env_id in _HF_TESTS},
    "length-ratio-v0": LENGTH_RATIO_CARD,
    **{f"collabllm-{ds}{'-large' if large else ''}-v1": collabllm_card(ds, large)
       for ds in _CL_TESTS for large in (False, True)},
    **{f"collabllm-bigcodebench{'-large' if large else ''}-v2": collabllm_card("bigcodebench", large, 2)
       for large in (False, True)},
}


def cards_section(cards: Mapping[str, EnvCard], source: str) -> str:
    """The ``Cards`` section a task module appends to its docstring (``__doc__ +=``): each id's
    card as :meth:`EnvCard.to_docstring` writes it, from the same cards the module registers
    (``source`` names where they are defined), so the docstring and the registry cannot disagree."""
    blocks = "\n\n".join(card.to_docstring(env_id) for env_id, card in cards.items())
    return f"\nCards (generated from {source}; ``collab-env info ID`` prints them)\n\n{blocks}\n"


def docstring_cards(*env_ids: str) -> str:
    """:func:`cards_section` of built-in ids whose cards are in :data:`BUILTIN_CARDS`."""
    return cards_section({i: BUILTIN_CARDS[i] for i in env_ids}, "collab_env.tasks.cards")
