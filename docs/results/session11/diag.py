"""One foreground join (3 -> 4 nodes, 200k x 1 KiB, 8 writers that record each put's key),
for diag_an.py: every slow answer against its partition's move, hand-off and eviction.
Usage: diag.py OUT.json [on|off]  (LOGLEVEL=INFO keeps the nodes' logs beside OUT.json)"""
import json, multiprocessing, os, sys, time, tempfile, shutil
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
from ferry.localcluster import LocalCluster
from node.control import Etcd
from node.settings import put as put_setting
from node.wire import Pool, load_secret
from rebalance_fg import read_samples, writer_main   # bench/ (the writers of --foreground)

def prim_map(pool, addr):
    from node.cluster_map import ClusterMap
    m = ClusterMap.from_wire(pool.call(addr, "get_map", timeout=5.0))
    return {p: m.primary("default", p) for p in range(16)}

if __name__ == "__main__":
    out = sys.argv[1]; protect = (sys.argv[2] if len(sys.argv) > 2 else "on")
    root = tempfile.mkdtemp(prefix="fgdiag-", dir="/work")
    with LocalCluster(os.path.join(root, "c"), partitions=16, mode="files", concurrency=4,
                      checkpoint_interval=2.0, log_level=os.environ.get("LOGLEVEL", "WARNING")) as c:
        c.start(3)
        c.load(200000, value_size=1024, threads=16)
        put_setting(Etcd(c.control_plane), "/ferry/default", "rebalance.protect", protect)
        time.sleep(1.0)
        mp = multiprocessing.get_context("spawn"); stop = mp.Event()
        paths = [os.path.join(root, f"w{i}.bin") for i in range(8)]
        procs = [mp.Process(target=writer_main, args=(c.seeds, c.secret_file, i, 1024, stop, p, True)) for i, p in enumerate(paths)]
        [p.start() for p in procs]
        pool = Pool(load_secret(c.secret_file), role="client")
        time.sleep(5); idle_lo = time.time(); time.sleep(5); idle_hi = time.time()
        before_map = prim_map(pool, c.nodes[0].address)
        new = c.add_node("n4", wait=False)
        c.wait_all_owning(timeout=300)
        settled = time.time()
        time.sleep(3)
        after_map = prim_map(pool, c.nodes[0].address)
        stop.set(); [p.join(60) for p in procs]
        moves = [m for m in pool.call(new.address, "moves_done", timeout=10.0) if m["finished"] >= idle_hi]
        pool.close()
        samples = [(t, l, int(i)) for t, l, i in read_samples(paths, 3)]
        json.dump({"idle": [idle_lo, idle_hi], "settled": settled, "before_map": before_map, "after_map": after_map,
                   "moves": moves, "samples": samples}, open(out, "w"))
        for f in os.listdir(os.path.join(root, "c")):
            if f.endswith(".log"):
                shutil.copy(os.path.join(root, "c", f), os.path.dirname(os.path.abspath(out)))
    shutil.rmtree(root, ignore_errors=True)
