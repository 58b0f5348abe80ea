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
``trainable`` (one bool per message, as :func:`~collab_env.tasks.collabllm_modes.build_sft_dataset`
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from collab_env.adapters.common.chat import chat_ids, check_token_prefix, cut_at_end_of_turn
from collab_env.adapters.common.checkpoint import load_checkpoint, save_checkpoint
from collab_env.adapters.common.config import TrainerConfig, check_int, learner_config
from collab_env.adapters.common.learner import epoch_order
from collab_env.adapters.common.logging import MetricsLogger
from collab_env.adapters.common.loop import RunState, Schedule, run
from collab_env.adapters.common.models import load_policy_models, make_optimizer, make_scheduler
from collab_env.errors import ConfigError, DataSchemaError

__all__ = ["SFTConfig", "SFTTrainer", "encode_conversation"]


@learner_config
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
    messages_key: str = "messages"
    """The column holding each conversation (verl's ``data.messages_key``): ``"messages"``, or
    ``"prompt"`` for the verl recipe's SFT rows (``collab-env data --dataset_type sft``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.messages_key, str) or not self.messages_key:
            raise ConfigError(f"messages_key must be a non-empty str, got {self.messages_key!r}.")
        check_int("max_length", self.max_length, 2, allow_none=True)
        check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        if self.shuffle not in (True, False):
            raise ConfigError(f"shuffle must be True or False, got {self.shuffle!r}.")



# ---------------------------------------------------------------------------------------------
# Tokenisation with exact masks
# ---------------------------------------------------------------------------------------------
def _normalise_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise DataSchemaError(f"{where}: messages must be a non-empty list of {{'role', 'content'}} dicts, "
                              f"got {type(messages).__name__}.")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataSchemaError(f"{where}: message {k} must be a dict with str 'role' and 'content', got {m!r}.")
        # tool calls and results travel as Conversation.to_chat writes them (the template renders them)
        out.append({"role": m["role"], "content": m["content"],
                    **{key: m[key] for key in ("tool_calls", "tool_call_id") if key in m}})
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
            raise DataSchemaError(f"{where}: {len(flags)} trainable flags for {len(msgs)} messages; "
                                  "pass one per message.")
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


def _rows(data: Any, what: str, key: str = "messages") -> list[tuple[list[dict[str, str]], list[bool] | None]]:
    """``(messages, trainable or None)`` per row of a dataset / list of rows / list of message lists
    (the conversation in column ``key``)."""
    if data is None:
        return []
    if isinstance(data, (str, bytes, Mapping)):
        raise ConfigError(f"{what} must be a datasets.Dataset, a list of rows or a list of message lists, "
                          f"got {type(data).__name__}.")
    out = []
    for i, row in enumerate(data):
        if isinstance(row, Mapping):
            if key not in row:
                hint = " (the recipe's SFT rows hold it in 'prompt': SFTConfig(messages_key='prompt'))" \
                    if "prompt" in row and key == "messages" else ""
                raise DataSchemaError(f"{what} row {i} has no {key!r} column (it has {sorted(row)}){hint}.")
            out.append((row[key], row.get("trainable")))
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
        self.state = RunState()
        self.logger = MetricsLogger(args.output_dir, args.to_dict(), wandb_config)

    def _encode(self, data: Any, what: str) -> list[tuple[list[int], list[int]]]:
        out = []
        for i, (messages, trainable) in enumerate(_rows(data, what, self.args.messages_key)):
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
        return epoch_order(len(self.train_rows), self.args.shuffle, self.args.seed, epoch)

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

        if not self.train_rows:
            raise ConfigError("train() needs train_dataset=.")
        if resume_from_checkpoint is not None:
            self.state = RunState.from_dict(load_checkpoint(resume_from_checkpoint, [self.pm]))
            self.logger.resume()
        return run(self)

    def schedule(self) -> Schedule:
        """Optimiser steps; evaluation before step ``s`` when ``s % eval_interval == 0``; logs
        every ``logging_steps`` steps (``tokens`` summed over the window); checkpoints every
        ``save_steps`` steps."""
        a = self.args
        return Schedule(unit="step", per_epoch=self._steps_per_epoch(), limit=self._planned_steps(),
                        epochs=a.num_train_epochs, eval_every=a.eval_interval, eval_rule="done",
                        can_evaluate=bool(self.eval_rows), log_every=a.logging_steps, log_item=False,
                        log_next_epoch=True, summed=("tokens",), save_every=a.save_steps, desc="SFT")

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """One optimiser step on the ``batch[0]``-th slice of this epoch's shuffled
        conversations: the mean NLL over every loss token of the slice, accumulated over
        micro-batches of ``per_device_train_batch_size``."""
        import torch

        a, pm, nb = self.args, self.pm, self._batch_rows()
        order = self._order(self.state.epoch)
        rows = [self.train_rows[i] for s in batch for i in order[s * nb:(s + 1) * nb]]
        num_tokens = sum(sum(m[1:]) for _, m in rows)
        pm.model.train()
        pm.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(0, len(rows), a.per_device_train_batch_size):
            nll, _ = self._nll(rows[k:k + a.per_device_train_batch_size])
            loss = nll.sum() / max(num_tokens, 1)
            loss.backward()
            total += float(loss.detach())
        params = [p for _, p in pm.trainable_parameters()]
        grad_norm = torch.nn.utils.clip_grad_norm_(
            params, a.max_grad_norm if a.max_grad_norm is not None else float("inf"))
        pm.optimizer.step()
        pm.scheduler.step()
        pm.model.eval()
        self.state.optimizer_steps += 1
        return {"loss": total, "grad_norm": float(grad_norm), "tokens": float(num_tokens),
                "learning_rate": float(pm.scheduler.get_last_lr()[0]), "env_steps": 1}

    def end_epoch(self) -> dict[str, float]:
        """Nothing to do at an epoch's end: ``{}``."""
        return {}

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
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch)
        return metrics

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Save the model, optimiser, scheduler, position and RNG states (default folder
        ``<output_dir>/checkpoint-<step>``); resume with ``train(resume_from_checkpoint=...)``."""

        if path is None:
            path = Path(self.args.output_dir) / f"checkpoint-{self.state.optimizer_steps}"
        return save_checkpoint(path, [self.pm], asdict(self.state))

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()
