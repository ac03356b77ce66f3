"""A pipe message between shards that cannot be read stops the node, loudly.

Only the node's own shards write to its pipes, so such a message is our bug, and the request
it carried can never be answered: dropping it (as before) left that request's client waiting
forever. Now the receiving shard logs which pipe broke and why and exits (EX_SOFTWARE), and
the supervisor stops the node, exit 1, as it does for any shard that dies.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import pytest
import zmq

from shards.pipes import pipe_path
from shards.shard import EXIT_PIPE_BROKEN
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def run_dir_of(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--run-dir") + 1].decode()


@pytest.mark.parametrize(
    "message",
    [
        [b"\xc1", b"payload"],  # a header that is not msgpack: the pipe itself breaks
        [msgpack.packb({"t": "bogus", "id": 7})],  # one the router has no use for
    ],
)
def test_an_unreadable_pipe_message_stops_the_node(tmp_path: Path, message: list[bytes]) -> None:
    node = BrokerProcess(tmp_path / "data", smp=2).start()
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    try:
        assert node.process is not None
        push.setsockopt(zmq.LINGER, 0)
        push.connect("ipc://" + pipe_path(run_dir_of(node.shard_pids()[1]), 0, 1))
        push.send_multipart(message)
        deadline = time.monotonic() + 30
        while node.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        code = node.process.poll()
        log = node.log()
        assert code == 1, (code, log[-3000:])
        assert "pipe from shard 0 broken" in log, log[-3000:]
        assert f"exited with code {EXIT_PIPE_BROKEN}" in log, log[-3000:]
    finally:
        push.close(linger=0)
        context.term()
        node.kill9() if node.alive() else node.stop()
