"""The learners' toolkit (collab_env.adapters.common): the math against hand-computed values,
masking, the evaluation schedule, logging and checkpoint RNG round trips."""

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.common.config import TrainerConfig, eval_due  # noqa: E402
from collab_env.adapters.common.losses import (  # noqa: E402
    clipped_surrogate,
    group_advantages,
    kl_k3,
    masked_aggregate,
    pack_sequences,
    policy_loss,
    token_logprobs,
)
from collab_env.errors import ConfigError  # noqa: E402

# -- advantages ----------------------------------------------------------------------------------


def test_group_advantages_by_hand():
    assert group_advantages([1, 0, 0, 1]) == [0.5, -0.5, -0.5, 0.5]
    norm = group_advantages([1, 0, 0, 1], normalize_std=True, eps=1e-4)
    assert norm == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001])
    # mean 2, population std sqrt(2/3)
    assert group_advantages([1, 2, 3]) == [-1.0, 0.0, 1.0]
    std = math.sqrt(2 / 3)
    assert group_advantages([1, 2, 3], normalize_std=True, eps=0.0) == pytest.approx([-1 / std, 0, 1 / std])
    assert group_advantages([0.7, 0.7]) == [0.0, 0.0]          # no signal, no gradient
    assert group_advantages([5.0]) == [0.0]
    assert group_advantages([]) == []


# -- losses --------------------------------------------------------------------------------------


def test_clipped_surrogate_by_hand():
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.5, 0.5]]))
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2)
    loss, active = clipped_surrogate(logp, old, adv, mask, clip_low=0.2)
    # A>0: ratio 1.5 -> min(1.5, 1.2) = 1.2; ratio 0.5 -> min(0.5, 0.8) = 0.5
    # A<0: ratio 1.5 -> min(-1.5, -1.2) = -1.5; ratio 0.5 -> min(-0.5, -0.8) = -0.8
    assert loss.flatten().tolist() == pytest.approx([-1.2, -0.5, 1.5, 0.8])
    assert active.tolist() == [[True, False], [False, True]]
    # an asymmetric upper clip
    loss_hi, _ = clipped_surrogate(logp, old, adv, mask, clip_low=0.2, clip_high=0.4)
    assert loss_hi[0, 0].item() == pytest.approx(-1.4)


def test_kl_k3_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    kl = kl_k3(logp, ref, torch.tensor([[1, 1]]))
    # d = log(0.25 / 0.5) = -log 2: exp(d) - d - 1 = 0.5 + log 2 - 1
    assert kl[0, 0].item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl[0, 1].item() == 0.0                      # same policy: zero


