import array, json, multiprocessing, os, sys, threading, time, tempfile, shutil
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
from ferry.localcluster import LocalCluster, key_of, value_of
from node.control import Etcd
from node.settings import put as put_setting
from node.wire import Pool, load_secret
from node.assignment import partition_of

def writer_main(seeds, secret_file, idx, value_size, stop, out_path):
    from node.client import Client
    samples = array.array("d")
    i = 2_000_000_000 + idx * 10_000_000
    value = value_of(i, value_size)
    with Client(seeds, secret_file=secret_file, timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.put("default", key_of(i), value)
            samples.append(time.time()); samples.append(time.perf_counter() - t0); samples.append(i)
            i += 1
    with open(out_path, "wb") as f:
        samples.tofile(f)

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
        procs = [mp.Process(target=writer_main, args=(c.seeds, c.secret_file, i, 1024, stop, p)) for i, p in enumerate(paths)]
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
        logs = {}
        for n in c.nodes:
            lp = os.path.join(root, "c", f"{n.id}.log")
            for cand in [lp] + [os.path.join(root, "c", f) for f in os.listdir(os.path.join(root, "c")) if f.endswith(".log")]:
                pass
        pool.close()
        samples = []
        for p in paths:
            a = array.array("d"); a.frombytes(open(p, "rb").read())
            samples += [(a[k], a[k+1], int(a[k+2])) for k in range(0, len(a), 3)]
        json.dump({"idle": [idle_lo, idle_hi], "settled": settled, "before_map": before_map, "after_map": after_map,
                   "moves": moves, "samples": samples}, open(out, "w"))
        os.system(f"cp -r {root}/c/*.log /tmp/fg/ 2>/dev/null; ls {root}/c > /tmp/fg/ls.txt")
    shutil.rmtree(root, ignore_errors=True)
