"""A real Spark standalone cluster on loopback for the tests: one master and
``workers`` workers started from the installed pyspark with ``spark-class``
(``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), bound to
127.0.0.1, Python workers running this interpreter. Stopped (and waited for) at the
end; its logs stay in the test's folder."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from node.listen_ports import free_port



def spark_home() -> str:
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def spark_env(root: str) -> dict[str, str]:
    e = dict(os.environ)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    e.update({"SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1",
              "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
              "SPARK_LOG_DIR": root, "SPARK_WORKER_DIR": os.path.join(root, "work"),
              "PYTHONPATH": repo + os.pathsep + e.get("PYTHONPATH", "")})
    return e


class StandaloneCluster:
    """``hide``: directories the workers (and so the executors and their Python
    workers) must not see, as on another host: each worker runs in its own mount
    namespace with an empty tmpfs over each of them (needs root and ``unshare``)."""

    def __init__(self, root: str, workers: int = 1, cores: int = 2,
                 hide: list[str] | None = None) -> None:
        self.root, self.workers, self.cores = root, workers, cores
        self.hide = list(hide or [])
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[str] = []

    def _spawn(self, name: str, args: list[str], hide: list[str] | None = None) -> str:
        log = os.path.join(self.root, f"{name}.log")
        argv = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        if hide:
            mounts = " && ".join(f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(d)}" for d in hide)
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f'{mounts} && exec "$@"', "sh", *argv]
        with open(log, "ab") as f:
            self.procs.append(subprocess.Popen(argv, stdout=f, stderr=f,
                                               env=spark_env(self.root), start_new_session=True))
        self.logs.append(log)
        return log

    def _wait(self, log: str, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Spark process ended; see {log}:\n{self.tail(log)}")
            with open(log, errors="replace") as f:
                if text in f.read():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{text!r} not seen in {timeout}s; see {log}:\n{self.tail(log)}")

    def work_dir(self, worker: int) -> str:
        """Worker ``worker``'s own work dir (executors' files, fetched ``addFile``s)."""
        return os.path.join(self.root, "work") if not self.hide else \
            os.path.join(self.root, f"work{worker}")

    @staticmethod
    def tail(log: str) -> str:
        with open(log, errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def start(self) -> "StandaloneCluster":
        os.makedirs(os.path.join(self.root, "work"), exist_ok=True)
        m = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(self.port), "--webui-port", str(free_port())])
        self._wait(m, "I have been elected leader")
        for i in range(self.workers):
            os.makedirs(self.work_dir(i), exist_ok=True)
            w = self._spawn(f"worker{i}", [
                "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", "1g", "--webui-port", str(free_port()),
                "--work-dir", self.work_dir(i)], hide=self.hide)
            self._wait(w, "Successfully registered with master")
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
