"""What the Ray executor needs of Ray itself: connecting (a cluster on the loopback too), the
cluster's nodes as run.json records them, a worker's death in one line, and Ray's own output
kept off stdout.

Importing this module imports Ray; without it, it says how to install it.
"""

from __future__ import annotations

import logging
import re
import socket
from typing import Any

from attnbench.errors import AttnbenchError

__all__ = [
    "RayError",
    "connect",
    "death_reason",
    "node_records",
    "quiet_ray_errors",
    "ray",
]

try:
    import ray
    from ray.exceptions import RayError
except ImportError:  # pragma: no cover - exercised by a test that hides ray
    raise AttnbenchError(
        '--executor ray needs Ray, which is not installed: pip install "attnbench[ray]"'
    ) from None


def quiet_ray_errors() -> None:
    """Send Ray's own copy of a worker's death to Ray's logger, not to stdout.

    The driver prints each error the cluster publishes ("(raylet) A worker died or was
    killed ...", in colour) to stdout from a thread of its own, whatever ``log_to_driver``
    says; stdout is for attnbench's product only. attnbench records each death in run.json
    (``end_reason``, ``workers_failed``) and says it in a line of its own. The thread looks
    the printer up by name when it prints, so replacing it is enough; a Ray without it is
    left as it is.
    """
    module = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(module, "print_to_stdstream", None)
    if original is None or getattr(original, "quiet", False):
        return

    def to_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        if data.get("pid") == "raylet":
            logging.getLogger("ray").info("%s", " ".join(map(str, data.get("lines", []))))
            return
        original(data, ignore_prefix)

    to_log.quiet = True  # type: ignore[attr-defined]  # ray's logger hook reads this attribute
    module.print_to_stdstream = to_log  # type: ignore[union-attr]  # ray's untyped module attribute


def death_reason(exc: BaseException) -> str:
    """One line saying why a Ray worker died or could not start."""
    text = str(exc)
    # The cause Ray reports last is the most specific: an exception raised in the actor's
    # creation ("AttnbenchError: ...") or the death cause ("The actor died because ...").
    raised = re.findall(r"^\s*(?:\w+\.)*(\w+(?:Error|Exception)): (.+)$", text, re.MULTILINE)
    if raised and raised[-1][0] not in ("ActorDiedError", "RayActorError"):
        kind, message = raised[-1]
        return f"{kind}: {message.strip()}"[:240]
    # "The actor died because its node has died. Node Id: ...", then, indented, how the node
    # ended ("the actor's node was terminated unexpectedly: health check failed ...").
    cause = re.search(
        r"^(.*(?:died|is dead) because.*)$(?:\n\s+(?!File )(\S.*)$)?", text, re.MULTILINE
    )
    if cause:
        return "; ".join(part.strip() for part in cause.groups() if part)[:300]
    for line in text.splitlines():
        line = line.strip()
        if "died" in line.lower() or "killed" in line.lower() or "exit" in line.lower():
            return line[:240]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}"[:240]


def connect(address: str | None, **options: Any) -> None:
    """``ray.init`` that can reach a cluster listening on the loopback only.

    Ray turns "127.0.0.1" and "localhost" in an address into the machine's network address
    (ray-project/ray#59110). A cluster from ``ray start`` listens there too, and is reached;
    one that listens on the loopback only (nodes started with ``node_ip_address="127.0.0.1"``,
    a test's cluster) never is: the connection retries for minutes. When nothing answers at the
    network address, the address is taken as written, and this process joins as the loopback
    node.
    """
    host, _, port = (address or "").rpartition(":")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
        ray.init(address=address, **options)
        return
    try:
        with socket.create_connection((ray.util.get_node_ip_address(), int(port)), timeout=2):
            reachable = True  # Ray's own resolution reaches the cluster
    except OSError:
        reachable = False
    if reachable:  # ray.init's own errors (ConnectionError is an OSError) are the caller's
        ray.init(address=address, **options)
        return
    from ray._private import services  # only for this case

    resolve = services.resolve_ip_for_localhost
    services.resolve_ip_for_localhost = lambda host: host
    try:
        ray.init(address=address, _node_ip_address="127.0.0.1", **options)
    finally:
        services.resolve_ip_for_localhost = resolve


def node_records() -> list[dict[str, Any]]:
    """Every node the cluster has known, alive or dead, as run.json's cluster.nodes lists it."""
    records = []
    for node in ray.nodes():
        record = {
            "node_id": node.get("NodeID"),
            "hostname": node.get("NodeManagerHostname"),
            "address": node.get("NodeManagerAddress"),
            "cpus": node.get("Resources", {}).get("CPU", 0),
            "gpus": node.get("Resources", {}).get("GPU", 0),
            "alive": bool(node.get("Alive")),
        }
        if not record["alive"]:
            record["death"] = node.get("DeathReasonMessage") or "dead"
        records.append(record)
    return records
