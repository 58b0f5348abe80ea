"""Generated task text reads as sense (issue 27).

Every registered id whose items are generated from templates is reset on many items of several
splits or problem sets, and everything each player sees at the start (system prompts, the
opening, the user's hidden goal with every fact) is checked:

* a clock time is an hour of the clock, 1..12 ("The courier comes at 41 o'clock" was found);
* the number 1 takes the singular ("1 dollars", "bakes 1 trays", "1 of the lemons are");
* no template field is left unfilled (no ``{`` or ``}`` outside ``\\boxed{...}`` and the JSON
  objects a prompt shows, such as a tool's arguments or an example tool call);
* no ``None``, ``nan``, ``null`` or ``inf`` stands in for a value;
* no doubled space and no space before punctuation (what an empty field leaves behind).

Ids whose text comes from a dataset (HumanEval code, the CollabLLM rows) are listed with that
reason in ``FROM_DATA``; every registered id must be in one table or the other, so a new suite is
checked or explicitly excused.

``LOCKED_DEFECTS`` lists defects that are still in the generators of released levels: their items
are fixed by hash-lock tests and by the leaderboard's recorded episodes, so the fix is a new
version of the id, not an edit of the generator. For those ids the test asserts that only the
listed kinds occur *and* that each listed kind still occurs (so an entry cannot outlive its
defect), and ``FIXED_BY`` names the version that fixes them (issue 27: ``hidden-facts*-v2`` and
``math-chat-v1``, with ``sensible_numbers=True``), which must be registered and clean; any other
defect fails at once.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import cache

import pytest

import collab_env
from collab_env.tasks.hidden_facts import HiddenFactsConfig, generate_item
from collab_env.tasks.math_problems import math_problem
from collab_env.testing.versions import building

#: entry point -> the make() keywords of the variants to read (splits, problem sets).
GENERATED: dict[str, tuple[dict, ...]] = {
    "collab_env.tasks.hidden_facts:make_env": ({"split": "train"}, {"split": "test"}),
    "collab_env.tasks.team:make_env": ({"split": "train"}, {"split": "test"}),
    "collab_env.tasks.chats:make_math_chat": ({"problem_seed": 0}, {"problem_seed": 1}, {"problem_seed": 7}),
    "collab_env.tasks.cooperative:make_length_ratio_env": ({"split": "all"},),
    "collab_env.tasks.letter_requests:make_env": ({},),
    "collab_env.tasks.phone_support:make_env": ({"abroad_rate": 0.0}, {"abroad_rate": 1.0}),
    "collab_env.tasks.sharded:make_sharded_math": ({"mode": "sharded"}, {"mode": "concat"}, {"mode": "full"},
                                                   {"problem_seed": 1}),
}

#: entry point -> why its text is not generated here.
FROM_DATA: dict[str, str] = {
    "collab_env.tasks.collabllm:make_env": "CollabLLM rows from the hub or local files",
    "collab_env.tasks.coop_code:make_humaneval_env": "HumanEval problems (code, where braces are Python)",
    "collab_env.tasks.coop_code:make_coop_humaneval_env": "HumanEval problems (code, where braces are Python)",
    "collab_env.tasks.chats:make_humaneval_chat": "HumanEval signatures and docstrings (code)",
    "collab_env.tasks.sharded:make_sharded_humaneval": "HumanEval signatures and docstrings (code)",
}

ITEMS_PER_VARIANT = 200

_HF_PLURAL = ("a unit value of 1 is said in the plural (\"Each apple costs 1 dollars.\"); "
              "fixed by the v2 ids (sensible_numbers) and hidden-facts-copy-v1")
_HF_CLOCK = ("distractor clock times are drawn from 2..59 (\"41 o'clock\"); fixed by the v2 ids "
             "(sensible_numbers) and hidden-facts-copy-v1")
_MC_PLURAL = ("math_problems writes \"a pen for 1 dollars\", \"bakes 1 trays\", \"keeps 1 cookies\", "
              "\"1 of the lemons are spoiled\"; math-chat@v1/v2 tracks replay these items; fixed by math-chat-v1")

#: env id -> {defect kind: why it is not fixed in place}. See the module docstring.
LOCKED_DEFECTS: dict[str, dict[str, str]] = {
    **{f"hidden-facts-{v}": {"plural": _HF_PLURAL, "clock": _HF_CLOCK} for v in ("v0", "v1")},
    **{f"hidden-facts-hard-{v}": {"plural": _HF_PLURAL, "clock": _HF_CLOCK} for v in ("v0", "v1")},
    **{f"hidden-facts-easy-{v}": {"plural": _HF_PLURAL} for v in ("v0", "v1")},
    "math-chat-v0": {"plural": _MC_PLURAL},
}

#: locked id -> the version of the same level whose text reads as sense (issue 27).
FIXED_BY: dict[str, str] = {
    **{f"{name}-{v}": f"{name}-v2" for name in ("hidden-facts", "hidden-facts-hard", "hidden-facts-easy")
       for v in ("v0", "v1")},
    "math-chat-v0": "math-chat-v1",
}

_CLOCK = re.compile(r"\b(\d+) o'clock\b")
_ONE = re.compile(r"(?<![\d.,])\b1 ([a-z]+)\b")
_ONE_OF_ARE = re.compile(r"(?<![\d.,])\b1 of the [a-z]+ are\b")
_NOT_PLURAL = {"is", "was", "has", "plus", "minus", "this", "thus", "yes", "bus", "gas"}
_BOXED = re.compile(r"\\boxed\{[^{}]*\}")
_MISSING = re.compile(r"\b(None|nan|NaN|null|inf)\b")
_SPACING = re.compile(r"[^\s] {2,}[^\s]|[^\s] [,;:!?]|[^\s] \.(?!\.)")


def problems(text: str) -> list[tuple[str, str]]:
    """``(kind, excerpt)`` for every defect of ``text``; kinds: clock, plural, brace, missing, spacing."""
    out = []
    for m in _CLOCK.finditer(text):
        if not 1 <= int(m.group(1)) <= 12:
            out.append(("clock", m.group(0)))
    for m in _ONE.finditer(text):
        word = m.group(1)
        if word.endswith("s") and not word.endswith("ss") and word not in _NOT_PLURAL:
            out.append(("plural", m.group(0)))
    out += [("plural", m.group(0)) for m in _ONE_OF_ARE.finditer(text)]
    unboxed = _without_json(_BOXED.sub("", text))
    out += [("brace", unboxed[max(0, m.start() - 30):m.end() + 30]) for m in re.finditer(r"[{}]", unboxed)]
    out += [("missing", text[max(0, m.start() - 30):m.end() + 10]) for m in _MISSING.finditer(text)]
    for line in text.splitlines():
        out += [("spacing", line[max(0, m.start() - 30):m.end() + 10]) for m in _SPACING.finditer(line)]
    return out


def _without_json(text: str) -> str:
    """``text`` without its JSON objects (each outermost ``{...}`` that parses as JSON)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    break
            try:
                json.loads(text[i:j + 1])
            except ValueError:
                pass
            else:
                i = j + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _generated_ids() -> list[str]:
    return [i for i in collab_env.list_envs() if collab_env.spec(i).entry_point in GENERATED]


