"""A GPU worker's lane's checks left behind (issue 32): a submission's check stage and verdict
(stages/behind.py's Left) finished on a thread of the lane's own while the lane runs the next
submission's run stage; the lane waits for it before any time stage, health check or baseline
(Behind.wait in the stages). One at a time: leaving another first waits for the one before.

The thread lives as long as the lane: the checker process it may start dies with the thread that
started it (procs.spawn_capped's parent-death signal), and one started per check would pay
torch's import and the references again each time.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator

from grader.course.results import SubmissionResult
from grader.stages.behind import Behind, Left, behind, forget_behind, install_behind


class ChecksBehind(Behind):
    """One lane's Left, finished one at a time on its own thread; `done(left, result, error)` is
    called there with the result, or with what stopped it (a grader bug's exception; the run
    stopping and an unhealthy GPU are also raised at the lane's next wait)."""

    def __init__(self, name: str = "checks-behind"):
        self._work: queue.Queue = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self._owner = threading.current_thread()   # the lane: the thread ends with it, at the latest
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def takes(self) -> bool:
        return True

    def busy(self) -> bool:
        return not self._idle.is_set()

    def leave(self, left: Left, done: Callable[[Left, SubmissionResult | None,
                                                  Exception | None], None]) -> None:
        """Finish `left` on this lane's thread, once the one before is done."""
        self.wait()
        self._idle.clear()
        self._work.put((left, done))

    def wait(self) -> None:
        error = self._settled()
        if error is not None:
            raise error

    def end(self) -> BaseException | None:
        """Wait for the last one, then end the thread (the lane's end); what stopped the last
        one, if anything did."""
        error = self._settled()
        self._work.put(None)
        self._thread.join()
        return error

    def _settled(self) -> BaseException | None:
        """Once nothing left behind runs: what stopped the last of it (taken: said once)."""
        self._idle.wait()
        error, self._error = self._error, None
        return error

    def _serve(self) -> None:
        while True:
            try:
                item = self._work.get(timeout=1.0)
            except queue.Empty:
                if self._owner.is_alive():
                    continue
                return   # its lane ended without end(): nothing more can come
            if item is None:
                return
            left, done = item
            try:
                try:
                    result = left.finish()
                except Exception as e:   # a grader bug: this submission's result says so
                    done(left, None, e)
                else:
                    done(left, result, None)
            except BaseException as e:   # Cancelled, GpuUnhealthy: the lane raises it
                self._error = e
                left.drop()
            finally:
                self._idle.set()


@contextlib.contextmanager
def checks_behind() -> Iterator[ChecksBehind]:
    """Inside, the calling thread (a GPU worker's lane) leaves each submission's check behind its
    turn (grade_submission returns a Left: give it to leave); on the way out the last one is
    waited for and the thread ends."""
    work = ChecksBehind(name=f"{threading.current_thread().name}.behind")
    install_behind(work)
    try:
        yield work
    finally:
        forget_behind()
        error = work.end()
    if error is not None:   # what stopped the last one (raised unless the lane is failing anyway)
        raise error


def lane_behind() -> ChecksBehind:
    """The calling lane's ChecksBehind (checks_behind)."""
    work = behind()
    assert isinstance(work, ChecksBehind), "not inside checks_behind()"
    return work
