"""Hostile checkpoint and cache files (issue 27): each is refused at once with a one-line
:class:`ConfigError` that names the file, says what is wrong and what to do; none hangs, none
runs code, none changes a generator, a parameter or the file itself.

Every load below runs with a deadline, in a thread, or for the FIFOs in a forked child that is
killed at the deadline (a hang fails the test instead of freezing the suite), and every hostile
file is fingerprinted (sha256, or its type for a FIFO, a link, a folder) before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sqlite3
import stat
import threading
import time

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")

from collab_env.adapters.common import checkpoint as ckpt_mod  # noqa: E402
from collab_env.adapters.common.checkpoint import (  # noqa: E402
    STATE_FILE,
    STATE_NAME,
    capture_rng,
    load_checkpoint,
    load_safe,
    load_tensors,
    save_safe,
    save_tensors,
)
from collab_env.agents.cache import ResponseCache  # noqa: E402
from collab_env.errors import ConfigError  # noqa: E402
from collab_env.types import Completion  # noqa: E402

DEADLINE_S = 60.0  # generous for a loaded machine: a hang is forever, a refusal milliseconds
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
FIX = re.compile(r"\b(save the run again|restore it|restore the checkpoint|record it again|record them again|"
                 r"pass (the|a)|put the file|build the trainer|resume on)\b", re.IGNORECASE)
NESTED = "[" * 200_000 + "]" * 200_000


# -- helpers -----------------------------------------------------------------------------------------


def fingerprint(path):
    """sha256 of a regular file; the type, link target or listing of anything else (reading a
    FIFO would block)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        return ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    if stat.S_ISDIR(st.st_mode):
        return ("dir", sorted(os.listdir(path)))
    return ("special", stat.S_IFMT(st.st_mode))