@cache
def defects(env_id: str) -> dict[str, list[str]]:
    """Defect kind -> excerpts, over ``ITEMS_PER_VARIANT`` items of every variant of ``env_id``."""
    found: dict[str, list[str]] = {}
    for kw in GENERATED[collab_env.spec(env_id).entry_point]:
        with building(env_id):  # every generated id, the superseded (locked) ones too
            env = collab_env.make(env_id, **kw)
        n = env.task.num_items()
        for index in range(ITEMS_PER_VARIANT if n is None else min(n, ITEMS_PER_VARIANT)):
            obs, _ = env.reset(seed=index, options={"index": index})
            text = "\n".join(m["content"] for o in obs.values() for m in o.to_chat())
            assert text.strip(), (env_id, kw, index)
            for kind, excerpt in problems(text):
                found.setdefault(kind, []).append(f"{kw} item {index}: {excerpt!r}")
    return found


def test_every_registered_id_is_classified():
    entry_points = {collab_env.spec(i).entry_point: i for i in collab_env.list_envs()}
    unknown = set(entry_points) - set(GENERATED) - set(FROM_DATA)
    assert not unknown, f"classify these suites in GENERATED or FROM_DATA: {sorted(unknown)}"
    assert not set(GENERATED) & set(FROM_DATA)
    assert set(LOCKED_DEFECTS) <= set(_generated_ids())


@pytest.mark.parametrize("env_id", _generated_ids())
def test_generated_text_reads_as_sense(env_id):
    found = defects(env_id)
    allowed = LOCKED_DEFECTS.get(env_id, {})
    new = {k: v[:3] for k, v in found.items() if k not in allowed}
    assert not new, f"{env_id}: {sum(len(found[k]) for k in new)} defects, e.g. {new}"
    gone = set(allowed) - set(found)
    assert not gone, f"{env_id}: {sorted(gone)} no longer occur: remove them from LOCKED_DEFECTS"


