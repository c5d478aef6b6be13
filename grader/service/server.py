"""Serving the application (issue 33): the store held by this process alone (Store.lock), what a
killed service left running queued again (Store.recover), then uvicorn on the given address,
loopback by default; TLS is a reverse proxy's (docs/instructor-guide.md, when the service ships)."""

from __future__ import annotations

from pathlib import Path

from grader.course.policy import Policy
from grader.service.app import create_app
from grader.service.store import Store

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8008


def serve(store_dir: Path, policy: Policy, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          scratch: Path | None = None) -> None:
    """Run until stopped; StoreBusy when another service holds the store."""
    import uvicorn
    store = Store(store_dir)
    store.lock()
    requeued = store.recover()
    if requeued:
        print(f"service: {len(requeued)} submission(s) left running by the last service "
              f"queued again", flush=True)
    try:
        uvicorn.run(create_app(store, policy, scratch=scratch), host=host, port=port,
                    log_level="warning")
    finally:
        store.close()
