"""A learned joint reward model: Bradley-Terry on preference pairs of the agents' joint responses.

Any RL trainer of :mod:`collab_env.adapters` takes its reward as a CoMLRL ``reward_func``; this
module learns one from preferences instead of writing it by hand::

    from collab_env.adapters.reward_model import RewardModelConfig, RewardModelTrainer

    pairs = [{"prompt": "Describe Paris.",
              "chosen":   ["Paris is the capital.", "It has the Louvre, the Seine and 2M people."],
              "rejected": ["Paris is the capital.", "It is a city."]}, ...]
    trainer = RewardModelTrainer(model="embedded", train_dataset=pairs[:800],
                                 eval_dataset=pairs[800:], args=RewardModelConfig(num_agents=2))
    trainer.train()
    trainer.evaluate()                 # eval/accuracy, eval/loss, eval/margin
    trainer.save_model("rm")           # or JointRewardModel.from_pretrained("rm") later

    rm = trainer.reward_model          # JointRewardModel
    rm.score(["Describe Paris."], [["Paris is the capital.", "It has the Louvre."]])  # [float]
    MAGRPOTrainer(agent_model="embedded", num_agents=2, formatters=formatters,
                  reward_func=rm.as_reward_func(), train_dataset=items, args=...)

**Data.** Rows (a ``datasets.Dataset`` or a list of dicts) with ``prompt`` (the task: a string,
or a list with one prompt per agent), ``chosen`` and ``rejected`` (the joint responses: a list
with one completion per agent, in agent order, or a string when there is one agent).

**Text.** A joint sample is rendered into one text by :class:`JointTemplate`; the default is::

    Task: <prompt>

    Agent 1: <completion of agent 1>

    Agent 2: <completion of agent 2>

(per-agent prompts that differ become ``Task for Agent k: ...`` lines). The text is tokenised
with the model's tokenizer (not its chat template), the EOS token is appended, and texts longer
than ``max_length`` tokens keep their *last* ``max_length`` tokens, so the answers survive.

**Model.** The causal LM (a folder, a hub id, ``"embedded"`` or a loaded model; LoRA through
``peft``) without its LM head, plus a linear head ``hidden -> 1`` on the hidden state of the last
token (the appended EOS). We keep the causal LM rather than ``AutoModelForSequenceClassification``
so any model the policy learners load works unchanged (a loaded model, ``"embedded"``, LoRA), and
the last token is found from the attention mask, not from a pad id the tokenizer may lack.
The head and the loss run in float32 whatever the backbone's dtype.

**Loss.** Bradley-Terry: ``P(chosen > rejected) = sigmoid(r_c - r_r)``, so the loss of a pair is
``-log sigmoid(r_c - r_r)`` (:func:`bradley_terry_loss`); ``center_rewards_coefficient`` adds
``c * (r_c + r_r)^2`` to keep the rewards near 0 (BT only fixes their differences).

**Evaluation.** ``eval/accuracy`` is the fraction of pairs with ``r_c > r_r`` (a tie counts 1/2,
so a constant model scores 0.5), with ``eval/loss``, ``eval/margin`` (mean ``r_c - r_r``) and the
mean rewards. Logs go to ``<output_dir>/metrics.jsonl`` (``env_step`` = optimiser steps).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from collab_env.adapters.common.config import TrainerConfig, check_float, check_int
from collab_env.adapters.common.learner import epoch_order
from collab_env.adapters.common.loop import RunState, Schedule
from collab_env.errors import ConfigError, DataSchemaError

__all__ = [
    "JointTemplate",
    "RewardModelConfig",
    "RewardModelTrainer",
    "RewardModelState",
    "JointRewardModel",
    "bradley_terry_loss",
    "HEAD_FILE",
    "META_FILE",
]

#: The linear head's weights inside a saved reward-model folder (safetensors: loading runs no
#: code; an older folder's ``reward_head.pt`` pickle is refused, see
#: :func:`collab_env.adapters.common.checkpoint.convert_legacy`).
HEAD_FILE = "reward_head.safetensors"
#: Template, length settings and tokenizer class of a saved reward-model folder.
META_FILE = "reward_model.json"


# ---------------------------------------------------------------------------------------------
# Rendering a joint sample
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JointTemplate:
    """How a task and one completion per agent become the reward model's input text."""

    task: str = "Task: {prompt}"
    """The task line (``{prompt}``); used when there is one prompt, or all agents' prompts are
    equal."""
    task_per_agent: str = "Task for Agent {index}: {prompt}"
    """One line per agent when the agents' prompts differ (``{index}`` is 1-based)."""
    agent: str = "Agent {index}: {completion}"
    """One line per agent's completion (``{index}`` is 1-based, ``{completion}`` its text)."""
    separator: str = "\n\n"
    """Between the task line(s) and the agent lines."""

    def __post_init__(self) -> None:
        for name, needed in (("task", ("prompt",)), ("task_per_agent", ("prompt", "index")),
                             ("agent", ("completion", "index"))):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ConfigError(f"JointTemplate.{name} must be a str, got {type(value).__name__}.")
            try:
                value.format(prompt="p", index=1, completion="c")
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    f"JointTemplate.{name}={value!r} is not a valid format string ({exc}); it may use only "
                    f"{{prompt}}, {{index}} and {{completion}} (escape literal braces as {{{{ }}}})."
                ) from exc
            missing = [k for k in needed[:1] if "{" + k + "}" not in value]
            if missing:
                raise ConfigError(f"JointTemplate.{name}={value!r} must contain {{{missing[0]}}}.")
        if not isinstance(self.separator, str):
            raise ConfigError(f"JointTemplate.separator must be a str, got {type(self.separator).__name__}.")

    def render(self, prompt: str | Sequence[str] | None, completions: str | Sequence[str]) -> str:
        """The text of one joint sample: ``prompt`` (a string, one string per agent, or
        ``None``/``""`` for no task line) and one completion per agent (a string: one agent)."""
        comps = _as_completions(completions, "completions")
        parts: list[str] = []
        if isinstance(prompt, str):
            if prompt:
                parts.append(self.task.format(prompt=prompt))
        elif prompt is not None:
            prompts = list(prompt)
            if not all(isinstance(p, str) for p in prompts):
                raise DataSchemaError(f"a prompt must be a str or a list of str (one per agent), got {prompt!r}.")
            if prompts and all(p == prompts[0] for p in prompts):
                parts.append(self.task.format(prompt=prompts[0]))
            else:
                parts.extend(self.task_per_agent.format(prompt=p, index=i + 1) for i, p in enumerate(prompts))
        parts.extend(self.agent.format(completion=c, index=i + 1) for i, c in enumerate(comps))
        return self.separator.join(parts)


