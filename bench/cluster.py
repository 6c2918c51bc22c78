#!/usr/bin/env python3
"""A shaped-network cluster on one machine: N servers as network namespaces, each with its
cache node and one training rank, over shared throttled storage.

Each server ``cdlcl<i>`` is a Linux network namespace with one veth link to a bridge
(``cdlclbr``, 10.213.77.254/24; server i is 10.213.77.<i+1>). Every link is shaped:

- bandwidth (``--bandwidth``, default ``1gbit``, tc rate syntax): an htb class on the
  namespace side (the server's uplink) and a tbf on the bridge side (its downlink);
- latency (``--latency``, default ``0.2ms``, one way, added on the sending side: a round
  trip between two servers gains 2 x latency): ``tc netem delay`` under the htb class
  when the kernel has sch_netem; where it does not (this machine's kernel is built
  without it: ``tc qdisc add ... netem`` says "Specified qdisc kind is unknown") a relay
  process in each namespace, in front of its redis-server, holds every chunk a peer sends
  to the node for the round trip's latency (2 x latency) before passing it on, and passes
  the node's answers back at once (traffic of the server's own rank is not delayed;
  threads and time.sleep: sub-millisecond waits are kept). A request and its answer are
  apart by the same round trip as with the latency on each way, and the answers, which are
  nearly all the bytes, cost the relay no queue, no sleep and no second thread. The relay
  moves bytes with splice(2) through a pipe, never into Python. On this loaded 2-core
  machine a PING from the bridge took 0.6-0.8 ms round trip at 0.2 ms (0.4 ms of it the
  latency). The JSON's ``latency_via`` says which was used, ``link_measured`` what a client saw.

In each namespace run its cache node (redis-server with coordl's node configuration,
`coordl.cache.partitioned.redisnode.NodeConfig`: maxmemory, noeviction, no persistence, a password)
and one rank: ``coordl.DataLoader(ds, rank=i, world_size=N, shuffle=True,
drop_page_cache=True)``, in lockstep epochs (the bench waits for every rank at each
epoch's start, as data-parallel training's allreduce does). All ranks and their workers
share one blkio cgroup whose ``blkio.throttle.read_bps_device`` caps the reads of the
disk holding the dataset (``--storage-mbps``, shared by all servers: one storage system),
and no read leaves pages in the page cache, so storage is really read each time.

Configurations, with the same budget per server (``--budget-fraction`` of the dataset,
default 0.4: three budgets hold 1.2x the dataset, one holds 0.4x):

- ``partitioned``: `coordl.PartitionedCache` over the N nodes' URLs on their namespace
  addresses, ``capacity_per_node`` = the budget (Redis's ``maxmemory`` gets room for its
  own per-key and allocator overhead on top: 1.25 x budget + 16 MiB);
- ``minio``: a local `coordl.MinIOCache` of the budget per server;
- ``none``: no cache;
- ``reference``: the whole dataset in each server's local memory (a MinIO cache of the
  dataset's size, filled before the first epoch): the floor the partitioned run is
  compared with.

Per epoch and server: epoch time, ``storage_bytes`` and ``remote_bytes`` (the loader's
stats), remote and local hits, node faults, the kernel's read_bytes of the rank and its
workers, and the CPU seconds of the rank's main process and of its workers. Per epoch and
side (the JSON's ``cpu``): the CPU of the ranks, their workers, the redis-servers and the
relays, and over the same window the whole machine's busy CPU, its interrupts and softirqs
(where packets are received: charged to no process), other processes and kernel threads.
CoorDL's shape (the JSON's ``shape``, epochs 2..N as medians, so that one noisy epoch does
not decide it): from epoch 2 the partitioned run reads no storage and its epoch time is
within 1.2x of the reference's; and where the extra time goes: the extra CPU per epoch and
per remote item, and the ratio of the two sides' own CPU, which is the time ratio of a
CPU-bound epoch on a machine with nothing else running (the measured times move with
whatever else runs on the machine; the CPU a side's processes take moves much less).
The order of the sides puts the reference right after the partitioned run. Then, with
``--pairs N`` (default 6) and both sides run, the two clusters stay alive together and run N
more epochs each, alternating (partitioned first in odd pairs, reference first in even ones):
the JSON's ``shape.interleaved`` has each pair's time and CPU ratio and their medians, which
a machine whose speed drifts during the run (other tenants) does not bias as it can the
sides' own epochs, run minutes apart.

Needs root, ``ip netns``, ``tc`` with htb and tbf, redis-server, and cgroup v1 blkio; it
says what is missing and exits 0 (``--require`` makes it exit 2). Run under the bench lock:

    flock /tmp/coordl-bench.lock .venv/bin/python bench/cluster.py \\
        --data $BENCH_DATA/cluster --out bench/results/cluster

NOTE [cluster bench lifecycle]
Every object the bench makes is named with the prefix ``cdlcl``: namespaces ``cdlcl<i>``,
veths ``cdlclh<i>``/``cdlcln<i>``, the bridge ``cdlclbr``, the blkio cgroup
``cdlcl-storage``, MinIO segments ``coordl-cache-cdlcl-*`` and temp folders
``$TMPDIR/cdlcl-run-*``. A run first takes an exclusive flock on ``$TMPDIR/cdlcl.lock`` (not
inherited by children, released by the kernel when the bench dies, even by SIGKILL), so
while it holds the lock every prefixed object is its own or a dead run's. Then:
1. `cleanup()` runs at start: it removes the objects a killed run left (every process in
   a prefixed namespace, from ``ip netns pids``, and in a prefixed cgroup is SIGKILLed by
   pid: only this bench puts processes there);
2. `cleanup()` is registered with atexit, and SIGTERM, SIGINT and SIGHUP raise SystemExit,
   so the ``finally`` of `orchestrate` and atexit run it on an error, a return or a signal
   (while it runs those signals are ignored, so a second Ctrl-C does not cut it short);
3. a SIGKILL of the bench leaves the objects behind, and its children run on until the
   next run's step 1, or ``bench/cluster.py --cleanup``, ends them.
Processes die before namespaces (a namespace deleted under a live process stays alive with
it); deleting a namespace deletes its veth pair; the bridge goes last with the cgroup.
Anything else named so (a folder of yours called ``$TMPDIR/cdlcl-run-x``) is removed too.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import json
import os
import queue
import secrets
import select
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time

from lib import cgroup, pagecache, report

PREFIX = "cdlcl"
SUBNET = "10.213.77"
BRIDGE, BRIDGE_IP = f"{PREFIX}br", f"{SUBNET}.254"
PORT, REDIS_PORT = 6390, 6391
SIDES = ("partitioned", "reference", "minio", "none")
MiB = 2**20
TMP = tempfile.gettempdir()
TMPS = f"{PREFIX}-run-"   # the temp folders of a run (the cache nodes' dirs)
LINE = "CDLCL "
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)   # the prefix of a protocol line on a rank's or relay's stdout


def ns_name(i: int) -> str:
    return f"{PREFIX}{i}"


def ns_ip(i: int) -> str:
    return f"{SUBNET}.{i + 1}"


def sh(*cmd: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    proc = subprocess.run(full, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"bench: `{' '.join(full)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


# -- what this machine has ----------------------------------------------------------------

def why_not() -> str | None:
    """None when the cluster can be built here; else what is missing and how to get it."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, a blkio cgroup): run it as root"
    for tool in ("ip", "tc", "redis-server"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / redis-server)"
    probe = f"{PREFIX}probe"
    try:
        if sh("ip", "netns", "add", probe, check=False).returncode != 0:
            return "`ip netns add` fails here (no network namespaces: a container without CAP_SYS_ADMIN?)"
        for qdisc in (["htb", "default", "10"], ["tbf", "rate", "1gbit", "burst", "64kb", "latency", "50ms"]):
            if sh("tc", "qdisc", "add", "dev", "lo", "root", *qdisc, ns=probe, check=False).returncode != 0:
                return f"tc qdisc {qdisc[0]} is not available in this kernel (shaping needs htb and tbf)"
            sh("tc", "qdisc", "del", "dev", "lo", "root", ns=probe, check=False)
    finally:
        sh("ip", "netns", "del", probe, check=False)
    return cgroup.why_not("blkio", "blkio.throttle.read_bps_device")


