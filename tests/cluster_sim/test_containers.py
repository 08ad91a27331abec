"""Container mode's parts against a real Docker engine (the `docker_engine` fixture:
DOCKER_HOST, or a private dockerd this session starts; they skip with the reason where
none can start): a node process per container life and what the harness reads from it
(exit statuses, crashes, a graceful stop), and the faults only containers give (pause,
a memory limit, a throttled data disk)."""
from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
import uuid

import pytest

import cluster_sim
from cluster_sim import containers, loopdisk
from cluster_sim.containerprocs import Box, ContainerProc, _status
from cluster_sim.diskfull import SimSkipped
from cluster_sim.procs import ROOT


def _proc(engine: containers.Engine, tmp_path, code: str, *, memory_mib: int = 0,
          extra: tuple[tuple[str, str, str], ...] = (), device: str = "",
          write_bps: int = 0) -> ContainerProc:
    """A Python program (not a node) in a container as the container mode runs one."""
    log = str(tmp_path / "p.log")
    open(log, "ab").close()
    box = Box(engine.image(), uuid.uuid4().hex[:6], (*containers.node_mounts(), (log, log, "rw"), *extra),
              memory_mib=memory_mib, device=device, write_bps=write_bps)
    return ContainerProc("p", [sys.executable, "-c", textwrap.dedent(code)], log, box=box,
                         host=engine.host)


def test_probe_gives_a_reason() -> None:
    ok, why = containers.available()
    assert ok or why


def test_exit_statuses_read_like_popen() -> None:
    # docker-init reports a child killed by signal N as 128+N; so does docker for the init
    assert _status(137) == -signal.SIGKILL and _status(143) == -signal.SIGTERM
    assert _status(0) == 0 and _status(1) == 1 and _status(2) == 2


def test_node_mounts_hold_interpreter_venv_and_checkout() -> None:
    mounts = containers.node_mounts()
    hosts = [h for h, c, m in mounts]
    assert all(h == c and m == "ro" for h, c, m in mounts)
    for path in (os.path.realpath(sys.executable), os.path.realpath(sys.prefix), ROOT):
        assert any(path == h or path.startswith(h + os.sep) for h in hosts), (path, hosts)
    # none inside another (a nested bind would hide nothing, but is noise)
    assert not any(a != b and a.startswith(b + os.sep) for a in hosts for b in hosts)


