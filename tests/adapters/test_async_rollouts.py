"""async_rollouts: the next batch is rolled out in the background by a frozen copy of the weights
while the current batch updates (collab_env/adapters/common/async_rollout.py).

What the tests pin: the first batch is a synchronous run's; every later batch was sampled by the
weights of exactly one update before those it trains (checked on the weights themselves: the
sampler's log-probs of each batch are recomputed under every recorded version of the weights);
the same seeds as a synchronous run; errors of the background rollout surface in the next step;
the thread ends with training, also on an error or an interrupt; a checkpoint drops the batch in
flight and a resumed run rolls it out again from the same seeds; the config's checks."""

import asyncio
import copy
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import collab_env  # noqa: E402
from collab_env._async import run_sync  # noqa: E402
from collab_env.adapters.common.async_rollout import PendingRollout, RolloutWorker  # noqa: E402
from collab_env.adapters.common.losses import pack_sequences, token_logprobs  # noqa: E402
from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from collab_env.adapters.reinforce import MAREINFORCEConfig, MAREINFORCETrainer, MAReMaxConfig  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.tasks.cooperative import formatters, length_ratio_rows  # noqa: E402

WORKER = "collab-env-rollout"


def _reward(completions, *, batch_items):
    return [min(len(c), 12) / 12.0 for c in completions]


def _rollout_threads():
    return [t for t in threading.enumerate() if t.name == WORKER and t.is_alive()]


def _trainer(tiny_dir, tmp_path, name, *, items=4, reward=_reward, trainer_class=MAGRPOTrainer,
             config_class=MAGRPOConfig, **kw):
    """A one-agent GRPO run on the first ``items`` length-ratio rows (batch 1), recording every
    batch's samples (prompt ids, completion ids, sampler log-probs) and the weights after every
    update (``versions[k]``: after ``k`` updates)."""
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    base = dict(num_agents=1, num_generations=2, max_new_tokens=4, eval_interval=0, logging_steps=1,
                learning_rate=1e-2, plot=False, output_dir=str(tmp_path / name))
    base.update(kw)
    trainer = trainer_class(agent_model=model, tokenizer=tok, num_agents=1, formatters=[formatters[0]],
                            reward_func=reward, train_dataset=length_ratio_rows("train")[:items],
                            args=config_class(**base))
    trainer.batches, trainer.versions = [], []
    node_groups, learn = trainer.node_groups, trainer.learn

    def record_batch(levels, *args, **kwargs):
        trainer.batches.append([(list(n.prompt_ids[a]), tuple(c.token_ids), tuple(c.logprobs))
                                for nodes in levels for n in nodes for a in n.acting for c in n.completions[a]])
        return node_groups(levels, *args, **kwargs)

    def record_weights(groups):
        out = learn(groups)
        trainer.versions.append(_weights(trainer))
        return out

    trainer.node_groups, trainer.learn = record_batch, record_weights
    trainer.versions.append(_weights(trainer))
    return trainer


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.models[0].model.state_dict().items()}


def _sampled_by(trainer, batch, tol=1e-4):
    """The versions of the weights (updates done) under which ``batch``'s sampler log-probs are
    the model's own log-probs (temperature 1, no top-p/top-k: the sampled distribution)."""
    pm = trainer.models[0]
    probe = copy.deepcopy(pm.model)
    probe.eval()
    packed = pack_sequences([b[0] for b in batch], [b[1] for b in batch], pm.pad_id)
    found = []
    for k, weights in enumerate(trainer.versions):
        probe.load_state_dict(weights)
        with torch.no_grad():
            logp = token_logprobs(probe, packed, 1.0)
        ok = True
        for row, (_, ids, sampled) in enumerate(batch):
            got = logp[row, :len(ids)].tolist()
            ok &= all(abs(a - b) <= tol for a, b in zip(got, sampled, strict=True))
        if ok:
            found.append(k)
    return found


# -- which weights sampled which batch -----------------------------------------------------------


