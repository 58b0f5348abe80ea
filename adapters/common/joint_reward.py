"""A scalar reward of the agents' joint response: the model that the joint reward model learns
(:mod:`~collab_env.adapters.reward_model` trains it with Bradley-Terry; MARLHF trains and then
freezes it), its input texts, scoring, saving and loading, and its use as a CoMLRL ``reward_func``.

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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from collab_env.adapters.common.checkpoint import (
    damaged,
    load_tensors,
    parse_json,
    read_regular,
    refuse_legacy,
    save_tensors,
    stat_regular,
)
from collab_env.adapters.common.config import check_int
from collab_env.adapters.common.models import load_model_and_tokenizer, resolve_device, resolve_dtype
from collab_env.adapters.common.pairs import JointPair, as_completions, as_prompt
from collab_env.errors import ConfigError, DataSchemaError

__all__ = ["JointTemplate", "JointRewardModel", "pair_rewards", "read_meta", "HEAD_FILE", "META_FILE", "MAX_META_BYTES"]

#: The linear head's weights inside a saved reward-model folder (safetensors: loading runs no
#: code; an older folder's ``reward_head.pt`` pickle is refused unread, see
#: :func:`collab_env.adapters.common.checkpoint.refuse_legacy`).
HEAD_FILE = "reward_head.safetensors"
#: Template, length settings and tokenizer class of a saved reward-model folder.
META_FILE = "reward_model.json"
#: Largest ``reward_model.json`` read, in bytes (the one save_pretrained writes is about 300).
MAX_META_BYTES = 64 * 2**10
#: The keys of ``reward_model.json`` and the types each value may have.
_META_TYPES: dict[str, tuple[type, ...]] = {
    "format": (int,), "template": (dict,), "max_length": (int, type(None)), "append_eos": (bool,),
    "num_agents": (int, type(None)), "tokenizer_class": (str, type(None)),
}
_META_FIX = ("it was not written by JointRewardModel.save_pretrained(), or it was damaged; nothing was loaded. "
             "Save the reward model again, or restore it from a good copy.")


def _bad_meta(file: Any, what: str) -> ConfigError:
    return ConfigError(f"{file}: {what}; {_META_FIX}")


def read_meta(file: str | Path) -> dict[str, Any]:
    """The settings of a saved reward model (``reward_model.json``), read without trusting the
    file: a regular file (a FIFO or device is refused unopened) of at most
    :data:`MAX_META_BYTES`, JSON nested at most as deep as a state file, with exactly the keys
    save_pretrained writes, each of its type (booleans are not integers), a template whose
    fields are those of :class:`JointTemplate`, and a tokenizer class that is a plain name (checked
    to be a tokenizer class when it is used). Anything
    else raises a one-line :class:`ConfigError` (the file, what is wrong, what to do); the file
    is only read."""
    file = Path(file)
    meta = parse_json(read_regular(file, MAX_META_BYTES), file, _bad_meta)
    if not isinstance(meta, dict):
        raise _bad_meta(file, f"it holds a JSON {type(meta).__name__}, not an object")
    if set(meta) != set(_META_TYPES):
        raise _bad_meta(file, f"its keys are {sorted(meta)[:8]}, expected {sorted(_META_TYPES)}")
    for key, types in _META_TYPES.items():
        value = meta[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise _bad_meta(file, f"{key} is {str(value)[:60]!r} ({type(value).__name__}), expected "
                                  f"{' or '.join('null' if t is type(None) else t.__name__ for t in types)}")
    if meta["format"] != 1:
        raise _bad_meta(file, f"format is {meta['format']}, this version reads format 1")
    for key, low in (("max_length", 1), ("num_agents", 1)):
        if meta[key] is not None and meta[key] < low:
            raise _bad_meta(file, f"{key} is {meta[key]}, expected >= {low} or null")
    names = {f.name for f in fields(JointTemplate)}
    template = meta["template"]
    if not set(template) <= names or not all(isinstance(v, str) for v in template.values()):
        raise _bad_meta(file, f"template must map some of {sorted(names)} to strings, got keys {sorted(template)[:8]}")
    try:
        meta["template"] = JointTemplate(**template)
    except ConfigError as exc:
        raise _bad_meta(file, f"template: {exc}") from None
    cls_name = meta["tokenizer_class"]
    if cls_name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,80}", cls_name):
        raise _bad_meta(file, f"tokenizer_class {cls_name[:60]!r} is not the name of a transformers tokenizer class")
    return meta


def _check_head(file: Path, head: Mapping[str, Any]) -> None:
    """A saved head is exactly ``weight [1, H]`` and ``bias [1]`` floating-point tensors."""
    shapes = {k: list(v.shape) for k, v in head.items()}
    if (set(head) != {"weight", "bias"} or len(shapes["weight"]) != 2 or shapes["weight"][0] != 1
            or shapes["bias"] != [1] or not all(v.is_floating_point() for v in head.values())):
        raise damaged(file, f"it holds {dict(list(shapes.items())[:4])}, not a reward head (float weight [1, hidden] "
                             "and bias [1])")


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
        comps = as_completions(completions, "completions")
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
    :class:`~collab_env.adapters.reward_model.RewardModelTrainer` exposes the one it trains as
    ``trainer.reward_model``.

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
        path = Path(path)
        has_meta, has_head = stat_regular(path / META_FILE), stat_regular(path / HEAD_FILE)
        if has_meta is not None and has_head is None:
            refuse_legacy(path / "reward_head.pt")
        if has_meta is None or has_head is None:
            raise ConfigError(
                f"{str(path)!r} is not a reward-model folder (it needs {META_FILE} and {HEAD_FILE}); pass the "
                "folder JointRewardModel.save_pretrained() or RewardModelTrainer.save_model() wrote."
            )
        # Both files are checked before the LM is loaded: a bad one fails at once, nothing changed.
        head = load_tensors(path / HEAD_FILE)
        _check_head(path / HEAD_FILE, head)
        meta = read_meta(path / META_FILE)
        if tokenizer is None:
            import transformers

            tok_cls = getattr(transformers, meta["tokenizer_class"] or "AutoTokenizer", transformers.AutoTokenizer)
            if tok_cls is not transformers.AutoTokenizer and not (
                    isinstance(tok_cls, type) and issubclass(tok_cls, transformers.PreTrainedTokenizerBase)):
                raise _bad_meta(path / META_FILE, f"tokenizer_class {meta['tokenizer_class']!r} is not a transformers "
                                                  "tokenizer class")
            tokenizer = tok_cls.from_pretrained(str(path))
        rm = cls.from_model(str(path), tokenizer, device=device, dtype=dtype,
                            template=meta["template"], max_length=meta["max_length"],
                            append_eos=meta["append_eos"], num_agents=meta["num_agents"])
        rm.head.load_state_dict(head)
        rm.head.to(resolve_device(device))
        rm.lm.eval()
        return rm

    def save_pretrained(self, path: str | Path) -> Path:
        """Write the LM (LoRA merged into a copy of the weights), the tokenizer, the head and
        the rendering settings to ``path``; reload with :meth:`from_pretrained`."""
        import copy

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
        comps = as_completions(completions, "a joint response")
        if self.num_agents is not None and len(comps) != self.num_agents:
            raise DataSchemaError(
                f"this reward model scores {self.num_agents} completion(s) per joint response, got {len(comps)}: "
                "pass one completion per agent, in agent order."
            )
        return self.template.render(as_prompt(prompt, "a prompt"), comps)

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


def pair_rewards(rm: JointRewardModel, pairs: Sequence[JointPair]):
    """``([B] chosen, [B] rejected)`` rewards of joint ``pairs`` in one forward pass (with
    gradient when grad is enabled)."""
    texts = [rm.render(p, c) for p, c, _ in pairs] + [rm.render(p, r) for p, _, r in pairs]
    rewards = rm.forward_texts(texts)
    return rewards[:len(pairs)], rewards[len(pairs):]

