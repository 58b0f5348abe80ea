"""TokenHistory: a player's later prompts extend its exact token history (the builder TRL's
rollout_func and the verl agent loop share)."""

import pytest

from collab_env.errors import ConfigError
from collab_env.types import Completion, Conversation

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def chat(*turns):
    return Conversation.from_chat([{"role": r, "content": c} for r, c in turns])


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def char_ids(tok, text):
    """A valid but non-canonical encoding of ``text``: one token per character (the tiny
    tokenizer merges several of them when it encodes the text itself)."""
    out = [i for c in text for i in ids(tok, c)]
    assert out != ids(tok, text) and tok.decode(out) == text
    return out


def completion(prompt, generated, text):
    return Completion(text=text, token_ids=tuple(generated), logprobs=(0.0,) * len(generated),
                      prompt_token_ids=tuple(prompt))


def test_first_prompt_is_the_plain_rendering(tok):
    from collab_env.agents.tokens import TokenHistory, chat_prompt_text, rendered_prompt_ids

    h = TokenHistory(tok)
    obs = chat(("user", "hi"))
    assert h.prompt_ids(obs) == rendered_prompt_ids(tok, chat_prompt_text(tok, obs))
    assert h.prompt_ids(obs) == ids(tok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_later_prompt_keeps_the_generated_ids_and_does_not_repeat_the_templates_eos(tok):
    from collab_env.agents.tokens import TokenHistory

    h = TokenHistory(tok)
    p1 = h.prompt_ids(chat(("user", "hi")))
    reply = "the answer is there"
    gen = char_ids(tok, reply) + [tok.convert_tokens_to_ids("<|im_end|>")]
    h.record(completion(p1, gen, reply))
    p2 = h.prompt_ids(chat(("user", "hi"), ("assistant", reply), ("user", "ok")))
    # prompt + generated ids as they were sampled, then only the text after the template's
    # "<|im_end|>" (which the model wrote itself) is tokenised
    assert p2 == p1 + gen + ids(tok, "\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")
    # the plain rendering would have re-tokenised the reply canonically
    assert p2 != ids(tok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + reply
                     + "<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")


def test_a_reply_cut_at_the_token_limit_gets_the_templates_end_of_turn(tok):
    from collab_env.agents.tokens import TokenHistory

    h = TokenHistory(tok)
    p1 = h.prompt_ids(chat(("user", "hi")))
    gen = char_ids(tok, "the ans")
    h.record(completion(p1, gen, "the ans"))
    p2 = h.prompt_ids(chat(("user", "hi"), ("assistant", "the ans"), ("user", "go on")))
    assert p2 == p1 + gen + ids(tok, "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n")


def test_an_eos_the_template_does_not_write_stays_before_its_end_of_turn(tok):
    from collab_env.agents.tokens import TokenHistory

    h = TokenHistory(tok)
    p1 = h.prompt_ids(chat(("user", "hi")))
    gen = ids(tok, "yes") + [tok.convert_tokens_to_ids("<|endoftext|>")]
    h.record(completion(p1, gen, "yes"))
    p2 = h.prompt_ids(chat(("user", "hi"), ("assistant", "yes"), ("user", "ok")))
    assert p2 == p1 + gen + ids(tok, "<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")


def test_the_longest_earlier_turn_is_extended_and_an_unrelated_prompt_is_plain(tok):
    from collab_env.agents.tokens import TokenHistory, chat_prompt_text, rendered_prompt_ids

    h = TokenHistory(tok)
    p1 = h.prompt_ids(chat(("user", "hi")))
    g1 = char_ids(tok, "the answer")
    h.record(completion(p1, g1, "the answer"))
    c2 = chat(("user", "hi"), ("assistant", "the answer"), ("user", "more"))
    p2 = h.prompt_ids(c2)
    g2 = char_ids(tok, "is there")
    h.record(completion(p2, g2, "is there"))
    p3 = h.prompt_ids(chat(("user", "hi"), ("assistant", "the answer"), ("user", "more"), ("assistant", "is there"),
                           ("user", "end")))
    assert p3[: len(p2) + len(g2)] == p2 + g2 and p2[: len(p1) + len(g1)] == p1 + g1
    other = chat(("user", "something else"))
    assert h.prompt_ids(other) == rendered_prompt_ids(tok, chat_prompt_text(tok, other))


def test_record_rejects_a_prompt_it_did_not_build(tok):
    from collab_env.agents.tokens import TokenHistory

    with pytest.raises(ConfigError, match="prompt_ids"):
        TokenHistory(tok).record(completion([1, 2, 3], [4], "x"))
