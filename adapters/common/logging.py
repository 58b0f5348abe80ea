"""Training logs: a JSONL file always, a PNG of the curves, Weights & Biases when configured.

Every record is one JSON line ``{"env_step": ..., "item": ..., "epoch": ..., <metric>: ...}``
in ``<output_dir>/metrics.jsonl``; :meth:`MetricsLogger.plot` draws every reward, return, loss
and KL curve against ``env_step`` into ``<output_dir>/curves.png``. With a ``wandb_config`` the
same records go to Weights & Biases (``mode="offline"`` works without network or account).
When a run ends, :meth:`MetricsLogger.summary` prints what it did and where its files went (every
trainer's ``train()`` ends there, through :func:`~collab_env.adapters.common.loop.run`).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collab_env.errors import ConfigError, require

__all__ = ["MetricsLogger", "WANDB_KEYS", "read_jsonl"]

#: ``wandb_config`` keys the trainers understand (the CoMLRL guide's, plus ``mode``).
WANDB_KEYS = ("project", "entity", "name", "run_name", "tags", "dir", "mode", "config_sections", "group", "notes")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL metrics file."""
    from collab_env._json import loads

    return [loads(line, f"{path}, line {i}") for i, line in enumerate(Path(path).read_text().splitlines(), 1)
            if line.strip()]


