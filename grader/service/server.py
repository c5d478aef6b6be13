"""Serving the application (issue 33): the store held by this process alone (Store.lock), what a
killed service left running queued again (Store.recover), the grading worker started
(worker.py), then uvicorn on the given address, loopback by default; TLS is a reverse proxy's
(docs/instructor-guide.md, "The check service").

When uvicorn stops (Ctrl-C, SIGTERM), the worker is stopped before the store is let go: the
run it was grading is killed and its jobs queued again. A kill -9 leaves them `running`, and
the next start's recover queues them again; nothing accepted is lost either way.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

from grader.course.policy import Policy
from grader.service.store import Store
from grader.service.worker import GradeFn, Worker

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8008


def unavailable() -> str | None:
    """Why the service cannot run on this machine (a package it needs is not installed), or None.
    Only the service needs them: grading imports none of them (app.py and uvicorn are imported
    when the service starts)."""
    try:
        import python_multipart  # noqa: F401  (starlette's form uploads)
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        return (f"the course check service needs the package {e.name!r}, not installed here: "
                f"make env installs it (offline: its wheel in .whl/, docs/gpu-machine.md)")
    return None


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def serve(store_dir: Path | Store, policy: Policy, *, host: str = DEFAULT_HOST,
          port: int = DEFAULT_PORT, scratch: Path | None = None, grade: GradeFn | None = None,
          slots: int = 1, announce: Callable[[], str] | None = None) -> None:
    """Run until stopped. `store_dir`: a folder (locked here; StoreBusy when another service holds
    it) or a Store this process has locked. `grade`: the pipeline the worker grades with (None:
    no worker, the jobs wait). `announce`: the line printed once the address is bound."""
    import uvicorn

    from grader.service.app import create_app
    store = store_dir if isinstance(store_dir, Store) else Store(store_dir)
    if not isinstance(store_dir, Store):
        store.lock()
    requeued = store.recover()
    if requeued:
        print(f"service: {len(requeued)} submission(s) left running by the last service "
              f"queued again", file=sys.__stderr__, flush=True)
    worker = Worker(store, grade, slots=slots) if grade is not None else None

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and announce is not None:
                print(announce(), file=sys.__stdout__, flush=True)

    previous = _stop_on_sigterm()
    try:
        if worker is not None:
            worker.start()
        Server(uvicorn.Config(create_app(store, policy, scratch=scratch), host=host, port=port,
                              log_level="warning")).run()
    finally:
        if worker is not None and not worker.stop():
            print("service: the grading worker did not stop in time; its jobs stay running and "
                  "are queued again at the next start", file=sys.__stderr__, flush=True)
        store.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stop_on_sigterm():
    """SIGTERM stops the service as Ctrl-C does: uvicorn shuts down on it, then raises it again
    under the handler it found, which this makes a KeyboardInterrupt, so that the worker is
    stopped and the store closed (not the process ended where it stood). The handler it
    replaced; None off the main thread, where none can be set."""
    def stop(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:
        return None
