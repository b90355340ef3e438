"""The rendezvous store the ranks of a fragment meet at: where it listens, its keys kept from clients without the
run's secret, its memory apart from the orchestrator's, no noise in the user's terminal, and no process left
behind."""
import sys
from pathlib import Path

import pytest


def _listening_on(port: int) -> list[str]:
    listening = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return [f[1] for f in listening if f[3] == "0A" and int(f[1].split(":")[1], 16) == port]


def test_loopback_rendezvous_store_listens_on_loopback_only():
    from parsl_bft.train.launcher import serve_store
    store = serve_store()
    assert _listening_on(store.port) == [f"0100007F:{store.port:04X}"]
    store.close()


def test_a_pilots_rendezvous_store_listens_on_the_interchange_address_only():
    """It listened on every interface; now on the address the pilots reach this host on (an address of this
    host that is not loopback, when there is one)."""
    import ipaddress
    import socket

    from parsl_bft.train.launcher import serve_store
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))                 # no packet is sent: the kernel picks the source address
        mine = [probe.getsockname()[0]]
    except OSError:
        mine = []
    finally:
        probe.close()
    if not mine or ipaddress.ip_address(mine[0]).is_loopback:
        pytest.skip("this host has no IPv4 address but loopback")
    store = serve_store(mine[0])
    hexed = "".join(f"{int(b):02X}" for b in reversed(mine[0].split(".")))
    assert _listening_on(store.port) == [f"{hexed}:{store.port:04X}"]
    assert store.address().endswith(f"@{mine[0]}:{store.port}")
    store.close()


def test_the_rendezvous_store_keeps_its_keys_from_clients_without_the_secret_and_its_memory_apart():
    """A client with no credentials stored 190 x 8 MB keys in the orchestrator's own process. Now: the store is a
    process of its own whose memory is capped (the flood is cut off there, the store goes on serving the run),
    and every key of the run is under a secret: a client without it neither sees nor changes them."""
    import resource
    from datetime import timedelta

    from torch._C._distributed_c10d import TCPStore

    from parsl_bft.train.launcher import RendezvousStore
    from parsl_bft.train.rank import open_store
    store = RendezvousStore(memory=64 << 20)
    store.set("f1/result", "ours")
    rank = open_store(store.address(), 30)              # what a rank is handed: SECRET@HOST:PORT
    assert rank.get("f1/result") == b"ours"
    stranger = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=30))
    assert not stranger.check(["f1/result"])
    stranger.set("f1/result", "theirs")
    assert store.get("f1/result") == b"ours"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(Exception, match=r"(?i)broken pipe|reset|closed"):
        for i in range(40):                             # 320 MB, five times the store's memory
            stranger.set(f"k{i}", b"x" * (8 << 20))
    assert store.alive() and store.get("f1/result") == b"ours"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10     # KiB: not here
    store.close()
    assert not store.alive()


def test_a_flood_of_keys_prints_nothing_into_the_users_terminal():
    """The store cut a flooding client off, but printed C++ stack traces into the terminal of the run (its
    stderr was the orchestrator's). The orchestrator here is a process whose stderr is a pipe; the flooding
    client silences its own; what is left there is the store's."""
    import subprocess
    script = """
import os, time
from datetime import timedelta
from torch._C._distributed_c10d import TCPStore
from parsl_bft.train.launcher import RendezvousStore
store = RendezvousStore(memory=64 << 20)
stranger = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=30))
os.dup2(os.open(os.devnull, os.O_WRONLY), 2)          # the flooding client's own complaints
try:
    for i in range(40):
        stranger.set(f"k{i}", b"x" * (8 << 20))
except Exception:
    pass
store.set("after", "flood")
print(store.get("after").decode(), store.alive(), flush=True)
store.close()
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.stdout.split() == ["flood", "True"], r.stderr[-2000:]
    assert "frame #" not in r.stderr and "TCPStore" not in r.stderr, r.stderr[-2000:]


def test_the_rendezvous_store_dies_with_the_process_that_serves_it(tmp_path):
    """Like the interchange: a SIGKILLed orchestrator leaves no store process behind."""
    import subprocess

    from harness import alive, wait_for
    script = ("import os, sys; from parsl_bft.train.launcher import serve_store; s = serve_store(); "
              "print(s._proc.pid, flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    assert Path(f"/proc/{pid}").exists()
    parent.kill()
    parent.wait()
    wait_for(lambda: not alive(pid), 60, 0.1, what="the store's process to end")