def test_first_batch_is_the_synchronous_one_and_each_later_batch_is_one_update_stale(tiny_dir, tmp_path):
    sync = _trainer(tiny_dir, tmp_path, "sync")
    sync.train()
    overlapped = _trainer(tiny_dir, tmp_path, "async", async_rollouts=True)
    overlapped.train()
    frozen = _trainer(tiny_dir, tmp_path, "sync-lr0", learning_rate=0.0)  # the initial weights throughout
    frozen.train()
    assert len(sync.batches) == len(overlapped.batches) == 4
    # same seeds: the first batch is the synchronous run's, token for token and log-prob for log-prob
    assert overlapped.batches[0] == sync.batches[0]
    # the second was sampled by the initial weights (the snapshot before update 1) from the same
    # seeds as the synchronous run's second batch: exactly what a run that never updates samples
    assert overlapped.batches[1] == frozen.batches[1]
    assert overlapped.batches[1] != sync.batches[1]  # the synchronous run sampled it after update 1
    # on the weights themselves: batch k (0-based) of the overlapped run was sampled by the
    # weights after k - 1 updates (the first: the initial ones), the synchronous run's by k
    assert [_sampled_by(overlapped, b) for b in overlapped.batches] == [[0], [0], [1], [2]]
    assert [_sampled_by(sync, b) for b in sync.batches] == [[0], [1], [2], [3]]
    # the log says how stale each batch was; the synchronous log does not have the key
    steps = [r for r in overlapped.logger.records if "loss" in r]
    assert [r["off_policy_steps"] for r in steps] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["rollout_wait_s"] >= 0.0 for r in steps)
    assert not any("off_policy_steps" in r for r in sync.logger.records)
    assert overlapped.args.is_correction == "token_truncate" and sync.args.is_correction is None
    assert not _rollout_threads()  # the worker ended with training


def test_reinforce_overlaps_too_and_a_multi_epoch_run_prefetches_across_the_epoch_boundary(tiny_dir, tmp_path):
    """REINFORCE (no importance correction field) with 3 items, 2 epochs, batches of 2: the loop
    announces [2] after [0, 1], then [0, 1] of the next epoch, then [2]."""
    kw = dict(trainer_class=MAREINFORCETrainer, config_class=MAREINFORCEConfig, items=3, num_train_epochs=2,
              per_device_train_batch_size=2)
    sync = _trainer(tiny_dir, tmp_path, "sync", **kw)
    sync.train()
    overlapped = _trainer(tiny_dir, tmp_path, "async", async_rollouts=True, **kw)
    announced = []
    prefetch = overlapped.prefetch
    overlapped.prefetch = lambda nxt: (announced.append(nxt), prefetch(nxt))[1]
    overlapped.train()
    assert announced == [[2], [0, 1], [2], None]
    assert overlapped.batches[0] == sync.batches[0]
    assert [_sampled_by(overlapped, b) for b in overlapped.batches] == [[0], [0], [1], [2]]
    steps = [r for r in overlapped.logger.records if "off_policy_steps" in r]
    assert [r["off_policy_steps"] for r in steps] == [0.0, 1.0, 1.0, 1.0]


# -- errors and the thread's end ---------------------------------------------------------------


def test_an_error_in_the_background_rollout_is_raised_by_the_next_step_with_its_traceback(tiny_dir, tmp_path):
    second = length_ratio_rows("train")[1]["prompt"]

    def reward_that_fails_on_the_second_item(completions, *, batch_items):
        if batch_items[0]["prompt"] == second:
            raise ValueError("judge unavailable")
        return _reward(completions, batch_items=batch_items)

    trainer = _trainer(tiny_dir, tmp_path, "async", async_rollouts=True, reward=reward_that_fails_on_the_second_item)
    with pytest.raises(Exception) as info:
        trainer.train()
    # raised by step 2, after step 1's update, in the main thread
    assert trainer.state.optimizer_steps == 1 and trainer.state.items_done == 1
    chain, exc = [], info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert any("judge unavailable" in str(e) for e in chain)
    # the traceback reaches into the worker thread: the reward function's frame is in it
    assert "reward_that_fails_on_the_second_item" in "".join(_frames(chain))
    assert any("background rollout of training items [1]" in n for n in getattr(info.value, "__notes__", []))
    assert not _rollout_threads()


def _frames(chain):
    import traceback

    return [line for e in chain for line in traceback.format_tb(e.__traceback__)]


@pytest.mark.parametrize("error", [RuntimeError("update failed"), KeyboardInterrupt()])
def test_the_thread_stops_when_training_fails_or_is_interrupted(tiny_dir, tmp_path, error):
    trainer = _trainer(tiny_dir, tmp_path, "async", async_rollouts=True)
    loss = trainer.loss

    def failing_loss(*args, **kwargs):
        if trainer.state.items_done == 1:  # step 2's update: step 3's rollout is in flight
            assert trainer._overlap.pending is not None and _rollout_threads()
            raise error
        return loss(*args, **kwargs)

    trainer.loss = failing_loss
    with pytest.raises(type(error)):
        trainer.train()
    assert trainer._overlap.pending is None
    assert not _rollout_threads()
    assert trainer.state.items_done == 1 and trainer.state.optimizer_steps == 1


