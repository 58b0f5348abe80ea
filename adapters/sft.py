"""SFT: supervised fine-tuning on multi-turn chat data, loss on assistant turns only.

The optional first stage of the CollabLLM recipe (``train_sft_collabllm.sh``)::

    from collab_env.adapters.sft import SFTConfig, SFTTrainer
    from collab_env.tasks.collabllm_data import process_collabllm_dataset

    splits = process_collabllm_dataset(data_files="math-hard.parquet", mode="sft")
    trainer = SFTTrainer(model="embedded", train_dataset=splits["train"],
                         eval_dataset=splits["validation"], args=SFTConfig(learning_rate=1e-5))
    trainer.train()
    print(trainer.evaluate())          # {"eval/loss": ..., "eval/perplexity": ...}

Data: rows with ``messages`` (a list of ``{"role", "content"}`` dicts) and optionally
``trainable`` (one bool per message, as :func:`~collab_env.tasks.collabllm_data.build_sft_dataset`
writes); without ``trainable`` every assistant message is trained on. A plain list of message
lists works too. System and user messages (the hidden goal included, were it ever in a message)
are context only: they are never in the loss, and a ``trainable`` flag on them is an error.

Masks (:func:`encode_conversation`): the conversation is tokenised once with the chat
template; the tokens of each trainable assistant message are located by tokenising the
template's prefixes (the messages before it with the generation prompt, then the messages up
to and including it), so the span starts right after the assistant header and ends with the
end-of-turn token: the template's text after that token (a newline) is not trained on. A
template whose prefixes are not prefixes of the whole conversation (one that rewrites earlier
turns) is rejected with an error rather than given approximate masks.

Optimisation: right padding; ``per_device_train_batch_size`` conversations per forward pass,
``gradient_accumulation_steps`` passes per optimiser step; the loss is the mean negative
log-likelihood over every loss token of the optimiser batch (accumulation is exact). Logs go to
``<output_dir>/metrics.jsonl`` and ``curves.png`` (``env_step`` is the optimiser step here);
checkpoints as in :mod:`~collab_env.adapters.common.checkpoint`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collab_env.adapters.common.config import TrainerConfig, check_int
from collab_env.errors import ConfigError, DataSchemaError

__all__ = ["SFTConfig", "SFTTrainer", "SFTState", "encode_conversation", "chat_ids", "cut_at_end_of_turn",
           "check_token_prefix"]


@dataclass
class SFTConfig(TrainerConfig):
    """Configuration of :class:`SFTTrainer`. Every field of
    :class:`~collab_env.adapters.common.config.TrainerConfig` applies; for SFT,
    ``per_device_train_batch_size`` is conversations per forward pass, ``max_steps`` counts
    optimiser steps, and ``eval_interval`` / ``save_steps`` / ``logging_steps`` count optimiser
    steps (evaluation also runs before the first step when ``eval_interval > 0``)."""

    max_length: int | None = 1024
    """Longest tokenised conversation; longer ones are cut on the right (``None``: no limit).
    A conversation left without any trainable token is skipped (counted in ``skipped``)."""
    gradient_accumulation_steps: int = 1
    """Forward/backward passes per optimiser step."""
    shuffle: bool = True
    """Shuffle the conversations every epoch (seeded by ``seed`` and the epoch)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("max_length", self.max_length, 2, allow_none=True)
        check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        if self.shuffle not in (True, False):
            raise ConfigError(f"shuffle must be True or False, got {self.shuffle!r}.")


@dataclass
class SFTState:
    """Where an SFT run is; saved in checkpoints."""

    epoch: int = 0
    """Current epoch (0-based)."""
    step_in_epoch: int = 0
    """Optimiser steps already taken in the current epoch."""
    optimizer_steps: int = 0
    """Optimiser steps taken in total."""
    evaluations: int = 0
    """Evaluations run."""


