import json, sys, glob, statistics as st
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        d = json.load(open(f))
    except Exception:
        continue
    r = d["runs"]["on"][0]
    cfg = f.split("/")[-1].split("-")[0]
    w = r["writers"]
    rows.setdefault(cfg, []).append((r["p99_during_over_idle"], r["throughput_during_over_idle"], r["seconds_from_join"],
                                     w["before"]["p99_ms"], w["during"]["p99_ms"], r["admission"]["move_limit_min"], r["machine_cpu_busy"]["join"]))
    print(f.split("/")[-1], rows[cfg][-1])
for k, v in rows.items():
    print(k, "median p99x", st.median(x[0] for x in v), "tput", st.median(x[1] for x in v), "join s", st.median(x[2] for x in v))