def test_the_worker_cancels_a_waiting_rollout_and_runs_the_next_one_on_its_own_loop():
    worker = RolloutWorker()
    try:
        loops = []

        async def where():
            loops.append(asyncio.get_running_loop())
            await asyncio.sleep(30)  # an API call that takes its time

        slow = worker.submit(PendingRollout(lambda check: run_sync(where()), key=1, versions=(0,)))
        while not loops:
            time.sleep(0.01)
        start = time.perf_counter()
        worker.cancel(slow)
        assert slow.wait(10) and time.perf_counter() - start < 5
        with pytest.raises(asyncio.CancelledError):
            slow.get()

        async def quick():
            loops.append(asyncio.get_running_loop())
            return threading.current_thread().name

        nxt = worker.submit(PendingRollout(lambda check: run_sync(quick()), key=2, versions=(0,)))
        assert nxt.get() == WORKER
        assert loops[0] is loops[1] and loops[0] is not asyncio.new_event_loop()  # one loop, kept
        # a cancelled rollout stops at its next seed draw, too
        stopped = PendingRollout(lambda check: check(), key=3, versions=(0,))
        stopped.cancelled.set()
        with pytest.raises(Exception, match="cancelled"):
            worker.submit(stopped).get()
    finally:
        assert worker.close(timeout=10)
    assert not worker.alive and loops[0].is_closed()


# -- checkpoints -------------------------------------------------------------------------------


def test_a_checkpoint_drops_the_batch_in_flight_and_a_resumed_run_rolls_it_again_from_the_same_seeds(
        tiny_dir, tmp_path):
    # Without updates every version of the weights is the same: a resumed run must sample
    # exactly the uninterrupted run's third batch, i.e. the checkpoint (saved after step 2,
    # while batch 3 was rolled out) holds the generator as it was before batch 3's rollout.
    straight = _trainer(tiny_dir, tmp_path, "a", items=3, learning_rate=0.0, save_steps=2, async_rollouts=True)
    straight.train()
    resumed = _trainer(tiny_dir, tmp_path, "b", items=3, learning_rate=0.0, async_rollouts=True)
    resumed.train(resume_from_checkpoint=tmp_path / "a" / "checkpoint-2")
    assert len(resumed.batches) == 1 and resumed.batches[0] == straight.batches[2]
    # With updates: the resumed run samples batch 3 with the checkpoint's weights (on-policy,
    # off_policy_steps 0), as a synchronous run resumed from the same checkpoint does.
    straight = _trainer(tiny_dir, tmp_path, "c", items=3, save_steps=2, async_rollouts=True)
    straight.train()
    resumed = _trainer(tiny_dir, tmp_path, "d", items=3, async_rollouts=True)
    resumed.train(resume_from_checkpoint=tmp_path / "c" / "checkpoint-2")
    resumed_sync = _trainer(tiny_dir, tmp_path, "e", items=3, is_correction="token_truncate")
    resumed_sync.train(resume_from_checkpoint=tmp_path / "c" / "checkpoint-2")
    assert resumed.batches == resumed_sync.batches and resumed.batches[0] != straight.batches[2]
    for name, value in resumed.versions[-1].items():
        assert torch.equal(value, resumed_sync.versions[-1][name]), name
    assert [r["off_policy_steps"] for r in resumed.logger.records if "off_policy_steps" in r][-1] == 0.0


# -- the frozen copy, bindings, evaluation --------------------------------------------------------


