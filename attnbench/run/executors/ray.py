"""The Ray executor: a sweep's cases on the workers of a Ray cluster (``--executor ray``).

One long-lived actor per worker, so torch's import, the CUDA context and the profiler start-up
are paid once per worker rather than once per case. A timed case never shares its device: a
GPU worker holds one whole GPU (``num_gpus=1``), a CPU worker as many CPUs as it runs threads.
A worker that dies (killed, out of memory, its node gone) loses only the job it was running; it
is replaced, and the runner decides whether that job runs again.

Importing this module imports Ray; ``attnbench.run.executors.make_executor`` does so only when
asked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import torch

from attnbench._version import __version__
from attnbench.devices import DEVICE_CHOICES, check_dtype
from attnbench.errors import AttnbenchError
from attnbench.layers import plugins
from attnbench.measure.timing.allocator import DEFAULT_ALLOCATOR
from attnbench.results.environment import environment
from attnbench.results.files import now_iso
from attnbench.run.executors.base import Job, JobDone, Placement, Take, local_ceilings
from attnbench.run.executors.ray_cluster import (
    RayError,
    connect,
    death_reason,
    node_records,
    quiet_ray_errors,
    ray,
)
from attnbench.run.executors.worker import Worker
from attnbench.spec import Grid

START_TIMEOUT_S = 120.0  # how long workers may take to start (placement, torch, CUDA)
# A cluster that starts its workers slowly (containers pulled, a busy machine) sets a longer one.
START_TIMEOUT_ENV = "ATTNBENCH_RAY_START_TIMEOUT"


def start_timeout() -> float:
    """Seconds workers may take to start: $ATTNBENCH_RAY_START_TIMEOUT, else START_TIMEOUT_S."""
    text = os.environ.get(START_TIMEOUT_ENV)
    if text is None:
        return START_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise AttnbenchError(f"{START_TIMEOUT_ENV}={text!r}: expected seconds, above 0")
    return value


class RayWorker:
    """The actor: one ``Worker`` on the device Ray gave it."""

    def __init__(
        self,
        device: str,
        threads: int | None,
        dtype: str,
        layers: list[dict[str, Any]],
        metric: str = "time",
        allocator: str = DEFAULT_ALLOCATOR,
    ) -> None:
        plugins.receive(layers)  # the sweep's plugin layers, as the driver loaded them
        check_dtype(dtype, device)  # on the worker's own GPU, not the driver's
        device_id = device
        if device.startswith("cuda"):
            ids = ray.get_gpu_ids()  # the physical GPU; the actor sees it as cuda:0
            device_id = f"cuda:{ids[0]}" if ids else device
        self.worker = Worker(
            device,
            threads,
            device_id=device_id,
            metric=metric,
            layers=layers,
            allocator=allocator,
        )

    def describe(self) -> dict[str, Any]:
        # Ray's id of the node: two nodes on one machine share a host name, never an id.
        return {**self.worker.describe(), "node_id": ray.get_runtime_context().get_node_id()}

    def run(self, job: Job) -> JobDone:
        return self.worker.run(job)


class RayExecutor:
    """Runs jobs on a Ray cluster: ``address`` as ``ray.init`` takes it ("auto" for the
    cluster ``ray start`` made here, ``ray://host:10001`` for a remote one; None starts a local
    instance unless Ray is already initialised in this process)."""

    # With no --threads, a case keeps torch's own threads (a node's cores: one case to a node),
    # not the one thread a local sweep takes on the CPU (``run_sweep`` reads this).
    keeps_torch_threads = True

    name = "ray"
    in_process = False

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        *,
        start_timeout_s: float | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise AttnbenchError(f"--workers must be 1 or more, got {workers}")
        self.address = address
        self.max_workers = workers
        self.start_timeout_s = start_timeout_s if start_timeout_s is not None else start_timeout()
        self._owns_ray = False
        self._asked_nodes: set[str | None] = set()  # nodes whose death Ray was asked to name
        if not ray.is_initialized():
            try:
                # A local instance of our own listens on the loopback only: no other machine
                # has any business with it.
                local = address is None and not os.environ.get("RAY_ADDRESS")
                connect(
                    address,
                    include_dashboard=False,
                    logging_level=logging.ERROR,
                    log_to_driver=False,
                    **({"_node_ip_address": "127.0.0.1"} if local else {}),
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                where = f"at {address!r}" if address else "here"
                # From Ray 2.59 `ray start --head` turns token authentication on; a connection
                # to a named address presents the token only when told to.
                token = (
                    "; if the cluster uses token authentication, set RAY_AUTH_MODE=token (and "
                    "RAY_AUTH_TOKEN on another machine than the head)"
                    if address not in (None, "auto") and "RAY_AUTH_MODE" not in os.environ
                    else ""
                )
                raise AttnbenchError(
                    f"no Ray cluster {where}: {str(exc).splitlines()[0] if str(exc) else exc}; "
                    f"start one with `ray start --head`, or leave out --address for a local one"
                    f"{token}"
                ) from None
            self._owns_ray = True
        quiet_ray_errors()
        self._actors: dict[Any, Placement] = {}  # live, started actors -> where they run
        # Every worker that ever started, as run.json's cluster.workers lists it: its record
        # (the same dict run.json holds, so a death or a replacement reaches the file with the
        # next save), with when it started and ended and why.
        self._lives: dict[Any, dict[str, Any]] = {}
        self._starting_actors: dict[Any, Any] = {}  # start reference -> actor not started yet
        self._record: dict[str, Any] = {}
        self.worker_resources: dict[str, Any] = {}
        self._args: tuple[Any, ...] = ()

    # -- what the cluster has

    def _nodes(self) -> list[dict[str, Any]]:
        return [node for node in ray.nodes() if node.get("Alive")]

    def _gpus(self) -> int:
        return int(ray.cluster_resources().get("GPU", 0))

    def resolve_device(self, name: str, dtype: str) -> str:
        name = name.strip().lower()
        gpus = self._gpus()
        if name == "auto":
            return "cuda:0" if gpus else "cpu"
        if name == "cpu":
            return "cpu"
        if name in ("cuda", "cuda:0"):
            if not gpus:
                cpus = int(ray.cluster_resources().get("CPU", 0))
                raise AttnbenchError(
                    f"--device {name}: the Ray cluster has no GPU (it has {cpus} CPUs); "
                    "try --device cpu"
                )
            return "cuda:0"  # what each GPU worker sees its own GPU as
        if re.fullmatch(r"cuda:\d+", name):
            raise AttnbenchError(
                f"--device {name}: with --executor ray every worker holds one GPU and sees it as "
                "cuda:0; pass --device cuda to use all of the cluster's GPUs"
            )
        if name == "mps":
            raise AttnbenchError("--executor ray runs cases on cpu or cuda, not mps")
        raise AttnbenchError(f"unknown device {name!r}; accepted: {DEVICE_CHOICES}")

    def environment(self, device: str) -> dict[str, Any]:
        """This (driver) machine's record, with the workers' devices and threads."""
        env = environment("cpu")
        workers = self._record.get("workers", [])
        names = sorted({w["device_name"] for w in workers})
        threads = sorted({w["threads"] for w in workers})
        env.update(
            device=device,
            device_name=" + ".join(names),
            torch_threads=threads[0] if len(threads) == 1 else threads,
            cuda_device_count=sum(w["device_id"].startswith("cuda") for w in workers),
        )
        return env

    def ceilings(self, grid: Grid, fault_cost: float | None) -> dict[str, Any]:
        """The driver's, as its ``environment`` is: where the driver has fewer CPUs than
        --threads asks of the nodes, none, with why (``local_ceilings``)."""
        return local_ceilings(grid, fault_cost)

    # -- workers

    def start(self, grid: Grid) -> dict[str, Any]:
        if self._record:
            return self._record
        nodes = self._nodes()
        threads = grid.threads
        if grid.device.startswith("cuda"):
            count = self._gpus()
            self.worker_resources = {"num_gpus": 1, "num_cpus": threads or 1}
        else:
            threads = threads or torch.get_num_threads()
            cpus = [int(node["Resources"].get("CPU", 0)) for node in nodes]
            count = sum(c // threads for c in cpus)
            if count == 0:
                raise AttnbenchError(
                    f"--threads {threads}: no Ray node has {threads} CPUs (the largest has "
                    f"{max(cpus, default=0)}); pass a smaller --threads"
                )
            self.worker_resources = {"num_cpus": threads}
        if self.max_workers is not None:
            count = min(count, self.max_workers)
        shipped = plugins.shipment(grid.layers, portable=grid.metric == "instructions")
        self._args = (grid.device, threads, grid.dtype, shipped, grid.metric, grid.allocator)
        if count == 0:
            raise AttnbenchError(f"the Ray cluster has no GPU for --device {grid.device}")
        failures = self._await_start([self._spawn() for _ in range(count)])
        if not self._actors:
            raise AttnbenchError(f"no Ray worker could start: {failures[0]}")
        workers = [self._lives[actor] for actor in self._actors]
        versions = {w["attnbench_version"] for w in workers}
        if versions != {__version__}:
            raise AttnbenchError(
                f"the Ray workers run attnbench {', '.join(sorted(versions))}, this machine "
                f"{__version__}: install the same version on every node"
            )
        self._record = {
            "executor": self.name,
            "address": self.address or "local",
            "ray_version": ray.__version__,
            # Alive at the start; refreshed as workers die and when the sweep ends, so that
            # a node that died, or joined, is on record with its fate.
            "nodes": [n for n in node_records() if n["alive"]],
            "worker_resources": self.worker_resources,
            "workers": workers,
            "workers_failed": failures,
        }
        return self._record

    @property
    def workers(self) -> int:
        return len(self._actors)

    def _spawn(self) -> Any:
        """A new actor, and the reference that resolves once it has started."""
        actor = (
            ray.remote(RayWorker)
            .options(max_restarts=0, max_task_retries=0, **self.worker_resources)
            .remote(*self._args)
        )
        ref = actor.describe.remote()  # type: ignore[attr-defined]  # ray adds .remote at runtime
        self._starting_actors[ref] = actor
        return ref

    def _await_start(self, refs: list[Any]) -> list[str]:
        """Wait for the actors behind ``refs`` to start; why the others did not."""
        failures: list[str] = []
        deadline = time.monotonic() + self.start_timeout_s
        while refs:
            ready, refs = ray.wait(
                refs, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not ready:
                break
            self._started(ready[0], failures)
        for ref in refs:  # never placed in time: the cluster is short of resources
            ray.kill(self._starting_actors.pop(ref), no_restart=True)
            failures.append(f"not started within {self.start_timeout_s:.0f} s")
        return failures

    def _started(self, ref: Any, failures: list[str]) -> Any | None:
        """Make the actor behind ``ref`` a worker; None (and why, in ``failures``) if it died."""
        actor = self._starting_actors.pop(ref)
        try:
            described = ray.get(ref)
        except RayError as exc:
            failures.append(death_reason(exc))
            return None
        self._actors[actor] = Placement(
            node=described["node"],
            device_id=described["device_id"],
            device_name=described["device_name"],
            threads=described["threads"],
        )
        self._lives[actor] = {**described, "started": now_iso(), "ended": None, "end_reason": None}
        return actor

    # -- running

    def run(self, take: Take) -> Iterator[JobDone]:
        completed = False
        try:
            yield from self._run(take)
            completed = True
        finally:  # the workers still alive end here: the sweep is done, or stopped
            for actor in self._actors:
                life = self._lives[actor]
                if life["end_reason"] is None:
                    life.update(ended=now_iso(), end_reason="finished" if completed else "stopped")
            self._refresh_nodes()

    def stopped(self) -> None:
        """The sweep was stopped (Ctrl-C, SIGTERM): the workers it ended did not finish it."""
        for actor in self._actors:
            life = self._lives[actor]
            if life["end_reason"] == "finished":
                life["end_reason"] = "stopped"

    def _refresh_nodes(self) -> None:
        """The nodes of the record, each with whether it is alive now (and if not, why); the
        nodes that joined since, where a worker of the sweep ran."""
        if "nodes" not in self._record:
            return
        with contextlib.suppress(RayError, ConnectionError, RuntimeError):
            now = {n["node_id"]: n for n in node_records()}
            ran_on = {life.get("node_id") for life in self._lives.values()}
            listed = [now.get(n.get("node_id"), n) for n in self._record["nodes"]]
            ids = {n.get("node_id") for n in listed}
            listed += [n for i, n in now.items() if i in ran_on and i not in ids]
            self._record["nodes"][:] = listed

    def _run(self, take: Take) -> Iterator[JobDone]:
        idle = list(self._actors)
        running: dict[Any, tuple[Any, Job]] = {}
        replacing = list(self._starting_actors)  # replacements still starting (a resume)
        failures: list[str] = []
        dead: list[dict[str, Any]] = []  # dead workers whose replacement has not started yet
        waiting_since = time.monotonic()
        while True:
            for actor in list(idle):
                job = take(self._actors[actor])
                if job is not None:
                    idle.remove(actor)
                    running[actor.run.remote(job)] = (actor, job)
            if not running and (idle or not replacing):
                return  # nothing running, and nothing left for any worker
            ready, _ = ray.wait([*running, *replacing], num_returns=1, timeout=1.0)
            if not ready:
                if not running and time.monotonic() - waiting_since > self.start_timeout_s:
                    raise AttnbenchError(
                        f"every Ray worker died and none could be started again within "
                        f"{self.start_timeout_s:.0f} s ({'; '.join(failures) or 'no resources'})"
                    )
                continue
            ref = ready[0]
            if ref in replacing:
                replacing.remove(ref)
                actor = self._started(ref, failures)
                if actor is not None:
                    idle.append(actor)
                    life = self._lives[actor]
                    if dead:  # each names the other: the story reads from either end
                        gone = dead.pop(0)
                        life["replaces"] = gone["pid"]
                        gone["replaced_by"] = life["pid"]
                    self._record.setdefault("workers", []).append(life)
                elif not self._actors and not replacing and not running:
                    raise AttnbenchError(f"every Ray worker died: {failures[-1]}")
                continue
            actor, job = running.pop(ref)
            try:
                done = ray.get(ref)
            except RayError as exc:  # the worker died (or its node): replace it
                where = self._actors.pop(actor)
                life = self._lives[actor]
                if _unavailable(exc) and life.get("node_id") not in self._asked_nodes:
                    self._asked_nodes.add(life.get("node_id"))  # once a node: Ray names its
                    exc = _named_cause(actor, exc)  # death in its other workers' errors then
                reason = death_reason(exc)
                life.update(ended=now_iso(), end_reason=f"died: {reason}")
                self._record.setdefault("workers_failed", []).append(
                    f"{life['node']} pid {life['pid']}: {reason}"
                )
                dead.append(life)
                self._refresh_nodes()  # if the node died, run.json says so from the next save
                ray.kill(actor, no_restart=True)
                replacing.append(self._spawn())
                waiting_since = time.monotonic()
                yield JobDone(job, where, lost=death_reason(exc))
                continue
            idle.append(actor)
            yield done

    def close(self) -> None:
        for actor in [*self._actors, *self._starting_actors.values()]:
            with contextlib.suppress(RayError):
                ray.kill(actor, no_restart=True)
        self._actors.clear()
        self._starting_actors.clear()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def _unavailable(exc: BaseException) -> bool:
    """Ray's "temporarily unavailable" (a Ray without ActorUnavailableError has none)."""
    kind = getattr(ray.exceptions, "ActorUnavailableError", None)
    return kind is not None and isinstance(exc, kind)


def _named_cause(actor: Any, exc: RayError, within_s: float = 10.0) -> RayError:
    """The error that says why ``actor`` is gone, where Ray says so within ``within_s``.

    A node killed mid-call first reads as ActorUnavailableError ("temporarily unavailable:
    Socket closed"), before Ray's control store has marked the actor dead and named its
    node's death (one run of the Ray tests in six kept the former): the actor is asked again
    until Ray answers ActorDiedError (returned), the actor answers after all, or ``within_s``
    passes (the first error, then, as it was). The sweep waits meanwhile: the executor asks
    once a node.
    """
    if not _unavailable(exc):
        return exc
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=left)
        except ray.exceptions.GetTimeoutError:
            break
        except RayError as later:
            if not _unavailable(later):
                return later  # dead, and why
            time.sleep(0.2)  # not marked yet
        else:
            break  # it answers: unavailable for a while, and back
    return exc