def test_aggregation_sequence_vs_token_by_hand():
    per_token = torch.tensor([[1.0, 3.0, 99.0], [4.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # sequence: mean(1, 3) = 2 and 4 -> (2 + 4) / 2 = 3; token: (1 + 3 + 4) / 3
    assert masked_aggregate(per_token, mask, "sequence", 2, 3).item() == pytest.approx(3.0)
    assert masked_aggregate(per_token, mask, "token", 2, 3).item() == pytest.approx(8 / 3)
    # micro-batch shares add up to the full-batch value
    a = masked_aggregate(per_token[:1], mask[:1], "sequence", 2, 3)
    b = masked_aggregate(per_token[1:], mask[1:], "sequence", 2, 3)
    assert (a + b).item() == pytest.approx(3.0)
    with pytest.raises(ConfigError):
        masked_aggregate(per_token, mask, "mean", 2, 3)


def test_policy_loss_with_kl_term_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    old = logp.detach().clone()
    ref = torch.log(torch.tensor([[0.25, 0.5]]))
    loss, stats = policy_loss(logp, old, torch.tensor([2.0]), torch.tensor([[1, 1]]), ref_logp=ref, beta=0.1)
    kl = (0.5 + math.log(2) - 1) / 2                  # mean over the two tokens
    assert stats["policy_loss"].item() == pytest.approx(-2.0)  # ratio 1: -A
    assert stats["kl"].item() == pytest.approx(kl)
    assert loss.item() == pytest.approx(-2.0 + 0.1 * kl)
    assert stats["clip_fraction"].item() == 0.0


def test_masked_tokens_get_exactly_zero_gradient_even_with_garbage_logprobs():
    logp = torch.tensor([[-0.5, -1.0, -1e4], [-0.2, -3e4, -5e4]], requires_grad=True)
    old = torch.tensor([[-0.4, -1.2, 0.0], [-0.3, 0.0, 0.0]])
    ref = torch.tensor([[-0.6, -0.9, 0.0], [-0.1, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    for loss_type in ("sequence", "token"):
        logp.grad = None
        loss, _ = policy_loss(logp, old, torch.tensor([1.0, -0.5]), mask, ref_logp=ref, beta=0.3,
                              loss_type=loss_type)
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.all(logp.grad[mask == 0] == 0.0)
        assert torch.all(logp.grad[mask == 1] != 0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model

    return load_tiny_chat_model(build_tiny_chat_model(tmp_path_factory.mktemp("tiny")))


def test_pack_sequences_layout():
    b = pack_sequences([[5, 6, 7], [8]], [[1, 2], [3, 4, 9]], pad_id=0)
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 2, 0], [0, 0, 8, 3, 4, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert b.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert b.position_ids.tolist()[1][2:] == [0, 1, 2, 3]


def test_padding_never_reaches_the_loss_or_the_gradient(tiny):
    """Changing what sits in padding slots (prompt left-padding, completion right-padding)
    changes neither the loss nor any parameter gradient: bit for bit."""
    model, _ = tiny
    prompts, completions = [[3, 4, 5, 6], [7, 8]], [[9, 10], [11, 12, 13, 14]]
    adv = torch.tensor([1.0, -1.0])
    results = []
    for pad in (0, 50):
        batch = pack_sequences(prompts, completions, pad_id=pad)
        model.zero_grad(set_to_none=True)
        logp = token_logprobs(model, batch)
        loss, _ = policy_loss(logp, logp.detach() - 0.1, adv, batch.completion_mask)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert results[0][0] == results[1][0]
    for n in results[0][1]:
        assert torch.equal(results[0][1][n], results[1][1][n]), n
    model.zero_grad(set_to_none=True)


def test_token_logprobs_match_a_plain_forward(tiny):
    model, _ = tiny
    batch = pack_sequences([[3, 4, 5], [6]], [[7, 8], [9]], pad_id=0)
    got = token_logprobs(model, batch)
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([[3, 4, 5, 7, 8]])).logits[0].float(), -1)
    assert got[0, 0].item() == pytest.approx(full[2, 7].item(), abs=1e-5)
    assert got[0, 1].item() == pytest.approx(full[3, 8].item(), abs=1e-5)
    with torch.no_grad():
        one = torch.log_softmax(model(torch.tensor([[6, 9]])).logits[0].float(), -1)
    assert got[1, 0].item() == pytest.approx(one[0, 9].item(), abs=1e-5)


def _forward_shapes(model):
    """A list that records the ``input_ids`` shape of every forward of ``model``, and its hook."""
    shapes = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        shapes.append(tuple(ids.shape))

    return shapes, model.register_forward_pre_hook(hook, with_kwargs=True)


# Three rows of one prompt, two of another (shorter: left padding), one alone; completions of
# 4, 1, 3, 2, 4 and 3 tokens (right padding), so sharing meets both paddings.
SHARED_PROMPTS = [[3, 4, 5, 6]] * 3 + [[7, 8]] * 2 + [[9, 10, 11]]
SHARED_COMPLETIONS = [[12, 13, 14, 15], [16], [17, 18, 19], [20, 21], [22, 23, 24, 25], [26, 27, 28]]


def test_pack_sequences_finds_the_repeated_prompts():
    b = pack_sequences(SHARED_PROMPTS, SHARED_COMPLETIONS, pad_id=0)
    assert b.prompt_rows.tolist() == [0, 3, 5]
    assert b.prompt_index.tolist() == [0, 0, 0, 1, 1, 2]
    # the same ids with no prompt repeated: nothing to share
    alone = pack_sequences([[3, 4], [3, 5]], [[1], [2]], pad_id=0)
    assert alone.prompt_rows is None and alone.prompt_index is None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompts_give_the_values_and_gradients_of_reading_every_row(tiny, temperature):
    """Reading each distinct prompt once (its KV cache indexed per row) gives every row's
    log-probs and every parameter's gradient of reading each row whole, up to float32 rounding;
    and it does read each prompt once: a forward over the 3 distinct prompts, then one over the
    6 completions but their last token."""
    model, _ = tiny
    batch = pack_sequences(SHARED_PROMPTS, SHARED_COMPLETIONS, pad_id=0)
    mask = batch.completion_mask.bool()
    weights = torch.linspace(-1.0, 2.0, mask.numel()).reshape(mask.shape)  # a gradient unlike any row's
    results = {}
    model.train()
    for share in (False, True):
        shapes, handle = _forward_shapes(model)
        model.zero_grad(set_to_none=True)
        try:
            logp = token_logprobs(model, batch, temperature, share_prompts=share)
        finally:
            handle.remove()
        (logp * weights).masked_fill(~mask, 0.0).sum().backward()
        results[share] = (logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, shapes)
    model.zero_grad(set_to_none=True)
    model.eval()
    (plain, plain_grads, plain_shapes), (shared, shared_grads, shared_shapes) = results[False], results[True]
    assert plain_shapes == [(6, 8)]                  # prompts padded to 4 + completions padded to 4
    assert shared_shapes == [(3, 4), (6, 3)]         # the distinct prompts, then the completions
    assert torch.allclose(shared[mask], plain[mask], atol=1e-5, rtol=0)
    for name, grad in plain_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-6, rtol=1e-4), name


def test_shared_prompts_with_one_token_completions_need_one_forward(tiny):
    model, _ = tiny
    batch = pack_sequences([[3, 4, 5]] * 2 + [[6]], [[7], [8], [9]], pad_id=0)
    shapes, handle = _forward_shapes(model)
    try:
        with torch.no_grad():
            shared = token_logprobs(model, batch)
            plain = token_logprobs(model, batch, share_prompts=False)
    finally:
        handle.remove()
    assert shapes == [(2, 3), (3, 4)]
    assert torch.allclose(shared, plain, atol=1e-5, rtol=0)


def test_gradient_checkpointing_reads_every_row_whole(tmp_path):
    """HF turns the KV cache off in training under gradient checkpointing: every row is read
    whole then (and sharing comes back for the no-grad passes in eval mode)."""
    from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model

    model, _ = load_tiny_chat_model(build_tiny_chat_model(tmp_path / "tiny"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = pack_sequences(SHARED_PROMPTS, SHARED_COMPLETIONS, pad_id=0)
    shapes, handle = _forward_shapes(model)
    try:
        model.train()
        token_logprobs(model, batch).sum().backward()
        assert shapes == [(6, 8)]
        model.eval()
        with torch.no_grad():
            token_logprobs(model, batch)
        assert shapes[1:] == [(3, 4), (6, 3)]
    finally:
        handle.remove()


# -- schedule and config -------------------------------------------------------------------------


def test_eval_schedule_guide_example():
    """eval_interval=4 over 2 epochs of 8 items: before items 0 and 4 of each epoch."""
    due = [(epoch, i) for epoch in range(2) for i in range(8) if eval_due(i, 1, 4)]
    assert due == [(0, 0), (0, 4), (1, 0), (1, 4)]
    assert not any(eval_due(i, 1, 0) for i in range(8))        # 0: manual only
    # batches of 3 over 8 items: 0-2 holds item 0, 3-5 holds item 4, 6-7 holds neither
    assert [i for i in range(0, 8, 3) if eval_due(i, min(3, 8 - i), 4)] == [0, 3]


def test_config_validation_messages():
    with pytest.raises(ConfigError, match="learning_rate"):
        TrainerConfig(learning_rate=-1.0)
    with pytest.raises(ConfigError, match="lr_scheduler_type"):
        TrainerConfig(lr_scheduler_type="exp")
    with pytest.raises(ConfigError, match="max_steps"):
        TrainerConfig(max_steps=0)
    assert TrainerConfig(lora_target_modules=["q_proj"]).lora_target_modules == ("q_proj",)


# -- logging and checkpoints ---------------------------------------------------------------------


def test_metrics_logger_writes_jsonl_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    from collab_env.adapters.common.logging import MetricsLogger, read_jsonl

    log = MetricsLogger(tmp_path, {"a": 1})
    log.log({"turn_1/reward_mean": 0.5, "loss": torch.tensor(0.25)}, env_step=4)
    log.log({"eval/turn_1/reward_mean": 0.7}, env_step=4)
    log.log({"turn_1/reward_mean": 0.6}, env_step=8)
    assert read_jsonl(tmp_path / "metrics.jsonl")[0] == {"env_step": 4, "turn_1/reward_mean": 0.5, "loss": 0.25}
    png = log.plot()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = MetricsLogger(tmp_path, resume=True)
    again.log({"turn_1/reward_mean": 0.9}, env_step=12)
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 4
    with pytest.raises(ConfigError, match="unknown wandb_config"):
        MetricsLogger(tmp_path, wandb_config={"projekt": "x"})


def test_wandb_offline(tmp_path):
    pytest.importorskip("wandb")
    from collab_env.adapters.common.logging import MetricsLogger

    log = MetricsLogger(tmp_path / "out", {"lr": 1e-5}, {
        "project": "collab-env-test", "name": "offline", "tags": ["t"], "mode": "offline",
        "dir": str(tmp_path / "wandb"), "config_sections": {"output": {"verbose": False}}})
    assert log.verbose is False
    log.log({"turn_1/reward_mean": 0.5}, env_step=1)
    log.close()
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert runs, "wandb wrote no offline run"


def test_rng_round_trip():
    import random

    import numpy as np

    from collab_env.adapters.common.checkpoint import capture_rng, restore_rng

    gen = np.random.default_rng(3)
    state = capture_rng(gen)
    first = (random.random(), np.random.rand(), torch.rand(1).item(), gen.random())
    restore_rng(state, gen)
    assert (random.random(), np.random.rand(), torch.rand(1).item(), gen.random()) == first
    json.dumps(gen.bit_generator.state)  # the trainer's generator state is plain data


def test_generation_backend_choice_and_missing_vllm(tmp_path):
    import importlib.util

    from collab_env.adapters.common.config import TrainerConfig
    from collab_env.adapters.common.models import _use_vllm
    from collab_env.errors import ConfigError

    with pytest.raises(ConfigError, match="generation_backend"):
        TrainerConfig(generation_backend="sglang")
    assert _use_vllm(TrainerConfig(generation_backend="hf"), "cuda") is False
    assert _use_vllm(TrainerConfig(), "cpu") is False  # auto: vLLM only on CUDA
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ConfigError, match="collab_env\\[vllm\\]"):
            _use_vllm(TrainerConfig(generation_backend="vllm"), "cpu")


# -- the run loop, the run state and the task source ----------------------------------------------


class _FakeLogger:
    verbose = False

    def __init__(self):
        self.lines = []

    def log(self, metrics, **position):
        line = {**position, **metrics}
        self.lines.append(line)
        return line

    def plot(self):
        pass

    def wrote(self, path):
        pass

    def summary(self, name, done):
        self.done = dict(done)
        return ""


class _FakeLearner:
    """Records what the run loop asks of it; each step earns 3 env steps and one update."""

    def __init__(self, schedule):
        from types import SimpleNamespace

        from collab_env.adapters.common.loop import RunState

        self.args = SimpleNamespace(plot=False)
        self.state = RunState()
        self.logger = _FakeLogger()
        self._schedule = schedule
        self.calls = []

    def schedule(self):
        return self._schedule

    def train_step(self, batch):
        self.calls.append(("step", self.state.epoch, tuple(batch)))
        self.state.optimizer_steps += 1
        return {"loss": float(len(batch)), "tokens": 2.0, "env_steps": 3}

    def evaluate(self):
        self.calls.append(("eval", self.state.epoch, self.state.in_epoch))
        return {}

    def save_checkpoint(self, path=None):
        self.calls.append(("save", self.state.items_done))

    def end_epoch(self):
        self.calls.append(("end_epoch", self.state.epoch))
        return {}


def test_run_loop_item_schedule_by_hand():
    """5 items per epoch, 2 epochs, batches of 2, CoMLRL evaluation every 3 items, a log every
    6 env steps (2 batches), a checkpoint every 4 items."""
    from collab_env.adapters.common.loop import Learner, Schedule, run

    s = Schedule(unit="item", per_epoch=5, limit=10, epochs=2, batch=2, eval_every=3, can_evaluate=True,
                 log_every=6, save_every=4)
    learner = _FakeLearner(s)
    assert isinstance(learner, Learner)
    run(learner)
    steps = [c[2] for c in learner.calls if c[0] == "step"]
    assert steps == [(0, 1), (2, 3), (4,), (0, 1), (2, 3), (4,)]  # an epoch's last batch is cut
    # batches holding item 0 or 3 of an epoch are evaluated first
    assert [c[1:] for c in learner.calls if c[0] == "eval"] == [(0, 0), (0, 2), (1, 0), (1, 2)]
    assert [c[1] for c in learner.calls if c[0] == "save"] == [4]  # items done 2, 4, 5, 7, 9, 10
    assert [c[1] for c in learner.calls if c[0] == "end_epoch"] == [0, 1, 2]  # each epoch, then the run
    st = learner.state
    assert (st.epoch, st.in_epoch, st.items_done, st.env_step, st.optimizer_steps) == (2, 0, 10, 18, 6)
    # logs at env steps 6, 12, 18: the mean loss of their two batches, positions as logged
    assert [(line["env_step"], line["epoch"], line["item"], line["loss"]) for line in learner.logger.lines] == [
        (6, 0, 4, 2.0), (12, 1, 7, 1.5), (18, 1, 10, 1.5)]


def test_run_loop_step_schedule_by_hand():
    """Step learners: 3 steps per epoch, 2 epochs capped at 5 steps; evaluation when the steps
    done are a multiple of 2 and after the last; a log every 9 env steps (3 steps), tokens summed
    over its window; the line of an epoch's last step carries the next epoch."""
    from collab_env.adapters.common.loop import Schedule, run

    s = Schedule(unit="step", per_epoch=3, limit=5, epochs=2, eval_every=2, eval_rule="done", can_evaluate=True,
                 final_eval=True, log_every=9, log_item=False, log_next_epoch=True, summed=("tokens",))
    learner = _FakeLearner(s)
    run(learner)
    assert [c[2] for c in learner.calls if c[0] == "step"] == [(0,), (1,), (2,), (0,), (1,)]
    evals = [c[1:] for c in learner.calls if c[0] == "eval"]
    assert evals == [(0, 0), (0, 2), (1, 1), (1, 2)]  # before steps 0, 2, 4, then the final one
    assert [(line["env_step"], line["epoch"], line["tokens"]) for line in learner.logger.lines] == [
        (9, 1, 6.0), (15, 1, 4.0)]
    assert all("item" not in line for line in learner.logger.lines)


def test_run_loop_update_rules_evaluate_and_save_once_per_update_count():
    """Online DPO's rules: a batch that takes no optimiser step neither re-evaluates nor saves."""
    from collab_env.adapters.common.loop import Schedule, run

    s = Schedule(unit="item", per_epoch=4, limit=4, epochs=1, batch=1, eval_every=1, eval_rule="update",
                 can_evaluate=True, log_every=1, log_rule="update", save_every=1, save_rule="update")
    learner = _FakeLearner(s)
    step = learner.train_step

    def every_other(batch):  # items 0 and 2 take no optimiser step
        out = step(batch)
        if batch[0] % 2 == 0:
            learner.state.optimizer_steps -= 1
        return out

    learner.train_step = every_other
    run(learner)
    assert [c[2] for c in learner.calls if c[0] == "eval"] == [0, 2]  # at 0 updates (item 0), at 1 (item 2)
    assert [c[1] for c in learner.calls if c[0] == "save"] == [2, 4]  # after the updates of items 1 and 3
    assert learner.state.optimizer_steps == 2


def test_run_state_round_trips_through_its_saved_dict():
    from dataclasses import asdict

    from collab_env.adapters.common.loop import RunState

    state = RunState(epoch=1, in_epoch=3, items_done=7, env_step=21, optimizer_steps=4, last_log_step=20)
    assert RunState.from_dict(asdict(state)) == state
    assert RunState.from_dict({**asdict(state), "unknown": 1}) == state
    # the former names are gone: in_epoch is the one name, read and written
    assert not hasattr(state, "item_in_epoch") and not hasattr(state, "step_in_epoch")
    assert RunState.from_dict({"epoch": 1, "item_in_epoch": 3}).in_epoch == 0


def test_learner_sampling_from_a_config():
    """The config's sampling fields travel as one SamplingParams (what the rollout tree takes)."""
    from types import SimpleNamespace

    from collab_env.adapters.common.config import learner_sampling
    from collab_env.adapters.common.task import sampling_keywords
    from collab_env.policy import SamplingParams

    a = SimpleNamespace(temperature=0.7, top_p=0.9, top_k=None, max_new_tokens=16, eval_max_new_tokens=4,
                        eval_greedy=False)
    assert learner_sampling(a) == SamplingParams(temperature=0.7, top_p=0.9, top_k=None, max_new_tokens=16)
    assert sampling_keywords(learner_sampling(a)) == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 16}
    assert learner_sampling(a, True).max_new_tokens == 4
    a.eval_greedy = True
    assert learner_sampling(a, True) == SamplingParams(temperature=0.0, max_new_tokens=4)
    assert learner_sampling(a).temperature == 0.7  # greedy is for evaluation only


def test_every_learner_implements_the_learner_protocol():
    """run() calls only the protocol's public methods; every trainer class defines them."""
    from collab_env.adapters import (
        DPOTrainer,
        IACTrainer,
        MAACTrainer,
        MADPOTrainer,
        MAGRPOTrainer,
        MAREINFORCETrainer,
        OnlineDPOTrainer,
        RewardModelTrainer,
        SFTTrainer,
    )

    for cls in (MAGRPOTrainer, MAREINFORCETrainer, IACTrainer, MAACTrainer, DPOTrainer, OnlineDPOTrainer,
                SFTTrainer, RewardModelTrainer, MADPOTrainer):
        for name in ("schedule", "train_step", "evaluate", "save_checkpoint", "end_epoch"):
            assert callable(getattr(cls, name, None)), (cls.__name__, name)


def test_adamw_fused_and_plain_take_the_same_step():
    import torch

    from collab_env.adapters.common.config import TrainerConfig
    from collab_env.adapters.common.models import adamw
    from collab_env.errors import ConfigError

    torch.manual_seed(0)
    start, grads = torch.randn(1000), [torch.randn(1000) for _ in range(3)]
    out = {}
    for optim in ("adamw_torch_fused", "adamw_torch"):
        p = torch.nn.Parameter(start.clone())
        opt = adamw([p], TrainerConfig(learning_rate=1e-2, weight_decay=0.1, optim=optim))
        assert bool(opt.defaults.get("fused")) == (optim == "adamw_torch_fused")
        for g in grads:
            p.grad = g.clone()
            opt.step()
        out[optim] = p.detach()
    # the same update up to float32 rounding (the kernels order the operations differently)
    assert not torch.equal(out["adamw_torch"], start)
    torch.testing.assert_close(out["adamw_torch_fused"], out["adamw_torch"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="optim"):
        TrainerConfig(optim="sgd")