def _outcome_in_child(load):
    """Run ``load()`` in a forked child, killed at the deadline: a read blocked on a FIFO may
    hold the GIL (the safetensors library does), which would freeze a thread-based deadline and
    the whole test process with it."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        try:
            load()
            send.send(None)
        except BaseException as exc:  # noqa: BLE001 - the parent judges it
            send.send((isinstance(exc, ConfigError), type(exc).__name__, str(exc)))
        finally:
            os._exit(0)

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    got = receive.poll(DEADLINE_S)
    if not got:
        proc.kill()
        proc.join()
        pytest.fail(f"the load did not return within {DEADLINE_S}s: it hangs")
    result = receive.recv()
    proc.join()
    if result is None:
        return None
    is_config, name, msg = result
    return ConfigError(msg) if is_config else RuntimeError(f"{name}: {msg}")


def _outcome_in_thread(load):
    out = {}

    def target():
        try:
            load()
        except BaseException as exc:  # noqa: BLE001 - the test judges it
            out["exc"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    if thread.is_alive():
        pytest.fail(f"the load did not return within {DEADLINE_S}s: it hangs")
    return out.get("exc")


def refused(load, *watched, isolate=False):
    """Run ``load()`` with a deadline (in a thread, or a forked child when ``isolate``: for
    FIFOs); return the exception it raised, after checking that it is a one-line ConfigError
    naming a watched file and saying what to do, and that no watched file changed."""
    before = {p: fingerprint(p) for p in watched}
    exc = _outcome_in_child(load) if isolate else _outcome_in_thread(load)
    assert exc is not None, "the hostile file was accepted"
    assert isinstance(exc, ConfigError), f"raw error: {type(exc).__name__}: {exc}"
    msg = str(exc)
    assert "\n" not in msg, msg
    assert any(str(p) in msg for p in watched), msg
    assert FIX.search(msg), f"the message does not say what to do: {msg}"
    for p in watched:
        assert fingerprint(p) == before[p], f"{p} was modified"
    return exc


def rng_snapshot():
    np_state = np.random.get_state(legacy=False)
    return (random.getstate(), np_state["state"]["key"].tolist(), np_state["state"]["pos"],
            torch.get_rng_state().tolist())


@pytest.fixture
def folder(tmp_path):
    """A valid trainer checkpoint without models (the RNG states and position are what the
    hostile edits below target); loading it unedited succeeds (the control)."""
    path = tmp_path / "ckpt"
    path.mkdir()
    save_safe(path, STATE_NAME, {"models": [], "state": {"epoch": 1}, "rng": capture_rng(np.random.default_rng(0))})
    return path


def edit(folder, change):
    """Rewrite trainer_state.json after ``change(data)`` (an attacker editing the JSON)."""
    file = folder / STATE_FILE
    blob = json.loads(file.read_text())
    change(blob["data"])
    file.write_text(json.dumps(blob))
    return file


def forge(folder, rng):
    """A well-formed pair of files whose RNG entry is ``rng`` (an attacker using save_safe)."""
    save_safe(folder, STATE_NAME, {"models": [], "state": {"epoch": 1}, "rng": rng})
    return folder / STATE_FILE


def load(folder):
    return lambda: load_checkpoint(folder, [], np.random.default_rng(1))


def test_control_the_unedited_checkpoint_loads(folder):
    assert load_checkpoint(folder, [], np.random.default_rng(1)) == {"epoch": 1}


# -- trainer_state.json: arrays ----------------------------------------------------------------------


def test_array_with_a_shape_of_2_pow_40_is_refused_before_any_array_is_built(folder):
    file = edit(folder, lambda d: d["state"].update(x={"__ndarray__": [1], "dtype": "<u4", "shape": [2**40]}))
    exc = refused(load(folder), file)
    assert "shape [1099511627776]" in str(exc) and "data.state.x" in str(exc)


@pytest.mark.parametrize("dtype", ["nonsense", "O", "(1000000000,)f8", "V8", "<U5", "c16", 5, None])
def test_array_with_a_bad_dtype_is_refused(folder, dtype):
    file = edit(folder, lambda d: d["state"].update(x={"__ndarray__": [1], "dtype": dtype, "shape": [1]}))
    assert "only bool, int, uint and float arrays" in str(refused(load(folder), file))


@pytest.mark.parametrize("data, shape, says", [
    ([1, 2, 3], [2], "holds 3 numbers, but its shape [2] needs 2"),
    (["1", 2], [2], "holds a str"),
    ([[1, 2], [3, [4]]], [2, 2], "is not a [2, 2] array"),
    ([2**40], [1], "is not a [1] array of <u4"),
    ([1], [-1], "non-negative integers"),
    ([1], "1", "not a list"),
    ({"a": 1}, [1], "holds a dict"),
])
def test_array_whose_data_does_not_fit_its_shape_or_dtype_is_refused(folder, data, shape, says):
    file = edit(folder, lambda d: d["state"].update(x={"__ndarray__": data, "dtype": "<u4", "shape": shape}))
    assert says in str(refused(load(folder), file))


# -- trainer_state.json: markers -----------------------------------------------------------------------


@pytest.mark.parametrize("items, says", [
    ([[1]], "not a [key, value] pair"),
    ([[1, 2, 3]], "not a [key, value] pair"),
    (5, "not a list of pairs"),
    ([[[1], 2]], "cannot key a dict"),
    ([[{"a": 1}, 2]], "cannot key a dict"),
    ([[{"__tuple__": [[1]]}, 2]], "cannot key a dict"),
])
def test_malformed_item_pairs_are_refused(folder, items, says):
    file = edit(folder, lambda d: d["state"].update(x={"__items__": items}))
    assert says in str(refused(load(folder), file))


@pytest.mark.parametrize("value, says", [
    ({"__tuple__": 5}, "not a list"),
    ({"__tuple__": [1], "extra": 2}, "expected ['__tuple__']"),
    ({"__tensor__": "0", "__items__": []}, "expected ['__tensor__']"),
    ({"__ndarray__": [1], "dtype": "<u4"}, "expected ['__ndarray__', 'dtype', 'shape']"),
    ({"__tensor__": "no such tensor"}, "which its .safetensors file lacks"),
])
def test_malformed_markers_are_refused(folder, value, says):
    file = edit(folder, lambda d: d["state"].update(x=value))
    assert says in str(refused(load(folder), file))


def test_200k_nested_lists_in_trainer_state_are_refused(folder):
    file = folder / STATE_FILE
    text = file.read_text().replace('"epoch": 1', '"epoch": ' + NESTED)
    file.write_text(text)
    assert "nested more than 64 deep" in str(refused(load(folder), file))


def test_nesting_just_over_the_limit_is_refused_and_at_the_limit_loads(tmp_path):
    """The limit is on the whole file's nesting: 64 levels load, 65 do not."""
    def nested(levels):  # the file's {"format", "data": {"x": [[...]]}}: two dicts, then the lists
        return {"x": json.loads("[" * (levels - 2) + "]" * (levels - 2))}
    save_safe(tmp_path, "ok", nested(64))
    load_safe(tmp_path, "ok")
    save_safe(tmp_path, "deep", nested(65))
    refused(lambda: load_safe(tmp_path, "deep"), tmp_path / "deep.json")