def has_netem() -> bool:
    probe = f"{PREFIX}probe"
    sh("ip", "netns", "add", probe, check=False)
    try:
        return sh("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", ns=probe,
                  check=False).returncode == 0
    finally:
        sh("ip", "netns", "del", probe, check=False)


# -- cleanup (NOTE [cluster bench lifecycle]) ----------------------------------------------

_procs: list[subprocess.Popen] = []
links_measured: list[dict] = []   # link_check of each partitioned side


def _kill_pids(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = {p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)}
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def namespaces() -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(PREFIX)]


def links() -> list[str]:
    out = sh("ip", "-o", "link", "show", check=False).stdout
    names = [ln.split(":")[1].strip().split("@")[0] for ln in out.splitlines() if ":" in ln]
    return [n for n in names if n.startswith(PREFIX)]


def cgroups() -> list[str]:
    base = cgroup.base_dir("blkio")
    if base is None or not os.path.isdir(base):
        return []
    return [os.path.join(base, n) for n in os.listdir(base) if n.startswith(PREFIX)]


def leftovers() -> list[str]:
    """Every prefixed object that exists now (empty after a clean exit)."""
    from coordl.cache import shm

    segs = [n for n in os.listdir(shm.SHM_DIR) if n.startswith(shm.PREFIX + PREFIX)]
    tmps = [n for n in os.listdir(TMP) if n.startswith(TMPS)]
    return namespaces() + links() + cgroups() + segs + tmps


