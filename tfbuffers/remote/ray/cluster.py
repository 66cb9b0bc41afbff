"""Ray for the Ray-hosted buffer: imported when asked for, a private local cluster started when none is there.

`ensure_ray` connects this process to `address` (or `RAY_ADDRESS`), or starts a local cluster without dashboard
or job server, with token authentication on, and logs the ports it listens on (`listening`); `call` waits for an
actor's method and raises what the actor raised. Only the modules of `tfbuffers.remote.ray` import Ray (the
`ray` extra), and only when a buffer is made or connected.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)


NAMESPACE = "tfbuffers"
"""The Ray namespace of every buffer's actor: `RayReplayBuffer.connect(name)` finds it from any driver."""


NO_RAY = "RayReplayBuffer needs Ray, which did not import ({error}). Install the extra: pip install 'tfbuffers[ray]'"


STARTED = (
    "tfbuffers started a local Ray cluster for RayReplayBuffer (no dashboard, no job server; token authentication "
    "%s). Listening: %s. Ray's GCS, raylet and workers listen on every interface whatever the node address: keep "
    "these ports private to the machine (docs/scaling.md). It stops when this process exits."
)


def import_ray() -> Any:
    """The `ray` module; an ImportError naming the extra to install when it does not import."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(NO_RAY.format(error=error)) from error
    return ray


def ensure_ray(address: str | None = None) -> Any:
    """Ray, connected: the running connection, the cluster at `address` (or `RAY_ADDRESS`), or a new local one.

    A driver joining a cluster at an address sends the cluster's token where Ray finds one
    (`RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`, `~/.ray/auth_token`) and `RAY_AUTH_MODE` is unset.

    A new local cluster has no dashboard and keeps Ray's token authentication on (`RAY_AUTH_MODE=token`
    unless the environment says otherwise); one log line says which ports it listens on.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        # Ray sends a token to an address only when RAY_AUTH_MODE=token, and a cluster with token
        # authentication (what a local start makes) refuses drivers without: with a token at hand
        # and no mode set, send it, as Ray itself does for address="auto".
        with contextlib.suppress(ImportError):  # Ray before 2.52 has no token authentication
            from ray._private.authentication import authentication_token_setup

            authentication_token_setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        return ray
    # Ray 2.52+ turns token authentication on for a new local cluster unless RAY_AUTH_MODE says otherwise.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    auth = "on" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "OFF (RAY_AUTH_MODE=disabled)"
    token = private_token() if auth == "on" else None
    if token is not None:
        auth += f"; its token file {token} made readable by its owner only"
    sockets = listening(ray_processes())
    described = ", ".join(f"{name} {address}:{port}" for name, address, port in sockets) or "none found"
    logger.warning(STARTED, auth, described)
    return ray


def private_token() -> pathlib.Path | None:
    """Ray's default token file (`~/.ray/auth_token`), made mode 0600 if others could read it; else None.

    Ray writes it with the process's umask (0644 here): any local user could then read the token and
    join the cluster. A token given by `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH` is the user's own: left.
    """
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    token = pathlib.Path.home() / ".ray" / "auth_token"
    try:
        if not token.stat().st_mode & 0o077:
            return None
        token.chmod(0o600)
    except OSError:  # no token file (authentication off), or not ours to change
        return None
    return token


def ray_processes() -> list[int]:
    """The pids of the processes this one started (Ray's GCS, raylet, workers, ...), read from `/proc`."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return sorted(found)


def listening(pids: Sequence[int]) -> list[tuple[str, str, int]]:
    """`(process name, address, port)` of every TCP socket the processes `pids` listen on ("*" for every interface).

    Read from `/proc/net/tcp`, `/proc/net/tcp6` and each process's descriptors (Linux).
    """
    sockets: dict[str, tuple[str, int]] = {}
    for table, width in (("tcp", 8), ("tcp6", 32)):
        with contextlib.suppress(OSError):
            for line in pathlib.Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] != "0A":  # LISTEN
                    continue
                hex_address, hex_port = parts[1].split(":")
                sockets[parts[9]] = (_address(hex_address, width), int(hex_port, 16))
    found = set()
    for pid in pids:
        try:
            name = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
            descriptors = list(pathlib.Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for descriptor in descriptors:
            with contextlib.suppress(OSError):
                target = os.readlink(descriptor)
                if target.startswith("socket:[") and target[8:-1] in sockets:
                    found.add((name, *sockets[target[8:-1]]))
    return sorted(found, key=lambda entry: (entry[2], entry[0]))


def _address(hex_address: str, width: int) -> str:
    raw = bytes.fromhex(hex_address)
    if width == 8:
        ip = ".".join(str(b) for b in raw[::-1])
        return "*" if ip == "0.0.0.0" else ip
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]  # four little-endian words
    packed = b"".join(words)
    if packed == bytes(16):
        return "*"
    if packed[:12] == bytes(10) + b"\xff\xff":
        return ".".join(str(b) for b in packed[12:])
    return ":".join(packed[i : i + 2].hex() for i in range(0, 16, 2))


RESTART_SECONDS = 120.0
"""How long a call waits for Ray to restart a buffer's actor (`max_restarts`) before it gives up."""


def call(actor: Any, method: str, *args: Any, restarts: bool = False) -> Any:
    """`actor.method(*args)`, waited for; an exception the actor raised is raised as it was raised there.

    `restarts`: the actor is restarted by Ray when its process dies, and the call may run again (it changes
    nothing twice): if it died, the call is made again once the actor is back (`wait_for_restart`).
    """
    ray = import_ray()
    while True:
        try:
            return ray.get(getattr(actor, method).remote(*args))
        except ray.exceptions.RayTaskError as error:
            raise cause_of(error) from None
        except ray.exceptions.RayActorError:
            if not restarts:
                raise
            wait_for_restart(actor)


def wait_for_restart(actor: Any, seconds: float | None = None) -> None:
    """Returns once the actor answers again (Ray restarted it); raises Ray's error past `seconds`.

    Raises:
      ray.exceptions.RayActorError: If the actor is dead for good, or not back within `RESTART_SECONDS`.
    """
    ray = import_ray()
    deadline = time.monotonic() + (RESTART_SECONDS if seconds is None else seconds)
    while True:
        try:
            ray.get(actor.ping.remote(), timeout=max(0.1, deadline - time.monotonic()))
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:  # dead for good (its restarts spent), or not back in time
                raise
            time.sleep(0.1)


def cause_of(error: BaseException) -> BaseException:
    """The exception a remote call raised, as it was raised in the actor (Ray wraps it)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error