def test_the_futures_of_the_training_env_play_the_frozen_copy_and_evaluation_the_live_model(tiny_dir, tmp_path):
    """async overlap hands the driver its frozen copy as the trained player's policy, so the
    training rollouts' MR futures are played by the copy that wrote the replies, and evaluation
    (the live model) by the live one: no binding, and one env object can serve both."""
    from collab_env.rewards.mr import MultiturnAwareReward
    from collab_env.testing.tiny_model import load_tiny_chat_model

    def mr():
        return MultiturnAwareReward(collab_env.make("hidden-facts-easy"),
                                    weights={"accuracy_rule": 1.0}, num_rollouts=1, max_user_turns=1,
                                    max_assistant_turns=2, aggregation="collabllm",
                                    sampling={"assistant": {"max_new_tokens": 4}})

    def recorded(env):
        """The assistant policy of every set of futures ``env``'s reward rolls (clones share it)."""
        played = []
        future_policies = env.scorer.future_policies

        def recording(policies):
            table, from_driver = future_policies(policies)
            played.append(table["assistant"])
            return table, from_driver

        env.scorer.future_policies = recording
        return played

    model, tok = load_tiny_chat_model(tiny_dir)
    train_env, eval_env = mr(), mr()
    args = MAGRPOConfig(num_agents=1, num_generations=2, max_new_tokens=4, max_steps=2, eval_interval=1,
                        eval_num_samples=1, plot=False, output_dir=str(tmp_path / "o"), async_rollouts=True)
    trainer = MAGRPOTrainer(agent_model=model, tokenizer=tok, env=train_env, eval_env=eval_env, args=args)
    frozen, live = trainer._overlap.models[0], trainer.models[0]
    assert frozen.model is not live.model
    trained_by, evaluated_by = recorded(train_env), recorded(eval_env)
    trainer.train()  # evaluations run between the steps, while the next rollout is in flight
    assert sum("eval/turn_1/reward_mean" in r for r in trainer.logger.records) == 2
    # training futures: the frozen copy that wrote the replies; evaluation futures: the live model
    assert trained_by and all(p is frozen.generator for p in trained_by)
    assert evaluated_by and all(p is live.generator for p in evaluated_by)
    assert train_env.scorer.named == {} and eval_env.scorer.named == {}
    # one env object serves both: each run plays the policy table it is given
    model, tok = load_tiny_chat_model(tiny_dir)
    shared = mr()
    MAGRPOTrainer(agent_model=model, tokenizer=tok, env=shared, eval_env=shared, args=args)


def test_lora_snapshot_copies_the_adapters_and_shares_the_base_weights(tiny_dir, tmp_path):
    pytest.importorskip("peft")
    trainer = _trainer(tiny_dir, tmp_path, "lora", async_rollouts=True, lora_r=2, lora_alpha=4.0, items=2)
    live, frozen = trainer.models[0].model, trainer._overlap.models[0].model
    pairs = list(zip(live.named_parameters(), frozen.named_parameters(), strict=True))
    assert all((q is p) != p.requires_grad for (_, p), (_, q) in pairs)  # frozen: shared; adapters: copied
    trainer.train()
    assert [_sampled_by(trainer, b) for b in trainer.batches] == [[0], [0]]
    assert any(not torch.equal(p, q) for (_, p), (_, q) in pairs if p.requires_grad)  # the copy lags one update


# -- configuration ---------------------------------------------------------------------------------


def test_config_checks(tiny_dir, tmp_path):
    assert MAGRPOConfig().async_rollouts is False
    with pytest.raises(ConfigError, match="async_rollouts must be True or False"):
        MAGRPOConfig(async_rollouts="yes")
    with pytest.raises(ConfigError, match="rollout_buffer_size"):
        MAGRPOConfig(async_rollouts=True, rollout_buffer_size=2)
    with pytest.raises(ConfigError, match="ReMax"):
        MAReMaxConfig(async_rollouts=True)
    with pytest.raises(ConfigError, match="generation_backend='hf'"):
        MAGRPOConfig(async_rollouts=True, generation_backend="vllm")
    # the stale samples are weighed back unless a correction was chosen
    assert MAGRPOConfig(async_rollouts=True).is_correction == "token_truncate"
    assert MAGRPOConfig(async_rollouts=True, is_correction="sequence_mask").is_correction == "sequence_mask"
    assert MAGRPOConfig().is_correction is None
    # learners that do not roll out inside their steps refuse it
    from collab_env.adapters.actor_critic import IACConfig, IACTrainer
    from collab_env.adapters.madpo import MADPOConfig, MADPOTrainer
    from collab_env.testing.tiny_model import load_tiny_chat_model

    model, tok = load_tiny_chat_model(tiny_dir)
    rows = length_ratio_rows("train")[:1]
    with pytest.raises(ConfigError, match="MADPOTrainer collects its samples"):
        MADPOTrainer(agent_model=model, tokenizer=tok, num_agents=1, formatters=[formatters[0]], reward_func=_reward,
                     train_dataset=rows, args=MADPOConfig(num_agents=1, async_rollouts=True, plot=False,
                                                          output_dir=str(tmp_path / "m")))
    iac = IACTrainer(agent_model=model, tokenizer=tok, num_agents=1, formatters=[formatters[0]], reward_func=_reward,
                     train_dataset=rows, args=IACConfig(num_agents=1, async_rollouts=True, plot=False,
                                                        output_dir=str(tmp_path / "i")))
    with pytest.raises(ConfigError, match="IACTrainer does not overlap"):
        iac.train()
    assert iac.state.items_done == 0