class MetricsLogger:
    """Writes metric records to JSONL, optionally to Weights & Biases, and plots them.

    Args:
        output_dir: Folder of ``metrics.jsonl`` and ``curves.png`` (created).
        config: The run's config as a JSON-friendly dict (logged to W&B).
        wandb_config: ``None`` (no W&B) or a dict with the keys of :data:`WANDB_KEYS`:
            ``project``, ``entity``, ``name`` (or ``run_name``), ``tags``, ``dir``, ``mode``
            (``"online"``, ``"offline"``, ``"disabled"``), ``group``, ``notes`` and
            ``config_sections`` (dicts merged into the logged config; its
            ``output.verbose`` says whether the trainer shows progress).
        resume: Append to an existing ``metrics.jsonl`` instead of starting it afresh (which
            happens at the first record, so a logger created and then resumed loses nothing).
    """

    def __init__(self, output_dir: str | Path, config: Mapping[str, Any] | None = None,
                 wandb_config: Mapping[str, Any] | None = None, *, resume: bool = False) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.output_dir / "metrics.jsonl"
        self.records: list[dict[str, Any]] = []
        self.written: list[Path] = []
        """Files and folders the run wrote besides the JSONL (curves, checkpoints), in order."""
        self._fresh = True
        if resume:
            self.resume()
        self.wandb_config = self._check_wandb(wandb_config)
        sections = (self.wandb_config or {}).get("config_sections") or {}
        output = sections.get("output") if isinstance(sections, Mapping) else None
        self.verbose = bool(output.get("verbose", True)) if isinstance(output, Mapping) else True
        self._run = None
        if self.wandb_config is not None:
            self._run = self._init_wandb(dict(config or {}))

    @staticmethod
    def _check_wandb(cfg: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if cfg is None:
            return None
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"wandb_config must be a dict or None, got {type(cfg).__name__}.")
        unknown = set(cfg) - set(WANDB_KEYS)
        if unknown:
            raise ConfigError(f"unknown wandb_config key(s) {sorted(unknown)}; valid: {list(WANDB_KEYS)}.")
        sections = cfg.get("config_sections")
        if sections is not None and not isinstance(sections, Mapping):
            raise ConfigError("wandb_config['config_sections'] must be a dict of dicts.")
        return dict(cfg)

    def _init_wandb(self, config: dict[str, Any]):
        wandb = require("wandb", "train", "Logging to Weights & Biases (wandb_config=...)")
        cfg = self.wandb_config or {}
        for name, section in (cfg.get("config_sections") or {}).items():
            config[name] = dict(section) if isinstance(section, Mapping) else section
        kwargs = {k: cfg[k] for k in ("project", "entity", "tags", "dir", "mode", "group", "notes")
                  if cfg.get(k) is not None}
        name = cfg.get("name") or cfg.get("run_name")
        if name:
            kwargs["name"] = name
        if "dir" in kwargs:
            Path(kwargs["dir"]).mkdir(parents=True, exist_ok=True)
        run = wandb.init(config=config, reinit="finish_previous", **kwargs)
        run.define_metric("env_step")
        run.define_metric("*", step_metric="env_step")
        return run

    def resume(self) -> None:
        """Keep the records already in ``metrics.jsonl`` and append after them."""
        self._fresh = False
        self.records = read_jsonl(self.path) if self.path.exists() else []

    def log(self, metrics: Mapping[str, Any], **position: Any) -> dict[str, Any]:
        """Append one record (``position`` holds ``env_step``, ``item``, ``epoch``...)."""
        record = {**position, **{k: _jsonable(v) for k, v in metrics.items()}}
        self.records.append(record)
        with self.path.open("w" if self._fresh else "a") as f:
            self._fresh = False
            f.write(json.dumps(record) + "\n")
        if self._run is not None:
            self._run.log({k: v for k, v in record.items() if isinstance(v, (int, float))})
        return record

    def plot(self, path: str | Path | None = None) -> Path | None:
        """Draw the curves to ``path`` (default ``<output_dir>/curves.png``); ``None`` when
        matplotlib is missing (with a warning) or nothing was logged."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=True)
            import matplotlib.pyplot as plt
        except ImportError:
            warnings.warn("matplotlib is not installed: no PNG of the curves "
                          "(pip install 'collab_env[train]' or matplotlib).", stacklevel=2)
            return None
        keys = sorted({k for r in self.records for k, v in r.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and _plotted(k)})
        if not keys:
            return None
        panels: dict[str, list[str]] = {}
        for k in keys:
            panels.setdefault(_panel(k), []).append(k)
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3 * len(panels)), squeeze=False)
        for ax, (title, names) in zip(axes[:, 0], panels.items(), strict=True):
            for k in names:
                pts = [(r["env_step"], r[k]) for r in self.records if k in r and "env_step" in r]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, marker="o" if k.startswith("eval/") else None, markersize=3, label=k)
            ax.set_title(title)
            ax.set_xlabel("env_step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        out = Path(path) if path is not None else self.output_dir / "curves.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        self.wrote(out)
        return out

    def wrote(self, path: str | Path | None) -> None:
        """Note a file or folder the run wrote (a checkpoint, the curves) for :meth:`summary`."""
        if path is None:
            return
        path = Path(path)
        if path not in self.written:
            self.written.append(path)

    def summary(self, name: str, done: Mapping[str, int]) -> str:
        """The end-of-run summary: ``name``, the counts in ``done`` (e.g. items, optimiser steps),
        the final and mean training reward when the log has one (``turn_1/reward_mean``, else
        the first other ``*reward_mean`` key, else the first ``*reward*`` key, of the training
        records), and the paths of the JSONL
        log and of every existing file noted by :meth:`wrote`. Printed when the run is verbose;
        always returned."""
        counts = ", ".join(f"{v} {k}" for k, v in done.items())
        lines = [f"{name} finished: {counts}" + _reward_line(self.records)]
        files = ([("metrics", self.path)] if self.path.exists() else []) + [
            ("curves" if p.suffix == ".png" else "metrics" if p.suffix == ".jsonl" else
             "checkpoint" if p.is_dir() else "file", p)
            for p in self.written if p.exists()]
        lines.extend(f"  {label + ':':<11} {p.resolve()}" for label, p in files)
        text = "\n".join(lines)
        if self.verbose:
            print(text, flush=True)
        return text

    def close(self) -> None:
        """Finish the W&B run (the JSONL file is always flushed)."""
        if self._run is not None:
            self._run.finish()
            self._run = None


def _reward_line(records: list[dict[str, Any]]) -> str:
    train = [r for r in records if not any(str(k).startswith("eval/") for k in r)]
    keys = sorted({k for r in train for k, v in r.items() if "reward" in k and isinstance(v, (int, float))
                   and not isinstance(v, bool)})
    preferred = [k for k in keys if k == "turn_1/reward_mean"] + [
        k for k in keys if k.endswith("reward_mean") and not k.startswith(("preference/", "reward_model/"))]
    if not (preferred or keys):
        return ""
    key = (preferred or keys)[0]
    values = [float(r[key]) for r in train if key in r and not math.isnan(float(r[key]))]
    if not values:
        return ""
    return f"; {key} final {values[-1]:.4g}, mean {sum(values) / len(values):.4g}"


def _plotted(key: str) -> bool:
    return (any(s in key for s in ("reward", "return", "loss", "kl", "pass@", "clip_fraction"))
            or key.startswith("eval/"))


def _panel(key: str) -> str:
    base = key.split("/")[-1]
    if "kl" in base:
        return "reference KL"
    if "loss" in base or "clip" in base:
        return "loss"
    if "return" in base or "pass@" in base:
        return "returns"
    if "reward" in base:
        return "rewards"
    return "eval (custom)"


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
