"""Served envs over loopback: steps per second and p50/p99 step latency of a data-free env served
by ``collab-env serve`` at 1, 16 and 64 concurrent sessions, beside the same env stepped in process
and beside OpenEnv's own echo env served the same way (uvicorn, one WebSocket session per client),
in one run.

    python benchmarks/bench_serve.py [--env letter-requests-v0] [--seconds 5] [--allow-loaded]

Each session is a thread with its own client (:class:`collab_env.serve.client.CollabEnvClient`
for both servers: the same wire) that plays episodes back to back for ``--seconds``; a step's
latency is one ``step`` round trip (the served env's step includes the scripted other seat's
reply and the reward). In process, the same threads step their own
``collab_env.make(ENV, view=SEAT)``. The echo env is OpenEnv's template env (``openenv init``'s
echo environment), rendered from the installed package into a temporary folder and served by
this script in a subprocess (``--echo-server``). The servers run in their own processes, on the
same cores as the clients: on a 2-core machine the figures measure both sides together.
Results: ``benchmarks/results/bench_serve.{json,md}``, with the machine's load (other processes'
busy cores and ``os.getloadavg``) over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import LoadMeter, add_load_arguments, check  # noqa: E402

CONCURRENCY = (1, 16, 64)
ACTION = "A short reply: it uses some letters and leaves out others, kept brief on purpose."


def _echo_package(where: Path) -> str:
    """OpenEnv's echo env (its ``openenv init`` template) rendered into ``where``; returns the
    module path of its server environment."""
    import importlib.util

    found = importlib.util.find_spec("openenv")  # not imported: the template's package needs a rendering first
    if found is None or not found.submodule_search_locations:
        raise SystemExit("OpenEnv is not installed: pip install 'collab_env[serve]'")
    src = Path(list(found.submodule_search_locations)[0]) / "cli" / "templates" / "openenv_env"
    names = {"__ENV_NAME__": "echo_env", "__ENV_CLASS_NAME__": "Echo", "__ENV_TITLE_NAME__": "Echo"}
    for f in (src / "models.py", src / "server" / "__ENV_NAME___environment.py"):
        text = f.read_text()
        for k, v in names.items():
            text = text.replace(k, v)
        (where / f.name.replace("__ENV_NAME__", "echo_env")).write_text(text)
    return "echo_env_environment"


def echo_server(max_sessions: int, max_bytes: int) -> None:
    """``--echo-server``: serve OpenEnv's echo env on a free loopback port, as collab-env serve does."""
    import socket

    import uvicorn
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import HTTPEnvServer

    where = Path(tempfile.mkdtemp(prefix="echo_env_"))
    module = _echo_package(where)
    sys.path.insert(0, str(where))
    env_mod = __import__(module)
    models = __import__("models")
    app = FastAPI()
    HTTPEnvServer(env_mod.EchoEnvironment, models.EchoAction, models.EchoObservation,
                  max_concurrent_envs=max_sessions).register_routes(app)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"serving echo on http://127.0.0.1:{sock.getsockname()[1]} (at most {max_sessions} sessions)", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=max_bytes, lifespan="off")).run(sockets=[sock])


def _run(sessions: int, seconds: float, make_session: Callable[[], tuple[Callable[[], Any], Callable[[], bool],
                                                                          Callable[[], None]]]) -> dict[str, Any]:
    """``sessions`` threads, each with its own ``(reset, step -> done, close)``, stepping for
    ``seconds``: steps/s and the step latencies' p50/p99 (ms)."""
    latencies: list[list[float]] = [[] for _ in range(sessions)]
    errors: list[BaseException] = []
    start = threading.Barrier(sessions + 1)
    stop = threading.Event()

    def worker(i: int) -> None:
        try:
            reset, step, close = make_session()
            reset()
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)
            start.abort()
            return
        try:
            start.wait()
            while not stop.is_set():
                t0 = time.perf_counter()
                done = step()
                latencies[i].append(time.perf_counter() - t0)
                if done:
                    reset()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(sessions)]
    for t in threads:
        t.start()
    try:
        start.wait(timeout=600)
    except threading.BrokenBarrierError:
        raise RuntimeError(f"a session failed to start: {errors[:1]}") from None
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(120)
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} session(s) failed; first: {errors[0]!r}")
    flat = sorted(x for lat in latencies for x in lat)
    q = statistics.quantiles(flat, n=100) if len(flat) >= 2 else flat * 99
    return {"sessions": sessions, "steps": len(flat), "seconds": round(wall, 3),
            "steps_per_s": round(len(flat) / wall, 1), "p50_ms": round(q[49] * 1e3, 3), "p99_ms": round(q[98] * 1e3, 3)}


