"""One files-mode join (3 -> 4 nodes, idle) under perf: system-wide CPU samples with
call graphs, fsync/fdatasync counts per process, per-thread CPU of every node process,
and the moves' stage seconds. Usage: profile.py VALUE_SIZE ENTRIES OUTDIR [stream on|off]"""
from __future__ import annotations
import json, os, signal, subprocess, sys, tempfile, time
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
from ferry.localcluster import LocalCluster
import psutil

def threads(pid):
    out = {}
    for t in psutil.Process(pid).threads():
        out[t.id] = round(t.user_time + t.system_time, 2)
    return out

vs, n, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
stream = (sys.argv[4] == "on") if len(sys.argv) > 4 else None
os.makedirs(outdir, exist_ok=True)
root = tempfile.mkdtemp(prefix="ferry-prof-", dir="/work")
res = {"value_size": vs, "entries": n, "loadavg_before": os.getloadavg()}
with LocalCluster(os.path.join(root, "c"), partitions=16, mode="files", concurrency=4,
                  checkpoint_interval=2.0, log_level="WARNING", stream_index=stream) as c:
    c.start(3)
    c.load(n, value_size=vs, threads=16)
    time.sleep(3)
    cpu0 = {x.id: x.cpu_seconds() for x in c.nodes}
    rec = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "499", "-o", f"{outdir}/perf.data"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    st = subprocess.Popen(["perf", "stat", "-a", "-x,", "-o", f"{outdir}/perfstat.txt", "-e",
                           "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync,syscalls:sys_enter_sendfile64,syscalls:sys_enter_splice,syscalls:sys_enter_pwrite64,syscalls:sys_enter_write"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    t0 = time.time()
    new = c.add_node("n4", wait=False)
    c.wait_all_owning(timeout=600)
    t1 = time.time()
    res["cpu_per_node_s"] = {x.id: round(x.cpu_seconds() - cpu0.get(x.id, 0.0), 2) for x in c.nodes}
    res["threads_n4"] = threads(new.proc.pid)
    res["pids"] = {x.id: x.proc.pid for x in c.nodes}
    for p in (rec, st):
        p.send_signal(signal.SIGINT)
    for p in (rec, st):
        p.wait(60)
    res["wall_s"] = round(t1 - t0, 2)
    from node.wire import Pool, load_secret
    pool = Pool(load_secret(c.secret_file), role="client")
    moves = [m for m in pool.call(new.address, "moves_done", timeout=10.0) if m["finished"] >= t0]
    pool.close()
    first = min(m["finished"] - m["seconds_to_owning"] for m in moves)
    res["seconds_from_join"] = round(max(m["finished"] for m in moves) - first, 3)
    res["moves"] = [{"partition": m["partition"], "start": round(m["finished"] - m["seconds_to_owning"] - first, 3),
                     "end": round(m["finished"] - first, 3), "bytes": m.get("wire_bytes") or m.get("bytes"),
                     "stage_seconds": m.get("stage_seconds")} for m in moves]
res["loadavg_after"] = os.getloadavg()
json.dump(res, open(f"{outdir}/profile.json", "w"), indent=1)
import shutil; shutil.rmtree(root, ignore_errors=True)
print(json.dumps({k: res[k] for k in ("wall_s", "seconds_from_join", "cpu_per_node_s")}))
