import json, os, signal, subprocess, sys, tempfile, time
R = os.environ.get("ROOT", "/work/main"); sys.path.insert(0, R); sys.path.insert(0, R + "/bench")
from ferry.localcluster import LocalCluster
vs, n, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
stream = (sys.argv[4] == "on") if len(sys.argv) > 4 else False
os.makedirs(outdir, exist_ok=True)
root = tempfile.mkdtemp(prefix="ferry-prof-", dir="/work")
res = {}
with LocalCluster(os.path.join(root, "c"), partitions=16, mode="files", concurrency=4,
                  checkpoint_interval=2.0, log_level="WARNING", stream_index=stream) as c:
    c.start(3)
    c.load(n, value_size=vs, threads=16)
    time.sleep(3)
    cpu0 = {x.id: x.cpu_seconds() for x in c.nodes}
    t0 = time.time()
    new = c.add_node("n4", wait=False)
    perf = subprocess.Popen(["perf", "record", "-a", "-F", "999", "-g", "-o", f"{outdir}/perf.data"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if os.environ.get("PERF") else None
    spy = None if os.environ.get("NOSPY") else subprocess.Popen([".venv/bin/py-spy", "record", "--pid", str(new.proc.pid), "--subprocesses", "-r", "200",
                            *(["--gil"] if os.environ.get("GIL") else []), "--nonblocking", "-f", "raw", "-o", f"{outdir}/n4.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c.wait_all_owning(timeout=600)
    t1 = time.time()
    if spy: spy.send_signal(signal.SIGINT); spy.wait(60)
    if perf: perf.send_signal(signal.SIGINT); perf.wait(60)
    res["n4pid"] = new.proc.pid
    res["cpu_per_node_s"] = {x.id: round(x.cpu_seconds() - cpu0.get(x.id, 0.0), 2) for x in c.nodes}
    res["wall_s"] = round(t1 - t0, 2)
    from node.wire import Pool, load_secret
    pool = Pool(load_secret(c.secret_file), role="client")
    moves = [m for m in pool.call(new.address, "moves_done", timeout=10.0) if m["finished"] >= t0]
    pool.close()
    first = min(m["finished"] - m["seconds_to_owning"] for m in moves)
    res["seconds_from_join"] = round(max(m["finished"] for m in moves) - first, 3)
    res["moves"] = sorted([{"p": m["partition"], "start": round(m["finished"] - m["seconds_to_owning"] - first, 3),
                     "end": round(m["finished"] - first, 3), "MB": round((m.get("wire_bytes") or m.get("bytes") or 0)/1e6),
                     "ts": m.get("transfer_stages"), "st": {k: round(v, 3) for k, v in (m.get("stage_seconds") or {}).items()}} for m in moves], key=lambda x: x["start"])
    for m in res["moves"]: print(m)
json.dump(res, open(f"{outdir}/res.json", "w"), indent=1)
import shutil; shutil.rmtree(root, ignore_errors=True)
print(json.dumps({k: res[k] for k in ("wall_s", "seconds_from_join", "cpu_per_node_s")}))