def _as_completions(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Sequence) and value and all(isinstance(c, str) for c in value):
        return list(value)
    raise DataSchemaError(
        f"{where} must be a string (one agent) or a non-empty list of strings (one completion per agent, "
        f"in agent order), got {value!r}."
    )


def _as_prompt(value: Any, where: str) -> str | list[str] | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        return list(value)
    raise DataSchemaError(f"{where} must be a string or a list of strings (one prompt per agent), got {value!r}.")


# ---------------------------------------------------------------------------------------------
# The loss
# ---------------------------------------------------------------------------------------------
def bradley_terry_loss(chosen, rejected):
    """``[B]`` Bradley-Terry loss ``-log sigmoid(r_c - r_r)`` of each pair (float32).

    Example: ``r_c = 1, r_r = 0`` gives ``log(1 + e^-1) = 0.3132617``; a tie gives ``log 2``.
    """
    import torch.nn.functional as F

    return -F.logsigmoid(chosen.float() - rejected.float())


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
def _hidden_states(lm: Any, input_ids, attention_mask):
    """``[B, T, H]`` last hidden states of a causal LM (or a ``PeftModel`` of one), without
    computing the vocabulary logits when the model exposes its decoder."""
    inner = lm.get_base_model() if hasattr(lm, "get_base_model") else lm  # peft injects LoRA in place
    decoder = getattr(inner, "base_model", inner)
    if decoder is not inner:
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        h = getattr(out, "last_hidden_state", None)
        if h is not None:
            return h
    out = lm(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1]


