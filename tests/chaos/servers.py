"""Private Redis servers for tests and benchmarks: one with AOF, a three-master cluster, Sentinel.

Each server runs on free loopback ports in a directory of its owner, is stopped with SIGKILL (as
a crash would), and can be started again on the same port and directory (AOF replays). Nothing
here touches the shared Redis.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

#: Seconds to wait for a server to answer after a start.
START_TIMEOUT = 30.0


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A free loopback port; ``with_bus``: port + 10000 is free too (Redis Cluster's bus port)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not with_bus or (port + 10000 < 65536 and _port_is_free(port + 10000)):
            return port
    raise RuntimeError("no free port pair found for a Redis Cluster node")


def wait_for(predicate: Any, what: str, timeout: float = START_TIMEOUT) -> Any:
    """Poll ``predicate`` until truthy; raise ``TimeoutError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _answers(port: int) -> bool:
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, socket_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisServer:
    """One ``redis-server`` on a free port, persisted with AOF (fsync on every write).

    Args:
        workdir: directory for its AOF and log (kept across restarts).
        port: a port to use (default: a free one).
        args: more ``redis-server`` arguments.
        appendfsync: ``always`` (nothing acknowledged is lost by a kill), ``everysec`` or ``no``.
    """

    def __init__(
        self,
        workdir: str | Path,
        *,
        port: int | None = None,
        args: Sequence[str] = (),
        appendfsync: str = "always",
        with_bus: bool = False,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port(with_bus=with_bus)
        self.args = list(args)
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--logfile",
            str(self.workdir / "redis.log"),
            *self.args,
        ]

    def start(self) -> None:
        """Start it (again) and wait until it answers (AOF loaded)."""
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(lambda: self._up(), f"redis-server on port {self.port}")

    def _up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"redis-server on port {self.port} exited:\n{log}")
        return _answers(self.port)

    def kill(self) -> None:
        """SIGKILL it, as a crash would, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def restart(self) -> None:
        """SIGKILL, then start on the same port and directory (the AOF is replayed)."""
        self.kill()
        self.start()
        self.restarts += 1

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def info_memory(self) -> dict[str, Any]:
        client = self.client()
        try:
            return dict(client.info("memory"))
        finally:
            client.close()


@contextlib.contextmanager
def own_redis(workdir: str | Path | None = None, **kwargs: Any) -> Iterator[RedisServer]:
    """A started :class:`RedisServer` in ``workdir`` (default: a new temp dir, removed after)."""
    made = workdir is None
    path = Path(tempfile.mkdtemp(prefix="dlx-redis-")) if workdir is None else Path(workdir)
    server = RedisServer(path, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.kill()
        if made:
            shutil.rmtree(path, ignore_errors=True)


class RedisClusterServers:
    """Three masters with ``--cluster-enabled yes`` joined by ``redis-cli --cluster create``."""

    def __init__(self, workdir: str | Path, masters: int = 3) -> None:
        self.workdir = Path(workdir)
        self.nodes = [
            RedisServer(
                self.workdir / f"node{i}",
                with_bus=True,
                args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
            )
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        """The celery_dlx URL of the cluster (any node seeds the slot map)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=true"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        create = ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0"]
        subprocess.run(
            [*create, "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )
        wait_for(self._ok, "cluster_state:ok on every node", timeout=60)

    def _ok(self) -> bool:
        for node in self.nodes:
            client = node.client()
            try:
                info = client.execute_command("CLUSTER", "INFO")
            finally:
                client.close()
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return True

    def node_of_slot(self, slot: int) -> RedisServer:
        """The master serving ``slot``."""
        client = self.nodes[0].client()
        try:
            for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        finally:
            client.close()
        raise LookupError(f"no master serves slot {slot}")

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


@contextlib.contextmanager
def redis_cluster(workdir: str | Path) -> Iterator[RedisClusterServers]:
    """A started three-master Redis Cluster in ``workdir``; killed after."""
    cluster = RedisClusterServers(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.kill()


class SentinelServers:
    """A master, a replica and one Sentinel monitoring them as ``mymaster`` (quorum 1)."""

    service = "mymaster"

    def __init__(self, workdir: str | Path) -> None:
        self.workdir = Path(workdir)
        self.master = RedisServer(self.workdir / "master")
        self.replica = RedisServer(
            self.workdir / "replica", args=["--replicaof", "127.0.0.1", str(self.master.port)]
        )
        self.sentinel_port = free_port()
        self.sentinel_dir = self.workdir / "sentinel"
        self.sentinel: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"sentinel://127.0.0.1:{self.sentinel_port}/{self.service}/{db}"

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        self.sentinel_dir.mkdir(parents=True, exist_ok=True)
        conf = self.sentinel_dir / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel_port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.sentinel_dir}\n"
            f"logfile {self.sentinel_dir / 'sentinel.log'}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
            f"sentinel failover-timeout {self.service} 5000\n"
        )
        # `redis-sentinel` is `redis-server --sentinel`; Debian ships the alias in another package.
        binary = shutil.which("redis-sentinel")
        cmd = [binary, str(conf)] if binary else ["redis-server", str(conf), "--sentinel"]
        self.sentinel = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        wait_for(lambda: self.master_port() == self.master.port, "sentinel to see the master")
        wait_for(self._replica_known, "sentinel to see the replica")

    def sentinel_client(self) -> redis.Redis:
        """A client of the Sentinel itself (SENTINEL commands)."""
        return redis.Redis(host="127.0.0.1", port=self.sentinel_port, socket_timeout=2)

    def master_port(self) -> int | None:
        """The master's port as Sentinel names it now (None while it cannot say)."""
        client = self.sentinel_client()
        try:
            addr = client.execute_command("SENTINEL", "get-master-addr-by-name", self.service)
        except redis.RedisError:
            return None
        finally:
            client.close()
        return int(addr[1]) if addr else None

    def _replica_known(self) -> bool:
        client = self.sentinel_client()
        try:
            return bool(client.execute_command("SENTINEL", "replicas", self.service))
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        if self.sentinel is not None and self.sentinel.poll() is None:
            self.sentinel.send_signal(signal.SIGKILL)
            self.sentinel.wait(30)
        self.replica.kill()
        self.master.kill()


@contextlib.contextmanager
def redis_sentinel(workdir: str | Path) -> Iterator[SentinelServers]:
    """A started master + replica + Sentinel in ``workdir``; killed after."""
    servers = SentinelServers(workdir)
    try:
        servers.start()
        yield servers
    finally:
        servers.kill()


#: The RabbitMQ 3.10 server and its control tool (Debian's package).
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
#: Seconds a RabbitMQ node may take to boot (a clustered node waits for its peers' tables).
RABBIT_START_TIMEOUT = 120.0


class RabbitNode:
    """One private RabbitMQ node (``NAME@localhost``) on free loopback ports, in its own folder.

    The recipe of ``../shared/SERVICES.md``: its own Erlang cookie (``cookie``; nodes that will
    form a cluster share one), AMQP, distribution and (with ``management``) management ports
    chosen at construction, kept across restarts. :meth:`kill` is a ``kill -9`` of the node's
    Erlang VM (its PID file), :meth:`stop` a ``rabbitmqctl stop`` by node name; nothing here
    looks a process up by pattern or touches the shared node.

    Args:
        workdir: the node's folder (database, logs, configuration); kept across restarts.
        name: the node name's first part (``NAME@localhost``), unique on the machine.
        cookie: the Erlang cookie.
        management: enable ``rabbitmq_management`` on a port of its own.
    """

    def __init__(
        self, workdir: str | Path, name: str, cookie: str, *, management: bool = False
    ) -> None:
        self.workdir = Path(workdir)
        self.name = name
        self.node = f"{name}@localhost"
        self.cookie = cookie
        self.management = management
        self.port = free_port()
        self.dist_port = free_port()
        self.management_port = free_port() if management else None
        self.pid: int | None = None
        self.restarts = 0
        self._write_files()

    @property
    def url(self) -> str:
        """The AMQP URL of the node (guest, default virtual host)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def management_url(self) -> str:
        if self.management_port is None:
            raise ValueError(f"node {self.node} was made without management")
        return f"http://127.0.0.1:{self.management_port}"

    def _write_files(self) -> None:
        home = self.workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)
        conf = [
            f"listeners.tcp.local = 127.0.0.1:{self.port}",
            "disk_free_limit.absolute = 50MB",
            "loopback_users.guest = true",
        ]
        if self.management_port is not None:
            conf += [
                f"management.tcp.port = {self.management_port}",
                "management.tcp.ip = 127.0.0.1",
            ]
        (self.workdir / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        plugins = "[rabbitmq_management]." if self.management else "[]."
        (self.workdir / "enabled_plugins").write_text(plugins + "\n")
        (self.workdir / "rabbitmq-env.conf").write_text("")

    def env(self) -> dict[str, str]:
        """The environment of this node's server and of ``rabbitmqctl`` talking to it."""
        d = self.workdir
        return {
            **os.environ,
            "HOME": str(d / "home"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def ctl(self, *args: str, timeout: float = 120.0, check: bool = True) -> int:
        """Run ``rabbitmqctl -n NODE ARGS``; its exit status (raises on failure with ``check``)."""
        done = subprocess.run(
            [RABBITMQCTL, "-n", self.node, *args],
            env=self.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace")[-1000:]
            raise RuntimeError(f"rabbitmqctl -n {self.node} {' '.join(args)}: {err}")
        return done.returncode

    def start(self, timeout: float = RABBIT_START_TIMEOUT) -> None:
        """Start the node (again) and wait until it has booted (``await_startup``)."""
        self.launch()
        self.await_startup(timeout)

    def launch(self) -> None:
        """Start the node's server in the background (:meth:`await_startup` waits for it)."""
        (self.workdir / "rabbitmq.pid").unlink(missing_ok=True)
        subprocess.run(
            [RABBITMQ_SERVER, "-detached"],
            env=self.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=60,
            start_new_session=True,
        )

    def await_startup(self, timeout: float = RABBIT_START_TIMEOUT) -> None:
        """Wait until the launched node has booted; its PID is then known."""
        pid_file = self.workdir / "rabbitmq.pid"
        deadline = time.monotonic() + timeout
        while self.ctl("await_startup", "-t", "5", check=False, timeout=30) != 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"RabbitMQ node {self.node} did not start within {timeout}s")
            time.sleep(0.5)
        self.pid = int(pid_file.read_text().strip())

    def kill(self) -> None:
        """``kill -9`` the node's Erlang VM (as a crash would) and wait until it is gone."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        wait_for(lambda: not _alive(self.pid), f"node {self.node} (pid {self.pid}) to die", 30)
        self.pid = None

    def restart(self) -> None:
        """Start it again after :meth:`kill` (same ports, folder and cluster membership)."""
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        """Stop the node by name (``rabbitmqctl stop``); by PID (``kill -9``) if that fails."""
        if self.pid is None:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.ctl("stop", timeout=60)
        if self.pid is not None and _alive(self.pid):
            self.kill()
        self.pid = None

    def join(self, first: RabbitNode) -> None:
        """Join ``first``'s cluster (``stop_app``, ``join_cluster``, ``start_app``)."""
        self.ctl("stop_app")
        self.ctl("join_cluster", first.node)
        self.ctl("start_app")
        self.ctl("await_startup", "-t", "60")


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # gone (psutil.NoSuchProcess)
        return False


class RabbitCluster:
    """``size`` private :class:`RabbitNode` s sharing one cookie, joined into one cluster.

    The nodes are named ``<prefix>N@localhost``; each has the management plugin on its own port.
    """

    def __init__(self, workdir: str | Path, size: int = 3, prefix: str | None = None) -> None:
        import secrets

        self.workdir = Path(workdir)
        prefix = prefix or f"dlxc{secrets.token_hex(3)}"
        cookie = secrets.token_hex(16)
        self.nodes = [
            RabbitNode(self.workdir / f"n{i}", f"{prefix}n{i}", cookie, management=True)
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def broker_url(self, order: Sequence[int] | None = None) -> str:
        """The failover URL list (``amqp://a;amqp://b;...``), nodes in ``order``."""
        picked = order if order is not None else range(len(self.nodes))
        return ";".join(self.nodes[i].url for i in picked)

    def node_of_port(self, port: int) -> RabbitNode | None:
        return next((n for n in self.nodes if port in (n.port, n.management_port)), None)

    def start(self) -> None:
        """Start every node, then join the others to the first one's cluster."""
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.await_startup()
        for node in self.nodes[1:]:
            node.join(self.nodes[0])

    def stop(self) -> None:
        """Stop every node by name (by PID where that fails); never raises."""
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.stop()


@contextlib.contextmanager
def rabbit_cluster(workdir: str | Path, size: int = 3) -> Iterator[RabbitCluster]:
    """A started cluster of ``size`` private RabbitMQ nodes in ``workdir``; stopped after (also
    when the start fails half-way)."""
    cluster = RabbitCluster(workdir, size)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
