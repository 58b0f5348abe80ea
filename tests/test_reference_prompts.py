"""The reference's prompt templates on request (``prompts="collabllm"`` / ``prompts=PATH``).

Every test writes its own stand-in sources into ``tmp_path``: a ``collabllm`` package with the
real package's layout (``collabllm/__init__.py``, ``collabllm/prompts/<its file names>.txt``,
the same placeholders) and a verl checkout (``recipe/collabllm/...``), all holding OUR OWN short
``STANDIN`` texts. No reference text is in this repository; only the file names and placeholder
names are the reference's.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys

import pytest

import collab_env
from collab_env.agents.judges import LLMJudge
from collab_env.agents.proactive import COLLABORATIVE_PROMPT, Proactive
from collab_env.agents.reference_prompts import (
    COLLABLLM_FILES,
    PromptSet,
    reference_chat_history,
    resolve_prompts,
)
from collab_env.agents.replies import fence_untrusted
from collab_env.agents.users import LLMUserSimulator, ReferenceFenceWarning
from collab_env.errors import ConfigError, MissingDependencyError
from collab_env.rewards.metrics import document_extractor, get_metric
from collab_env.tasks.collabllm import DEFAULT_SYSTEM_PROMPT
from collab_env.testing.collabllm_fixtures import collabllm_fixture_rows, write_collabllm_fixture
from collab_env.types import FAULT, Completion, Conversation, Message

# The stand-in package's templates: the real file names and placeholders, our own text.
STANDIN_FILES = {
    "system_prompt.txt": "STANDIN SYSTEM: work with the user.",
    "user_simulator.txt": ("STANDIN USER task=<{task_desc}> goal=<{single_turn_prompt}> "
                           "chat=<{chat_history}> stop=<{terminal_signal}> JSON please"),
    "proact_instruction.txt": ("STANDIN PROACT chat=<{chat_history}> max=<{max_new_tokens}> "
                               "info=<{additional_info}> JSON please"),
    "extract_multiturn_completion.txt": ('STANDIN EXTRACT type=<{extract_type}> chat=<{chat_history}> '
                                         'req=<{extraction_requirement}> reply {{"thought": "...", '
                                         '"final_completion": "..."}}'),
}
assert set(STANDIN_FILES) == set(COLLABLLM_FILES.values())

# The stand-in verl checkout: file -> source. The code around the constants would fail if run.
STANDIN_VERL = {
    "recipe/collabllm/metrics/accuracy.py": (
        'raise SystemExit("this file must be parsed, never executed")\n'
        "ACCURACY_PROMPT = '''STANDIN ACCURACY q=<{single_turn_prompt}> gt=<{ground_truth}> "
        'chat=<{chat_history}> reply {{"thought": "...", "accuracy": 0 or 1}}\'\'\'\n'),
    "recipe/collabllm/metrics/interactivity.py": (
        "import not_a_module_anywhere\n"
        "INTERACTIVITY_PROMPT = 'STANDIN INTERACTIVITY chat=<{chat_history}> ' \\\n"
        "    'reply {{\"thought\": \"...\", \"interactivity\": <score>}}'\n"),
    "recipe/collabllm/metrics/bleu_score.py": (
        "EXTRACT_MULTITURN_COMPLETION_PROMPT = ('STANDIN DOCUMENT chat=<{chat_history}> '\n"
        "                                       + 'reply final_completion')\n"),
    "recipe/collabllm/process_dataset.py": 'SYSTEM_PROMPT: str = "STANDIN VERL SYSTEM"\n',
    "verl/interactions/collabllm_interation.py": (
        "USER_PROMPT_TEMPLATE = 'STANDIN VERL USER {task_desc}|{single_turn_prompt}|{chat_history}|"
        "{termination_signal}'\n"),
}


@pytest.fixture
def standin_pkg(tmp_path, monkeypatch):
    """A stand-in ``collabllm`` package on ``sys.path``; importing it fails (it must never be)."""
    root = tmp_path / "site"
    pkg = root / "collabllm"
    (pkg / "prompts").mkdir(parents=True)
    (pkg / "__init__.py").write_text('raise RuntimeError("collab_env must not import collabllm")\n')
    for name, text in STANDIN_FILES.items():
        (pkg / "prompts" / name).write_text(text)
    monkeypatch.delitem(sys.modules, "collabllm", raising=False)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return pkg


@pytest.fixture
def verl_checkout(tmp_path):
    root = tmp_path / "verl"
    for rel, src in STANDIN_VERL.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(src)
    return root


class Recorder:
    """A backend that records every conversation it is sent and answers with fixed texts."""

    name = "recorder"

    def __init__(self, *replies: str):
        self.replies = list(replies)
        self.seen: list[Conversation] = []
        self.sampling: list[dict] = []

    async def act(self, observations, **sampling):
        self.seen.extend(observations)
        self.sampling.append(dict(sampling))
        out = []
        for _ in observations:
            text = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
            out.append(Completion(text=text))
        return out


def run(coro):
    return asyncio.run(coro)


def user_reply(response: str) -> str:
    return json.dumps({"current_answer": "", "thought": "private", "response": response})


def make_env(tmp_path, **kw):
    path = write_collabllm_fixture(tmp_path / "rows.jsonl", n=2)
    return collab_env.make("collabllm-math-hard", data_files=str(path), **kw)


def chat_after_one_turn(env):
    """Observations after the assistant answered once (train mode: row 1 has a prefix)."""
    env.reset(seed=0, options={"index": 1})
    obs, *_ = env.step({"assistant": "ASSISTANT-REPLY-1"})
    return obs


# -- the env's assistant system prompt ------------------------------------------------------------
def test_env_collabllm_prompts_change_the_system_prompt_and_nothing_else(tmp_path, standin_pkg):
    ref, own = make_env(tmp_path, prompts="collabllm"), make_env(tmp_path)
    ref_obs, ref_info = ref.reset(seed=0, options={"index": 1})
    own_obs, own_info = own.reset(seed=0, options={"index": 1})
    assert ref_obs["assistant"][0].content == STANDIN_FILES["system_prompt.txt"]
    assert own_obs["assistant"][0].content == DEFAULT_SYSTEM_PROMPT
    # Everything else the players see is the same.
    assert ref_obs["assistant"][1:] == own_obs["assistant"][1:]
    assert ref_obs["user"] == own_obs["user"]
    assert STANDIN_FILES["system_prompt.txt"] not in "".join(m.content for m in ref_obs["user"])
    # Which set is in use is visible; the default env's info is as before.
    task = ref.unwrapped.task
    assert task.prompt_source.startswith("collabllm (version unknown) from ")
    assert task.prompt_source.endswith(str(standin_pkg / "prompts"))
    assert ref_info["assistant"]["prompts"] == task.prompt_source
    assert own.unwrapped.task.prompt_source == "collab_env (own wording)"
    assert "prompts" not in own_info["assistant"]
    assert make_env(tmp_path, prompts="collab_env").reset(seed=0, options={"index": 1})[0] == own_obs
    # The package was located, never imported.
    assert "collabllm" not in sys.modules
    # The card names the prompt sets.
    assert "prompts: collab_env (own wording) by default" in collab_env.spec("collabllm-math-hard").card.players["assistant"]


def test_env_prompts_conflicts_and_bad_values(tmp_path, standin_pkg):
    with pytest.raises(ConfigError, match="Pass one of the two"):
        make_env(tmp_path, prompts="collabllm", system_prompt="Be brief.")
    with pytest.raises(ConfigError, match="Pass one of the two"):
        make_env(tmp_path, prompts="collabllm", system_prompt=None)
    with pytest.raises(ConfigError, match="neither 'collab_env'.*'collabllm'"):
        make_env(tmp_path, prompts="collabllm-v2")


def test_env_verl_path_reads_the_constant_without_running_the_file(tmp_path, verl_checkout):
    env = make_env(tmp_path, prompts=str(verl_checkout))
    obs, _ = env.reset(seed=0)
    assert obs["assistant"][0].content == "STANDIN VERL SYSTEM"
    assert env.unwrapped.task.prompt_source == f"verl recipe checkout {verl_checkout.resolve()}"


# -- the clear errors ------------------------------------------------------------------------------
def test_missing_package_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "collabllm", None)  # absent, whatever this machine has installed
    for build in (lambda: LLMUserSimulator(Recorder("x"), prompts="collabllm"),
                  lambda: Proactive(Recorder("x"), prompts="collabllm"),
                  lambda: LLMJudge.preset("extract_answer", Recorder("x"), prompts="collabllm"),
                  lambda: make_env(tmp_path, prompts="collabllm")):
        with pytest.raises(MissingDependencyError, match=r"pip install --no-deps collabllm"):
            build()


def test_a_placeholder_we_cannot_fill_names_the_file_and_the_placeholder(standin_pkg):
    bad = standin_pkg / "prompts" / "user_simulator.txt"
    bad.write_text(STANDIN_FILES["user_simulator.txt"] + " mood=<{user_mood}>")
    with pytest.raises(ConfigError, match=r"user_simulator\.txt.*\{user_mood\}"):
        LLMUserSimulator(Recorder("x"), prompts="collabllm")
    (standin_pkg / "prompts" / "proact_instruction.txt").unlink()
    with pytest.raises(ConfigError, match=r"has no proact_instruction\.txt"):
        Proactive(Recorder("x"), prompts="collabllm")


def test_a_component_the_source_lacks_is_an_error_that_says_where_it_is(standin_pkg, verl_checkout):
    with pytest.raises(ConfigError, match=r"no accuracy template.*recipe/collabllm/metrics/accuracy\.py"):
        LLMJudge.preset("accuracy", Recorder("x"), prompts="collabllm")
    with pytest.raises(ConfigError, match=r"no proactive template.*proact_instruction\.txt"):
        Proactive(Recorder("x"), prompts=str(verl_checkout))
    with pytest.raises(ConfigError, match="our own rubric"):
        LLMJudge.preset("answer_match", Recorder("x"), prompts="collabllm")
    (verl_checkout / "recipe/collabllm/metrics/interactivity.py").write_text("INTERACTIVITY_PROMPT = make()\n")
    with pytest.raises(ConfigError, match=r"interactivity\.py:INTERACTIVITY_PROMPT.*not a string literal"):
        LLMJudge.preset("interactivity", Recorder("x"), prompts=str(verl_checkout))


# -- the user simulator ------------------------------------------------------------------------------
def test_user_simulator_sends_the_filled_template_alone(tmp_path, standin_pkg):
    obs = chat_after_one_turn(make_env(tmp_path))
    backend = Recorder(user_reply("thanks, and the next step?"))
    # The reference's exact prompt: fence_transcript=False.
    sim = LLMUserSimulator(backend, prompts="collabllm", fence_transcript=False)
    (out,) = run(sim.act([obs["user"]]))
    assert out.text == "thanks, and the next step?"
    (sent,) = backend.seen
    assert len(sent) == 1 and sent[0].role == "user"
    row = collabllm_fixture_rows(2)[1]
    chat = "\n".join([f"**User**: {row['prompt'][0]['content']}",
                      f"**Assistant**: {row['prompt'][1]['content']}",
                      f"**User**: {row['prompt'][2]['content']}",
                      "**Assistant**: ASSISTANT-REPLY-1"])
    assert sent[0].content == (f"STANDIN USER task=<solving math problems> goal=<{row['single_turn_prompt']}> "
                               f"chat=<{chat}> stop=<[[TERMINATE CHAT]]> JSON please")
    # By default (issue 43) the quoted transcript is fenced; the template's wording is kept, and
    # the simulator says that the note on untrusted data has no place in it.
    fenced_backend = Recorder(user_reply("thanks, and the next step?"))
    with pytest.warns(ReferenceFenceWarning, match="wording kept"):
        fenced = LLMUserSimulator(fenced_backend, prompts="collabllm")
    run(fenced.act([obs["user"]]))
    assert fenced_backend.seen[0][0].content == (
        f"STANDIN USER task=<solving math problems> goal=<{row['single_turn_prompt']}> "
        f"chat=<{fence_untrusted(chat, 'conversation')}> stop=<[[TERMINATE CHAT]]> JSON please")
    assert sim.prompt_source.startswith("collabllm ")
    # The default prompt is unchanged by the keyword's existence.
    default = LLMUserSimulator(Recorder("x")).build_prompt(obs["user"])
    assert LLMUserSimulator(Recorder("x"), prompts=None).build_prompt(obs["user"]) == default
    assert LLMUserSimulator(Recorder("x"), prompts="collab_env").build_prompt(obs["user"]) == default
    assert "STANDIN" not in "".join(m.content for m in default)
    with pytest.raises(ConfigError, match="persona"):
        LLMUserSimulator(Recorder("x"), prompts="collabllm", persona="a busy engineer")
    with pytest.raises(ConfigError, match="reply_format='plain'"):
        LLMUserSimulator(Recorder("x"), prompts="collabllm", reply_format="plain")


def test_user_simulator_opening_and_verl_template(tmp_path, standin_pkg, verl_checkout):
    env = make_env(tmp_path, mode="eval")
    obs, _ = env.reset(seed=0, options={"index": 0})
    backend = Recorder(user_reply("hi, can you help?"))
    (out,) = run(LLMUserSimulator(backend, prompts="collabllm").act([obs["user"]]))
    assert out.text == "hi, can you help?"
    assert "chat=<>" in backend.seen[0][0].content  # nothing said yet: an empty chat history
    backend = Recorder(user_reply("hello"))
    run(LLMUserSimulator(backend, prompts=str(verl_checkout)).act([obs["user"]]))
    goal = collabllm_fixture_rows(1)[0]["single_turn_prompt"]
    assert backend.seen[0][0].content == f"STANDIN VERL USER solving math problems|{goal}||[[TERMINATE CHAT]]"


# -- Proactive ---------------------------------------------------------------------------------------
def test_proactive_sends_the_template_and_acts_with_the_response(tmp_path, standin_pkg):
    obs = chat_after_one_turn(make_env(tmp_path))
    inner = Recorder(json.dumps({"current_problem": "p", "thought": "t", "response": "Which sum exactly?"}))
    pro = Proactive(inner, prompts="collabllm", additional_info="INFO")
    (out,) = run(pro.act([obs["assistant"]], max_new_tokens=77))
    assert out.text == "Which sum exactly?" and out.meta["thought"] == "t"
    (sent,) = inner.seen
    assert len(sent) == 1 and sent[0].role == "user"
    assert sent[0].content == ("STANDIN PROACT chat=<" + reference_chat_history(obs["assistant"])
                               + "> max=<77> info=<INFO> JSON please")
    assert "**Assistant**: ASSISTANT-REPLY-1" in sent[0].content
    assert DEFAULT_SYSTEM_PROMPT not in sent[0].content  # the reference leaves system messages out
    (out,) = run(Proactive(Recorder("not json at all"), prompts="collabllm", max_retries=1).act([obs["assistant"]]))
    assert out.finish_reason == FAULT and "no readable 'response' after 2 attempt(s)" in out.meta["fault"]
    # Default: our system prompt, placed as before.
    inner = Recorder("plain reply")
    (out,) = run(Proactive(inner).act([obs["assistant"]]))
    assert out.text == "plain reply" and inner.seen[0][0].content.startswith(COLLABORATIVE_PROMPT)
    with pytest.raises(ConfigError, match="one or the other"):
        Proactive(Recorder("x"), "my prompt", prompts="collabllm")


# -- the judges -----------------------------------------------------------------------------------------
def _judged_conversation():
    return Conversation((
        Message(role="system", content="HIDDEN GOAL", audience=("user",)),
        Message(role="user", content="what is 2+2?", author="user"),
        Message(role="assistant", content="It is 4.", author="assistant"),
    ))


def test_extraction_judges_from_the_package(standin_pkg):
    conv = _judged_conversation()
    backend = Recorder('{"thought": "easy", "final_completion": "4"}')
    judge = LLMJudge.preset("extract_answer", backend, prompts="collabllm", method="generate")
    assert judge.fields == ["conversation"]
    result = run(judge.score(conversation=conv))
    assert result.score == "4" and result.reason == "easy"
    chat = "**User**: what is 2+2?\n**Assistant**: It is 4."
    assert backend.seen[0][-1].content == ('STANDIN EXTRACT type=<answer> chat=<' + chat + '> req=<> reply '
                                           '{"thought": "...", "final_completion": "..."}')
    backend = Recorder('{"final_completion": "the document"}')
    extractor = document_extractor(backend, prompts="collabllm")
    assert run(extractor.score(conversation=conv)).score == "the document"
    assert backend.seen[0][-1].content.startswith("STANDIN EXTRACT type=<document> ")


def test_metric_judges_from_a_verl_checkout_and_unchanged_arithmetic(verl_checkout, standin_pkg):
    conv = _judged_conversation()
    item = {"single_turn_prompt": "Add 2 and 2.", "single_turn_completion": "4"}
    backend = Recorder('{"thought": "matches", "accuracy": 1}')
    acc = LLMJudge.preset("accuracy", backend, prompts=str(verl_checkout), method="generate")
    ref = run(get_metric("accuracy")(conv, item, judge={"accuracy": acc}))
    assert backend.seen[0][-1].content == ('STANDIN ACCURACY q=<Add 2 and 2.> gt=<4> chat=<**User**: what '
                                           'is 2+2?\n**Assistant**: It is 4.> reply {"thought": "...", '
                                           '"accuracy": 0 or 1}')
    own = run(get_metric("accuracy")(conv, item, judge={"accuracy": LLMJudge.preset(
        "accuracy", Recorder('{"reason": "ok", "score": true}'), method="generate")}))
    assert ref.value == own.value == 1.0 and ref.detail["reason"] == "matches"
    backend = Recorder('{"thought": "fine", "interactivity": 0.6}')
    inter = LLMJudge.preset("interactivity", backend, prompts=str(verl_checkout))
    res = run(get_metric("interactivity")(conv, item, judge={"interactivity": inter}))
    assert res.value == pytest.approx(0.6)
    assert backend.seen[0][-1].content.startswith("STANDIN INTERACTIVITY chat=<**User**: what is 2+2?")
    backend = Recorder('{"final_completion": "doc"}')
    run(document_extractor(backend, prompts=str(verl_checkout)).score(conversation=conv))
    assert backend.seen[0][-1].content == "STANDIN DOCUMENT chat=<**User**: what is 2+2?\n**Assistant**: It is 4.> reply final_completion"
    # Combined sources: the first that has the component wins.
    both = resolve_prompts((str(verl_checkout), "collabllm"))
    assert isinstance(both, PromptSet) and " + collabllm " in both.describe()
    backend = Recorder('{"final_completion": "4"}')
    run(LLMJudge.preset("extract_answer", backend, prompts=both).score(conversation=conv))
    assert backend.seen[0][-1].content.startswith("STANDIN EXTRACT type=<answer> ")
    assert LLMJudge.preset("accuracy", Recorder("x"), prompts=both).prompt_template.startswith("STANDIN ACCURACY")


def test_reference_judges_are_scored_by_logprobs_in_the_reference_spelling(verl_checkout):
    class Scorer(Recorder):
        supports_prefill = True

        async def score_continuations(self, observations, continuations):
            self.seen.extend(observations)
            self.continuations = continuations
            return [[-1.0 if '": 1' in c else -3.0 for c in row] for row in continuations]

    backend = Scorer("unused")
    acc = LLMJudge.preset("accuracy", backend, prompts=str(verl_checkout))
    if not acc.uses_logprobs:
        pytest.skip("this backend double is not taken for a continuation scorer")
    result = run(acc.score(problem="p", conversation=_judged_conversation(), reference="4"))
    assert result.score == 1
    assert backend.continuations[0] == ['accuracy": 0,', 'accuracy": 0}', 'accuracy": 1,', 'accuracy": 1}']


def test_triple_quoted_replies_the_extraction_template_asks_for(standin_pkg):
    backend = Recorder('{"thought": """two\nlines""", "final_completion": """x = 1\nprint(\'x\')"""}')
    judge = LLMJudge.preset("extract_answer", backend, prompts="collabllm")
    assert run(judge.score(conversation=_judged_conversation())).score == "x = 1\nprint('x')"


