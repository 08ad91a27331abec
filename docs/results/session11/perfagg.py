import sys, subprocess, collections, json
d = sys.argv[1]; res = json.load(open(f"{d}/res.json")); n4 = res["n4pid"]
out = subprocess.run(["perf", "script", "-i", f"{d}/perf.data", "-F", "pid,tid,ip,sym,dso"], capture_output=True, text=True).stdout
samples = out.split("\n\n")
byproc = collections.Counter(); cat = collections.Counter(); top = collections.Counter(); tot = 0
for s in samples:
    lines = [l.strip() for l in s.strip().split("\n") if l.strip()]
    if not lines: continue
    head = lines[0].split()
    try: pid = int(head[0].split("/")[0])
    except: continue
    tot += 1
    byproc[pid] += 1
    if pid != n4: continue
    frames = lines[1:]
    syms = " ".join(frames)
    leaf = frames[0].split(None, 1)[1] if frames else "?"
    top[leaf.rsplit(" (", 1)[0][:50]] += 1
    k = "other"
    for key, name in [("iter_file_splice_write", "splice->file (page cache write)"), ("splice_to_pipe", "socket->pipe splice"),
                      ("tcp_splice_read", "socket->pipe splice"), ("filemap_read", "pread/read page cache"), ("ferry_crc", "crc"),
                      ("fdatasync", "fsync"), ("fsync", "fsync"), ("mdb_", "lmdb"), ("_ixaccel", "ixaccel"), ("_pageaccel", "pageaccel"),
                      ("libpython", "python interp"), ("do_exit", "exit"), ("futex", "futex"), ("schedule", "sched"), ("libc.so", "libc")]:
        if key in syms: k = name; break
    cat[k] += 1
print("total samples", tot)
for p, c in byproc.most_common(8): print(p, c, "N4" if p == n4 else "")
n = byproc[n4]
print("== n4 categories (first match)")
for k, c in cat.most_common(): print(f"{c/n:6.1%} {k}")
print("== n4 leaf")
for k, c in top.most_common(25): print(f"{c/n:6.1%} {k}")