def cleanup() -> None:
    """Remove every object named with PREFIX, its processes first (idempotent; a second
    SIGTERM or Ctrl-C while it runs is ignored, so that it finishes)."""
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in SIGNALS} if main else {}
    try:
        _cleanup()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _cleanup() -> None:
    from coordl.cache import shm


    for p in _procs:
        if p.poll() is None:
            p.kill()
    for p in _procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (p.stdin, p.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
    _procs.clear()
    pids: set[int] = set()
    for ns in namespaces():
        pids |= {int(x) for x in sh("ip", "netns", "pids", ns, check=False).stdout.split()}
    for cg in cgroups():
        try:
            with open(os.path.join(cg, "cgroup.procs")) as f:
                pids |= {int(x) for x in f.read().split()}
        except OSError:
            pass
    pids.discard(os.getpid())
    _kill_pids(pids)
    for ns in namespaces():
        sh("ip", "netns", "del", ns, check=False)
    for link in links():
        sh("ip", "link", "del", link, check=False)
    for cg in cgroups():
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
    for n in os.listdir(shm.SHM_DIR):
        if n.startswith(shm.PREFIX + PREFIX):
            try:
                os.unlink(os.path.join(shm.SHM_DIR, n))
            except OSError:
                pass
    for n in os.listdir(TMP):
        if n.startswith(TMPS):
            shutil.rmtree(os.path.join(TMP, n), ignore_errors=True)


def _on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def take_lock():
    fd = os.open(os.path.join(TMP, f"{PREFIX}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("bench: another cluster bench runs; waiting for its lock", flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


# -- the network ---------------------------------------------------------------------------

def storage_cgroup(disk: str, bps: int) -> list[str]:
    """The shared storage: one blkio cgroup capping reads of `disk`; its cgroup.procs files."""
    path = os.path.join(cgroup.base_dir("blkio"), f"{PREFIX}-storage")
    os.mkdir(path)
    with open(os.path.join(path, "blkio.throttle.read_bps_device"), "w") as f:
        f.write(f"{disk} {bps}")
    return [os.path.join(path, "cgroup.procs")]


def latency_ms(text: str) -> float:
    """'0.2ms', '200us' or '0' -> milliseconds."""
    for suffix, scale in (("ms", 1.0), ("us", 1e-3), ("s", 1e3), ("", 1.0)):
        if text.endswith(suffix):
            try:
                value = float(text[:len(text) - len(suffix)] if suffix else text) * scale
            except ValueError:
                break
            if value >= 0:
                return value
            break
    raise SystemExit(f"bench: --latency {text!r}: give a time such as 0.2ms or 200us (0: none)")


def build_network(n: int, bandwidth: str, delay_ms: float, netem: bool) -> None:
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for i in range(n):
        ns, host, inner = ns_name(i), f"{PREFIX}h{i}", f"{PREFIX}n{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", ns)
        sh("ip", "link", "set", host, "master", BRIDGE)
        sh("ip", "link", "set", host, "up")
        sh("ip", "addr", "add", f"{ns_ip(i)}/24", "dev", inner, ns=ns)
        sh("ip", "link", "set", inner, "up", ns=ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        # uplink: htb at the rate (+ netem delay as its leaf); downlink: tbf at the rate
        sh("tc", "qdisc", "add", "dev", inner, "root", "handle", "1:", "htb", "default", "10", ns=ns)
        sh("tc", "class", "add", "dev", inner, "parent", "1:", "classid", "1:10", "htb", "rate", bandwidth,
           "ceil", bandwidth, "quantum", "60000", ns=ns)
        if netem and delay_ms > 0:
            sh("tc", "qdisc", "add", "dev", inner, "parent", "1:10", "handle", "10:", "netem", "delay",
               f"{delay_ms}ms", "limit", "100000", ns=ns)
        sh("tc", "qdisc", "add", "dev", host, "root", "tbf", "rate", bandwidth, "burst", "256kb",
           "latency", "50ms")


# -- the delay relay (latency without sch_netem) -------------------------------------------

PIPE_BYTES = 1 << 20   # the relay's pipe per direction (fs.pipe-max-size allows 1 MiB by default)
F_SETPIPE_SZ = 1031


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Forward src -> dst, each chunk no earlier than `delay` s after it arrived (order kept).

    The bytes never enter Python: splice(2) moves each chunk from the socket into a pipe, which
    holds it while it waits, and from the pipe to the other socket (a user-space copy each way
    cost the relay most of its CPU). A queue of (due time, length) per chunk orders the
    writer. Threads and time.sleep, not asyncio: epoll waits in whole milliseconds, which
    would turn a 0.2 ms delay into 1 ms. With no delay, one thread moves chunks straight on."""
    pipe_r, pipe_w = os.pipe()
    try:
        fcntl.fcntl(pipe_w, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass   # a smaller pipe only means smaller chunks
    chunks: queue.SimpleQueue = queue.SimpleQueue()

    def move(n: int) -> None:   # n bytes from the pipe to dst
        while n:
            n -= os.splice(pipe_r, dst.fileno(), n)

    def writer() -> None:
        try:
            while True:
                due, n = chunks.get()
                if n is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                move(n)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    t = threading.Thread(target=writer, daemon=True) if delay > 0 else None
    try:
        if t is not None:
            t.start()
        ready = select.poll()
        ready.register(src, select.POLLIN)
        while True:
            ready.poll()   # splice would wait for the socket holding the pipe's lock: the writer too
            n = os.splice(src.fileno(), pipe_w, PIPE_BYTES)
            if not n:
                break
            if t is None:
                move(n)
            else:
                chunks.put((time.monotonic() + delay, n))
    except OSError:
        pass
    finally:
        if t is not None:
            chunks.put((0.0, None))
            t.join()
        else:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        os.close(pipe_r)
        os.close(pipe_w)


def relay_main(listen: str, port: int, to_port: int, delay: float) -> None:
    """Listen on listen:port, forward each connection to 127.0.0.1:to_port, delaying what the
    client sends by the round trip (2 x `delay`) and the answers not at all, unless the client
    is this server itself (its own rank: no delay)."""
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            d = 0.0 if self.client_address[0] in (listen, "127.0.0.1") else delay
            try:
                up = socket.create_connection(("127.0.0.1", to_port))
            except OSError:
                return
            for sock in (self.request, up):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            back = threading.Thread(target=_pump, args=(up, self.request, 0.0), daemon=True)
            back.start()
            _pump(self.request, up, 2 * d)   # the request waits for the whole round trip
            back.join()
            up.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads, allow_reuse_address = True, True

    with Server((listen, port), Handler) as server:
        print(LINE + "ready", flush=True)
        server.serve_forever()


# -- one server's rank ------------------------------------------------------------------------

def rank_main(args) -> None:
    import psutil

    import coordl

    urls = json.loads(os.environ.pop("CDLCL_URLS", "[]"))
    ds = coordl.ImageFolder(args.data, transform="train", size=args.size, seed=0)
    r, side = args.rank, args.side
    if side == "partitioned":
        cache = coordl.PartitionedCache(urls, r, capacity_per_node=args.budget, timeout=args.node_timeout)
    elif side in ("minio", "reference"):
        cache = coordl.MinIOCache(args.budget, name=f"{PREFIX}-{side}-{r}")
    else:
        cache = None
    loader = coordl.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                               persistent_workers=args.workers > 0, rank=r, world_size=args.servers,
                               cache=cache, drop_page_cache=True)
    me = psutil.Process()

    def read_bytes() -> int:
        return pagecache.read_bytes([me.pid] + [c.pid for c in me.children(recursive=True)])

    def cpu() -> tuple[float, float]:
        """CPU seconds (user + system) so far of this rank's main process and of its workers
        (persistent: the same processes every epoch)."""
        return _cpu_s([me.pid]), _cpu_s([c.pid for c in me.children(recursive=True)])

    keys = ("storage_bytes", "storage_reads", "remote_bytes", "remote_hits", "local_hits", "cache_hits",
            "remote_errors", "node_faults")
    print(LINE + "ready", flush=True)
    for epoch in range(args.epochs):
        if sys.stdin.readline().strip() != "go":
            return
        before, io0, (main0, workers0) = loader.stats(), read_bytes(), cpu()
        t0 = time.perf_counter()
        for _ in loader:
            if args.step_ms:
                time.sleep(args.step_ms / 1e3)
        dt = time.perf_counter() - t0
        after, io1, (main1, workers1) = loader.stats(), read_bytes(), cpu()
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
        print(LINE + json.dumps({"epoch": epoch, "time_s": round(dt, 3), "disk_read_bytes": io1 - io0,
                                 "cpu_main_s": round(main1 - main0, 3),
                                 "cpu_workers_s": round(workers1 - workers0, 3), **delta}), flush=True)
    del loader
    if side == "minio":
        cache.drop()        # this server's own cache (the reference's is dropped by the bench)
    elif cache is not None:
        cache.close()


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds so far of `pids`, their threads included (an exited one: 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _machine_busy_s() -> tuple[float, float]:
    """CPU seconds the whole machine has been busy (every process and the kernel's interrupts,
    ours or not: other work on the machine counts here too), and of those in interrupts and
    softirqs (where the kernel receives and forwards network packets, charged to no process)."""
    import psutil

    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0) + getattr(t, "steal", 0.0)
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)   # already in user and nice
    return sum(t) - idle - guest, getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def _all_cpu() -> dict[tuple[int, float], tuple[float, bool]]:
    """{(pid, start time): (CPU s so far, whether it is a kernel thread)} of every process now."""
    import psutil

    out = {}
    for p in psutil.process_iter(["ppid", "create_time", "cpu_times"]):
        t, ppid = p.info["cpu_times"], p.info["ppid"]
        if t is not None:
            out[(p.pid, p.info["create_time"])] = (t.user + t.system, p.pid == 2 or ppid == 2)
    return out


def others_cpu(before: dict, after: dict, ours: set[int]) -> tuple[float, float]:
    """CPU s between two `_all_cpu` snapshots of the processes that are not `ours`: user
    processes (other work on the machine), kernel threads (ksoftirqd, kworkers). A process
    that started between them counts from 0; one that ended between them is not seen."""
    user = kernel = 0.0
    for key, (cpu, kthread) in after.items():
        if key[0] in ours:
            continue
        d = cpu - before.get(key, (0.0, kthread))[0]
        if kthread:
            kernel += d
        else:
            user += d
    return user, kernel


# -- the orchestrator ---------------------------------------------------------------------------

def _spawn(cmd: list[str], ns: str, env: dict | None = None, join: list[str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, preexec_fn=(lambda: cgroup.join(join)) if join else None)
    _procs.append(proc)
    return proc


def _expect(proc: subprocess.Popen, what: str, timeout: float = 600) -> str:
    """The next protocol line of `proc` (other output is passed through to stderr)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench: {what} exited ({proc.wait()}) before answering")
        if line.startswith(LINE):
            return line[len(LINE):].strip()
        sys.stderr.write(line)
    raise RuntimeError(f"bench: {what} did not answer within {timeout:.0f}s")


def start_nodes(args, budget: int, password: str, tmp: str, relay: bool) -> list[str]:
    from coordl.cache.partitioned import nodeurl, redisnode

    urls = []
    for i in range(args.servers):
        ns = ns_name(i)
        cfg = redisnode.NodeConfig(port=REDIS_PORT if relay else PORT, bind="127.0.0.1" if relay else ns_ip(i),
                                   memory=int(budget * 1.25) + 16 * MiB, password=password)
        d = os.path.join(tmp, f"node{i}")
        os.makedirs(d)
        proc = _spawn(["redis-server", "-"], ns)
        proc.stdin.write("\n".join(cfg.lines(d, daemonize=False)) + "\n")
        proc.stdin.close()
        proc.stdin = None
        if relay:
            r = _spawn([sys.executable, os.path.abspath(__file__), "--relay", ns_ip(i),
                        "--latency", args.latency], ns)
            _expect(r, f"delay relay of {ns}", 30)
        url = nodeurl.node_url(ns_ip(i), PORT, password)
        redisnode.wait_ready(url, timeout=30)
        urls.append(url)
    return urls


def link_check(url: str, pings: int = 50, size: int = 4 * MiB, gets: int = 5) -> dict:
    """The shaped path as a client sees it, from the bridge (the host) to a node: median round
    trip of a PING, and MiB/s of a GET of a `size`-byte value (median of `gets`; set first,
    deleted after)."""
    import statistics

    from coordl.cache.partitioned import redisnode

    client = redisnode.redis_module().Redis.from_url(url, socket_timeout=30)
    try:
        client.ping()
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            client.ping()
            rtts.append(time.perf_counter() - t0)
        key = f"{PREFIX}:probe"
        client.set(key, b"\0" * size)
        times = []
        for _ in range(gets):
            t0 = time.perf_counter()
            got = client.get(key)
            times.append(time.perf_counter() - t0)
            if got is None or len(got) != size:
                raise RuntimeError(f"bench: link check: the {size}-byte value did not come back from the node")
        client.delete(key)
        return {"ping_rtt_ms": round(1e3 * statistics.median(rtts), 3),
                "get_mib_s": round(size / MiB / statistics.median(times), 1), "get_bytes": size}
    finally:
        client.close()


class Side:
    """One configuration's cluster: its cache nodes (and relays), its ranks in their namespaces,
    its reference caches; started, run an epoch at a time, stopped. Two can be alive at once
    (the interleaved pairs: partitioned and reference)."""

    def __init__(self, args, side: str, budget: int, total: int, files: list[str], storage_cg: list[str],
                 tmp: str, relay: bool) -> None:
        import coordl

        self.args, self.side = args, side
        os.sync()   # dirty pages (a dataset just written) cannot be evicted
        pagecache.evict(files)
        password = secrets.token_hex(16)
        first = len(_procs)
        urls = start_nodes(args, budget, password, tmp, relay) if side == "partitioned" else []
        self.node_procs = _procs[first:]
        if urls:
            links_measured.append(link_check(urls[-1]))
            print(f"bench: link from the bridge to {ns_name(args.servers - 1)}'s node: {links_measured[-1]}",
                  flush=True)
        side_budget = total if side == "reference" else budget
        self.made = []
        if side == "reference":   # the whole dataset in each server's memory before epoch 1
            ds = coordl.ImageFolder(args.data, transform="val")
            for r in range(args.servers):
                c = coordl.MinIOCache(side_budget, name=f"{PREFIX}-{side}-{r}")
                c.open(ds.fingerprint, len(ds), ds.root)
                for i, path in enumerate(files):
                    with open(path, "rb") as f:
                        c.put(i, f.read())
                c.close()
                self.made.append(c)
            pagecache.evict(files)
        env = {**os.environ, "CDLCL_URLS": json.dumps(urls)}
        self.ranks = []
        for r in range(args.servers):
            cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(r), "--side", side, "--data",
                   args.data, "--budget", str(side_budget), "--servers", str(args.servers),
                   # one more than it will run: a rank leaves when its stdin closes (`stop`), never on
                   # its own while the other side runs an epoch (its exit took CPU from that epoch)
                   "--epochs", str(args.epochs + args.pairs + 1), "--workers", str(args.workers),
                   "--batch-size", str(args.batch_size), "--size", str(args.size),
                   "--node-timeout", str(args.node_timeout), "--step-ms", str(args.step_ms)]
            self.ranks.append(_spawn(cmd, ns_name(r), env=env, join=storage_cg))
        for r, p in enumerate(self.ranks):
            _expect(p, f"rank {r} ({side})")
        self.rows: list[list[dict]] = [[] for _ in range(args.servers)]
        self.cpu_rows: list[dict] = []
        self.nodes = {"redis": [p.pid for p in self.node_procs if _runs(p, "redis-server")],
                      "relay": [p.pid for p in self.node_procs if _runs(p, "--relay")]}

    def epoch(self, label: str) -> tuple[list[dict], dict]:
        """Run one epoch on every rank together; (each rank's row, the side's CPU row)."""
        ranks, nodes, side = self.ranks, self.nodes, self.side
        node0, busy0, all0 = {k: _cpu_s(v) for k, v in nodes.items()}, _machine_busy_s(), _all_cpu()
        for p in ranks:   # lockstep: every rank starts the epoch together
            p.stdin.write("go\n")
            p.stdin.flush()
        rows = [json.loads(_expect(p, f"rank {r} ({side}) epoch {label}")) for r, p in enumerate(ranks)]
        node1, busy1, all1 = {k: _cpu_s(v) for k, v in nodes.items()}, _machine_busy_s(), _all_cpu()
        ours = {os.getpid(), *(p.pid for p in ranks), *nodes["redis"], *nodes["relay"]}
        ours |= {c.pid for p in ranks for c in _children(p.pid)}
        cpu = epoch_cpu(rows, {k: node1[k] - node0[k] for k in nodes}, busy1[0] - busy0[0], busy1[1] - busy0[1],
                        others_cpu(all0, all1, ours))
        print(f"bench: {side} epoch {label}: slowest {max(x['time_s'] for x in rows):.2f}"
              " s, storage MiB " + "/".join(f"{x['storage_bytes'] / MiB:.1f}" for x in rows)
              + ", remote MiB " + "/".join(f"{x['remote_bytes'] / MiB:.1f}" for x in rows), flush=True)
        return rows, cpu

    def run(self) -> None:
        """The side's own epochs (1..--epochs), in its rows."""
        for e in range(self.args.epochs):
            rows, cpu = self.epoch(str(e + 1))
            for r, row in enumerate(rows):
                self.rows[r].append(row)
            self.cpu_rows.append(cpu)

    def stop(self) -> None:
        for r, p in enumerate(self.ranks):
            p.stdin.close()
            if p.wait(timeout=120):
                raise RuntimeError(f"bench: rank {r} of side {self.side} exited with {p.returncode}")
            p.stdout.close()
            _procs.remove(p)
        for p in self.node_procs:   # this side's cache nodes and relays
            p.terminate()
        for p in self.node_procs:
            p.wait(timeout=30)
            p.stdout.close()
            _procs.remove(p)
        for c in self.made:
            c.drop()


def run_pairs(part: Side, ref: Side, pairs: int) -> dict:
    """`pairs` epochs of each side, alternating (partitioned then reference, then the other way
    round), both clusters alive throughout: whatever else the machine does falls on both sides
    of a pair alike. Per pair the ratio of the slowest servers' epoch times, and of the sides'
    own CPU (their processes and the interrupts)."""
    import statistics

    times, cpus, rows = [], [], {"partitioned": [], "reference": []}
    for k in range(pairs):
        got = {}
        for s in ((part, ref) if k % 2 == 0 else (ref, part)):
            got[s.side] = s.epoch(f"pair {k + 1}")
            rows[s.side].append(got[s.side][0])
        (prows, pcpu), (rrows, rcpu) = got["partitioned"], got["reference"]
        times.append(max(x["time_s"] for x in prows) / max(x["time_s"] for x in rrows))
        cpus.append(cpu_ratio(pcpu["total_s"] + pcpu["machine_irq_s"], rcpu["total_s"] + rcpu["machine_irq_s"]))
        print(f"bench: pair {k + 1}: partitioned / reference epoch time {times[-1]:.3f}, CPU {cpus[-1]}",
              flush=True)
    measured = [x for x in cpus if x is not None]
    return {"pairs": pairs, "time_ratios": [round(x, 3) for x in times],
            "median_time_ratio": round(statistics.median(times), 3), "min_time_ratio": round(min(times), 3),
            "max_time_ratio": round(max(times), 3), "cpu_ratios": cpus,
            "median_cpu_ratio": round(statistics.median(measured), 3) if measured else None,
            "within_1_2x": statistics.median(times) <= 1.2, "rows": rows}


def cpu_ratio(part_s: float, ref_s: float) -> float | None:
    """partitioned / reference CPU seconds, rounded; None where the reference side's CPU is 0:
    /proc counts CPU in clock ticks (10 ms), and a tiny epoch (the tests' 24 images) can take
    less than one tick in every process of a side."""
    return round(part_s / ref_s, 3) if ref_s > 0 else None


def _runs(proc: subprocess.Popen, word: str) -> bool:
    """Whether `word` is one of the arguments `proc` was started with."""
    return isinstance(proc.args, list) and word in proc.args


def _children(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def epoch_cpu(per_rank: list[dict], nodes: dict[str, float], machine_busy: float, machine_irq: float,
              others: tuple[float, float]) -> dict:
    """One epoch's CPU seconds of a side by component (all servers together): the ranks' main
    processes, their workers, the redis-servers, the delay relays; `total_s` their sum;
    `machine_busy_s` what the whole machine spent in the same window (kernel softirqs and
    other work on the machine included), `machine_irq_s` the part of it in interrupts and
    softirqs, `other_procs_s` and `kernel_threads_s` the processes not this side's and the
    kernel's threads (ksoftirqd: softirqs deferred under load); `remote_items` the items read
    from peers."""
    out = {"ranks_main_s": sum(x["cpu_main_s"] for x in per_rank),
           "workers_s": sum(x["cpu_workers_s"] for x in per_rank),
           "redis_s": nodes.get("redis", 0.0), "relay_s": nodes.get("relay", 0.0)}
    out["total_s"] = sum(out.values())
    out = {k: round(v, 3) for k, v in out.items()}
    out["machine_busy_s"], out["machine_irq_s"] = round(machine_busy, 3), round(machine_irq, 3)
    out["other_procs_s"], out["kernel_threads_s"] = round(others[0], 3), round(others[1], 3)
    out["remote_items"] = sum(x.get("remote_hits", 0) for x in per_rank)
    return out


def shape(args, sides: dict, cpu: dict) -> dict:
    """CoorDL's claim, checked on this run's figures from the second epoch on (medians over
    epochs 2..N, so that one noisy epoch does not decide it), and where the CPU went."""
    import statistics

    later = range(1, args.epochs)
    out: dict = {}
    if "partitioned" in sides:
        part = sides["partitioned"]
        out["partitioned_storage_bytes_from_epoch_2"] = sum(e["storage_bytes"] for rows in part for e in rows[1:])
    if not later:
        return out
    out["median_epoch_s_per_server"] = {
        side: [round(statistics.median(rows[e]["time_s"] for e in later), 3) for rows in per]
        for side, per in sides.items()}
    slowest = {side: [max(rows[e]["time_s"] for rows in per) for e in later] for side, per in sides.items()}
    out["median_slowest_epoch_s"] = {side: round(statistics.median(v), 3) for side, v in slowest.items()}
    out["cpu_median_per_epoch"] = {
        side: {k: round(statistics.median(rows[e][k] for e in later), 3) for k in rows[0]}
        for side, rows in cpu.items()}
    if "partitioned" in sides and "reference" in sides:
        ratios = [p / r for p, r in zip(slowest["partitioned"], slowest["reference"])]
        out["time_ratio_partitioned_over_reference"] = [round(x, 3) for x in ratios]
        out["median_time_ratio"] = round(out["median_slowest_epoch_s"]["partitioned"]
                                         / out["median_slowest_epoch_s"]["reference"], 3)
        out["within_1_2x"] = out["median_time_ratio"] <= 1.2
        part, ref = cpu["partitioned"], cpu["reference"]
        extra = [part[e]["total_s"] - ref[e]["total_s"] for e in later]
        out["extra_cpu_s_per_epoch"] = round(statistics.median(extra), 3)
        # on a machine where the epoch is CPU-bound, the epoch time goes as the CPU it takes: the
        # ratio of the sides' own CPU (and the interrupts) is what the time ratio would be with
        # the machine to themselves, whatever else ran beside this run
        own = {side: [c[e]["total_s"] + c[e]["machine_irq_s"] for e in later] for side, c in cpu.items()}
        out["cpu_ratio_partitioned_over_reference"] = cpu_ratio(statistics.median(own["partitioned"]),
                                                                statistics.median(own["reference"]))
        per_item = [x / part[e]["remote_items"] for x, e in zip(extra, later) if part[e]["remote_items"]]
        if per_item:
            out["extra_cpu_ms_per_remote_item"] = round(1e3 * statistics.median(per_item), 3)
    return out


def _ratio_text(x: float | None) -> str:
    return "n/a (under one clock tick of CPU)" if x is None else str(x)


def markdown(args, result: dict) -> str:
    d, s = result["dataset"], result["settings"]
    lines = [f"{args.servers} servers (network namespaces on one machine), links {s['bandwidth']} each way, "
             f"latency {s['latency']} one way ({result['latency_via']}), storage shared and throttled to "
             f"{s['storage_mbps']} MiB/s in all (blkio), page cache bypassed. Dataset {d['files']} JPEGs, "
             f"{d['total_bytes'] / MiB:.1f} MiB; budget {result['budget_bytes'] / MiB:.1f} MiB per server "
             f"({s['budget_fraction']:.2f} of the dataset; reference: the whole dataset in each server's memory). "
             f"Train transform {s['size']} px, batch {s['batch_size']}, {s['workers']} worker(s) per rank."
             + (f" Link as measured from the bridge to a node: PING round trip {lk['ping_rtt_ms']} ms (median), "
                f"a 4 MiB GET {lk['get_mib_s']} MiB/s (median of 5)."
                if (lk := result.get("link_measured")) else ""), "",
             "| config | epoch | epoch s (slowest) | s per server | storage MiB per server | remote MiB per server |",
             "|---|---:|---:|---|---|---|"]
    for side, rows in result["sides"].items():
        for e in range(args.epochs):
            per = [rows[r][e] for r in range(args.servers)]
            lines.append(f"| {side} | {e + 1} | {max(x['time_s'] for x in per):.2f} | "
                         + "/".join(f"{x['time_s']:.2f}" for x in per) + " | "
                         + "/".join(f"{x['storage_bytes'] / MiB:.1f}" for x in per) + " | "
                         + "/".join(f"{x['remote_bytes'] / MiB:.1f}" for x in per) + " |")
    sh_ = result["shape"]
    if "median_slowest_epoch_s" in sh_:
        lines += ["", f"Epochs 2-{args.epochs}, medians: slowest-server epoch s, each server's own epoch s; "
                  "CPU s per epoch of all servers together by component (ranks' main processes, their "
                  "workers, redis-servers, delay relays; machine: the whole machine's busy CPU in the "
                  "same window, other work and the kernel's interrupts included; irq: the interrupts and "
                  "softirqs, where packets are received, charged to no process; others: processes not this "
                  "run's; kthreads: the kernel's threads), and items read from peers:", "",
                  "| config | slowest epoch s | s per server | CPU main | workers | redis | relays | total | "
                  "machine | irq | others | kthreads | remote items |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for side, med in sh_["median_slowest_epoch_s"].items():
            c = sh_["cpu_median_per_epoch"][side]
            lines.append(f"| {side} | {med:.2f} | "
                         + "/".join(f"{x:.2f}" for x in sh_["median_epoch_s_per_server"][side])
                         + f" | {c['ranks_main_s']:.2f} | {c['workers_s']:.2f} | {c['redis_s']:.2f} | "
                         f"{c['relay_s']:.2f} | {c['total_s']:.2f} | {c['machine_busy_s']:.2f} | "
                         f"{c['machine_irq_s']:.2f} | {c['other_procs_s']:.2f} | {c['kernel_threads_s']:.2f} | "
                         f"{c['remote_items']:.0f} |")
    if "median_time_ratio" in sh_:
        lines += ["", f"From epoch 2: partitioned storage bytes {sh_['partitioned_storage_bytes_from_epoch_2']}; "
                  f"slowest-server epoch time partitioned / reference per epoch "
                  f"{sh_['time_ratio_partitioned_over_reference']}, of the medians {sh_['median_time_ratio']} "
                  f"(target <= 1.2: {'met' if sh_['within_1_2x'] else 'NOT met'}). Extra CPU of partitioned over "
                  f"reference: {sh_['extra_cpu_s_per_epoch']} s per epoch (median)"
                  + (f", {sh_['extra_cpu_ms_per_remote_item']} ms per remote item"
                     if "extra_cpu_ms_per_remote_item" in sh_ else "")
                  + f"; CPU (this run's processes and the interrupts) partitioned / reference "
                  f"{_ratio_text(sh_['cpu_ratio_partitioned_over_reference'])} (the time ratio of a CPU-bound "
                  "epoch on a machine with nothing else running)."]
    if "interleaved" in sh_:
        iv = sh_["interleaved"]
        lines += ["", f"Interleaved pairs ({iv['pairs']} epochs of each side after their own epochs, alternating "
                  "partitioned and reference with both clusters alive, so that whatever else the machine does "
                  f"falls on both): partitioned / reference epoch time per pair {iv['time_ratios']}, median "
                  f"**{iv['median_time_ratio']}** (min {iv['min_time_ratio']}, max {iv['max_time_ratio']}; "
                  f"target <= 1.2: {'met' if iv['within_1_2x'] else 'NOT met'}); CPU per pair "
                  f"[{', '.join(_ratio_text(x) for x in iv['cpu_ratios'])}], "
                  f"median {_ratio_text(iv['median_cpu_ratio'])}."]
    lines += ["", f"Load average (1/5/15 min) before the run {fmt_load(result['load_before'])}, after "
              f"{fmt_load(result['load_after'])}, on {result['machine']['cores_online']} "
              "CPU(s).", "", "Command:", "", "    " + result["command"], ""]
    return "\n".join(lines)


def fmt_load(load) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def orchestrate(args) -> int:
    import coordl

    why = why_not()
    if why:
        print(f"bench: cluster bench skipped: {why}", flush=True)
        return 2 if args.require else 0
    lock = take_lock()
    load_before = os.getloadavg()
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    atexit.register(cleanup)
    try:
        cleanup()   # a killed run's objects (we hold the lock: no live run owns them)
        if args.cleanup:
            print("bench: cluster objects removed", flush=True)
            return 0
        ds = coordl.ImageFolder(args.data, transform="val")
        total = ds.manifest.total_bytes
        files = [ds.manifest.path(i) for i in range(len(ds))]
        budget = int(args.budget_fraction * total)
        netem = has_netem()
        relay = not netem and latency_ms(args.latency) > 0
        build_network(args.servers, args.bandwidth, latency_ms(args.latency), netem)
        tmp = tempfile.mkdtemp(prefix=TMPS)
        storage_cg = storage_cgroup(cgroup.disk_of(args.data), int(args.storage_mbps * MiB))
        names = args.sides.split(",")
        for side in names:
            if side not in SIDES:
                raise SystemExit(f"bench: --sides {side!r}: use some of {','.join(SIDES)}")
        paired = args.pairs > 0 and {"partitioned", "reference"} <= set(names)
        if not paired:
            args.pairs = 0
        sides, cpu, alive = {}, {}, {}
        for side in names:
            s = Side(args, side, budget, total, files, storage_cg, tmp, relay)
            s.run()
            sides[side], cpu[side] = s.rows, s.cpu_rows
            if paired and side in ("partitioned", "reference"):
                alive[side] = s   # kept for the interleaved pairs
            else:
                s.stop()
        pairs = run_pairs(alive["partitioned"], alive["reference"], args.pairs) if paired else None
        for s in alive.values():
            s.stop()
        pagecache.evict(files)
        result = {"command": report.command(), "dataset": report.dataset(args.data), "versions": report.versions(),
                  "machine": report.machine(sorted(os.sched_getaffinity(0))),
                  "settings": {"servers": args.servers, "bandwidth": args.bandwidth, "latency": args.latency,
                               "storage_mbps": args.storage_mbps, "budget_fraction": args.budget_fraction,
                               "epochs": args.epochs, "workers": args.workers, "batch_size": args.batch_size,
                               "size": args.size, "node_timeout": args.node_timeout, "step_ms": args.step_ms,
                               "pairs": args.pairs},
                  "latency_via": "tc netem" if netem else ("a delay relay in front of each redis-server "
                                                           "(this kernel has no sch_netem)" if relay else "none"),
                  "link_measured": links_measured[-1] if links_measured else None,
                  "budget_bytes": budget, "dataset_bytes": total, "sides": sides, "cpu": cpu,
                  "load_before": load_before, "load_after": os.getloadavg()}
        result["shape"] = shape(args, sides, cpu)
        if pairs is not None:
            result["shape"]["interleaved"] = pairs
        report.write(args.out, result, markdown(args, result))
        return 0
    finally:
        cleanup()
        os.close(lock)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="an ImageFolder root (coordl make-dataset DIR ...)")
    p.add_argument("--out", default=None, help="writes OUT.json and OUT.md")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--bandwidth", default="1gbit", help="each link's rate, each way (tc syntax; default 1gbit)")
    p.add_argument("--latency", default="0.2ms", help="one-way latency added per link (default 0.2ms)")
    p.add_argument("--storage-mbps", type=float, default=10.0, help="shared storage read limit, MiB/s in all")
    p.add_argument("--budget-fraction", type=float, default=0.4, help="per-server budget / dataset bytes")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--node-timeout", type=float, default=1.0, help="PartitionedCache timeout, s")
    p.add_argument("--step-ms", type=float, default=0.0, help="a sleep per batch standing for a train step")
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--pairs", type=int, default=6,
                   help="after the sides' own epochs, this many epochs of partitioned and of reference "
                        "alternating, both alive (0: none; needs both sides)")
    p.add_argument("--require", action="store_true", help="exit 2 (not 0) when the machine cannot run it")
    p.add_argument("--cleanup", action="store_true", help="only remove what a killed run left")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    p.add_argument("--relay", metavar="IP", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.relay:
        relay_main(args.relay, PORT, REDIS_PORT, latency_ms(args.latency) / 1e3)
        return
    if args.rank is not None:
        rank_main(args)
        return
    if not args.data and not args.cleanup:
        p.error("--data DIR is required (an ImageFolder, e.g. made with coordl make-dataset)")
    if args.data:
        args.data = os.path.abspath(args.data)
    sys.exit(orchestrate(args))


if __name__ == "__main__":
    main()
