"""``lcfed compare``'s methods side by side: a driver process per method, on the comparison's Ray.

Each sweep spends its first seconds starting its trial's process (Ray's worker, Tune and torch: 6-8 s on
2 cores), and a comparison runs two sweeps per method. One after the other, those starts and the cores a
single trial leaves idle add up; side by side, one method's trial process starts while another's trains.
A method runs in a process of its own, not a thread: Tune stops a sweep on a signal (its state saved for the
resume) only from a process's main thread, and each sweep stays its own Tune experiment and MLflow run,
exactly as one after the other.

:func:`run_drivers` runs a process per method (:func:`drive`), at most ``parallel`` at once, forked by a
``multiprocessing`` fork server that imported Tune, torch and lcfed once (:func:`prestart`, while the parent
starts Ray): a driver costs no imports of its own. A driver attaches to the parent's Ray (its GCS address),
runs :func:`tune_jobs.compare.run_method` and writes how it ended to a file: nothing, or its exception, which
the parent raises again once every driver has ended (a stop first, else the first method's failure). A
signal to the parent (SIGINT, SIGTERM, SIGHUP) is passed on to each driver as SIGTERM, whose Tune stops its trials
and saves its state; the drivers have a session of their own, so a terminal's Ctrl-C reaches them once, through
the parent. A driver whose fork server ends (with the parent) gets SIGTERM (Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from lcfed import logs
from lcfed.errors import CheckpointError, ConfigError, DataError, DivergenceError, SweepFailed, TrackingError
from lcfed.run.stop import SIGNALS

#: seconds between two looks at the drivers
POLL_S = 0.2
#: Linux's prctl option: a signal to this process when its parent dies
PR_SET_PDEATHSIG = 1
#: what the fork server imports once for every driver
PRELOAD = ["tune_jobs.compare_drivers", "tune_jobs.compare", "tune_jobs.sweep.run", "actors.connect"]
#: the errors a driver reports in one line, as ``lcfed`` does (any other also prints its traceback)
EXPECTED: tuple[type[BaseException], ...] = (ConfigError, DataError, CheckpointError, TrackingError, DivergenceError,
                                             SweepFailed, KeyboardInterrupt)


@dataclass(frozen=True)
class Job:
    """What a driver runs: ``work`` (a method's phases: :func:`tune_jobs.compare.run_method` with its arguments),
    on the comparison's Ray."""

    method: str
    work: Callable[[], None]  # pickled by reference: a module's function with its arguments
    address: str  # the GCS of the comparison's Ray
    verbosity: int  # lcfed's (-q, -v)
    outcome: str  # the file the driver writes how it ended to
    cwd: str  # the parent's, and its environment: the fork server's are those of when it started
    env: dict[str, str]


@dataclass
class Driver:
    job: Job
    proc: BaseProcess
    started: float

    @property
    def method(self) -> str:
        return self.job.method

    def outcome(self) -> BaseException | None:
        """How the driver ended: None (both phases written), or its exception."""
        try:
            with open(self.job.outcome, "rb") as f:
                return pickle.load(f)  # type: ignore[no-any-return]
        except (OSError, EOFError, pickle.UnpicklingError):
            code = self.proc.exitcode or 0
            how = f"by {signal.Signals(-code).name}" if code < 0 else f"with exit code {code}"
            return SweepFailed(f"the driver process of {self.method} ended {how} before it said how its phases went")


def _context() -> Any:
    return multiprocessing.get_context("forkserver")


def prestart() -> None:
    """The fork server started, importing :data:`PRELOAD` in the background (the caller goes on, e.g. starts Ray)."""
    from multiprocessing import forkserver

    _context().set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()


def run_drivers(works: dict[str, Callable[[], None]], parallel: int) -> None:
    """Each method's ``works`` (its phases), ``parallel`` at once, each by its own driver process; returns when all
    have ended well, else raises (a stop, or the first method's failure) once all have ended."""
    import ray  # connected already: the comparison's ParentRun

    address = ray.get_runtime_context().gcs_address
    prestart()  # (running already if run_compare started it)
    methods = list(works)
    pending, running, ended = list(methods), list[Driver](), dict[str, BaseException | None]()
    at_once = min(parallel, len(methods))
    print(f"lcfed compare: {len(methods)} methods, {at_once} at once (a driver process each)", file=sys.stderr,
          flush=True)
    with tempfile.TemporaryDirectory(prefix="lcfed-compare-") as tmp, _forwarded(running) as received:
        while running or (pending and not received):
            while pending and len(running) < at_once and not received:
                m = pending.pop(0)
                job = Job(m, works[m], address, logs.verbosity(), str(Path(tmp) / f"{methods.index(m)}"), os.getcwd(),
                          dict(os.environ))
                proc = _context().Process(target=drive, args=(job,), name=f"lcfed compare {m}")
                proc.start()
                running.append(Driver(job, proc, time.monotonic()))
                if received:  # a signal came while it started
                    running[-1].proc.terminate()
            for d in [d for d in running if not d.proc.is_alive()]:
                d.proc.join()
                running.remove(d)
                ended[d.method] = d.outcome()
                _report(d, ended[d.method])
            time.sleep(POLL_S)
    failed = {m: exc for m in methods if (exc := ended.get(m)) is not None}
    stops = [exc for exc in failed.values() if isinstance(exc, KeyboardInterrupt)]
    if stops or pending:  # (a signal that came when every method had ended well stops nothing)
        from tune_jobs.sweep.options import SweepInterrupted

        reason = received[0] if received else str(getattr(stops[0], "reason", "SIGINT"))
        raise SweepInterrupted(reason, f"{reason}: comparison stopped")
    if failed:
        raise next(iter(failed.values()))


def _report(driver: Driver, outcome: BaseException | None) -> None:
    took = time.monotonic() - driver.started
    if outcome is None:
        print(f"lcfed compare: {driver.method}: both phases done ({took:.0f} s)", file=sys.stderr, flush=True)
    elif not isinstance(outcome, KeyboardInterrupt):
        print(f"lcfed compare: {driver.method} failed after {took:.0f} s: {type(outcome).__name__}: {outcome}",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def _forwarded(running: list[Driver]) -> Iterator[list[str]]:
    """SIGINT, SIGTERM and SIGHUP passed on to the running drivers as SIGTERM (``terminate``: their Tune saves and
    stops; a second stops them at once); yields the names received. Left by an error of this process, the drivers
    are stopped too. SIGTERM whatever the parent got: a driver's sweep records it and raises once Tune has saved,
    where a SIGINT would go to Tune alone, which ends a sweep whose trials have just finished as if nothing came,
    and the driver would start its next one."""
    received: list[str] = []

    def forward(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if not received:
            print(f"lcfed: {name}: stopping the comparison's sweeps and saving their state (send it again to stop "
                  "now)", file=sys.stderr, flush=True)
        received.append(name)
        for d in running:
            d.proc.terminate()

    previous = {s: signal.signal(s, forward) for s in SIGNALS}
    try:
        yield received
    except BaseException:
        for d in running:
            d.proc.terminate()
        for d in running:
            d.proc.join()
        raise
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def drive(job: Job) -> None:
    """A driver: one method's phases, how it ended written to the job's file."""
    os.setsid()  # a terminal's signals reach the parent only, which passes them on once
    os.chdir(job.cwd)
    # multiprocessing queues made here (tensorboardX's, in Tune's logger) unlink their semaphores at once, as in any
    # process, instead of leaving them to the fork server's resource tracker, which warns of each it cleans up
    multiprocessing.set_start_method("fork", force=True)
    os.environ.clear()
    os.environ.update(job.env)
    for s in SIGNALS:  # until Tune's own handling: a stop, reported
        signal.signal(s, _stop)
    _die_with_parent()
    outcome: BaseException | None = None
    try:
        with logs.verbosity_scope(job.verbosity):
            from actors.connect import attach

            attach(job.address)
            job.work()
    except BaseException as exc:
        outcome = exc
        if not isinstance(exc, EXPECTED) and not type(exc).__module__.startswith("ray."):
            traceback.print_exc()
    finally:
        import ray

        ray.shutdown()  # a multiprocessing child runs no atexit handler, Ray's included
    _write_outcome(job.outcome, outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    # now, not through multiprocessing's exit: its finalizers close the queues that Tune's logger threads still
    # wait on (tensorboardX's), each of which then prints a traceback
    os._exit(0 if outcome is None else 1)


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _write_outcome(path: str, outcome: BaseException | None) -> None:
    try:
        data = pickle.dumps(outcome)
        pickle.loads(data)
    except Exception:  # an exception that does not survive pickling: its type and message
        data = pickle.dumps(SweepFailed(f"{type(outcome).__name__}: {outcome}"))
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _die_with_parent() -> None:
    """SIGTERM to this process when its parent (the fork server, which ends with the comparison) dies: Linux's
    ``PR_SET_PDEATHSIG``; elsewhere nothing."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request
        os.kill(os.getpid(), signal.SIGTERM)