def test_an_integer_too_long_to_convert_is_refused(folder):
    file = folder / STATE_FILE
    file.write_text(file.read_text().replace('"epoch": 1', '"epoch": ' + "9" * 5000))
    assert "not JSON" in str(refused(load(folder), file))


def test_a_state_file_larger_than_the_limit_is_refused_unread(folder, monkeypatch):
    monkeypatch.setattr(ckpt_mod, "MAX_JSON_BYTES", 100)
    assert "more than the 100 a state file may be" in str(refused(load(folder), folder / STATE_FILE))


def test_a_state_file_with_extra_top_level_keys_is_refused(folder):
    file = folder / STATE_FILE
    blob = json.loads(file.read_text())
    blob["code"] = "__import__('os').system('touch pwned')"
    file.write_text(json.dumps(blob))
    assert "not a collab_env state file" in str(refused(load(folder), file))


# -- trainer_state.json: RNG states ----------------------------------------------------------------------


def _python_state(d):
    return d["rng"]["python"]["__tuple__"][1]["__tuple__"]


@pytest.mark.parametrize("change, says", [
    (lambda d: _python_state(d).__setitem__(624, 10**6), "Python"),
    (lambda d: _python_state(d).__setitem__(624, -1), "Python"),
    (lambda d: _python_state(d).__setitem__(0, 2**32), "Python"),
    (lambda d: _python_state(d).pop(), "Python"),
    (lambda d: d["rng"]["numpy"]["state"].update(pos=10**6), "NumPy"),  # NumPy itself would accept it
    (lambda d: d["rng"]["numpy"]["state"].update(pos=-5), "NumPy"),
    (lambda d: d["rng"]["numpy"]["state"]["key"]["__ndarray__"].__setitem__(0, -1),
     "the array at data.rng.numpy.state.key is not a [624] array of <u4"),
    (lambda d: d["rng"]["numpy"]["state"]["key"].update(__ndarray__=[0] * 623, shape=[623]), "NumPy"),
    (lambda d: d["rng"]["numpy"].update(has_gauss=-1), "NumPy"),
    (lambda d: d["rng"]["generator"]["state"].update(state=2**130), "trainer generator"),
    (lambda d: d["rng"]["generator"]["state"].update(inc=-1), "trainer generator"),
])
def test_out_of_range_rng_states_are_refused_and_touch_no_generator(folder, change, says):
    file = edit(folder, change)
    before = rng_snapshot()
    msg = str(refused(load(folder), file))
    assert f"its {says} RNG state is invalid" in msg or says in msg
    assert rng_snapshot() == before


