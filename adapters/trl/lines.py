"""Progress lines and a closing line for a TRL run through :func:`~collab_env.adapters.trl.rollout_func`.

TRL's own bar is a tqdm bar, drawn when a step ends: in a log file it stays silent through a long
step and says nothing at the end about where the run went. :class:`RunLines` is a
``TrainerCallback`` that :class:`~collab_env.adapters.trl.rollout.RolloutFunc` adds to the trainer at
its first call (once per trainer), so the README's snippet needs no extra argument:

* while the run lasts, the library's one progress display (:func:`collab_env._progress.progress_bar`):
  with stderr redirected, a line per tenth of the steps and at least one per
  :func:`~collab_env._progress.progress_interval` (60 s), labelled with the env and the trained
  player, the last logged reward after the count. There it takes the place of transformers'
  ``ProgressCallback`` (its bar's carriage returns would glue every line of a log into one),
  whose log dicts ``PrinterCallback`` prints instead; on a terminal TRL's bar is left alone;
* when training ends, one line: the steps, the first and last logged reward, and where the outputs
  are (``args.output_dir`` as an absolute path, the checkpoints in it, and that
  ``trainer.save_model()`` writes the final model there: TRL saves only every ``save_steps``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from collab_env._progress import progress_bar, say


class RunLines(TrainerCallback):
    """Progress lines while a TRL run lasts and a closing line when it ends (see the module).

    Args:
        what: What runs, for the labels (``"hidden-facts-v2 assistant"``).
        max_steps: The run's optimiser steps (``trainer.state.max_steps``).
        done: Steps already done when the display starts.
    """

    def __init__(self, what: str, max_steps: int | None, done: int = 0) -> None:
        self.what = what
        self.label = f"TRL {what}"
        # On a terminal TRL draws its own bar: lines only when stderr is redirected.
        self.bar = progress_bar(max_steps or None, self.label, show=False if sys.stderr.isatty() else None,
                                lines=True, initial=done, unit="steps")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.bar is not None and logs and "reward" in logs:
            self.bar.set_postfix(reward=f"{float(logs['reward']):.3g}")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if state.is_world_process_zero:
            say(closing_line(self.label, args, state))


def closing_line(label: str, args: Any, state: Any) -> str:
    """The closing line of a TRL run: steps, the logged reward's first and last value, and where
    the outputs are."""
    rewards = [float(r["reward"]) for r in state.log_history if "reward" in r]
    reward = f"; reward first {rewards[0]:.3g}, last {rewards[-1]:.3g}" if rewards else ""
    out = Path(args.output_dir).resolve()
    checkpoints = sorted(p.name for p in out.glob("checkpoint-*")) if out.is_dir() else []
    saved = (f"checkpoints {', '.join(checkpoints)}" if checkpoints
             else f"no checkpoint yet (save_steps={args.save_steps})")
    return (f"{label} finished: {state.global_step} steps{reward}; output_dir {out}: {saved}; "
            "trainer.save_model() writes the final model there")


def add_run_lines(trainer: Any, what: str) -> RunLines:
    """Give ``trainer`` a :class:`RunLines` for ``what``; with stderr redirected, in place of its
    ``ProgressCallback`` (a ``PrinterCallback`` prints the log dicts it printed)."""
    state = trainer.state
    if not sys.stderr.isatty():
        for cb in list(trainer.callback_handler.callbacks):
            if isinstance(cb, ProgressCallback):
                if cb.training_bar is not None:
                    cb.training_bar.close()
                trainer.remove_callback(cb)
                trainer.add_callback(PrinterCallback)
    lines = RunLines(what, getattr(state, "max_steps", None), getattr(state, "global_step", 0))
    trainer.add_callback(lines)
    return lines
