import sys, collections, re
self_c = collections.Counter(); incl = collections.Counter(); thr = collections.Counter(); tot = 0
for line in open(sys.argv[1]):
    line = line.rstrip()
    if not line: continue
    stack, _, cnt = line.rpartition(" ")
    cnt = int(cnt); tot += cnt
    frames = stack.split(";")
    thr[frames[0][:60]] += cnt
    fr = [re.sub(r" \(/work/main/|\(/work/main/", "(", f) for f in frames[1:]]
    if fr: self_c[fr[-1]] += cnt
    for f in set(fr): incl[f] += cnt
print("total", tot)
print("== threads"); [print(f"{c:6d} {c/tot:5.1%} {t}") for t, c in thr.most_common(12)]
print("== self"); [print(f"{c:6d} {c/tot:5.1%} {t}") for t, c in self_c.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 30)]
print("== inclusive"); [print(f"{c:6d} {c/tot:5.1%} {t}") for t, c in incl.most_common(int(sys.argv[3]) if len(sys.argv)>3 else 50)]
