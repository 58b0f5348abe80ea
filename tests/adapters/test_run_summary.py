"""Every trainer's ``train()`` ends with one summary (MetricsLogger.summary, called by the shared
loop): what was done, the reward when there is one, and where the log, curves and checkpoints went."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.adapters.common.logging import MetricsLogger  # noqa: E402
from collab_env.adapters.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from collab_env.adapters.reinforce import MAREINFORCEConfig, MAREINFORCETrainer  # noqa: E402
from collab_env.tasks.cooperative import formatters, length_ratio_rows, reward_func  # noqa: E402


def _paths(text):
    return {m.group(1): Path(m.group(2)) for m in re.finditer(r"^  (\w+):\s+(\S.*)$", text, re.MULTILINE)}


@pytest.mark.parametrize("trainer_cls, config_cls", [(MAGRPOTrainer, MAGRPOConfig),
                                                     (MAREINFORCETrainer, MAREINFORCEConfig)])
def test_a_tiny_run_prints_its_summary_with_existing_paths(tiny_dir, tmp_path, capsys, trainer_cls, config_cls):
    from collab_env.testing.tiny_model import load_tiny_chat_model

    pytest.importorskip("matplotlib")
    model, tok = load_tiny_chat_model(tiny_dir)
    args = config_cls(num_agents=2, num_generations=2, max_new_tokens=4, eval_interval=0, logging_steps=1,
                      output_dir=str(tmp_path / "out"), save_steps=2, plot=True)
    trainer = trainer_cls(agent_model=model, tokenizer=tok, num_agents=2, formatters=formatters,
                          reward_func=reward_func, train_dataset=length_ratio_rows("train")[:2], args=args)
    trainer.train()
    captured = capsys.readouterr()
    out = captured.out
    # stderr is not a terminal here: the loop's progress comes as plain lines, the last at 2/2.
    # Labelled with the trained players (a dataset run: no env id).
    name = trainer_cls.__name__.removesuffix("Trainer")
    assert re.search(rf"^{name} agent_0,agent_1: 2/2 item \(100%\) [0-9.]+ (s|min)$", captured.err,
                     re.MULTILINE), captured.err[-500:]
    text = out[out.index(f"{trainer_cls.__name__.removesuffix('Trainer')} finished:"):]
    assert "2 items" in text and "turn_1/reward_mean final" in text
    paths = _paths(text)
    assert paths["metrics"].name == "metrics.jsonl" and paths["curves"].name == "curves.png"
    assert paths["checkpoint"].name == "checkpoint-2"
    assert all(p.exists() and p.is_absolute() for p in paths.values())


def test_the_summary_without_reward_or_files_and_quiet(tmp_path, capsys):
    logger = MetricsLogger(tmp_path)
    logger.verbose = False  # what wandb_config's config_sections.output.verbose=False sets
    logger.log({"loss": 1.0}, env_step=1)
    logger.wrote(tmp_path / "missing")  # not written after all: not listed
    text = logger.summary("SFT", {"steps": 1})
    assert text.splitlines()[0] == "SFT finished: 1 steps"
    assert list(_paths(text)) == ["metrics"]
    assert capsys.readouterr().out == ""