class JointRewardModel:
    """A scalar reward of a joint response: a causal LM's last-token hidden state through a
    linear head (module docstring).

    Build it with :meth:`from_model` (a fresh head) or :meth:`from_pretrained` (a saved one); a
    :class:`RewardModelTrainer` exposes the one it trains as ``trainer.reward_model``.

    Attributes:
        lm: The causal LM (a ``PeftModel`` under LoRA); only its decoder is run.
        head: ``torch.nn.Linear(hidden, 1)`` in float32 on the LM's device.
        tokenizer: The LM's tokenizer.
        template: The :class:`JointTemplate` of the input texts.
        max_length: Longest input in tokens (the last tokens are kept); ``None``: no limit.
        append_eos: Whether the EOS token ends every input (the token whose state is scored).
        num_agents: Completions per joint sample (``None``: any number).
    """

    def __init__(self, lm: Any, head: Any, tokenizer: Any, *, template: JointTemplate | None = None,
                 max_length: int | None = 512, append_eos: bool = True, num_agents: int | None = None) -> None:
        self.lm = lm
        self.head = head
        self.tokenizer = tokenizer
        self.template = template or JointTemplate()
        self.max_length = max_length
        self.append_eos = append_eos
        self.num_agents = num_agents

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_model(cls, model: Any = "embedded", tokenizer: Any = None, *, device: str = "auto",
                   dtype: str = "auto", seed: int = 0, template: JointTemplate | None = None,
                   max_length: int | None = 512, append_eos: bool = True,
                   num_agents: int | None = None) -> JointRewardModel:
        """A reward model on ``model`` (a folder, a hub id, ``"embedded"`` or a loaded causal
        LM) with a fresh head, drawn from ``seed`` without moving the global RNG."""
        import torch

        from collab_env.adapters.common.models import (
            load_model_and_tokenizer,
            resolve_device,
            resolve_dtype,
        )

        dev = resolve_device(device)
        lm, tok = load_model_and_tokenizer(model, tokenizer, dev, resolve_dtype(dtype, dev))
        hidden = int(lm.config.get_text_config().hidden_size if hasattr(lm.config, "get_text_config")
                     else lm.config.hidden_size)
        head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
        g = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            head.weight.copy_(torch.randn(head.weight.shape, generator=g) / math.sqrt(hidden + 1))
            head.bias.zero_()
        head.to(dev)
        return cls(lm, head, tok, template=template, max_length=max_length, append_eos=append_eos,
                   num_agents=num_agents)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, tokenizer: Any = None, device: str = "auto",
                        dtype: str = "auto") -> JointRewardModel:
        """Load a folder written by :meth:`save_pretrained` (the tokenizer is reloaded with the
        class it was saved from, so its ids do not change)."""
        from collab_env.adapters.common.checkpoint import load_tensors, refuse_legacy
        from collab_env.adapters.common.models import resolve_device

        path = Path(path)
        if (path / META_FILE).is_file() and not (path / HEAD_FILE).is_file():
            refuse_legacy(path / "reward_head.pt")
        if not (path / META_FILE).is_file() or not (path / HEAD_FILE).is_file():
            raise ConfigError(
                f"{str(path)!r} is not a reward-model folder (it needs {META_FILE} and {HEAD_FILE}); pass the "
                "folder JointRewardModel.save_pretrained() or RewardModelTrainer.save_model() wrote."
            )
        meta = json.loads((path / META_FILE).read_text())
        head = load_tensors(path / HEAD_FILE)  # before the LM: a bad head file fails at once
        if tokenizer is None:
            import transformers

            cls_name = meta.get("tokenizer_class") or "AutoTokenizer"
            tokenizer = getattr(transformers, cls_name, transformers.AutoTokenizer).from_pretrained(str(path))
        rm = cls.from_model(str(path), tokenizer, device=device, dtype=dtype,
                            template=JointTemplate(**meta["template"]), max_length=meta["max_length"],
                            append_eos=meta["append_eos"], num_agents=meta["num_agents"])
        rm.head.load_state_dict(head)
        rm.head.to(resolve_device(device))
        rm.lm.eval()
        return rm

    def save_pretrained(self, path: str | Path) -> Path:
        """Write the LM (LoRA merged into a copy of the weights), the tokenizer, the head and
        the rendering settings to ``path``; reload with :meth:`from_pretrained`."""
        import copy

        from collab_env.adapters.common.checkpoint import save_tensors

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        lm = self.lm
        if hasattr(lm, "merge_and_unload"):
            lm = copy.deepcopy(lm).merge_and_unload()
        lm.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        save_tensors(path / HEAD_FILE, self.head.state_dict())
        meta = {"format": 1, "template": asdict(self.template), "max_length": self.max_length,
                "append_eos": self.append_eos, "num_agents": self.num_agents,
                "tokenizer_class": type(self.tokenizer).__name__}
        (path / META_FILE).write_text(json.dumps(meta, indent=2))
        return path

    # -- forward ----------------------------------------------------------------------------------
    @property
    def device(self):
        """The device of the LM's parameters."""
        return next(self.lm.parameters()).device

    def parameters(self) -> list[Any]:
        """The trainable parameters: the LM's (its LoRA adapters under LoRA) and the head's."""
        return [p for p in self.lm.parameters() if p.requires_grad] + list(self.head.parameters())

    def train(self, mode: bool = True) -> JointRewardModel:
        """Put the LM and the head in training (``mode``) or evaluation mode."""
        self.lm.train(mode)
        self.head.train(mode)
        return self

    def eval(self) -> JointRewardModel:
        """Evaluation mode (no dropout)."""
        return self.train(False)

    def render(self, prompt: Any, completions: Any) -> str:
        """The input text of one joint sample (:meth:`JointTemplate.render`), checking the number
        of agents."""
        comps = _as_completions(completions, "a joint response")
        if self.num_agents is not None and len(comps) != self.num_agents:
            raise DataSchemaError(
                f"this reward model scores {self.num_agents} completion(s) per joint response, got {len(comps)}: "
                "pass one completion per agent, in agent order."
            )
        return self.template.render(_as_prompt(prompt, "a prompt"), comps)

    def encode(self, texts: Sequence[str]):
        """``(input_ids [B, T], attention_mask [B, T], last [B])``: right-padded ids (EOS appended,
        the last ``max_length`` tokens kept) and the index of each row's scored token."""
        import torch

        tok = self.tokenizer
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0)
        rows: list[list[int]] = []
        for text in texts:
            ids = list(tok(text, add_special_tokens=True)["input_ids"])
            if self.append_eos and eos is not None and (not ids or ids[-1] != eos):
                ids.append(eos)
            if self.max_length is not None:
                ids = ids[-self.max_length:]
            if not ids:
                raise DataSchemaError(f"the text {text!r} has no tokens; give the tokenizer an EOS token or text.")
            rows.append(ids)
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        return input_ids, mask, torch.tensor([len(r) - 1 for r in rows], dtype=torch.long)

    def forward_texts(self, texts: Sequence[str]):
        """``[B]`` float32 rewards of rendered texts, with gradients when enabled."""
        import torch

        input_ids, mask, last = (t.to(self.device) for t in self.encode(texts))
        h = _hidden_states(self.lm, input_ids, mask)
        pooled = h[torch.arange(h.shape[0], device=h.device), last].float()
        return self.head(pooled).squeeze(-1)

    def score(self, prompts: Sequence[Any], joint_completions: Sequence[Any], *,
              batch_size: int = 16) -> list[float]:
        """One reward per joint sample, under ``torch.no_grad`` in evaluation mode.

        Args:
            prompts: One prompt per sample (a string, a list with one per agent, or ``None``).
            joint_completions: One joint response per sample: a list with one completion per
                agent (a string when there is one agent).
            batch_size: Texts per forward pass.
        """
        import torch

        if len(prompts) != len(joint_completions):
            raise ConfigError(f"score() got {len(prompts)} prompts for {len(joint_completions)} joint responses; "
                              "pass one prompt per joint response.")
        check_int("batch_size", batch_size, 1)
        texts = [self.render(p, c) for p, c in zip(prompts, joint_completions, strict=True)]
        was_training = self.lm.training
        self.eval()
        out: list[float] = []
        try:
            with torch.no_grad():
                for k in range(0, len(texts), batch_size):
                    out.extend(float(r) for r in self.forward_texts(texts[k:k + batch_size]).cpu())
        finally:
            self.train(was_training)
        return out

    def as_reward_func(self, *, prompt_from: str = "item", prompt_key: str = "prompt",
                       batch_size: int = 16) -> Callable[..., list[float]]:
        """A CoMLRL ``reward_func(*agent_completions, batch_items=None, prompts=None)`` scoring
        each joint sample with this model (for ``MAGRPOTrainer(reward_func=...)``,
        :func:`~collab_env.tasks.from_dataset`, :class:`~collab_env.rewards.joint.JointReward`).

        It takes one completion list per agent, positionally, and returns one float per joint
        sample (the j-th completions of the agents form sample j).

        Args:
            prompt_from: Where the task text comes from: ``"item"``: ``batch_items[j][prompt_key]``
                (one item for every sample, or one per sample); ``"prompts"``: the ``prompts``
                keyword (this turn's prompt of each agent, shared by the samples); ``"none"``: no
                task line.
            prompt_key: The item field holding the task (``prompt_from="item"``).
            batch_size: Texts per forward pass.
        """
        if prompt_from not in ("item", "prompts", "none"):
            raise ConfigError(f"prompt_from must be one of ['item', 'prompts', 'none'], got {prompt_from!r}.")
        check_int("batch_size", batch_size, 1)
        model = self

        def joint_reward_model(*agent_completions: Sequence[str], batch_items: Sequence[Any] | None = None,
                               prompts: Sequence[str] | None = None) -> list[float]:
            if not agent_completions:
                raise ConfigError("the reward function got no completion lists: pass one list per agent.")
            lists = [[c] if isinstance(c, str) else list(c) for c in agent_completions]
            n = len(lists[0])
            if any(len(c) != n for c in lists):
                raise ConfigError(f"the agents' completion lists differ in length {[len(c) for c in lists]}; "
                                  "they must be aligned (sample j is the j-th completion of every agent).")
            task: list[Any]
            if prompt_from == "none":
                task = [None] * n
            elif prompt_from == "prompts":
                if prompts is None:
                    raise ConfigError("prompt_from='prompts' needs the prompts= keyword (the trainers pass it).")
                task = [list(prompts)] * n
            else:
                items = list(batch_items) if batch_items is not None else []
                if len(items) not in (1, n):
                    raise ConfigError(
                        f"prompt_from='item' needs batch_items with one item (shared) or {n} (one per sample), got "
                        f"{len(items)}; or use as_reward_func(prompt_from='prompts' or 'none')."
                    )
                items = items * n if len(items) == 1 else items
                task = []
                for item in items:
                    if not isinstance(item, Mapping) or prompt_key not in item:
                        keys = sorted(item) if isinstance(item, Mapping) else type(item).__name__
                        raise ConfigError(f"a task item has no {prompt_key!r} field ({keys}); pass "
                                          "as_reward_func(prompt_key=...) naming the field with the task text.")
                    task.append(item[prompt_key])
            return model.score(task, [list(j) for j in zip(*lists, strict=True)], batch_size=batch_size)

        return joint_reward_model


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
@dataclass
class RewardModelConfig(TrainerConfig):
    """Configuration of :class:`RewardModelTrainer`. Every field of
    :class:`~collab_env.adapters.common.config.TrainerConfig` applies (``share_model`` does not:
    there is one model); ``per_device_train_batch_size`` is pairs per forward pass, and
    ``max_steps``, ``eval_interval``, ``save_steps`` and ``logging_steps`` count optimiser
    steps."""

    num_agents: int | None = None
    """Completions per joint response; ``None``: taken from the first training row. Every row
    (and every scored sample later) must have this many."""
    max_length: int | None = 512
    """Longest input in tokens; longer texts keep their last ``max_length`` tokens (the agents'
    answers). ``None``: no limit."""
    append_eos: bool = True
    """End every input with the EOS token, whose hidden state is scored."""
    template: JointTemplate = field(default_factory=JointTemplate)
    """How a joint sample becomes text (module docstring)."""
    gradient_accumulation_steps: int = 1
    """Forward/backward passes per optimiser step."""
    center_rewards_coefficient: float = 0.0
    """Weight of ``(r_c + r_r)^2`` added to the loss to keep rewards centred on 0."""
    shuffle: bool = True
    """Shuffle the pairs every epoch (seeded by ``seed`` and the epoch)."""
    eval_num_samples: int = 256
    """Evaluation pairs used (at most), from the start of the evaluation set."""
    eval_batch_size: int = 16
    """Evaluation pairs per forward pass."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_agents", self.num_agents, 1, allow_none=True)
        check_int("max_length", self.max_length, 2, allow_none=True)
        for name in ("append_eos", "shuffle"):
            if getattr(self, name) not in (True, False):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        if isinstance(self.template, Mapping):
            self.template = JointTemplate(**self.template)
        if not isinstance(self.template, JointTemplate):
            raise ConfigError(f"template must be a JointTemplate or a dict of its fields, got {type(self.template).__name__}.")
        check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        check_float("center_rewards_coefficient", self.center_rewards_coefficient, 0.0)
        if self.share_model:
            raise ConfigError("share_model does not apply to a reward model (there is one model); leave it False.")


#: Former name of the run state (:class:`~collab_env.adapters.common.loop.RunState`).
RewardModelState = RunState


#: One preference pair: (prompt, chosen completions, rejected completions).
JointPair = tuple[Any, list[str], list[str]]


def _read_pairs(data: Any, what: str, num_agents: int | None) -> list[JointPair]:
    if data is None:
        return []
    if isinstance(data, (str, bytes, Mapping)):
        raise ConfigError(f"{what} must be a datasets.Dataset or a list of rows, got {type(data).__name__}.")
    out: list[JointPair] = []
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise DataSchemaError(f"{what} row {i} must be a dict, got {type(row).__name__}.")
        for col in ("prompt", "chosen", "rejected"):
            if col not in row:
                raise DataSchemaError(f"{what} row {i} has no {col!r} column (it has {sorted(row)}).")
        prompt = _as_prompt(row["prompt"], f"{what} row {i}: prompt")
        chosen = _as_completions(row["chosen"], f"{what} row {i}: chosen")
        rejected = _as_completions(row["rejected"], f"{what} row {i}: rejected")
        n = num_agents if num_agents is not None else len(chosen)
        if len(chosen) != n or len(rejected) != n:
            raise DataSchemaError(
                f"{what} row {i}: chosen has {len(chosen)} and rejected {len(rejected)} completion(s), expected "
                f"{n} (one per agent); set RewardModelConfig(num_agents=...) or fix the row."
            )
        out.append((prompt, chosen, rejected))
    return out


def _pair_rewards(rm: JointRewardModel, pairs: Sequence[JointPair]):
    """``([B] chosen, [B] rejected)`` rewards of ``pairs`` in one forward pass."""
    texts = [rm.render(p, c) for p, c, _ in pairs] + [rm.render(p, r) for p, _, r in pairs]
    rewards = rm.forward_texts(texts)
    return rewards[:len(pairs)], rewards[len(pairs):]


def _pair_sums(losses, rc, rr) -> dict[str, float]:
    d = (rc - rr).detach()
    return {"loss": float(losses.detach().sum()),
            "accuracy": float((d > 0).float().sum() + 0.5 * (d == 0).float().sum()),
            "margin": float(d.sum()), "chosen_reward": float(rc.detach().sum()),
            "rejected_reward": float(rr.detach().sum())}


class RewardModelTrainer:
    """Train a :class:`JointRewardModel` with the Bradley-Terry loss (module docstring).

    Args:
        model: A folder, a hub id, ``"embedded"``, a loaded causal LM, or a
            :class:`JointRewardModel` to keep training.
        train_dataset: Preference rows (``prompt``, ``chosen``, ``rejected``).
        eval_dataset: Same format; ``None``: :meth:`evaluate` returns ``{}``.
        args: A :class:`RewardModelConfig`.
        tokenizer: A tokenizer (or folder); default: the model folder's.
        wandb_config: ``None`` or Weights & Biases settings (see
            :class:`~collab_env.adapters.common.logging.MetricsLogger`).

    Attributes:
        reward_model: The :class:`JointRewardModel` being trained (score it, save it, or pass
            ``reward_model.as_reward_func()`` to an RL trainer).
    """

    def __init__(self, model: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 args: RewardModelConfig | None = None, *, tokenizer: Any = None,
                 wandb_config: Mapping[str, Any] | None = None) -> None:
        import torch

        from collab_env.adapters.common.logging import MetricsLogger
        from collab_env.adapters.common.models import apply_lora, make_scheduler

        args = RewardModelConfig() if args is None else args
        if not isinstance(args, RewardModelConfig):
            raise ConfigError(f"args must be a RewardModelConfig, got {type(args).__name__}.")
        if model is None:
            raise ConfigError("model is required: a model folder, a hub id, 'embedded', a loaded causal LM "
                              "or a JointRewardModel.")
        if train_dataset is None and eval_dataset is None:
            raise ConfigError("pass train_dataset= (and optionally eval_dataset=).")
        self.args = args
        self.train_pairs = _read_pairs(train_dataset, "train_dataset", args.num_agents)
        num_agents = args.num_agents
        if num_agents is None and self.train_pairs:
            num_agents = len(self.train_pairs[0][1])
        self.train_pairs = _read_pairs(train_dataset, "train_dataset", num_agents)  # all rows agree
        self.eval_pairs = _read_pairs(eval_dataset, "eval_dataset", num_agents)
        if num_agents is None and self.eval_pairs:
            num_agents = len(self.eval_pairs[0][1])
            self.eval_pairs = _read_pairs(eval_dataset, "eval_dataset", num_agents)
        if train_dataset is not None and not self.train_pairs:
            raise DataSchemaError("train_dataset has no rows.")
        torch.manual_seed(args.seed)
        if isinstance(model, JointRewardModel):
            rm = model
            if rm.num_agents is not None and num_agents is not None and rm.num_agents != num_agents:
                raise ConfigError(f"the reward model scores {rm.num_agents} agent(s) but the data has {num_agents}.")
            rm.num_agents = rm.num_agents if num_agents is None else num_agents
        else:
            rm = JointRewardModel.from_model(model, tokenizer, device=args.device, dtype=args.dtype, seed=args.seed,
                                             template=args.template, max_length=args.max_length,
                                             append_eos=args.append_eos, num_agents=num_agents)
            if args.lora_r > 0:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(args.seed)
                    rm.lm = apply_lora(rm.lm, args)
        checkpointing = args.gradient_checkpointing
        if checkpointing is None:
            checkpointing = rm.device.type == "cuda"
        if checkpointing:
            rm.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if args.lora_r > 0 and hasattr(rm.lm, "enable_input_require_grads"):
                rm.lm.enable_input_require_grads()
        self.reward_model = rm
        params = rm.parameters()
        self.optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=args.weight_decay,
                                           betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
        self.scheduler = make_scheduler(self.optimizer, args, self._planned_steps())
        self.state = RunState()
        self.logger = MetricsLogger(args.output_dir, {**args.to_dict(), "num_agents": num_agents}, wandb_config)

    # -- schedule ---------------------------------------------------------------------------------
    def _batch_pairs(self) -> int:
        return self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps

    def _steps_per_epoch(self) -> int:
        return max(1, math.ceil(len(self.train_pairs) / self._batch_pairs()))

    def _planned_steps(self) -> int:
        steps = self._steps_per_epoch() * self.args.num_train_epochs
        return min(steps, self.args.max_steps) if self.args.max_steps > 0 else steps

    def _order(self, epoch: int) -> list[int]:
        return epoch_order(len(self.train_pairs), self.args.shuffle, self.args.seed, epoch)

    # -- one optimiser step -----------------------------------------------------------------------
    def training_step(self, pairs: Sequence[JointPair]) -> dict[str, float]:
        """One optimiser step on ``pairs`` (micro-batches of ``per_device_train_batch_size``; the
        loss is the mean over all pairs, so accumulation is exact). Returns the step's metrics."""
        import torch

        a, rm, n = self.args, self.reward_model, len(pairs)
        if not n:
            raise ConfigError("training_step() needs at least one pair.")
        rm.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for k in range(0, n, a.per_device_train_batch_size):
            chunk = pairs[k:k + a.per_device_train_batch_size]
            rc, rr = _pair_rewards(rm, chunk)
            losses = bradley_terry_loss(rc, rr)
            total = losses.sum()
            if a.center_rewards_coefficient:
                total = total + a.center_rewards_coefficient * ((rc + rr) ** 2).sum()
            (total / n).backward()
            for key, v in _pair_sums(losses, rc, rr).items():
                sums[key] = sums.get(key, 0.0) + v
        clip = a.max_grad_norm if a.max_grad_norm is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(rm.parameters(), clip)
        self.optimizer.step()
        self.scheduler.step()
        rm.eval()
        out = {k: v / n for k, v in sums.items()}
        out.update(grad_norm=float(grad_norm), pairs=float(n), learning_rate=float(self.scheduler.get_last_lr()[0]))
        return out

    # -- the run ----------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Train for ``num_train_epochs`` (or ``max_steps`` optimiser steps), evaluating every
        ``eval_interval`` steps and at the end; returns the last logged training metrics."""
        from collab_env.adapters.common.loop import run

        if not self.train_pairs:
            raise ConfigError("train() needs train_dataset=.")
        return run(self)

    def schedule(self) -> Schedule:
        """Optimiser steps; evaluation before step ``s`` when ``s % eval_interval == 0`` and
        after the last; logs every ``logging_steps`` steps; the model saved every
        ``save_steps`` steps."""
        a = self.args
        return Schedule(unit="step", per_epoch=self._steps_per_epoch(), limit=self._planned_steps(),
                        epochs=a.num_train_epochs, eval_every=a.eval_interval, eval_rule="done",
                        can_evaluate=bool(self.eval_pairs), final_eval=True, log_every=a.logging_steps,
                        log_item=False, log_next_epoch=True, save_every=a.save_steps, desc="RewardModel")

    def train_step(self, batch: Sequence[int]) -> dict[str, float]:
        """:meth:`training_step` on the ``batch[0]``-th slice of this epoch's shuffled pairs."""
        nb = self._batch_pairs()
        order = self._order(self.state.epoch)
        metrics = self.training_step([self.train_pairs[i] for s in batch for i in order[s * nb:(s + 1) * nb]])
        self.state.optimizer_steps += 1
        return {**metrics, "env_steps": 1}

    def end_epoch(self) -> dict[str, float]:
        """Nothing to do at an epoch's end: ``{}``."""
        return {}

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """:meth:`save_model` into ``path`` (default ``<output_dir>/checkpoint-<step>``)."""
        path = Path(path) if path is not None else Path(self.args.output_dir) / f"checkpoint-{self.state.optimizer_steps}"
        return self.save_model(path)

    def evaluate(self, num_eval_samples: int | None = None, eval_dataset: Any = None) -> dict[str, float]:
        """Bradley-Terry loss, pairwise accuracy (ties count 1/2), margin and mean rewards on the
        first ``num_eval_samples`` evaluation pairs (default ``args.eval_num_samples``), without
        updating weights; ``eval_dataset`` replaces the trainer's for this call. Logs and returns
        ``eval/...`` metrics (``{}`` without evaluation pairs)."""
        import torch

        n = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        check_int("num_eval_samples", n, 0)
        pool = self.eval_pairs if eval_dataset is None else _read_pairs(
            eval_dataset, "eval_dataset", self.reward_model.num_agents)
        pairs = pool[:n]
        if not pairs:
            return {}
        rm = self.reward_model
        was_training = rm.lm.training
        rm.eval()
        sums: dict[str, float] = {}
        with torch.no_grad():
            for k in range(0, len(pairs), self.args.eval_batch_size):
                rc, rr = _pair_rewards(rm, pairs[k:k + self.args.eval_batch_size])
                for key, v in _pair_sums(bradley_terry_loss(rc, rr), rc, rr).items():
                    sums[key] = sums.get(key, 0.0) + v
        rm.train(was_training)
        self.state.evaluations += 1
        metrics = {f"eval/{k}": v / len(pairs) for k, v in sums.items()}
        metrics["eval/pairs"] = float(len(pairs))
        self.logger.log(metrics, env_step=self.state.env_step, epoch=self.state.epoch)
        return metrics

    def save_model(self, path: str | Path | None = None) -> Path:
        """Save the reward model (default ``<output_dir>/reward_model``); reload it with
        :meth:`JointRewardModel.from_pretrained`. (Weights only: optimiser state is not saved.)"""
        path = Path(path) if path is not None else Path(self.args.output_dir) / "reward_model"
        return self.reward_model.save_pretrained(path)

    def close(self) -> None:
        """Finish logging (closes the Weights & Biases run)."""
        self.logger.close()