def remote_session(url: str) -> Callable[[], tuple[Callable[[], Any], Callable[[], bool], Callable[[], None]]]:
    from collab_env.serve.client import CollabEnvClient

    def make() -> tuple[Callable[[], Any], Callable[[], bool], Callable[[], None]]:
        client = CollabEnvClient(url)
        return (lambda: client.reset()), (lambda: bool(client.step(ACTION).done)), client.close

    return make


def local_session(env_id: str) -> Callable[[], tuple[Callable[[], Any], Callable[[], bool], Callable[[], None]]]:
    import collab_env
    from collab_env.registry import spec

    seat = spec(env_id).trainable[0]

    def make() -> tuple[Callable[[], Any], Callable[[], bool], Callable[[], None]]:
        env = collab_env.make(env_id, view=seat)

        def step() -> bool:
            _, _, term, trunc, _ = env.step(ACTION)
            return bool(term or trunc)

        return (lambda: env.reset()), step, env.close

    return make


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="letter-requests-v0", help="a data-free env (default letter-requests-v0)")
    p.add_argument("--seconds", type=float, default=5.0, help="timed seconds per configuration (default 5)")
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)),
                   help="concurrent sessions, comma-separated (default 1,16,64)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_serve"),
                   help="results path without extension (.json and .md are written)")
    p.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--max-sessions", type=int, default=64, help=argparse.SUPPRESS)
    add_load_arguments(p)
    a = p.parse_args(argv)
    if a.echo_server:
        echo_server(a.max_sessions, 1 << 20)
        return 0
    from collab_env.testing.served import served, server_process

    levels = [int(x) for x in a.concurrency.split(",")]
    load = check(a)
    meter = LoadMeter().start()
    avg_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with served(a.env, "--max-sessions", str(max(levels))) as url, \
            server_process([sys.executable, __file__, "--echo-server", "--max-sessions", str(max(levels))]) as echo:
        for n in levels:
            for name, make in (("in process", local_session(a.env)), (f"served {a.env}", remote_session(url)),
                               ("served OpenEnv echo", remote_session(echo))):
                r = {"setup": name, **_run(n, a.seconds, make)}
                print(json.dumps(r), flush=True)
                rows.append(r)
    during = meter.stop()
    avg_after = os.getloadavg()
    result = {"env": a.env, "seconds_per_config": a.seconds, "rows": rows,
              "machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "cores": os.cpu_count(), "loadavg_before": avg_before, "loadavg_after": avg_after,
                          "load_check": load.to_dict(), "load_during": during.to_dict()}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# bench_serve: {a.env} served over loopback vs in process vs OpenEnv's echo env", "",
             f"`python benchmarks/bench_serve.py --seconds {a.seconds:g}`; {a.seconds:g} s timed per row; "
             f"{os.cpu_count()} cores, server and clients on the same cores.", "",
             f"Machine load: os.getloadavg() {tuple(round(x, 2) for x in avg_before)} before, "
             f"{tuple(round(x, 2) for x in avg_after)} after; other processes kept "
             f"{during.other_busy_cores:.2f} cores busy during the run"
             + (" (THE MACHINE WAS BUSY: read the figures as rough)." if during.other_busy_cores >= 0.5 else "."),
             "", "| sessions | setup | steps | steps/s | p50 ms | p99 ms |", "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['sessions']} | {r['setup']} | {r['steps']} | {r['steps_per_s']} | {r['p50_ms']} | {r['p99_ms']} |"
              for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"results in {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
