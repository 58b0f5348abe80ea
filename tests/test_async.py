"""collab_env._async.run_sync: the loop it keeps per thread is closed at exit like asyncio.run's,
so a library's background task left on it (litellm's logging worker) is cancelled, not destroyed
pending with a "Task was destroyed but it is pending!" message at every program's exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from collab_env._async import run_sync

SCRIPT = textwrap.dedent("""
    import asyncio
    from collab_env._async import run_sync

    async def background():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            print("cancelled", flush=True)
            raise

    async def main():
        asyncio.get_running_loop().create_task(background())  # like litellm's logging worker
        return 41 + 1

    print(run_sync(main()), flush=True)
""")


def test_a_background_task_left_on_the_kept_loop_is_cancelled_at_exit(tmp_path):
    script = tmp_path / "leave_a_task.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["42", "cancelled"]
    assert "Task was destroyed" not in done.stderr


def test_run_sync_reuses_one_loop_per_thread_and_works_inside_a_running_loop():
    import asyncio

    async def current():
        return asyncio.get_running_loop()

    assert run_sync(current()) is run_sync(current())

    async def nested():
        return run_sync(current())  # a sync facade called from async code

    outer = run_sync(nested())
    assert outer.is_closed()  # it ran on a fresh loop in a worker thread, closed by asyncio.run


def test_run_main_returns_the_result_without_formatting_it():
    """run_main is asyncio.run whose main task returns nothing: on Python 3.11 asyncio.run, when
    Ctrl-C has its default handler (a program's main thread), formats its finished main task,
    result included, as it restores that handler (the control below counts it); for an
    evaluation's result that walked every message."""
    import asyncio
    import signal

    from collab_env._async import run_main

    formatted = []

    class Large:
        def __repr__(self) -> str:
            formatted.append(1)
            return "Large()"

    async def work():
        await asyncio.sleep(0)
        return Large()

    async def fails():
        raise KeyError("x")

    # As in a program's main thread (a pytest-xdist worker ignores Ctrl-C, and asyncio.run then
    # leaves the handler alone).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert isinstance(run_main(work()), Large) and formatted == []
        with pytest.raises(KeyError):
            run_main(fails())
        if sys.version_info[:2] == (3, 11):  # the control: what asyncio.run does there
            asyncio.run(work())
            assert formatted, "asyncio.run no longer formats its result: run_main can go"
    finally:
        signal.signal(signal.SIGINT, old)
