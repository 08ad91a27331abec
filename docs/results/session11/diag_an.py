import json, sys, statistics
sys.path.insert(0, "/work/main")
from node.assignment import partition_of
from ferry.localcluster import key_of
d = json.load(open(sys.argv[1]))
S = [(t, l, partition_of(key_of(i), 16)) for t, l, i in d["samples"]]
lo, hi = d["idle"]
idle = sorted(l for t, l, p in S if lo <= t < hi)
p99i = idle[int(.99 * len(idle))]
moves = d["moves"]
first = min(m["finished"] - m["seconds_to_owning"] for m in moves); last = max(m["finished"] for m in moves)
dur = [(t, l, p) for t, l, p in S if first <= t < last]
ls = sorted(l for t, l, p in dur)
print(f"idle p99 {p99i*1e3:.1f} ms; during n={len(dur)} p99 {ls[int(.99*len(ls))]*1e3:.1f} ms  join {last-first:.2f}s")
ho = {int(p) for p, x in d["before_map"].items() if d["after_map"][p] != x}
print("primary changed for partitions", sorted(ho), {p: (d['before_map'][str(p)], d['after_map'][str(p)]) for p in sorted(ho)})
span = {}
for m in moves:
    st = m["finished"] - m["seconds_to_owning"]
    span[m["partition"]] = (st, m["finished"])
print("moving partitions", sorted(span))
thr = 2 * p99i
slow = [(t, l, p) for t, l, p in dur if l > thr]
print(f"slow (> {thr*1e3:.1f} ms): {len(slow)} of {len(dur)}")
cats = {}
for t, l, p in slow:
    start = t - l
    c = []
    if p in ho: c.append("handoff-part")
    if p in span and span[p][0] <= t and start <= span[p][1]: c.append("moving")
    if p in span and start <= span[p][1] + 0.5 and t >= span[p][1]: c.append("right-after-owning")
    k = ",".join(c) or "other"
    cats.setdefault(k, []).append(l)
for k, v in sorted(cats.items(), key=lambda x: -len(x[1])):
    print(f"  {k:40s} n={len(v):4d} median {statistics.median(v)*1e3:.0f} ms max {max(v)*1e3:.0f}")
# slow puts over time (100 ms bins)
import collections
b = collections.Counter(int((t - first) * 10) for t, l, p in slow)
print("slow per 100ms bin:", [b.get(i, 0) for i in range(int((last - first) * 10) + 1)])
allb = collections.Counter(int((t - first) * 10) for t, l, p in dur)
print("puts per 100ms bin:", [allb.get(i, 0) for i in range(int((last - first) * 10) + 1)])
for m in sorted(moves, key=lambda m: m["finished"]):
    print(f"  p{m['partition']:2d} {span[m['partition']][0]-first:6.2f} -> {span[m['partition']][1]-first:6.2f}")
print("== slow by primary (before map) and time")
for t, l, p in sorted(slow):
    print(f"  t={t-first:5.2f} start={t-l-first:5.2f} lat={l*1e3:4.0f} p{p:2d} prim={d['before_map'][str(p)]}->{d['after_map'][str(p)]}")
print("== stage at slow put (moving partitions)")
order = ["prepare", "demand", "transfer", "install", "index rebuild", "replay", "checkpoint wait"]
bounds = {}
for m in moves:
    t = m["finished"] - m["seconds_to_owning"]; b = []
    for k in order:
        v = (m.get("stage_seconds") or {}).get(k, 0.0); b.append((k, t, t + v)); t += v
    b.append(("owning+", t, t + 1e9)); bounds[m["partition"]] = b
def stage_at(p, x):
    for k, a, z in bounds.get(p, []):
        if a <= x < z: return k
    return "before"
agg = {}
for t, l, p in slow:
    if p in bounds:
        k = f"{stage_at(p, t - l)} -> {stage_at(p, t)}"
        agg.setdefault(k, []).append(l)
for k, v in sorted(agg.items(), key=lambda x: -len(x[1])):
    print(f"  {k:45s} n={len(v):3d} median {statistics.median(v)*1e3:.0f}")
for p in sorted(bounds):
    print(p, [(k, round(a - first, 2)) for k, a, z in bounds[p]])
print("== right-after-owning slow puts relative to OWNING")
for t, l, p in sorted(slow):
    if p in span and t >= span[p][1]:
        print(f"  p{p:2d} start +{(t-l-span[p][1])*1e3:5.0f} ms end +{(t-span[p][1])*1e3:5.0f} ms lat {l*1e3:.0f} prim {d['before_map'][str(p)]}->{d['after_map'][str(p)]}")
