"""Hostile files given to the critic checkpoint loader and the reward model's settings file
(issue 27): each is refused at once with a one-line ConfigError naming the file, what is wrong and
what to do; nothing hangs, nothing in the trainer changes, the file itself is unchanged."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from collab_env.adapters.actor_critic import IACConfig, IACTrainer  # noqa: E402
from collab_env.adapters.common.checkpoint import save_safe  # noqa: E402
from collab_env.adapters.common.joint_reward import (  # noqa: E402
    HEAD_FILE,
    MAX_META_BYTES,
    META_FILE,
    JointRewardModel,
    read_meta,
)
from collab_env.tasks.cooperative import formatters, length_ratio_rows, reward_func  # noqa: E402
from tests.test_hostile_files import NESTED, needs_fifo, refused  # noqa: E402


# -- the critic checkpoint --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def critic_setup(tiny_dir, tmp_path_factory):
    """An IAC trainer (separate critics) and a checkpoint folder it saved (the control loads)."""
    from collab_env.testing.tiny_model import load_tiny_chat_model

    out = tmp_path_factory.mktemp("iac")
    model, tok = load_tiny_chat_model(tiny_dir)
    cfg = IACConfig(num_agents=2, max_new_tokens=4, eval_interval=0, output_dir=str(out / "run"), plot=False)
    trainer = IACTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                         reward_func=reward_func, train_dataset=length_ratio_rows("train")[:1], args=cfg)
    return trainer, trainer.save_checkpoint(out / "ckpt")


def _weights(trainer):
    parts = [c.head for c in trainer.critics] + [c.backbone for c in trainer.critics]
    parts += [m.model for m in trainer._unique]
    return [p.detach().clone() for part in parts for p in part.parameters()]


def _unchanged(trainer, before):
    return all(torch.equal(a, b) for a, b in zip(before, _weights(trainer), strict=True))


def _copy(folder, tmp_path):
    import shutil

    dest = tmp_path / "copy"
    shutil.copytree(folder, dest)
    return dest


def test_control_the_saved_critic_checkpoint_loads(critic_setup):
    trainer, folder = critic_setup
    trainer.load_checkpoint(folder)


def _forge_critic(folder, change):
    """Rewrite critic_0 with save_safe after ``change(blob)`` (an attacker with the library)."""
    from collab_env.adapters.common.checkpoint import load_safe

    blob = load_safe(folder, "critic_0")
    change(blob)
    save_safe(folder, "critic_0", blob)
    return folder / "critic_0.json"


@pytest.mark.parametrize("change", [
    pytest.param(lambda b: b["head"].update(weight=torch.zeros(3, 3)), id="head-shape"),
    pytest.param(lambda b: b["head"].update(weight=b["head"]["weight"].to(torch.int64)), id="head-dtype"),
    pytest.param(lambda b: b["head"].pop("bias"), id="head-missing"),
    pytest.param(lambda b: b.update(head=[1, 2]), id="head-not-a-dict"),
    pytest.param(lambda b: b.update(shares_actor=1), id="shares-actor-int"),
    pytest.param(lambda b: b.update(extra=1), id="extra-key"),
    pytest.param(lambda b: b["backbone"].update({next(iter(b["backbone"])): torch.zeros(2)}), id="backbone-shape"),
    pytest.param(lambda b: b.update(optimizer=[1]), id="optimizer-list"),
    pytest.param(lambda b: b["optimizer"].update(param_groups=[]), id="optimizer-groups"),
])
def test_a_forged_critic_state_is_refused_before_anything_changes(critic_setup, tmp_path, change):
    trainer, folder = critic_setup
    folder = _copy(folder, tmp_path)
    file = _forge_critic(folder, change)
    before, state = _weights(trainer), trainer.state
    refused(lambda: trainer.load_checkpoint(folder), file, folder / "critic_0.safetensors")
    assert _unchanged(trainer, before) and trainer.state is state


@pytest.mark.parametrize("text", ["not json", NESTED, json.dumps({"format": 1})])
def test_a_damaged_critic_json_is_refused(critic_setup, tmp_path, text):
    trainer, folder = critic_setup
    folder = _copy(folder, tmp_path)
    file = folder / "critic_1.json"
    file.write_text(text)
    before = _weights(trainer)
    refused(lambda: trainer.load_checkpoint(folder), file)
    assert _unchanged(trainer, before)


@needs_fifo
def test_a_fifo_as_a_critic_file_is_refused_at_once(critic_setup, tmp_path):
    trainer, folder = critic_setup
    folder = _copy(folder, tmp_path)
    for name in ("critic_0.json", "critic_1.safetensors"):
        (folder / name).unlink()
        os.mkfifo(folder / name)
        refused(lambda: trainer.load_checkpoint(folder), folder / name, isolate=True)
        (folder / name).unlink()
        (folder / name).write_bytes((critic_setup[1] / name).read_bytes())


# -- the reward model's settings -------------------------------------------------------------------
GOOD_META = {"format": 1, "template": {"task": "Task: {prompt}"}, "max_length": 512, "append_eos": True,
             "num_agents": 2, "tokenizer_class": "PreTrainedTokenizerFast"}


@pytest.fixture
def meta_folder(tmp_path):
    """A folder with a valid settings file and head (enough to reach the checks)."""
    from collab_env.adapters.common.checkpoint import save_tensors

    folder = tmp_path / "rm"
    folder.mkdir()
    (folder / META_FILE).write_text(json.dumps(GOOD_META))
    save_tensors(folder / HEAD_FILE, {"weight": torch.zeros(1, 8), "bias": torch.zeros(1)})
    return folder


def test_control_good_settings_are_read(meta_folder):
    meta = read_meta(meta_folder / META_FILE)
    assert meta["num_agents"] == 2 and meta["template"].task == "Task: {prompt}"


@pytest.mark.parametrize("text", [
    pytest.param("{not json", id="not-json"),
    pytest.param(b"\xff\xfe{}", id="not-utf8"),
    pytest.param(NESTED, id="nested-200k"),
    pytest.param("[1, 2]", id="a-list"),
    pytest.param("9" * 5000, id="huge-int"),
    pytest.param(json.dumps({**GOOD_META, "max_length": "512"}), id="max-length-str"),
    pytest.param(json.dumps({**GOOD_META, "num_agents": True}), id="num-agents-bool"),
    pytest.param(json.dumps({**GOOD_META, "append_eos": 1}), id="append-eos-int"),
    pytest.param(json.dumps({**GOOD_META, "format": 2}), id="format-2"),
    pytest.param(json.dumps({**GOOD_META, "extra": 1}), id="extra-key"),
    pytest.param(json.dumps({k: v for k, v in GOOD_META.items() if k != "template"}), id="no-template"),
    pytest.param(json.dumps({**GOOD_META, "template": {"task": 3}}), id="template-int"),
    pytest.param(json.dumps({**GOOD_META, "template": {"bogus": "x"}}), id="template-key"),
    pytest.param(json.dumps({**GOOD_META, "template": {"task": "{0.__class__}"}}), id="template-format"),
    pytest.param(json.dumps({**GOOD_META, "tokenizer_class": "pipeline"}), id="tokenizer-class"),
])
def test_hostile_reward_settings_are_refused(meta_folder, text):
    file = meta_folder / META_FILE
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    exc = refused(lambda: JointRewardModel.from_pretrained(meta_folder, device="cpu"), file)
    assert "reward" in str(exc).lower() or "save" in str(exc).lower()


def test_a_huge_settings_file_is_refused_unread(meta_folder):
    file = meta_folder / META_FILE
    file.write_text(" " * (MAX_META_BYTES + 1) + json.dumps(GOOD_META))
    refused(lambda: read_meta(file), file)


def test_a_forged_head_is_refused_before_the_model_loads(meta_folder):
    from collab_env.adapters.common.checkpoint import save_tensors

    save_tensors(meta_folder / HEAD_FILE, {"weight": torch.zeros(4, 8), "bias": torch.zeros(4)})
    refused(lambda: JointRewardModel.from_pretrained(meta_folder, device="cpu"), meta_folder / HEAD_FILE)


@needs_fifo
def test_a_fifo_as_the_settings_file_is_refused_at_once(meta_folder):
    file = meta_folder / META_FILE
    file.unlink()
    os.mkfifo(file)
    refused(lambda: JointRewardModel.from_pretrained(meta_folder, device="cpu"), file, isolate=True)