def test_version_from_the_dist_info_and_the_env_pickles(tmp_path, standin_pkg):
    import pickle

    info = standin_pkg.parent / "collabllm-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: collabllm\nVersion: 9.9.9\n")
    env = make_env(tmp_path, prompts="collabllm")
    assert env.unwrapped.task.prompt_source == f"collabllm 9.9.9 from {standin_pkg / 'prompts'}"
    twin = pickle.loads(pickle.dumps(env))
    obs, _ = twin.reset(seed=0)
    assert obs["assistant"][0].content == STANDIN_FILES["system_prompt.txt"]
    assert env.unwrapped.clone().unwrapped.task.prompt_source == env.unwrapped.task.prompt_source


def test_env_prompts_reach_the_reward_user_simulator_and_judges(tmp_path, standin_pkg, verl_checkout):
    """make(..., prompts=..., reward="mr"): the futures' user simulator and the judges the weights
    use read the reference templates too (built, no API call); a source without a judge's template
    is an error naming it, never our rubric in its place; the default builds our own."""
    data = write_collabllm_fixture(tmp_path, "list", "jsonl", n=4)
    kw = {"user": "litellm:openai/gpt-4o-mini", "judge": "litellm:openai/gpt-4o-mini",
          "weights": {"accuracy": 1.0, "interactivity": 1.0}}
    env = collab_env.make("collabllm-math-hard", data_files=str(data), prompts=("collabllm", str(verl_checkout)),
                          reward="mr", reward_kwargs=kw)
    assert "STANDIN" in env.unwrapped.task.reference_system_prompt
    user = env.scorer.named["user"]
    assert user.template is not None and "STANDIN USER" in user.template.text
    judges = env.scorer.metric_set.ctx["judge"]
    assert set(judges) == {"accuracy", "interactivity"}
    assert all(str(verl_checkout) in j.prompt_origin for j in judges.values())
    assert "extractor" not in env.scorer.metric_set.ctx  # no weighted metric reads it
    with pytest.raises(ConfigError, match="accuracy"):
        collab_env.make("collabllm-math-hard", data_files=str(data), prompts="collabllm", reward="mr",
                        reward_kwargs=kw)
    ours = collab_env.make("collabllm-math-hard", data_files=str(data), reward="mr", reward_kwargs=kw)
    assert ours.scorer.named["user"].template is None
    assert {j.prompt_origin for j in ours.scorer.metric_set.ctx["judge"].values()} == {None}
    assert {"extractor", "document_extractor"} <= set(ours.scorer.metric_set.ctx)