def test_the_checks_catch_each_kind():
    bad = ("The courier comes at 41 o'clock. Each apple costs 1 dollars. 1 of the lemons are soft. "
           "I need {n} apples. The price is None.  Twice , here .")
    kinds = Counter(k for k, _ in problems(bad))
    assert kinds == {"clock": 1, "plural": 2, "brace": 2, "missing": 1, "spacing": 3}, kinds
    good = ("The party starts at 12 o'clock. Each apple costs 1 dollar. 1 of the lemons is soft. "
            "11 apples, 1 glass, 0.1 grams... Answer with \\boxed{N}, e.g. \\boxed{42}. Is it 1 plus 2?")
    assert problems(good) == []


def test_hidden_facts_copy_fixed_both_defects():
    """hidden-facts-copy (issue 26) draws clock hours from 2..12 and says 1 in the singular."""
    assert "hidden-facts-copy-v1" in _generated_ids() and "hidden-facts-copy-v1" not in LOCKED_DEFECTS
    assert defects("hidden-facts-copy-v1") == {}


def test_every_locked_defect_has_a_clean_fixed_version():
    assert set(FIXED_BY) == set(LOCKED_DEFECTS)
    for old, new in FIXED_BY.items():
        assert new in _generated_ids() and new not in LOCKED_DEFECTS, (old, new)
        assert collab_env.spec(new).entry_point == collab_env.spec(old).entry_point
        assert collab_env.spec(new).kwargs.get("sensible_numbers") is True, new
        assert not collab_env.spec(old).kwargs.get("sensible_numbers"), old
    # the unversioned names are the fixed versions or later ones (hidden-facts v3, issue 43: the
    # same items with the syntax rule)
    fixed = {v.rsplit("-v", 1)[0]: int(v.rsplit("-v", 1)[1]) for v in FIXED_BY.values()}
    for name in ("hidden-facts", "hidden-facts-easy", "hidden-facts-hard", "math-chat"):
        latest = collab_env.spec(name)
        assert latest.version >= fixed[name] and latest.kwargs.get("sensible_numbers") is True, name


HF_NAMES = ("hidden-facts", "hidden-facts-easy", "hidden-facts-hard", "hidden-facts-copy")


def _item_text(item: dict) -> str:
    """Everything of a hidden-facts item a player can read: the opening, every fact, every
    distractor (the user may add one to a reply) and the full problem."""
    return "\n".join([item["opening"], item["single_turn_prompt"], *(f["sentence"] for f in item["facts"]),
                      *item["distractors"]])


@pytest.mark.parametrize("name", HF_NAMES)
def test_no_impossible_clock_hour_or_plural_one_at_the_latest_version(name):
    """The o'clock example of issue 27, read directly: 1,000 items per split of every hidden-facts
    level at its latest version (the id ``collab_env.make(name)`` builds) have every clock hour in
    1..12 and never "1 <plural>"; and the check does see both on the locked v1 items."""
    latest = collab_env.spec(name)
    assert latest.id == max((collab_env.spec(i) for i in collab_env.list_envs()
                             if collab_env.spec(i).name == name), key=lambda s: s.version).id
    hours, found = Counter(), Counter()
    for split in ("train", "test"):
        cfg = HiddenFactsConfig(split=split, **latest.kwargs)
        for index in range(1000):
            text = _item_text(generate_item(cfg, index))
            hours.update(int(h) for h in _CLOCK.findall(text))
            found.update(k for k, _ in problems(text) if k in ("clock", "plural"))
    assert not found, f"{latest.id}: {dict(found)}"
    assert all(1 <= h <= 12 for h in hours), sorted(hours)
    if name in ("hidden-facts", "hidden-facts-hard"):  # levels with distractors draw clock hours
        assert set(hours) == set(range(2, 13)), sorted(hours)
    if name != "hidden-facts-copy":  # the check finds both defects on the locked v1 items
        old = Counter(k for split in ("train", "test") for index in range(200)
                      for k, _ in problems(_item_text(generate_item(
                          HiddenFactsConfig(split=split, **collab_env.spec(f"{name}-v1").kwargs), index))))
        assert old["plural"] > 0 and (old["clock"] > 0 or name == "hidden-facts-easy"), (name, old)