@pytest.mark.parametrize("change, part", [
    (lambda d: d["rng"].update(python="garbage"), "Python"),
    (lambda d: d["rng"].update(python={"__tuple__": [2, "x", None]}), "Python"),
    (lambda d: d["rng"].update(numpy={"x": 1}), "NumPy"),
    (lambda d: d["rng"]["numpy"].update(bit_generator="PCG64"), "NumPy"),
    (lambda d: d["rng"]["numpy"]["state"].update(key="garbage"), "NumPy"),
    (lambda d: d["rng"].update(torch=[1, 2, 3]), "torch"),
    (lambda d: d["rng"].update(generator=5), "trainer generator"),
    (lambda d: d["rng"].update(cuda="garbage"), "CUDA"),
    (lambda d: d.update(rng=[1, 2]), "rng entry"),
])
def test_garbage_rng_states_are_refused_and_touch_no_generator(folder, change, part):
    file = edit(folder, change)
    before = rng_snapshot()
    assert part in str(refused(load(folder), file))
    assert rng_snapshot() == before


@pytest.mark.parametrize("torch_state", [torch.zeros(10, dtype=torch.uint8),
                                         torch.full_like(torch.get_rng_state(), 255),
                                         torch.get_rng_state().float()])
def test_a_forged_torch_rng_state_is_refused_before_python_or_numpy_are_set(folder, torch_state):
    """A torch state of the wrong size, dtype, or the right size and invalid contents (torch's
    own check): refused with the Python and NumPy generators untouched (no half restore)."""
    rng = capture_rng(np.random.default_rng(0))
    rng["torch"] = torch_state
    file = forge(folder, rng)
    random.seed(123)
    before = rng_snapshot()
    assert "its torch RNG state is invalid" in str(refused(load(folder), file, folder / f"{STATE_NAME}.safetensors"))
    assert rng_snapshot() == before


def test_a_forged_parameter_shape_is_refused_before_any_parameter_changes(tmp_path):
    class PM:
        def __init__(self):
            self.model = torch.nn.Linear(3, 2)
            self.optimizer = self.scheduler = self.reference = None

        def trainable_parameters(self):
            return list(self.model.named_parameters())

    pm = PM()
    saved = {"params": {"weight": torch.zeros(2, 3), "bias": torch.zeros(7)}, "optimizer": None,
             "scheduler": None, "reference": None}
    save_safe(tmp_path, STATE_NAME, {"models": [saved], "state": {}, "rng": capture_rng()})
    weight = pm.model.weight.detach().clone()
    exc = refused(lambda: load_checkpoint(tmp_path, [pm]), tmp_path / STATE_FILE)
    assert "bias has shape [7], this model's has [2]" in str(exc)
    assert torch.equal(pm.model.weight, weight)


# -- safetensors files ---------------------------------------------------------------------------------


def _header(folder):
    raw = (folder / f"{STATE_NAME}.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(path, header, data):
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + data)


@needs_fifo
def test_a_fifo_as_safetensors_file_is_refused_at_once(folder):
    st = folder / f"{STATE_NAME}.safetensors"
    st.unlink()
    os.mkfifo(st)
    start = time.monotonic()
    exc = refused(load(folder), st, isolate=True)
    assert time.monotonic() - start < 20 and "is a FIFO (named pipe), not a regular file" in str(exc)
    assert stat.S_ISFIFO(os.stat(st).st_mode)


@needs_fifo
def test_a_fifo_as_the_state_json_is_refused_at_once(folder):
    file = folder / STATE_FILE
    file.unlink()
    os.mkfifo(file)
    assert "is a FIFO" in str(refused(load(folder), file, isolate=True))


@needs_fifo
def test_a_fifo_given_to_load_tensors_directly_is_refused(tmp_path):
    fifo = tmp_path / "head.safetensors"
    os.mkfifo(fifo)
    assert "is a FIFO" in str(refused(lambda: load_tensors(fifo), fifo, isolate=True))


