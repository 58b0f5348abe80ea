"""The HF backend's sampler (collab_env.agents.hf_sampling): each row is drawn from exactly the
processed distribution with its own generator; excluded tokens are never drawn, even at the
rounding edge; and the log-prob it records is the drawn token's."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from collab_env.agents.hf_sampling import RowSampler, draw  # noqa: E402
from collab_env.policy import SamplingParams  # noqa: E402


def _chi_square(counts, probs, n):
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True) if p > 0)


def test_draws_follow_the_distribution_and_never_an_excluded_token():
    """20,000 draws (fixed seeds, so the outcome is fixed) from a distribution with excluded
    tokens and a rare one: the chi-square statistic is far below its 0.1% critical value, the
    rare token shows up about as often as it should, and an excluded token never does."""
    probs = torch.tensor([0.5, 0.0, 0.2, 0.15, 0.0, 0.1, 0.049, 0.001, 0.0])
    logp = torch.log(probs)  # -inf at the excluded tokens
    n, rows = 20_000, 8
    counts = torch.zeros(len(probs))
    gens = [torch.Generator().manual_seed(1000 + i) for i in range(rows)]
    for _ in range(n // rows):
        chosen = draw(logp.expand(rows, -1), gens)
        assert chosen.shape == (rows, 1)
        counts += torch.bincount(chosen.squeeze(-1), minlength=len(probs))
    assert counts[probs == 0].sum() == 0
    p = probs.tolist()
    stat = _chi_square(counts.tolist(), p, n)
    assert stat < 22.46  # 0.1% critical value, 6 degrees of freedom (7 possible tokens)
    assert 5 <= counts[7] <= 40  # the 0.001 token: 20 expected
    # A sampler that ignored the distribution (uniform over the possible tokens) fails the test.
    uniform = [n / 7 if q > 0 else 0 for q in p]
    assert _chi_square(uniform, p, n) > 1000


def test_each_row_uses_its_own_generator_and_distribution():
    """Rows with different distributions in one call each follow their own; a row's draw
    depends only on its own generator (the same seed gives the same token whatever shares
    the batch)."""
    logp = torch.log(torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.3, 0.3, 0.4]]))
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    assert draw(logp, gens)[:2].squeeze(-1).tolist() == [0, 2]
    alone = draw(logp[2:], [torch.Generator().manual_seed(3)]).item()
    together = draw(logp, [torch.Generator().manual_seed(s) for s in (9, 9, 3)])[2].item()
    assert alone == together


def test_the_rounding_edge_never_draws_an_excluded_token(monkeypatch):
    """A uniform just under 1 can round ``u * total`` up to the total; the draw is then the last
    token of positive probability, not the excluded tokens after it."""
    logp = torch.log(torch.tensor([[0.3, 0.7, 0.0, 0.0]]))
    real_rand = torch.rand

    def top(*args, **kwargs):
        return torch.ones_like(real_rand(*args, **kwargs))  # u = 1: past every interval

    monkeypatch.setattr(torch, "rand", top)
    assert draw(logp, [torch.Generator()]).item() == 1


@pytest.mark.parametrize("broken", [float("nan"), float("inf")])
def test_a_broken_distribution_raises_instead_of_drawing(broken):
    """NaN or infinite scores (a broken model) raise, naming the row, rather than draw a token."""
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]))
    logp[1, 0] = broken
    with pytest.raises(FloatingPointError, match=r"row\(s\) \[1\]"):
        draw(logp, [torch.Generator(), torch.Generator()])
    with pytest.raises(FloatingPointError):
        draw(torch.full((1, 3), float("-inf")), [torch.Generator()])  # no possible token


@pytest.mark.parametrize("params", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 3},
                                    {"temperature": 1.3, "top_p": 0.8}])
def test_the_sampler_records_the_drawn_tokens_log_prob_and_forces_it(params):
    """The processed distribution (temperature, top-k, top-p) is what is drawn from and what
    the recorded log-prob is taken from; generate's greedy step then picks the drawn token."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    sampler = RowSampler(SamplingParams.from_kwargs(**params), seeds=[1, 2, 3, 4])
    forced = sampler(None, scores.clone())
    chosen = forced.argmax(-1)
    assert torch.all(forced.isinf().sum(-1) == 49)
    expected = scores.clone()
    expected = TemperatureLogitsWarper(params["temperature"])(None, expected)
    if "top_k" in params:
        expected = TopKLogitsWarper(params["top_k"])(None, expected)
    if "top_p" in params:
        expected = TopPLogitsWarper(params["top_p"])(None, expected)
    logp = torch.log_softmax(expected, -1)
    picked = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    assert torch.all(torch.isfinite(picked))  # never a token the warpers excluded
    assert torch.allclose(sampler.logprobs[0], picked, atol=1e-6)
    assert math.isclose(float(torch.exp(logp).sum(-1).mean()), 1.0, rel_tol=1e-5)
