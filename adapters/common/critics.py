"""Critics for the actor-critic learners: TD and GAE targets, the clipped value loss, the actor
loss, and value heads on a language model.

The math functions take plain lists or tensors so tests can check them against values worked
out by hand. A trajectory here is one agent's sequence of turns in one episode: ``rewards[t]`` is
what the agent earned for its ``t``-th completion and ``values[t]`` the critic's estimate before
it; the value after the last turn is ``last_value`` (0 when the episode ended).

:class:`ValueCritic` is a scalar (or per-agent) linear head on the last hidden state of a causal
LM, read at two positions of one forward pass: the last *prefix* token (the prompt, i.e. the
state: ``V(s)``) and the last *suffix* token (the prompt plus the completion: ``Q(s, a)``). The
backbone is either its own model (a copy of the actor or a smaller one) or the actor itself
(a value head on the actor; the critic loss then also trains the actor's weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collab_env.adapters.common.losses import pack_sequences
from collab_env.errors import ConfigError

__all__ = ["td_targets", "gae", "clipped_value_loss", "actor_loss", "ValueCritic"]


# ---------------------------------------------------------------------------------------------
# Targets and advantages
# ---------------------------------------------------------------------------------------------
def td_targets(rewards: Sequence[float], values: Sequence[float], discount: float,
               last_value: float = 0.0) -> list[float]:
    """One-step TD targets ``y_t = r_t + discount * v_{t+1}``, with ``v_T = last_value``.

    Example: rewards ``[1, 0, 2]``, values ``[0.5, 0.4, 0.3]``, discount 0.9 give
    ``[1 + 0.9 * 0.4, 0 + 0.9 * 0.3, 2 + 0]``.
    """
    if len(rewards) != len(values):
        raise ConfigError(f"td_targets needs one value per reward, got {len(values)} and {len(rewards)}.")
    nxt = list(values[1:]) + [last_value]
    return [float(r) + discount * float(v) for r, v in zip(rewards, nxt, strict=True)]


def gae(rewards: Sequence[float], values: Sequence[float], discount: float, lam: float,
        last_value: float = 0.0) -> tuple[list[float], list[float]]:
    """Generalised advantage estimates and the critic's lambda-return targets.

    ``delta_t = r_t + discount * v_{t+1} - v_t``; ``A_t = delta_t + discount * lam * A_{t+1}``
    (``A_T = 0``); target ``y_t = A_t + v_t``. ``lam = 0`` is the one-step TD error (targets
    :func:`td_targets`); ``lam = 1`` is the Monte-Carlo return minus the value.

    Returns:
        ``(advantages, targets)``, one per step.
    """
    if len(rewards) != len(values):
        raise ConfigError(f"gae needs one value per reward, got {len(values)} and {len(rewards)}.")
    nxt = list(values[1:]) + [last_value]
    adv = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        delta = float(rewards[t]) + discount * float(nxt[t]) - float(values[t])
        running = delta + discount * lam * running
        adv[t] = running
    return adv, [a + float(v) for a, v in zip(adv, values, strict=True)]


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------
def clipped_value_loss(values, old_values, targets, clip_range: float | None):
    """PPO-style clipped value loss, summed over the batch (divide for a mean).

    ``v_clip = old + clamp(v - old, -clip_range, clip_range)``;
    ``loss = 0.5 * max((v - y)^2, (v_clip - y)^2)`` per element. ``clip_range=None`` is the plain
    ``0.5 * (v - y)^2``. While ``v`` stays within ``clip_range`` of the rollout-time value the two
    agree; beyond it the gradient stops pushing ``v`` further from ``old``.

    Returns:
        ``(loss_sum, clipped)``: a scalar tensor and a bool tensor of where the clipped term won.
    """
    import torch

    err = (values - targets) ** 2
    if clip_range is None:
        return 0.5 * err.sum(), torch.zeros_like(err, dtype=torch.bool)
    v_clip = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    err_clip = (v_clip - targets) ** 2
    return 0.5 * torch.maximum(err, err_clip).sum(), err_clip > err


def actor_loss(logp, advantages, mask, *, num_sequences: int | None = None):
    """Policy-gradient loss ``-(A * sum_t log pi(token_t))`` per sequence, averaged over
    ``num_sequences`` (default: the rows here), over completion tokens only.

    ``mask`` is applied with ``torch.where`` before the product, so a masked position (padding,
    or any token not trainable) contributes exactly zero and gets exactly zero gradient, even if
    its log-prob is ``-inf`` or NaN.
    """
    import torch

    m = mask.bool()
    safe = torch.where(m, logp, torch.zeros_like(logp))
    per_seq = safe.sum(-1)
    n = int(mask.shape[0]) if num_sequences is None else num_sequences
    return -(advantages.to(per_seq.dtype) * per_seq).sum() / max(n, 1)


# ---------------------------------------------------------------------------------------------
# Value heads on a language model
# ---------------------------------------------------------------------------------------------
class ValueCritic:
    """A linear value head (``num_outputs`` scalars) on a causal LM's last hidden state.

    Args:
        backbone: The causal LM (``PreTrainedModel`` or ``PeftModel``) whose hidden states the
            head reads.
        tokenizer: Its tokenizer.
        num_outputs: Values per input (1 for an agent's own critic; the number of agents for a
            centralised critic, one value per agent's reward).
        shares_actor: ``backbone`` is an actor being trained: its weights belong to the actor's
            optimiser and only the head is in :attr:`optimizer`.
        seed: Seed of the head's initialisation.

    Attributes:
        head: ``torch.nn.Linear(hidden_size, num_outputs)`` in float32 on the backbone's device.
        optimizer: Set by the trainer (AdamW over :meth:`parameters`).
        scheduler: Set by the trainer.
    """

    def __init__(self, backbone: Any, tokenizer: Any, num_outputs: int = 1, *, shares_actor: bool = False,
                 seed: int = 0) -> None:
        import torch

        self.backbone = backbone
        self.tokenizer = tokenizer
        self.num_outputs = int(num_outputs)
        self.shares_actor = shares_actor
        config = getattr(backbone, "config", None)
        hidden = (getattr(config, "hidden_size", None)
                  or getattr(getattr(config, "text_config", None), "hidden_size", None))
        if hidden is None:
            raise ConfigError("the critic's model has no config.hidden_size; pass a transformers causal LM.")
        device = next(backbone.parameters()).device
        with torch.random.fork_rng(devices=[]):  # never move the caller's RNG
            torch.manual_seed(seed)
            self.head = torch.nn.Linear(int(hidden), self.num_outputs).to(device=device, dtype=torch.float32)
            torch.nn.init.normal_(self.head.weight, std=1.0 / int(hidden))
            torch.nn.init.zeros_(self.head.bias)
        self.optimizer: Any = None
        self.scheduler: Any = None
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0))

    @property
    def device(self):
        """Device of the backbone (and the head)."""
        return self.head.weight.device

    def parameters(self) -> list[Any]:
        """What :attr:`optimizer` trains: the head, plus the backbone's trainable weights unless
        the backbone is an actor (whose optimiser owns them)."""
        params = list(self.head.parameters())
        if not self.shares_actor:
            params += [p for p in self.backbone.parameters() if p.requires_grad]
        return params

    def values(self, prefixes: Sequence[Sequence[int]], suffixes: Sequence[Sequence[int]]):
        """Values at the last prefix token and at the last suffix token.

        Args:
            prefixes: Token ids of the state (a prompt, a transcript); non-empty.
            suffixes: Token ids that follow (a completion, a joint action); may be empty, then
                the second value is read at the last prefix token.

        Returns:
            ``(v_prefix, v_full)``, each ``[B, num_outputs]`` float32, with gradient when grad
            is enabled.
        """
        import torch

        if any(len(p) == 0 for p in prefixes):
            raise ConfigError("a critic input has an empty prefix; the state must hold at least one token.")
        batch = pack_sequences(prefixes, suffixes, self.pad_id).to(self.device)
        kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False, output_hidden_states=True)
        try:
            out = self.backbone(**kwargs, logits_to_keep=1)  # the LM head's logits are not needed
        except TypeError:
            out = self.backbone(**kwargs)
        hidden = out.hidden_states[-1]
        p_width = batch.input_ids.shape[1] - batch.completion_mask.shape[1]
        lengths = torch.tensor([len(s) for s in suffixes], device=hidden.device)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        # Prompts are left-padded (they end at column p_width - 1); suffixes start at p_width.
        h_prefix = hidden[:, p_width - 1]
        h_full = hidden[rows, p_width - 1 + lengths]
        return self.head(h_prefix.float()), self.head(h_full.float())

    def train(self) -> None:
        """Training mode for the backbone (dropout) when it is the critic's own."""
        if not self.shares_actor:
            self.backbone.train()

    def eval(self) -> None:
        """Evaluation mode for the backbone when it is the critic's own."""
        if not self.shares_actor:
            self.backbone.eval()