@pytest.mark.parametrize("name", ("hidden-facts", "hidden-facts-easy", "hidden-facts-hard"))
def test_v2_is_v1_in_other_words(name):
    """v2 changes text only: every item has v1's scenario, objects, values, withheld facts,
    occasion, distractor sentences and answer; only a stated 1 and the distractor numbers differ."""
    v1, v2 = collab_env.spec(f"{name}-v1"), collab_env.spec(f"{name}-v2")
    assert {**v1.kwargs, "sensible_numbers": True} == dict(v2.kwargs)
    assert (v1.players, v1.turn_order, v1.reward, v1.limits, v1.default_policies) == \
        (v2.players, v2.turn_order, v2.reward, v2.limits, v2.default_policies)
    changed = 0
    for split in ("train", "test"):
        c1, c2 = (HiddenFactsConfig(split=split, **s.kwargs) for s in (v1, v2))
        for index in range(300):
            a, b = generate_item(c1, index), generate_item(c2, index)
            for key in ("scenario", "objects", "plurals", "objects_named", "question", "answer"):
                assert a[key] == b[key], (name, index, key)
            assert [{k: f[k] for k in f if k != "sentence"} for f in a["facts"]] == \
                [{k: f[k] for k in f if k != "sentence"} for f in b["facts"]]
            for fa, fb in zip(a["facts"], b["facts"], strict=True):
                assert fa["sentence"] == fb["sentence"] or (fa["value"] == 1 and fa["kind"] == "unit"), fa
            assert [re.sub(r"\d+", "N", d) for d in a["distractors"]] == \
                [re.sub(r"\d+", "N", d) for d in b["distractors"]]
            changed += a != b
    assert changed > 0


def test_v2_reads_a_singular_one_back():
    """The reference assistant reads "costs 1 dollar" / "needs 1 gram" / "weighs 1 kilogram" and
    still answers every v2 item with a unit value of 1 right."""
    from collab_env.rollout import run_episode
    from collab_env.tasks.hidden_facts import AskThenAnswer, HiddenFactsUser

    env = collab_env.make("hidden-facts-v3")
    cfg = env.task.config
    ones = [i for i in range(200) if any(f["kind"] == "unit" and f["value"] == 1
                                         for f in generate_item(cfg, i)["facts"])]
    scenarios = {generate_item(cfg, i)["scenario"] for i in ones}
    assert len(ones) >= 10 and scenarios == {"shopping", "baking", "shipping"}
    for i in ones:
        ep = run_episode(env, {"assistant": AskThenAnswer(), "user": HiddenFactsUser()}, seed=i, index=i)
        assert ep.returns["assistant"] == 1.0, i


def test_the_knob_is_off_by_default_and_old_items_keep_their_words():
    assert HiddenFactsConfig().sensible_numbers is False
    item = next(generate_item(HiddenFactsConfig(), i) for i in range(200)
                if any(f["kind"] == "unit" and f["value"] == 1 for f in generate_item(HiddenFactsConfig(), i)["facts"]))
    assert re.search(r"\b1 (dollars|grams|kilograms)\b", item["single_turn_prompt"])  # v0/v1: locked words


def test_math_chat_v1_is_v0_in_other_words():
    """math-chat-v1 says a 1 in the singular; every problem keeps v0's kind, numbers and answer."""
    assert collab_env.spec("math-chat-v1").kwargs == {"sensible_numbers": True}
    assert not collab_env.spec("math-chat-v0").kwargs
    changed, words = 0, Counter()
    for seed in (0, 1):
        for index in range(1000):
            a, b = math_problem(seed, index), math_problem(seed, index, sensible_numbers=True)
            assert (a.problem_id, a.kind, a.answer, len(a.facts)) == (b.problem_id, b.kind, b.answer, len(b.facts))
            assert re.findall(r"\d+", a.text) == re.findall(r"\d+", b.text)
            assert not [k for k, _ in problems(b.text)], b.text
            if a != b:
                changed += 1
                words.update(w for fa, fb in zip(a.facts, b.facts, strict=True) if fa != fb
                             for w in set(fb.split()) - set(fa.split()))
    assert changed == 48, changed  # the 48 problems of issue 27
    assert {"dollar.", "tray", "cookie.", "is"} <= set(words), words
    env = collab_env.make("math-chat-v1")
    item = env.task.get_item(0)
    assert item["single_turn_prompt"] == math_problem(0, 0, sensible_numbers=True).text


def test_math_chat_texts_are_locked():
    """The problem texts of sets 0 and 1 (1,000 each): v0's as they were before issue 27 (its
    tracks replay them), v1's as released; a change of either needs a new version."""
    import hashlib
    import json

    def digest(sense: bool) -> str:
        texts = [math_problem(seed, i, sensible_numbers=sense).text for seed in (0, 1) for i in range(1000)]
        return hashlib.sha256(json.dumps(texts).encode()).hexdigest()

    assert digest(False) == "a6cba942e504f7643fd31c76aaaece1d7d06a0ef553169b972129006ec9df3b0"
    assert digest(True) == "571c05f90873e75fc5d8e4be4d85ff1ac5b83131f1d195eabac79bba2638bd85"

