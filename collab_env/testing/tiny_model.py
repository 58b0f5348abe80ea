"""A tiny local chat model for fast, offline tests (a fake: never imported by the library).

:func:`build_tiny_chat_model` writes a complete Hugging Face model folder in about a tenth of a
second: a byte-level BPE tokenizer trained with ``tokenizers`` on a few KB of text, wrapped in
``PreTrainedTokenizerFast`` with a ChatML chat template, and a randomly initialised 2-layer,
hidden-64 Qwen2 model (or Qwen3, ``architecture="qwen3"``) (one 64-wide attention head, so the vLLM CPU build accepts it too).

The weights are random, so the text is gibberish; what the tests check is the plumbing (batching,
padding, token ids, log-probs, stop strings, adapters), which does not need a trained model.

Reload the tokenizer with :func:`load_tiny_chat_model` (``PreTrainedTokenizerFast``): loading a
Qwen2 folder with ``AutoTokenizer`` gives ``Qwen2Tokenizer``, whose pre-tokenizer differs from
the one trained here and therefore changes the ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["CHATML_TEMPLATE", "build_tiny_chat_model", "load_tiny_chat_model", "TRAINING_TEXT"]

#: The ChatML template (Qwen2 style) without a default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: A few KB of chat-flavoured English: enough for BPE merges of common words and punctuation.
TRAINING_TEXT = "\n".join(
    [
        "The capital of France is Paris. The capital of Italy is Rome.",
        "Which object is involved? The red box is heavy and the blue ball is light.",
        "Could you tell me more about the colour, the size and the weight of each object?",
        "Thanks, that's what I needed. The answer is \\boxed{42}.",
        "I would like to know how many apples are left after we eat three of them.",
        "Let us think step by step: first we count, then we subtract, then we answer.",
        "Hello! How can I help you today? Please ask a question about the task.",
        "user: what is the weather like? assistant: it is sunny with a light wind.",
        "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000. Symbols: + - * / = ( ) [ ] { } < > | :",
    ]
    * 6
)


def build_tiny_chat_model(
    path: str | Path, *, seed: int = 0, vocab_size: int = 384, architecture: str = "qwen2"
) -> Path:
    """Write a tiny chat model folder (config, weights, tokenizer, chat template) to ``path``.

    Args:
        path: Folder to create (may exist).
        seed: Seed of the weight initialisation: the same seed gives the same weights.
        vocab_size: Target BPE vocabulary size (bytes, merges and the special tokens).
        architecture: ``"qwen2"`` (default) or ``"qwen3"`` (the same sizes as a Qwen3 model, for
            engines that serve Qwen3 but not Qwen2, such as SkyRL's JAX Tinker backend).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    classes = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}
    if architecture not in classes:
        raise ValueError(f"architecture={architecture!r}: choose one of {sorted(classes)}.")
    config_class, model_class = (getattr(transformers, n) for n in classes[architecture])
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(TRAINING_TEXT.splitlines(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(path)

    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    # fork_rng: building the model must not disturb the caller's global torch RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    return path


def load_tiny_chat_model(path: str | Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a folder written by :func:`build_tiny_chat_model`."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
    model.eval()
    return model, tokenizer