def test_no_engine_and_no_image_skip_with_the_reasons(monkeypatch, tmp_path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name, why in (("docker-up", "a private dockerd needs root"),
                      ("ferry-image", "debootstrap is not installed")):
        (scripts / name).write_text(f"#!/bin/sh\necho '{name}: {why}' >&2\nexit 3\n")
        (scripts / name).chmod(0o755)
    monkeypatch.setattr(containers, "SCRIPTS", str(scripts))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.delenv(containers.IMAGE_ENV, raising=False)
    with pytest.raises(SimSkipped, match=r"no Docker engine reachable at unix://.*needs root"):
        containers.Engine.find_or_start()
    with pytest.raises(SimSkipped, match="no node image: ferry-image: debootstrap is not installed"):
        containers.Engine("unix:///nowhere").image()


def test_pause_needs_container_mode(tmp_path) -> None:
    s = cluster_sim.Scenario(name="p", nodes=("n1", "n2"),
                             events=(cluster_sim.Event(10, "pause", "n1", duration_s=1.0),))
    with pytest.raises(SimSkipped, match="container mode"):
        cluster_sim.run(s, workdir=str(tmp_path))


def test_a_sigkill_of_itself_is_a_crash_and_our_kill_is_not(docker_engine, tmp_path) -> None:
    # an armed crash point SIGKILLs its own process: PID 1 of a namespace could not,
    # docker's init as PID 1 makes it work as for a plain process
    p = _proc(docker_engine, tmp_path, "import os, signal; print('up', os.getpid(), flush=True); "
                                       "os.kill(os.getpid(), signal.SIGKILL)")
    p.start()
    assert p.popen.wait(30) == -signal.SIGKILL
    assert p.self_killed() and p.crashed
    assert "up" in p.current_life() and "(container)" in open(p.log).read()
    assert p.popen.pid != 1           # the host's PID of the node process, not the namespace's

    q = _proc(docker_engine, tmp_path, "import time; print('up', flush=True); time.sleep(60)")
    q.start()
    q.wait_for_line("up", timeout=30)
    q.kill()
    assert q.popen.returncode == -signal.SIGKILL and not q.self_killed()


def test_stop_is_a_sigterm_the_node_handles(docker_engine, tmp_path) -> None:
    p = _proc(docker_engine, tmp_path, """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(0)))
        print('up', flush=True)
        time.sleep(60)
        """)
    p.start()
    p.wait_for_line("up", timeout=30)
    assert p.stop(timeout=20) == 0
    assert "bye" in p.current_life()
    p.start()                         # a new life is a new container
    p.wait_for_line("up", timeout=30)
    assert p.lives == 2 and p.history[0].name != p.history[1].name
    p.kill()


def test_pause_freezes_every_process_and_kill_thaws_it_first(docker_engine, tmp_path) -> None:
    p = _proc(docker_engine, tmp_path, """
        import time
        n = 0
        while True:
            n += 1
            print('tick', n, flush=True)
            time.sleep(0.05)
        """)
    p.start()
    p.wait_for_line("tick 3", timeout=30)
    p.popen.pause()
    time.sleep(0.3)                  # a tick in flight lands
    frozen = p.current_life().count("tick")
    time.sleep(1.0)
    assert p.current_life().count("tick") == frozen and p.alive()
    p.popen.unpause()
    time.sleep(0.5)
    assert p.current_life().count("tick") > frozen
    p.popen.pause()
    p.kill()                         # docker refuses to signal a frozen container
    assert p.popen.returncode == -signal.SIGKILL and not p.self_killed()


def test_memory_limit_ends_in_an_oom_kill_seen_as_a_crash(docker_engine, tmp_path) -> None:
    p = _proc(docker_engine, tmp_path, """
        print('up', flush=True)
        hog = [bytearray(1 << 20) for _ in range(400)]
        print('survived', flush=True)
        """, memory_mib=64)
    p.start()
    assert p.popen.wait(60) == -signal.SIGKILL
    assert p.popen.oom_killed and p.self_killed()
    assert "survived" not in p.current_life()


@pytest.mark.skipif(not loopdisk.permitted()[0], reason=f"slow disk: {loopdisk.permitted()[1]}")
def test_slow_disk_makes_fsync_wait_for_the_limit(docker_engine, tmp_path) -> None:
    disk = loopdisk.LoopDisk(str(tmp_path / "data"), size_mib=64)
    disk.mount()
    try:
        data = disk.path
        code = f"""
            import os, time
            t = time.monotonic()
            with open({data + '/f'!r}, 'wb') as f:
                for _ in range(8):
                    f.write(os.urandom(128 << 10))
                    f.flush()
                    os.fsync(f.fileno())
            print('took %.2f' % (time.monotonic() - t), flush=True)
            """
        p = _proc(docker_engine, tmp_path, code, extra=((data, data, "rw"),),
                  device=disk.device, write_bps=512 << 10)
        p.start()
        assert p.popen.wait(60) == 0
        took = float(p.current_life().split("took ")[1].split()[0])
        assert took >= 1.4, took          # 1 MiB at 512 KiB/s: about 2 s (bursts allowed)
        assert os.path.getsize(os.path.join(data, "f")) == 1 << 20
    finally:
        disk.unmount()
    assert os.path.getsize(str(tmp_path / "data" / "f")) == 1 << 20   # kept after unmount
    assert not os.path.exists(disk.image)
