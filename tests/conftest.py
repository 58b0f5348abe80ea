"""Test-wide settings: the hub is never reached from tests."""

import os

import pytest

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

#: Under pytest-xdist (make test's `-n auto`), whatever the worker count.
_XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))

if _XDIST_WORKER:
    # One process per core (make test's `-n auto`): each worker computes on one thread, or every
    # worker's torch/OpenMP pool would take every core and they would fight over them.
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")


@pytest.fixture(scope="session")
def run_tmp(tmp_path_factory):
    """The folder of this test run that every xdist worker shares (else this session's own): what
    is built there, under a lock, is built once per run however the tests are split."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if _XDIST_WORKER else base


def pytest_runtest_setup(item):
    """Each test on a worker starts on one torch thread, whatever a test module did at import
    (every worker imports every module) or an earlier test did: ``torch.set_num_threads(2)`` at the
    top of one module once gave every worker two threads on two cores, and the tests that computed
    side by side ran 2-6x slower (OpenMP threads waiting on each other): the suite's wall time swung by
    minutes with the order."""
    import sys

    torch = sys.modules.get("torch")
    if _XDIST_WORKER and torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


# The tiny model's fixtures (tiny_dir, tiny) come from collab_env.testing.pytest_fixtures, loaded
# as a plugin by pyproject.toml's addopts.


def _xdist_chunks(total: int, workers: int) -> list[int]:
    """How many of ``total`` tests each of ``workers`` workers is first sent under
    ``--dist worksteal`` (xdist hands the queue out in order, an even share each)."""
    sizes, left = [], total
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle
def pytest_collection_modifyitems(config, items):
    """Under xdist, the test files that hold a long test (marked ``slow``) go first in the
    workers' shares, dealt round-robin, so the run never ends on one worker still busy with a
    long test while the others are done (a worker that runs out steals from the end of another's
    queue: short tests). A file moves whole, so its module fixtures are still built once per
    worker. Every group keeps the seed's random order; a run in one process is not reordered."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    heavy = [group for group in files.values() if any(i.get_closest_marker("slow") for i in group)]
    if not heavy:
        return
    moved = {id(item) for group in heavy for item in group}
    rest = [item for item in items if id(item) not in moved]
    heads: list[list] = [[] for _ in range(workers)]
    for k, group in enumerate(heavy):
        heads[k % workers] += group
    ordered = []
    for head, size in zip(heads, _xdist_chunks(len(items), workers)):
        take = max(0, size - len(head))
        ordered += head + rest[:take]
        rest = rest[take:]
    items[:] = ordered + rest