# ---------------------------------------------------------------------------------------------
# Tokenisation with exact masks
# ---------------------------------------------------------------------------------------------
def chat_ids(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template (the template writes
    any BOS token, so the tokenizer adds none)."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def cut_at_end_of_turn(tokenizer: Any, ids: Sequence[int], start: int, end: int) -> int:
    """``end`` cut just after the last EOS token in ``ids[start:end]`` (the template's text
    after the end-of-turn token is never generated), or ``end`` when there is none."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return end
    for j in range(end - 1, start - 1, -1):
        if ids[j] == eos:
            return j + 1
    return end


def check_token_prefix(full: Sequence[int], prefix: Sequence[int], where: str) -> None:
    """Raise :class:`ConfigError` (naming ``where``) unless ``prefix`` is a token prefix of
    ``full``: the chat template must render a conversation's start the same way alone."""
    if len(prefix) > len(full) or list(full[:len(prefix)]) != list(prefix):
        raise ConfigError(
            f"{where}: the chat template renders a conversation prefix differently from the start of "
            "the whole conversation (it rewrites earlier turns, or the tokenizer merges across the turn "
            "boundary), so assistant spans cannot be located exactly. Use a template that renders "
            "turns independently (e.g. ChatML), or train on conversations ending at the trained turn."
        )


def _normalise_messages(messages: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise DataSchemaError(f"{where}: messages must be a non-empty list of {{'role', 'content'}} dicts, got {type(messages).__name__}.")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataSchemaError(f"{where}: message {k} must be a dict with str 'role' and 'content', got {m!r}.")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def encode_conversation(tokenizer: Any, messages: Sequence[Mapping[str, str]],
                        trainable: Sequence[bool] | None = None, *, max_length: int | None = None,
                        where: str = "conversation") -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of one conversation: ``loss_mask[t] == 1`` exactly on the
    tokens of the trainable assistant messages (header excluded, end-of-turn token included).

    Args:
        tokenizer: A tokenizer with a chat template.
        messages: ``{"role", "content"}`` dicts.
        trainable: One bool per message (default: every assistant message). Only assistant
            messages may be trainable.
        max_length: Cut the result to this many tokens.
        where: Name of the conversation in error messages.

    Raises:
        DataSchemaError: Malformed messages or flags.
        ConfigError: The template is not prefix-stable (see the module docstring).
    """
    msgs = _normalise_messages(messages, where)
    if trainable is None:
        flags = [m["role"] == "assistant" for m in msgs]
    else:
        flags = [bool(f) for f in trainable]
        if len(flags) != len(msgs):
            raise DataSchemaError(f"{where}: {len(flags)} trainable flags for {len(msgs)} messages; pass one per message.")
        bad = [k for k, (m, f) in enumerate(zip(msgs, flags, strict=True)) if f and m["role"] != "assistant"]
        if bad:
            raise DataSchemaError(
                f"{where}: message(s) {bad} are flagged trainable but are not assistant messages; only "
                "assistant replies are trained on (user and system text is context)."
            )
    ids = chat_ids(tokenizer, msgs)
    mask = [0] * len(ids)
    for k, f in enumerate(flags):
        if not f:
            continue
        head = chat_ids(tokenizer, msgs[:k], generation_prompt=True)
        upto = chat_ids(tokenizer, msgs[:k + 1])
        check_token_prefix(ids, head, where)
        check_token_prefix(ids, upto, where)
        end = cut_at_end_of_turn(tokenizer, ids, len(head), len(upto))
        for t in range(len(head), end):
            mask[t] = 1
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


def _rows(data: Any, what: str) -> list[tuple[list[dict[str, str]], list[bool] | None]]:
    """``(messages, trainable or None)`` per row of a dataset / list of rows / list of message lists."""
    if data is None:
        return []
    if isinstance(data, (str, bytes, Mapping)):
        raise ConfigError(f"{what} must be a datasets.Dataset, a list of rows or a list of message lists, got {type(data).__name__}.")
    out = []
    for i, row in enumerate(data):
        if isinstance(row, Mapping):
            if "messages" not in row:
                raise DataSchemaError(f"{what} row {i} has no 'messages' column (it has {sorted(row)}).")
            out.append((row["messages"], row.get("trainable")))
        else:
            out.append((row, None))
    return out


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------
class SFTTrainer:
    """Supervised fine-tuning of one chat model on assistant turns.

    Args:
        model: A folder, hub id, ``"embedded"`` or a loaded ``PreTrainedModel``/``PeftModel``.
        train_dataset: Rows with ``messages`` (and optionally ``trainable``), or message lists.
        eval_dataset: Same format; ``None``: :meth:`evaluate` returns ``{}``.
        args: An :class:`SFTConfig`.
        tokenizer: A tokenizer (or folder); default: the model folder's.
        wandb_config: ``None`` or Weights & Biases settings (see
            :class:`~collab_env.adapters.common.logging.MetricsLogger`).

    Raises:
        ConfigError: Invalid arguments; DataSchemaError: malformed rows.
    """

    def __init__(self, model: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 args: SFTConfig | None = None, *, tokenizer: Any = None,
                 wandb_config: Mapping[str, Any] | None = None) -> None:
        import torch

        from collab_env.adapters.common.logging import MetricsLogger
        from collab_env.adapters.common.models import (
            load_policy_models,
            make_optimizer,
            make_scheduler,
        )

        args = SFTConfig() if args is None else args
        if not isinstance(args, SFTConfig):
            raise ConfigError(f"args must be an SFTConfig, got {type(args).__name__}.")
        if model is None:
            raise ConfigError("model is required: a model folder, a hub id, 'embedded' or a loaded model.")
        if train_dataset is None and eval_dataset is None:
            raise ConfigError("pass train_dataset= (and optionally eval_dataset=).")
        self.args = args
        torch.manual_seed(args.seed)
        self.pm = load_policy_models(model, tokenizer, 1, args, need_reference=False)[0]
        self.skipped = 0
        self.train_rows = self._encode(train_dataset, "train_dataset")
        self.eval_rows = self._encode(eval_dataset, "eval_dataset")
        if train_dataset is not None and not self.train_rows:
            raise DataSchemaError("train_dataset has no conversation with a trainable assistant token.")
        self.pm.optimizer = make_optimizer(self.pm, args)
        self.pm.scheduler = make_scheduler(self.pm.optimizer, args, self._planned_steps())
        self.state = SFTState()
        self.logger = MetricsLogger(args.output_dir, args.to_dict(), wandb_config)

    def _encode(self, data: Any, what: str) -> list[tuple[list[int], list[int]]]:
        out = []
        for i, (messages, trainable) in enumerate(_rows(data, what)):
            ids, mask = encode_conversation(self.pm.tokenizer, messages, trainable,
                                            max_length=self.args.max_length, where=f"{what} row {i}")
            if sum(mask[1:]) == 0:  # the first token is never predicted
                self.skipped += 1
                continue
            out.append((ids, mask))
        return out

    def _batch_rows(self) -> int:
        return self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps

    def _steps_per_epoch(self) -> int:
        return max(1, math.ceil(len(self.train_rows) / self._batch_rows()))

    def _planned_steps(self) -> int:
        total = self._steps_per_epoch() * self.args.num_train_epochs
        return min(total, self.args.max_steps) if self.args.max_steps > 0 else total

    def _order(self, epoch: int) -> list[int]:
        import numpy as np

        n = len(self.train_rows)
        if not self.args.shuffle:
            return list(range(n))
        return [int(i) for i in np.random.default_rng([self.args.seed, epoch]).permutation(n)]

    # -- the loss -------------------------------------------------------------------------------
    def _nll(self, rows: Sequence[tuple[list[int], list[int]]]):
        """``([B, L-1] per-token NLL, [B, L-1] mask)`` of right-padded ``rows``."""
        import torch

        width = max(len(ids) for ids, _ in rows)
        b = len(rows)
        ids = torch.full((b, width), self.pm.pad_id, dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        lmask = torch.zeros((b, width), dtype=torch.long)
        for i, (r_ids, r_mask) in enumerate(rows):
            ids[i, :len(r_ids)] = torch.tensor(r_ids)
            attn[i, :len(r_ids)] = 1
            lmask[i, :len(r_mask)] = torch.tensor(r_mask)
        dev = self.pm.device
        ids, attn, lmask = ids.to(dev), attn.to(dev), lmask.to(dev)
        logits = self.pm.model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
        targets = ids[:, 1:]
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        nll = torch.logsumexp(logits, dim=-1) - picked
        m = lmask[:, 1:].bool()
        return torch.where(m, nll, torch.zeros_like(nll)), m

    # -- training -------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | Path | None = None) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` optimiser steps); returns the last
        logged training metrics."""
        import torch
        from tqdm.auto import tqdm

        from collab_env.adapters.common.checkpoint import load_checkpoint

        if not self.train_rows:
            raise ConfigError("train() needs train_dataset=.")
        if resume_from_checkpoint is not None:
            self.state = SFTState(**load_checkpoint(resume_from_checkpoint, [self.pm]))
            self.logger.resume()
        a, pm = self.args, self.pm
        limit = self._planned_steps()
        per_epoch = self._steps_per_epoch()
        params = [p for _, p in pm.trainable_parameters()]
        bar = tqdm(total=limit, initial=self.state.optimizer_steps, disable=not self.logger.verbose,
                   desc="SFT", unit="step")
        last: dict[str, Any] = {}
        window: list[dict[str, float]] = []
        while self.state.optimizer_steps < limit:
            if a.eval_interval and self.state.optimizer_steps % a.eval_interval == 0 and self.eval_rows:
                self.evaluate()
            order = self._order(self.state.epoch)
            s = self.state.step_in_epoch
            batch = [self.train_rows[i] for i in order[s * self._batch_rows():(s + 1) * self._batch_rows()]]
            num_tokens = sum(sum(m[1:]) for _, m in batch)
            pm.model.train()
            pm.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for k in range(0, len(batch), a.per_device_train_batch_size):
                nll, _ = self._nll(batch[k:k + a.per_device_train_batch_size])
                loss = nll.sum() / max(num_tokens, 1)
                loss.backward()
                total += float(loss.detach())
            grad_norm = torch.nn.utils.clip_grad_norm_(
                params, a.max_grad_norm if a.max_grad_norm is not None else float("inf"))
            pm.optimizer.step()
            pm.scheduler.step()
            pm.model.eval()
            self.state.optimizer_steps += 1
            self.state.step_in_epoch += 1
            window.append({"loss": total, "grad_norm": float(grad_norm), "tokens": float(num_tokens),
                           "learning_rate": float(pm.scheduler.get_last_lr()[0])})
            if self.state.step_in_epoch >= per_epoch:
                self.state.epoch += 1
                self.state.step_in_epoch = 0
            if self.state.optimizer_steps % a.logging_steps == 0 or self.state.optimizer_steps == limit:
                last = self._log(window)
                window = []
            if a.save_steps and self.state.optimizer_steps % a.save_steps == 0:
                self.save_checkpoint()
            bar.update(1)
        bar.close()
        if a.plot:
            self.logger.plot()
        return last

    def _log(self, window: Sequence[Mapping[str, float]]) -> dict[str, Any]:
        keys = sorted({k for w in window for k in w})
        merged = {k: sum(w[k] for w in window) / len(window) for k in keys}
        merged["tokens"] = sum(w["tokens"] for w in window)
        return self.logger.log(merged, env_step=self.state.optimizer_steps, epoch=self.state.epoch)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Mean token NLL (``eval/loss``) and its exponential (``eval/perplexity``) on the
        assistant tokens of the first ``num_eval_samples`` evaluation conversations (default
        ``args.eval_num_samples``; ``{}`` without evaluation data). Logs and returns them."""
        import torch

        n = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        check_int("num_eval_samples", n, 0)
        rows = self.eval_rows[:n]
        if not rows:
            return {}
        total, tokens = 0.0, 0
        self.pm.model.eval()
        with torch.no_grad():
            for k in range(0, len(rows), self.args.eval_batch_size):
                nll, m = self._nll(rows[k:k + self.args.eval_batch_size])
                total += float(nll.sum())
                tokens += int(m.sum())
        self.state.evaluations += 1
        loss = total / max(tokens, 1)
        metrics = {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 700.0)), "eval/tokens": float(tokens)}
        self.logger.log(metrics, env_step=self.state.optimizer_steps, epoch=self.state.epoch)
        return metrics

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Save the model, optimiser, scheduler, position and RNG states (default folder
        ``<output_dir>/checkpoint-<step>``); resume with ``train(resume_from_checkpoint=...)``."""
        from collab_env.adapters.common.checkpoint import save_checkpoint

        path = Path(path) if path is not None else Path(self.args.output_dir) / f"checkpoint-{self.state.optimizer_steps}"
        return save_checkpoint(path, [self.pm], asdict(self.state))

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()
