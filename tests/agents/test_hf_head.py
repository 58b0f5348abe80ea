"""The rows-first output layer of the HF backend's decode steps (collab_env.agents.hf_head): the
same product as ``linear`` up to float rounding, only where it is meant to act (few rows, no
gradient, a plain CPU ``Linear``), undone on exit, and the same generations with and without it."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.agents import hf_generator  # noqa: E402
from collab_env.agents.hf_head import MAX_ROWS, rows_first_head  # noqa: E402
from collab_env.testing.tiny_model import build_tiny_chat_model, load_tiny_chat_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_tiny_chat_model(build_tiny_chat_model(tmp_path_factory.mktemp("tiny")))


def _calls(head):
    """Count ``torch.nn.functional.linear`` calls made by ``head`` (its class forward's)."""
    seen = []
    original = torch.nn.functional.linear

    def counting(*args, **kwargs):
        seen.append(args[0].shape)
        return original(*args, **kwargs)

    return seen, counting


@pytest.mark.parametrize("rows", [1, 2, 3, MAX_ROWS])
def test_few_rows_give_linears_product_without_calling_linear(tiny, rows, monkeypatch):
    model, _ = tiny
    head = model.get_output_embeddings()
    x = torch.randn(rows, 1, head.in_features, generator=torch.Generator().manual_seed(rows))
    with torch.no_grad():
        expected = torch.nn.functional.linear(x, head.weight, head.bias)
        seen, counting = _calls(head)
        monkeypatch.setattr(torch.nn.functional, "linear", counting)
        with rows_first_head(model) as active:
            got = head(x)
    assert active and seen == []                 # the rows-first product, not linear
    assert got.shape == expected.shape == (rows, 1, head.out_features)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_many_rows_and_gradients_keep_linear_bit_for_bit(tiny):
    model, _ = tiny
    head = model.get_output_embeddings()
    x = torch.randn(MAX_ROWS + 1, 1, head.in_features)
    few = torch.randn(2, 1, head.in_features, requires_grad=True)
    with rows_first_head(model):
        with torch.no_grad():
            assert torch.equal(head(x), torch.nn.functional.linear(x, head.weight, head.bias))
        out = head(few)                          # grad mode: linear, with its gradient
        out.sum().backward()
    assert torch.equal(out, torch.nn.functional.linear(few, head.weight, head.bias))
    assert few.grad is not None and head.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_undone_on_exit_and_on_error(tiny):
    model, _ = tiny
    head = model.get_output_embeddings()
    with rows_first_head(model):
        assert "forward" in vars(head)
    assert "forward" not in vars(head)
    with pytest.raises(RuntimeError, match="boom"):
        with rows_first_head(model):
            raise RuntimeError("boom")
    assert "forward" not in vars(head)


def test_left_alone_where_it_does_not_apply(tiny):
    model, _ = tiny

    class NoHead(torch.nn.Module):
        def get_output_embeddings(self):
            return None

    with rows_first_head(NoHead()) as active:
        assert not active
    head = model.get_output_embeddings()
    head.forward = head.__class__.forward.__get__(head)  # someone else's patch: never stacked
    try:
        with rows_first_head(model) as active:
            assert not active
    finally:
        del head.forward


def test_another_threads_grad_mode_keeps_linear(tiny):
    """Grad mode is per thread: a training step in another thread while a decode holds the
    patch gets ``linear`` and its gradient."""
    model, _ = tiny
    head = model.get_output_embeddings()
    x = torch.randn(2, 1, head.in_features)
    result = {}

    def train_step():
        out = head(x)
        result["equal"] = torch.equal(out, torch.nn.functional.linear(x, head.weight, head.bias))
        result["grad"] = out.requires_grad

    with torch.no_grad(), rows_first_head(model):
        thread = threading.Thread(target=train_step)
        thread.start()
        thread.join()
    assert result == {"equal": True, "grad": True}


def test_generations_are_the_same_with_and_without_it(tiny, monkeypatch):
    """Greedy and seeded sampled generations of the HF backend, with the rows-first head (the
    default) and with it replaced by a no-op: the same tokens, log-probs within float rounding."""
    import contextlib

    from collab_env.agents.hf import HFPolicy

    model, tok = tiny
    prompts = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8]]
    runs = {}
    for name in ("rows_first", "linear"):
        if name == "linear":
            monkeypatch.setattr(hf_generator, "rows_first_head", lambda m: contextlib.nullcontext(False))
        policy = HFPolicy(model, tok, max_new_tokens=6)
        policy.prefix_cache_tokens = 0  # each run reads its prompts itself
        runs[name] = [policy.generate_tokens(prompts, {"max_new_tokens": 6, "temperature": t}, [1, 2, 3])
                      for t in (0.0, 1.0)]
    for a_run, b_run in zip(runs["rows_first"], runs["linear"], strict=True):
        for a, b in zip(a_run, b_run, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
