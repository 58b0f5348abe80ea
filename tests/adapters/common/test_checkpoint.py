"""Nothing collab_env loads runs code: checkpoints, critics, reward-model heads and response
caches are JSON, safetensors or SQLite; a booby-trapped pickle in any of their places is refused
and never executed; the safe format resumes exactly; an old pickle checkpoint is refused unread
(the format is not supported: no converter)."""

from __future__ import annotations

import json
import pickle
import random
import sqlite3

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from collab_env.adapters.common.checkpoint import (  # noqa: E402
    LEGACY_STATE_FILE,
    capture_rng,
    load_checkpoint,
    load_safe,
    load_tensors,
    restore_rng,
    save_safe,
    save_tensors,
)
from collab_env.errors import ConfigError  # noqa: E402


class Trap:
    """Unpickling this runs code: it creates ``marker`` (what an attacker's payload would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"import pathlib; pathlib.Path({self.marker!r}).touch()",))


def trap_files(tmp_path, name="marker"):
    """(marker path, raw pickle bytes, torch.save zip bytes) of a trap that creates the marker."""
    marker = tmp_path / name
    raw = pickle.dumps({"models": [Trap(marker)], "state": {}, "rng": {}})
    zipped = tmp_path / f"{name}.zip"
    torch.save({"models": [Trap(marker)], "state": {}, "rng": {}}, zipped)
    data = zipped.read_bytes()
    zipped.unlink()
    return marker, raw, data


def test_the_trap_is_live(tmp_path):
    """Control: the trap does run code when unpickled the old way, so the refusals below mean
    something."""
    marker, raw, zipped = trap_files(tmp_path)
    pickle.loads(raw)
    assert marker.exists()
    marker.unlink()
    (tmp_path / "t.pt").write_bytes(zipped)
    torch.load(tmp_path / "t.pt", weights_only=False)  # what checkpoint.py used to do
    assert marker.exists()


# -- trainer checkpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["raw", "torch"])
def test_an_old_pickle_checkpoint_is_refused_unread(tmp_path, kind, monkeypatch):
    marker, raw, zipped = trap_files(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / LEGACY_STATE_FILE).write_bytes(raw if kind == "raw" else zipped)
    opened = []
    real_open = open

    def spy_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy_open)
    with pytest.raises(ConfigError, match="old pickle format.*not supported") as err:
        load_checkpoint(ckpt, [])
    monkeypatch.undo()
    message = str(err.value)
    assert "\n" not in message and str(ckpt / LEGACY_STATE_FILE) in message
    assert "python -m" not in message and "convert" not in message  # no converter is offered
    assert str(ckpt / LEGACY_STATE_FILE) not in opened  # nothing is read
    assert not marker.exists()
    assert sorted(p.name for p in ckpt.iterdir()) == [LEGACY_STATE_FILE]
    from collab_env.adapters.common import checkpoint

    assert not hasattr(checkpoint, "convert_legacy")


def test_a_trap_under_the_new_names_is_refused(tmp_path):
    marker, raw, zipped = trap_files(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_bytes(raw)
    (ckpt / "trainer_state.safetensors").write_bytes(zipped)
    with pytest.raises(ConfigError, match="not JSON"):
        load_checkpoint(ckpt, [])
    save_safe(ckpt, "trainer_state", {"models": [], "state": {}, "rng": {}})  # a valid JSON half
    (ckpt / "trainer_state.safetensors").write_bytes(zipped)
    with pytest.raises(ConfigError, match="not a safetensors file"):
        load_checkpoint(ckpt, [])
    (ckpt / "trainer_state.safetensors").write_bytes(raw)
    with pytest.raises(ConfigError, match="not a safetensors file"):
        load_checkpoint(ckpt, [])
    assert not marker.exists()


def test_safe_state_round_trip_keeps_every_type_exactly(tmp_path):
    state = {
        "tuple": (3, (1, 2), None),
        "int_keys": {0: {"step": torch.tensor(7.0)}, 1: {}},
        "reserved": {"__tensor__": "not a tensor"},
        "array": np.arange(5, dtype=np.uint32),
        "floats": [0.1, 1e-300, float("inf"), -0.0],
        "bf16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "bytes": torch.get_rng_state(),
        "np_scalar": np.int64(5),
    }
    save_safe(tmp_path, "s", state)
    back = load_safe(tmp_path, "s")
    assert back["tuple"] == (3, (1, 2), None) and isinstance(back["tuple"][1], tuple)
    assert set(back["int_keys"]) == {0, 1} and torch.equal(back["int_keys"][0]["step"], torch.tensor(7.0))
    assert back["reserved"] == {"__tensor__": "not a tensor"}
    assert back["array"].dtype == np.uint32 and back["array"].tolist() == [0, 1, 2, 3, 4]
    assert back["floats"][:3] == [0.1, 1e-300, float("inf")] and str(back["floats"][3]) == "-0.0"
    assert back["bf16"].dtype == torch.bfloat16 and torch.equal(back["bf16"], state["bf16"])
    assert torch.equal(back["bytes"], state["bytes"]) and back["np_scalar"] == 5
    json.loads((tmp_path / "s.json").read_text())  # plain JSON


def test_unsafe_values_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="cannot save function"):
        save_safe(tmp_path, "s", {"f": lambda: 0})
    with pytest.raises(ConfigError, match="cannot save Trap"):
        save_safe(tmp_path, "s", {"x": Trap(tmp_path / "m")})
    assert list(tmp_path.iterdir()) == []


def test_optimizer_state_resumes_bit_for_bit(tmp_path):
    """AdamW continued after a save/load equals AdamW run straight: the state (step counts,
    moments, int-keyed) and the LR schedule round-trip exactly; equal operations on equal
    inputs give equal bits on one machine."""
    def build():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.9))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
        return model, opt, sched

    def step(model, opt, sched, k):
        x = torch.arange(4.0) + k
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.step()
        sched.step()

    model, opt, sched = build()
    for k in range(2):
        step(model, opt, sched, k)
    save_safe(tmp_path, "opt", {"model": dict(model.state_dict()), "opt": opt.state_dict(),
                                "sched": sched.state_dict()})
    for k in range(2, 4):
        step(model, opt, sched, k)

    model2, opt2, sched2 = build()
    saved = load_safe(tmp_path, "opt")
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    assert opt2.param_groups[0]["betas"] == (0.8, 0.9)
    for k in range(2, 4):
        step(model2, opt2, sched2, k)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_rng_states_round_trip_through_files(tmp_path):
    gen = np.random.default_rng(3)
    save_safe(tmp_path, "rng", capture_rng(gen))
    first = (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item(), gen.random())
    restore_rng(load_safe(tmp_path, "rng"), gen)
    assert (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item(), gen.random()) == first


# -- reward-model heads ------------------------------------------------------------------------------


def test_reward_head_trap_is_refused(tmp_path):
    pytest.importorskip("transformers")
    from collab_env.adapters.common.joint_reward import HEAD_FILE, META_FILE, JointRewardModel

    marker, raw, zipped = trap_files(tmp_path)
    folder = tmp_path / "rm"
    folder.mkdir()
    (folder / META_FILE).write_text(json.dumps({"format": 1}))
    (folder / "reward_head.pt").write_bytes(zipped)
    with pytest.raises(ConfigError, match="old pickle format.*not supported"):
        JointRewardModel.from_pretrained(folder, device="cpu")
    (folder / HEAD_FILE).write_bytes(raw)
    with pytest.raises(ConfigError, match="not a safetensors file"):
        JointRewardModel.from_pretrained(folder, device="cpu")
    assert not marker.exists()


def test_tensor_files_round_trip(tmp_path):
    head = {"weight": torch.randn(1, 8), "bias": torch.zeros(1)}
    save_tensors(tmp_path / "reward_head.safetensors", head)
    back = load_tensors(tmp_path / "reward_head.safetensors")
    assert set(back) == {"weight", "bias"} and all(torch.equal(back[k], head[k]) for k in head)
    save_tensors(tmp_path / "again.safetensors", back)
    assert torch.equal(load_tensors(tmp_path / "again.safetensors")["weight"], head["weight"])


# -- critics -------------------------------------------------------------------------------------------


def _iac(tiny_dir, out, **kw):
    pytest.importorskip("transformers")
    from collab_env.adapters.actor_critic import IACConfig, IACTrainer
    from collab_env.tasks.cooperative import formatters, length_ratio_rows, reward_func
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    args = IACConfig(num_agents=2, max_new_tokens=3, eval_interval=0, logging_steps=1, learning_rate=1e-2,
                     output_dir=str(out), plot=False, **kw)
    return IACTrainer(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                      reward_func=reward_func, train_dataset=length_ratio_rows("train")[:2], args=args)


def test_actor_critic_checkpoint_is_safe_and_resumes_bit_for_bit(tiny_dir, tmp_path):
    """Two items straight equal one item, a save, and a fresh trainer loading it and training
    the second: actors, critics (separate backbones) and their optimisers round-trip exactly."""
    straight = _iac(tiny_dir, tmp_path / "a", save_steps=1)
    straight.train()
    ckpt = tmp_path / "a" / "checkpoint-1"
    names = sorted(p.name for p in ckpt.iterdir())
    assert {"critic_0.json", "critic_0.safetensors", "critic_1.json", "trainer_state.json",
            "trainer_state.safetensors"} <= set(names)
    assert not [n for n in names if n.endswith((".pt", ".bin", ".pkl"))]

    resumed = _iac(tiny_dir, tmp_path / "b", save_steps=1)
    resumed.load_checkpoint(ckpt)
    assert resumed.state.items_done == 1
    resumed.train()
    assert resumed.state.items_done == 2
    for pa, pb in zip(straight.models, resumed.models, strict=True):
        for (n, p), (_, q) in zip(pa.model.named_parameters(), pb.model.named_parameters(), strict=True):
            assert torch.equal(p, q), n
    for ca, cb in zip(straight.critics, resumed.critics, strict=True):
        assert torch.equal(ca.head.weight, cb.head.weight) and torch.equal(ca.head.bias, cb.head.bias)
        for (n, p), (_, q) in zip(ca.backbone.named_parameters(), cb.backbone.named_parameters(), strict=True):
            assert torch.equal(p, q), n


def test_critic_trap_is_refused(tiny_dir, tmp_path):
    trainer = _iac(tiny_dir, tmp_path / "a")
    ckpt = trainer.save_checkpoint(tmp_path / "ckpt")
    marker, raw, zipped = trap_files(tmp_path)
    (ckpt / "critic_0.json").unlink()
    (ckpt / "critic_0.safetensors").unlink()
    (ckpt / "critic_0.pt").write_bytes(zipped)
    fresh = _iac(tiny_dir, tmp_path / "b")
    with pytest.raises(ConfigError, match="old pickle format.*not supported"):
        fresh.load_checkpoint(ckpt)
    (ckpt / "critic_0.pt").unlink()
    save_safe(ckpt, "critic_0", {"x": 1})
    (ckpt / "critic_0.safetensors").write_bytes(raw)
    with pytest.raises(ConfigError, match="not a safetensors file"):
        fresh.load_checkpoint(ckpt)
    assert not marker.exists()
    assert fresh.state.items_done == 0  # nothing was half-loaded


# -- response caches -----------------------------------------------------------------------------------


def test_cache_trap_is_refused(tmp_path):
    from collab_env.agents.cache import ResponseCache

    marker, raw, _ = trap_files(tmp_path)
    path = tmp_path / "cache.sqlite"
    path.write_bytes(raw)
    cache = ResponseCache(path, mode="replay")
    with pytest.raises(ConfigError, match="SQLite file written by ResponseCache"):
        cache.get("0" * 64)
    assert not marker.exists()


def test_cache_with_a_foreign_table_or_damaged_entry_is_refused(tmp_path):
    from collab_env.agents.cache import ResponseCache
    from collab_env.types import Completion

    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE responses (key TEXT, blob BLOB)")
    with pytest.raises(ConfigError, match="not a response cache"):
        ResponseCache(foreign, mode="replay").get("k")

    good = tmp_path / "good.sqlite"
    cache = ResponseCache(good)
    cache.put("k", {"model": "m"}, Completion(text="hi"))
    cache.close()
    with sqlite3.connect(good) as conn:
        conn.execute("UPDATE responses SET completion = ? WHERE key = 'k'", (pickle.dumps(Trap(tmp_path / "m")),))
    with pytest.raises(ConfigError, match="entry for key k is damaged"):
        ResponseCache(good, mode="replay").get("k")
    assert not (tmp_path / "m").exists()
