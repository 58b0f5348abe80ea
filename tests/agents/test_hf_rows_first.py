"""The rows-first linear layers of the HF backend's decode steps (collab_env.agents.hf_rows_first):
the same product as ``linear`` up to float rounding, only where it is meant to act (few rows, no
gradient, a plain CPU ``Linear``), undone on exit, and the same generations with and without it."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.agents import hf_generator  # noqa: E402
from collab_env.agents.hf_rows_first import MAX_ROWS, MIN_ELEMENTS, rows_first_linears  # noqa: E402
from collab_env.testing.tiny_model import load_tiny_chat_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """A copy of the tiny model of its own: these tests replace its layers' forwards."""
    return load_tiny_chat_model(tiny_dir)


def _calls():
    """A stand-in for ``torch.nn.functional.linear`` that records the shape of each call."""
    seen = []
    original = torch.nn.functional.linear

    def counting(*args, **kwargs):
        seen.append(args[0].shape)
        return original(*args, **kwargs)

    return seen, counting


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


@pytest.mark.parametrize("rows", [1, 2, 3, MAX_ROWS])
def test_few_rows_give_linears_product_without_calling_linear(tiny, rows, monkeypatch):
    """Every linear layer (projections and output layer) gives ``linear``'s product, rows-first."""
    model, _ = tiny
    layers = _linears(model)
    assert model.get_output_embeddings() in layers and len(layers) > 1
    gen = torch.Generator().manual_seed(rows)
    xs = [torch.randn(rows, 1, layer.in_features, generator=gen) for layer in layers]
    with torch.no_grad():
        expected = [torch.nn.functional.linear(x, layer.weight, layer.bias) for x, layer in zip(xs, layers)]
        seen, counting = _calls()
        monkeypatch.setattr(torch.nn.functional, "linear", counting)
        with rows_first_linears(model, min_elements=0) as patched:
            got = [layer(x) for x, layer in zip(xs, layers)]
    assert patched == len(layers) and seen == []  # the rows-first product, not linear
    for g, e, layer in zip(got, expected, layers, strict=True):
        assert g.shape == e.shape == (rows, 1, layer.out_features)
        assert torch.allclose(g, e, atol=1e-5, rtol=1e-5)


def test_a_bias_is_added(monkeypatch):
    layer = torch.nn.Linear(5, 3, bias=True)
    x = torch.randn(2, 5)
    with torch.no_grad():
        expected = layer(x)
        with rows_first_linears(layer, min_elements=0) as patched:
            got = layer(x)
    assert patched == 1 and torch.allclose(got, expected, atol=1e-6)


def test_many_rows_and_gradients_keep_linear_bit_for_bit(tiny):
    model, _ = tiny
    head = model.get_output_embeddings()
    x = torch.randn(MAX_ROWS + 1, 1, head.in_features)
    few = torch.randn(2, 1, head.in_features, requires_grad=True)
    with rows_first_linears(model, min_elements=0):
        with torch.no_grad():
            assert torch.equal(head(x), torch.nn.functional.linear(x, head.weight, head.bias))
        out = head(few)                          # grad mode: linear, with its gradient
        out.sum().backward()
    assert torch.equal(out, torch.nn.functional.linear(few, head.weight, head.bias))
    assert few.grad is not None and head.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_undone_on_exit_and_on_error(tiny):
    model, _ = tiny
    layers = _linears(model)
    with rows_first_linears(model, min_elements=0):
        assert all("forward" in vars(layer) for layer in layers)
    assert not any("forward" in vars(layer) for layer in layers)
    with pytest.raises(RuntimeError, match="boom"):
        with rows_first_linears(model, min_elements=0):
            raise RuntimeError("boom")
    assert not any("forward" in vars(layer) for layer in layers)


def test_left_alone_where_it_does_not_apply(tiny):
    model, _ = tiny

    class NoLinear(torch.nn.Module):
        pass

    class Quantised(torch.nn.Linear):  # a subclass computes its own way
        pass

    with rows_first_linears(NoLinear(), min_elements=0) as patched:
        assert patched == 0
    with rows_first_linears(Quantised(4, 4), min_elements=0) as patched:
        assert patched == 0
    head = model.get_output_embeddings()
    foreign = head.__class__.forward.__get__(head)
    head.forward = foreign  # someone else's patch: never stacked, never removed
    try:
        with rows_first_linears(model, min_elements=0) as patched:
            assert patched == len(_linears(model)) - 1
            assert vars(head)["forward"] is foreign
        assert vars(head)["forward"] is foreign
    finally:
        del head.forward


def test_small_and_half_precision_layers_are_left_alone_by_default(tiny):
    """Below MIN_ELEMENTS weights the wrapper costs more than it saves: the tiny model's layers
    keep their class forward, a large float32 layer is patched, the same in bfloat16 is not."""
    model, _ = tiny
    assert all(m.weight.numel() < MIN_ELEMENTS for m in _linears(model))
    with rows_first_linears(model) as patched:
        assert patched == 0 and not any("forward" in vars(m) for m in _linears(model))
    big = torch.nn.Linear(256, MIN_ELEMENTS // 256, bias=False)
    with rows_first_linears(big) as patched:
        assert patched == 1 and "forward" in vars(big)
    with rows_first_linears(big.to(torch.bfloat16)) as patched:  # measured in float32 only
        assert patched == 0 and "forward" not in vars(big)


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

    with torch.no_grad(), rows_first_linears(model, min_elements=0):
        thread = threading.Thread(target=train_step)
        thread.start()
        thread.join()
    assert result == {"equal": True, "grad": True}


def test_generations_are_the_same_with_and_without_it(tiny, monkeypatch):
    """Greedy and seeded sampled generations of the HF backend, with the rows-first layers (the
    default; here for the tiny model's small layers too) and with them replaced by a no-op: the
    same tokens, log-probs within float rounding."""
    import contextlib

    from collab_env.agents.hf import HFPolicy

    model, tok = tiny
    prompts = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8]]
    runs = {}
    used = []

    def every_layer(m):
        context = rows_first_linears(m, min_elements=0)
        used.append(context)
        return context

    for name in ("rows_first", "linear"):
        monkeypatch.setattr(hf_generator, "rows_first_linears", every_layer if name == "rows_first"
                            else (lambda m: contextlib.nullcontext(0)))
        policy = HFPolicy(model, tok, max_new_tokens=6)
        policy.prefix_cache_tokens = 0  # each run reads its prompts itself
        runs[name] = [policy.generate_tokens(prompts, {"max_new_tokens": 6, "temperature": t}, [1, 2, 3])
                      for t in (0.0, 1.0)]
    assert used  # the generator went through the patch
    for a_run, b_run in zip(runs["rows_first"], runs["linear"], strict=True):
        for a, b in zip(a_run, b_run, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