def test_a_symlink_to_dev_zero_is_refused(folder):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    st = folder / f"{STATE_NAME}.safetensors"
    st.unlink()
    st.symlink_to("/dev/zero")
    assert "is a character device" in str(refused(load(folder), st))
    file = folder / STATE_FILE
    file.unlink()
    file.symlink_to("/dev/zero")
    assert "is a character device" in str(refused(load(folder), file))


@pytest.mark.parametrize("which", ["safetensors", "json"])
def test_a_directory_where_a_file_is_expected_is_refused(folder, which):
    path = folder / (f"{STATE_NAME}.safetensors" if which == "safetensors" else STATE_FILE)
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")
    assert "is a directory, not a regular file" in str(refused(load(folder), path))


def test_a_truncated_safetensors_header_is_refused(folder):
    st = folder / f"{STATE_NAME}.safetensors"
    raw = st.read_bytes()
    st.write_bytes(raw[:8 + 10])
    assert "follow (a truncated file)" in str(refused(load(folder), st))
    st.write_bytes(raw[:5])
    assert "too short" in str(refused(load(folder), st))


@pytest.mark.parametrize("length", [10**6, 2**63, 2**64 - 1])
def test_a_header_length_larger_than_the_file_is_refused(folder, length):
    st = folder / f"{STATE_NAME}.safetensors"
    raw = st.read_bytes()
    st.write_bytes(length.to_bytes(8, "little") + raw[8:])
    assert f"its header length says {length} bytes" in str(refused(load(folder), st))


@pytest.mark.parametrize("change, says", [
    (lambda h: h["0"].update(shape=[2**40]), "but its data span holds"),
    (lambda h: h["0"].update(shape=[2**62, 2**62]), "but its data span holds"),
    (lambda h: h["0"].update(dtype="Q99"), "has dtype 'Q99'"),
    (lambda h: h["0"].update(dtype="F4"), "has dtype 'F4'"),
    (lambda h: h["0"].update(data_offsets=[0, 2**40]), "inside the file's"),
    (lambda h: h["0"].update(shape="x"), "not a list of at most"),
    (lambda h: h["0"].update(code="print(1)"), "not described by exactly dtype, shape and data_offsets"),
    (lambda h: h.update(__metadata__={"a": [1]}), "__metadata__ is not a mapping of strings"),
])
def test_a_forged_safetensors_header_is_refused(folder, change, says):
    st = folder / f"{STATE_NAME}.safetensors"
    header, data = _header(folder)
    change(header)
    _write(st, header, data)
    assert says in str(refused(load(folder), st))


def test_a_safetensors_header_nested_200k_deep_is_refused(folder):
    st = folder / f"{STATE_NAME}.safetensors"
    h = ('{"x": ' + NESTED + "}").encode()
    st.write_bytes(len(h).to_bytes(8, "little") + h)
    assert "nested more than 64 deep" in str(refused(load(folder), st))


def test_overlapping_tensor_data_is_refused(tmp_path):
    save_tensors(tmp_path / "t.safetensors", {"a": torch.zeros(2), "b": torch.ones(2)})
    raw = (tmp_path / "t.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["b"]["data_offsets"] = header["a"]["data_offsets"]
    _write(tmp_path / "t.safetensors", header, raw[8 + n:])
    path = tmp_path / "t.safetensors"
    assert "overlap or leave a gap" in str(refused(lambda: load_tensors(path), path))


# -- response caches -------------------------------------------------------------------------------------


def _cache(tmp_path):
    path = tmp_path / "cache.sqlite"
    with ResponseCache(path, "record") as cache:
        cache.put("k", {"model": "m"}, Completion(text="hi"))
        cache.put_scores("s", {"model": "m"}, [0.5, -1.0])
    return path


def _set(path, sql, *args):
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql, args)
    conn.close()  # the last connection: the WAL is folded into the file before it is fingerprinted