def test_data_rows_carry_the_reference_system_prompt(tmp_path, verl_checkout, standin_pkg, capsys):
    """collab-env data --prompts PATH: the recipe's rows with the checkout's own SYSTEM_PROMPT."""
    from collab_env.tasks.collabllm_data import main

    data = write_collabllm_fixture(tmp_path, "list", "jsonl", n=4)
    out = tmp_path / "out"
    assert main(["--data_files", str(data), "--local_dir", str(out), "--prompts", str(verl_checkout),
                 "--validation_size", "1"]) == 0
    import datasets

    rows = datasets.load_dataset("parquet", data_files=str(out / "rl_train.parquet"))["train"]
    assert {r["prompt"][0]["content"] for r in rows} == {"STANDIN VERL SYSTEM"}
    assert main(["--data_files", str(data), "--local_dir", str(out), "--prompts", "collabllm",
                 "--dataset_type", "sft", "--validation_size", "1"]) == 0
    rows = datasets.load_dataset("parquet", data_files=str(out / "sft_train.parquet"))["train"]
    assert {r["prompt"][0]["content"] for r in rows} == {STANDIN_FILES["system_prompt.txt"]}
    assert main(["--data_files", str(data), "--local_dir", str(out), "--prompts", "collabllm",
                 "--system_prompt", "mine"]) == 1
    assert "one of the two" in capsys.readouterr().err
