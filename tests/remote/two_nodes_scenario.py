"""A Ray cluster of two nodes on this machine (loopback only), a buffer on one, writers on the other.

Run as a process of its own by `ray_cluster_test.py` (it starts and stops its own cluster, apart from the
test process's): `python two_nodes_scenario.py DIRECTORY SECONDS [LAYOUT]`. Prints one line, `RESULT` and JSON: what
every writer session returned, what the buffer holds, what the learner sampled.

The writers are Ray actors on the writer node. For SECONDS (and at least six sessions and the buffer's death),
sessions join and leave: each claims one
segment, adds traced frames (its own writer id, its segment, its step; an episode of 5 frames at a time)
and then closes, drops its writer without `close()`, or is killed (SIGKILL of its worker process). A
learner in this driver samples windows of 2 throughout, and the buffer's own actor is killed once,
halfway (Ray restarts it from its directory). LAYOUT: the buffer's, `elastic` (its segments sharing one
storage, the default, which CI runs) or `segments`, memory-mapped under DIRECTORY either way.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time

import numpy as np
from traced_frames import TRACED

from tfbuffers import RayReplayBuffer

EPISODE = 5
SEGMENTS = 4
LEASE = 2.0
RESULT = "RESULT "  # the line holding the result (Ray's own processes print to stdout too)


def traced(writer: int, segment: int, step: int) -> dict[str, np.ndarray]:
    first_or_last = step % EPISODE in (0, EPISODE - 1)
    value = np.float32(writer * 1_000_000 + segment * 1_000 + step)
    return {
        "writer": np.array([writer], np.int64),
        "env": np.array([segment], np.int64),
        "step": np.array([step], np.int64),
        "step_type": np.array([0 if step % EPISODE == 0 else (2 if first_or_last else 1)], np.int32),
        "obs": np.full([1, 4], value, np.float32),
    }


class Session:
    """One writer session on the writer node (a Ray actor there): claims a segment, adds, and ends as told."""

    def __init__(self, buffer: RayReplayBuffer, writer_id: int) -> None:
        self.writer = buffer.writer(1)
        self.id = writer_id

    def where(self) -> tuple[str, int, int]:
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid(), self.writer.segments[0]

    def add(self, steps: int, pause: float) -> int:
        segment = self.writer.segments[0]
        for step in range(steps):
            self.writer.add_batch(traced(self.id, segment, step))
            time.sleep(pause)
        return steps

    def end(self, how: str) -> None:
        if how == "close":
            self.writer.close()
        else:  # "drop": the writer goes out of scope without close()
            del self.writer
            gc.collect()


def main(directory: str, seconds: float, layout: str = "elastic") -> dict:
    """Runs the scenario on a cluster of its own; Ray is imported here, after its environment is set.

    (Importing this module does nothing else: pytest imports it for its doctests.)
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every address Ray picks is 127.0.0.1: loopback only
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray
    from ray.cluster_utils import Cluster

    session_actor = ray.remote(num_cpus=0, resources={"writer_node": 1})(Session)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"buffer_node": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, resources={"writer_node": 64})
    ray.init(address=cluster.address, log_to_driver=False)
    nodes = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    buffer = RayReplayBuffer(
        TRACED, batch_size=SEGMENTS, max_length=20_000, episode_boundaries=True, layout=layout,
        directory=directory, max_restarts=-1, writer_lease=LEASE, seed=0,
        actor_options={"resources": {"buffer_node": 0.01}},
    )  # fmt: skip

    @ray.remote(num_cpus=0)
    def buffer_node() -> str:
        return ray.get_runtime_context().get_node_id()

    stop = threading.Event()
    sampled = {"batches": 0, "bad_windows": 0}

    def learn() -> None:
        while max(buffer.frames_per_segment()) < 2:  # a window of two frames first
            if stop.wait(0.05):
                return
        dataset = iter(buffer.as_dataset(sample_batch_size=32, num_steps=2))
        while not stop.is_set():
            items, _ = next(dataset)
            writer, env, step = (np.asarray(items[key]) for key in ("writer", "env", "step"))
            obs = np.asarray(items["obs"])
            good = (writer == writer[:, :1]).all(1) & (env == env[:, :1]).all(1) & (step[:, 1] - step[:, 0] == 1)
            good &= (obs == (writer * 1_000_000 + env * 1_000 + step)[..., None].astype(np.float32)).all((1, 2))
            sampled["bad_windows"] += int((~good).sum())
            sampled["batches"] += 1

    learner = threading.Thread(target=learn)
    learner.start()
    sessions, killed_buffer, rng, writer_id = [], False, np.random.default_rng(0), 0
    start = time.monotonic()
    # At least SECONDS, and at least two sessions of each kind and the buffer's death: a loaded machine starts a
    # session's worker process (TensorFlow's import) in seconds, so a time bound alone may see two sessions.
    while time.monotonic() - start < seconds or len(sessions) < 6 or not killed_buffer:
        running = []
        for _ in range(2):  # two sessions at a time, on the writer node
            writer_id += 1
            session = session_actor.remote(buffer, writer_id)
            try:
                node, pid, segment = ray.get(session.where.remote())
            except ray.exceptions.RayTaskError:  # no free segment yet: a killed session's lease runs out
                ray.kill(session)
                time.sleep(0.5)
                continue
            how = ["close", "drop", "kill"][writer_id % 3]
            # A killed one dies mid-run: it would add for hours (a loaded machine can take over 10 s to reach its
            # kill, behind the other session's end and the buffer's restart).
            steps = 1_000_000 if how == "kill" else int(rng.integers(20, 80))
            running.append((session, writer_id, node, pid, segment, how, steps, session.add.remote(steps, 0.005)))
        if not killed_buffer and time.monotonic() - start > seconds / 2:
            os.kill(ray.get(buffer.actor.ping.remote()), signal.SIGKILL)  # the buffer's actor dies; Ray restarts it
            killed_buffer = True
        for session, wid, node, pid, segment, how, steps, added in sorted(running, key=lambda run: run[5] != "kill"):
            if how == "kill":  # first, while it adds
                time.sleep(0.05 + rng.random() * 0.2)  # mid-run
                os.kill(pid, signal.SIGKILL)
                returned = None  # unknown: at most the adds it made
            else:
                returned = ray.get(added)
                ray.get(session.end.remote(how))
            sessions.append({"writer": wid, "node": node, "segment": segment, "how": how, "steps": steps,
                             "returned": returned})  # fmt: skip
    deadline = time.monotonic() + 20 * LEASE
    while buffer.writer_report()["claims"] and time.monotonic() < deadline:  # dropped: stored; killed: expire
        time.sleep(0.2)
    stop.set()
    learner.join()
    stored, segments_of = {}, {}
    for segment in range(SEGMENTS):
        frames = buffer.gather_segment(segment)
        for writer, step in zip(np.asarray(frames["writer"]).tolist(), np.asarray(frames["step"]).tolist()):
            stored.setdefault(writer, []).append(step)
            segments_of.setdefault(writer, set()).add(segment)
    result = {
        "nodes": nodes,
        "buffer_node": ray.get(buffer_node.options(resources={"buffer_node": 0.01}).remote()),
        "buffer_restarted": killed_buffer,
        "sessions": sessions,
        "stored": {str(writer): steps for writer, steps in stored.items()},
        "segments_of": {str(writer): sorted(segments) for writer, segments in segments_of.items()},
        "report": buffer.writer_report(),
        "sampled": sampled,
    }
    buffer.close()
    ray.shutdown()
    cluster.shutdown()
    return result


if __name__ == "__main__":
    print(RESULT + json.dumps(main(sys.argv[1], float(sys.argv[2]), *sys.argv[3:4])), flush=True)
