"""The processes of a chaos run, and the monkey that kills and restarts them.

Every process runs in its own session (``kill -9`` of a Celery worker reaches its pool children
through the process group) and writes its output to a log file of the run. The monkey picks an
action at random every few seconds: kill -9 a worker, a worker's pool child, a DLX service, a
drain or the foreign consumer (each is started again at once, as a supervisor would), restart
celery_dlx's Redis (SIGKILL, then start on its AOF), or restart the RabbitMQ node
(``rabbitmqctl stop_app``/``start_app``, only when the plan allows it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.chaos.servers import RedisServer

logger = logging.getLogger("chaos")

ROOT = Path(__file__).resolve().parent.parent.parent

#: Kinds of process a run starts.
WORKER, SERVICE, DRAIN, FOREIGN = "worker", "service", "drain", "foreign"

#: Monkey actions.
KILL_WORKER = "kill -9 worker"
KILL_POOL_CHILD = "kill -9 pool child"
KILL_SERVICE = "kill -9 DLX service"
KILL_DRAIN = "kill -9 drain"
KILL_FOREIGN = "kill -9 foreign consumer"
RESTART_REDIS = "restart Redis (SIGKILL + AOF)"
RESTART_RABBITMQ = "restart RabbitMQ (stop_app/start_app)"
#: Prefix of the events of a crash point firing (``DLX_FAULT``), e.g. "crash at service.buried".
FAULT_PREFIX = "crash at "

#: Seconds after a worker said it is ready before its pool children may be killed.
POOL_SETTLE = 2.0
#: Seconds RabbitMQ commands may take.
RABBITMQCTL_TIMEOUT = 180


#: The log level of the run's workers and service (``DLX_CHAOS_LOGLEVEL``): INFO at least, the
#: monkey waits for a worker's "ready." line before it kills its pool children.
LOGLEVEL = os.environ.get("DLX_CHAOS_LOGLEVEL", "INFO")


def command(kind: str, name: str, concurrency: int) -> list[str]:
    """The command line of one process of ``kind``."""
    if kind == WORKER:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.chaos.chaos_app",
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "-l",
            LOGLEVEL,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"{name}@%h",
        ]
    if kind == SERVICE:
        # The CLI's entry function, not the console script: a stale script cannot break a run.
        return [
            sys.executable,
            "-c",
            "from celery_dlx.cli.main import main; main()",
            "-A",
            "tests.chaos.chaos_app",
            "service",
            # the drain role is its own process here: a service kill is not also a drain kill
            "--no-drain",
            "-l",
            LOGLEVEL,
        ]
    return [sys.executable, "-m", "tests.chaos.roles", kind]


class Proc:
    """One process of the run, restartable; its output goes to ``<logdir>/<name>.log``.

    ``faults`` are crash points (``DLX_FAULT`` values, see :mod:`celery_dlx.faults`) armed one at
    a time: each start arms the first one not yet fired, so every one fires once, at a known
    point, whatever the monkey does meanwhile. Fired ones are logged to ``<logdir>/faults.log``.
    """

    def __init__(
        self,
        kind: str,
        name: str,
        env: dict[str, str],
        logdir: Path,
        concurrency: int,
        faults: list[str] | None = None,
    ):
        self.kind = kind
        self.name = name
        self.env = env
        self.log = logdir / f"{name}.log"
        self.fault_log = logdir / "faults.log"
        self.faults = list(faults or ())
        self.concurrency = concurrency
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_at = 0.0
        self.log_offset = 0
        self.ready_at = 0.0

    def fault_fired(self) -> str | None:
        """The armed fault this (exited) process died of, if it did (popped), else None."""
        if self.proc is None or self.proc.returncode != 9 or not self.faults:
            return None
        point = self.faults[0].split("@")[0]
        if not self.fault_log.exists():
            return None
        mark = f"{point} pid={self.proc.pid} "
        if any(line.startswith(mark) for line in self.fault_log.read_text().splitlines()):
            return self.faults.pop(0)
        return None

    def start(self) -> None:
        env = dict(self.env, DLX_FAULT_LOG=str(self.fault_log))
        if self.faults:
            env["DLX_FAULT"] = self.faults[0]
        else:
            env.pop("DLX_FAULT", None)
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        self.ready_at = 0.0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command(self.kind, self.name, self.concurrency),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        self.started_at = time.monotonic()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group (a worker's pool children too) and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def settled(self) -> bool:
        """True once this start's worker said it is ready, at least ``POOL_SETTLE`` s ago."""
        if not self.ready_at:
            try:
                with self.log.open("rb") as log:
                    log.seek(self.log_offset)
                    ready = b" ready." in log.read()
            except OSError:
                ready = False
            if not ready:
                return False
            self.ready_at = time.monotonic()
        return time.monotonic() - self.ready_at >= POOL_SETTLE

    def kill_pool_child(self, rng: random.Random) -> bool:
        """SIGKILL one pool child of a worker (its main process starts another); False if none."""
        if not self.alive or self.proc is None:
            return False
        if not self.settled():
            # Celery gives up ("Could not start worker processes") when a child dies while the
            # pool is still starting (a broker restart can delay that well past the start): a
            # Celery limit, not what this run measures.
            return False
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return False
        if not children:
            return False
        victim = rng.choice(children)
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return False
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a worker finishes what it runs, a service acks its batch), then SIGKILL."""
        if not self.alive or self.proc is None:
            return
        try:
            # The main process only: it stops its pool children after their tasks.
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
        except ProcessLookupError:
            pass
        # Pool children left behind by a killed main process must not keep consuming.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class Rabbit:
    """The RabbitMQ node: restarted with ``rabbitmqctl``, and always started again.

    Args:
        node: a private node (:class:`tests.chaos.servers.RabbitNode`) whose ``ctl`` is used;
            None: the machine's node (only ``benchmarks/chaos.py`` restarts that one).
    """

    def __init__(self, node: Any = None) -> None:
        self.node = node
        self.stopped = False
        self.restarts = 0

    def _ctl(self, *args: str) -> None:
        if self.node is not None:
            self.node.ctl(*args, timeout=RABBITMQCTL_TIMEOUT)
            return
        subprocess.run(
            ["rabbitmqctl", *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=RABBITMQCTL_TIMEOUT,
        )

    def restart(self, down_seconds: float) -> None:
        """``stop_app``, wait, ``start_app``, ``await_startup``."""
        self.stopped = True
        try:
            self._ctl("stop_app")
            time.sleep(down_seconds)
        finally:
            self.ensure_running()
        self.restarts += 1

    def ensure_running(self) -> None:
        """Start the app again if this run stopped it, and wait until the node is up."""
        if self.stopped:
            self._ctl("start_app")
            self._ctl("await_startup")
            self.stopped = False


@dataclass
class Event:
    """One thing the monkey did, at ``at`` seconds into the run."""

    at: float
    action: str
    target: str = ""
    #: Epoch seconds the action started and ended (a restart lasts its downtime).
    wall: float = 0.0
    until: float = 0.0


@dataclass
class Monkey:
    """Kills and restarts at random intervals of ``gap`` seconds until stopped.

    Also restarts any process that died by itself (counted in ``unexpected_exits``).
    """

    procs: list[Proc]
    redis: RedisServer
    rabbit: Rabbit
    actions: tuple[str, ...]
    gap: tuple[float, float]
    rng: random.Random
    started: float = field(default_factory=time.monotonic)
    rabbit_limit: int = 2
    #: Monotonic time after which the monkey only supervises (a calm tail: messages published
    #: then meet no chaos, so the ledger check can hold them to exact run counts).
    act_until: float = float("inf")
    redis_down: tuple[float, float] = (0.2, 2.0)
    rabbit_down: tuple[float, float] = (1.0, 5.0)
    events: list[Event] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: list[str] = field(default_factory=list)
    #: Held while an action is under way (see :meth:`calm`).
    _acting: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-monkey", daemon=True)
        self._thread.start()

    def calm(self) -> None:
        """Act no more (an action under way finishes first) but go on supervising until
        :meth:`stop`: a crash point can still fire while the run settles, and a supervisor
        restarts that process as it would any other."""
        self.act_until = 0.0
        with self._acting:
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(RABBITMQCTL_TIMEOUT * 3)

    def _run(self) -> None:
        # Every action once first (in a random order), so a short run still covers them all.
        first = list(self.actions)
        self.rng.shuffle(first)
        next_at = time.monotonic() + self.rng.uniform(*self.gap)
        while not self._stop.wait(0.2):
            self.supervise()
            if time.monotonic() < next_at or time.monotonic() > self.act_until:
                continue
            action = first.pop() if first else self.rng.choice(self.actions)
            try:
                with self._acting:
                    if time.monotonic() > self.act_until:  # calm() came first
                        continue
                    done = self.act(action)
                if not done and action != RESTART_RABBITMQ and action not in first:
                    first.insert(0, action)  # nothing to act on yet: again later
            except Exception as exc:  # a failed action is reported, the run goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
                logger.exception("chaos action failed")
            next_at = time.monotonic() + self.rng.uniform(*self.gap)

    def supervise(self) -> None:
        """Start again every process that is not running (killed, a crash point, or died by
        itself: only the last counts in ``unexpected_exits``)."""
        for proc in self.procs:
            if not proc.alive:
                fired = proc.fault_fired()
                if fired is not None:
                    self._note(f"{FAULT_PREFIX}{fired.split('@')[0]}", proc.name)
                elif proc.proc is not None:
                    self.unexpected_exits.append(f"{proc.name} exit {proc.proc.returncode}")
                proc.start()

    def _note(self, action: str, target: str = "", wall: float | None = None) -> Event:
        now = time.time()
        event = Event(round(time.monotonic() - self.started, 2), action, target, wall or now, now)
        self.events.append(event)
        return event

    def _pick(self, kind: str) -> Proc | None:
        alive = [p for p in self.procs if p.kind == kind and p.alive]
        return self.rng.choice(alive) if alive else None

    def act(self, action: str) -> bool:
        """Carry out one action now; False if there was nothing to act on."""
        kinds = {
            KILL_WORKER: WORKER,
            KILL_SERVICE: SERVICE,
            KILL_DRAIN: DRAIN,
            KILL_FOREIGN: FOREIGN,
        }
        if action in kinds:
            victim = self._pick(kinds[action])
            if victim is None:
                return False
            victim.kill9()
            self._note(action, victim.name)
            victim.start()
        elif action == KILL_POOL_CHILD:
            victim = self._pick(WORKER)
            if victim is None or not victim.kill_pool_child(self.rng):
                return False
            self._note(action, victim.name)
        elif action == RESTART_REDIS:
            self.redis.kill()
            event = self._note(action, f"port {self.redis.port}")
            time.sleep(self.rng.uniform(*self.redis_down))
            self.redis.start()
            event.until = time.time()
        elif action == RESTART_RABBITMQ:
            if self.rabbit.restarts >= self.rabbit_limit:
                return False
            event = self._note(action)
            self.rabbit.restart(self.rng.uniform(*self.rabbit_down))
            event.until = time.time()
        else:
            raise ValueError(f"unknown chaos action {action!r}")
        return True

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for event in self.events:
            out[event.action] = out.get(event.action, 0) + 1
        return out


def dump_stacks(procs: list[Proc], logdir: Path) -> None:
    """Write every live process's Python stacks (py-spy, each thread, its children too) to
    ``<logdir>/<name>.stacks``: what a run that did not settle was waiting on."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return
    for proc in procs:
        if not proc.alive or proc.proc is None:
            continue
        try:
            pids = [proc.proc.pid, *(c.pid for c in psutil.Process(proc.proc.pid).children())]
        except psutil.NoSuchProcess:
            continue
        with (logdir / f"{proc.name}.stacks").open("w") as out:
            for pid in pids:
                out.write(f"== pid {pid}\n")
                out.flush()
                subprocess.run(
                    [str(spy), "dump", "--pid", str(pid)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=60,
                    check=False,
                )


def stop_all(procs: list[Proc], order: Callable[[Proc], int]) -> None:
    """Stop every process, in ``order`` (consumers before what feeds them)."""
    for proc in sorted(procs, key=order):
        proc.stop()