def _replay_get(path, key="k"):
    def run():
        with ResponseCache(path, "replay") as cache:
            cache.get(key)
    return run


def test_control_the_unedited_cache_replays(tmp_path):
    path = _cache(tmp_path)
    with ResponseCache(path, "replay") as cache:
        assert cache.get("k").text == "hi" and cache.get_scores("s", 2) == (0.5, -1.0)


def test_a_cache_row_with_200k_nested_lists_is_refused(tmp_path):
    path = _cache(tmp_path)
    _set(path, "UPDATE responses SET completion = ? WHERE key = 'k'", NESTED)
    exc = refused(_replay_get(path), path)
    assert "the entry for key k is damaged (its lists and dicts are nested more than 64 deep)" in str(exc)


def test_a_completion_nested_200k_deep_inside_a_field_is_refused(tmp_path):
    path = _cache(tmp_path)
    _set(path, "UPDATE responses SET completion = ? WHERE key = 'k'", '{"text": "hi", "meta": {"x": ' + NESTED + "}}")
    assert "nested more than 64 deep" in str(refused(_replay_get(path), path))


def test_a_scores_row_with_200k_nested_lists_is_refused(tmp_path):
    path = _cache(tmp_path)
    _set(path, "UPDATE scores SET scores = ? WHERE key = 's'", NESTED)

    def run():
        with ResponseCache(path, "replay") as cache:
            cache.get_scores("s", 2)
    assert "the scores for key s are damaged" in str(refused(run, path))


@pytest.mark.parametrize("row, says", [
    ("[1, 2]", "expected a JSON object"),
    ('{"text": 5}', "text is not a string"),
    ('{"text": "hi", "token_ids": ["a"]}', "token_ids is not a list of numbers"),
    ('{"text": "hi", "usage": [1]}', "usage is not a JSON object"),
    ('{"text": "hi", "finish_reason": {"a": 1}}', "finish_reason is not a string"),
])
def test_a_cache_row_that_is_not_a_completion_is_refused(tmp_path, row, says):
    path = _cache(tmp_path)
    _set(path, "UPDATE responses SET completion = ? WHERE key = 'k'", row)
    assert says in str(refused(_replay_get(path), path))


@needs_fifo
@pytest.mark.parametrize("suffix", ["", "-wal"])
def test_a_fifo_as_the_cache_or_its_wal_is_refused_at_once(tmp_path, suffix):
    path = tmp_path / "cache.sqlite"
    if suffix:
        path = _cache(tmp_path)
    fifo = tmp_path / f"cache.sqlite{suffix}"
    os.mkfifo(fifo)
    watched = [fifo] + ([path] if suffix else [])
    exc = refused(_replay_get(path), *watched, isolate=True)
    assert "is a FIFO (named pipe), not a regular file" in str(exc)


def test_a_cache_path_that_is_a_directory_or_a_device_is_refused(tmp_path):
    folder = tmp_path / "cache.sqlite"
    folder.mkdir()
    assert "is a directory" in str(refused(lambda: ResponseCache(folder, "record").get("k"), folder))
    if os.path.exists("/dev/zero"):
        link = tmp_path / "zero.sqlite"
        link.symlink_to("/dev/zero")
        assert "is a character device" in str(refused(lambda: ResponseCache(link, "record").get("k"), link))


def test_another_programs_sqlite_file_is_refused_unchanged(tmp_path):
    """Refused before the WAL pragma or the cache's tables touch it (its sha256 is unchanged)."""
    for columns in ("(key TEXT, blob BLOB)", None):
        path = tmp_path / f"foreign-{bool(columns)}.sqlite"
        _set(path, f"CREATE TABLE {'responses' if columns else 'accounts'} {columns or '(id INTEGER)'}")
        exc = refused(_replay_get(path), path)
        assert "is a SQLite file, but not a response cache" in str(exc)
        exc = refused(lambda p=path: ResponseCache(p, "record").get("k"), path)
