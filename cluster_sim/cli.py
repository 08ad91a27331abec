"""``ferry sim run`` and ``ferry sim matrix``. Imports only click at module level."""
from __future__ import annotations

import json
import sys

import click


SKIPPED_EXIT = 5    # `ferry sim run`: the scenario cannot run on this machine (reason printed)


@click.group("sim")
def sim() -> None:
    """Crash-point simulation: scenarios, crash plans, invariants, matrices."""


def _crash(point: str | None, side: str, seed: int):
    from .matrix import default_nth
    from .scenario import CrashPlan
    if not point:
        return None
    name, _, nth = point.partition(":")
    try:
        n = int(nth) if nth else default_nth(name, seed)
    except ValueError:
        raise click.BadParameter(f"{point!r}: use POINT or POINT:N with N a number", param_hint="--crash")
    return CrashPlan(name, side=side, nth=n)


@sim.command("run")
@click.option("--scenario", "scenario", required=True, help="Built-in name or a .toml/.json file.")
@click.option("--crash", "crash", help="POINT[:N]: crash the --side process on the Nth hit "
              "(N from the seed when left out).")
@click.option("--side", type=click.Choice(["supplier", "demander", "third"]), default="demander",
              show_default=True, help="Which process the crash plan arms.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help='Print {"passed", "invariants", "seed"}.')
@click.option("--keep", is_flag=True, help="Keep the run folder even when it passed.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Where run folders go (default: $TMPDIR).")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write the timeline PNG here.")
@click.option("--expected", type=click.Path(dir_okay=False),
              help="Write the model of acknowledged writes here (JSON lines for "
                   "`ferry validate --expected`; use with --keep).")
@click.option("--containers", "in_containers", is_flag=True,
              help="Container mode: each node in its own container (the Docker engine at "
                   "DOCKER_HOST, else a private one; root). Also knows the container runs: "
                   "pause, slow-disk-join (docs/harness.md).")
@click.option("--netns", "in_netns", is_flag=True,
              help="Network-namespace mode: each node in its own `ip netns` on its own "
                   "address, reaching etcd through proxies on its gateway (root; not with "
                   "proxy = true scenarios).")
@click.option("--tls", is_flag=True,
              help="The scenario with tls = true: the nodes' links mutual TLS with certificates "
                   "of the run's CA, the harness's clients with a client certificate, etcd "
                   "over https with client certificates and RBAC.")
def run_cmd(scenario: str, crash: str | None, side: str, seed: int, as_json: bool, keep: bool,
            workdir: str | None, plot: str | None, expected: str | None,
            in_containers: bool = False, in_netns: bool = False, tls: bool = False) -> None:
    """Run one scenario under one seed (and crash plan); exit 0 only if every invariant holds."""
    from dataclasses import replace
    from .diskfull import SimSkipped
    from .errors import SimError
    from .runner import run
    from .builtins import load
    if in_containers and in_netns:
        raise click.UsageError("--containers and --netns are two different modes: pick one")
    try:
        plan = _crash(crash, side, seed)
        kw = dict(seed=seed, crash=plan, workdir=workdir, keep=keep, expected=expected,
                  log=(lambda m: None) if as_json else (lambda m: click.echo(m, err=True)))
        if in_containers:          # cluster_sim/drivers/container.py
            from .drivers.container import load as load_container_run, run_in_containers
            cs, spec = load_container_run(scenario)
            res = run_in_containers(replace(cs, tls=True) if tls else cs, spec, **kw)
        elif in_netns:             # cluster_sim/netns.py
            from . import netns
            s = replace(load(scenario), tls=True) if tls else load(scenario)
            if s.proxy:
                raise SimSkipped(f"scenario {s.name!r} has proxy = true, which runs on "
                                 "loopback only, not with network namespaces")
            ok, why = netns.permitted()
            if not ok:
                raise SimSkipped(f"network namespaces: {why}")
            with netns.Netns(s.all_nodes()) as net:
                res = run(s, net=net, **kw)
        else:
            s = load(scenario)
            res = run(replace(s, tls=True) if tls else s, **kw)
    except SimSkipped as e:      # a prerequisite of the scenario is missing here (e.g. tmpfs)
        click.echo(f"SKIPPED: {e}", err=True)
        sys.exit(SKIPPED_EXIT)
    except (SimError, KeyError) as e:
        raise click.ClickException(str(e))
    if plot:
        from .report import timeline_png
        timeline_png(res, plot)
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        for name, ok in res.invariants.items():
            click.echo(f"  {name:<30} {'ok' if ok else 'FAILED'}")
            for p in res.problems.get(name, [])[:10] if not ok else []:
                click.echo(f"      {p}")
        click.echo(f"{'PASSED' if res.passed else 'FAILED'}: {res.scenario} seed={seed} "
                   f"crash={res.crash or '-'} side={res.side or '-'} acked={res.acked} "
                   f"unsure={res.unsure} in {res.seconds}s" + (f"; kept {res.dir}" if res.dir else ""))
    sys.exit(0 if res.passed else 1)


@sim.command("matrix")
@click.option("--points", default="all", show_default=True, help="'all' or a comma list of crash points.")
@click.option("--sides", default="supplier,demander,third", show_default=True,
              help="Comma list of sides; each point runs on the sides it can hit.")
@click.option("--seeds", type=int, default=1, show_default=True, help="Seeds per cell (1..K).")
@click.option("--first-seed", type=int, default=1, show_default=True)
@click.option("--scenario", help="Run every point in this scenario instead of the built-in plan.")
@click.option("--faults", default=None,
              help="Fault scenarios to run once per seed without a crash plan: 'all', 'none' "
                   "or a comma list (default: all with --points all and no --scenario, else none).")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"cells": [...], "passed": n, "failed": n}.')
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Write report.md, report.html and per-cell timeline PNGs here.")
@click.option("--workdir", type=click.Path(file_okay=False))
@click.option("--tls", is_flag=True, help="Every cell with tls = true (the nodes' links mutual TLS).")
def matrix_cmd(points: str, sides: str, seeds: int, first_seed: int, scenario: str | None,
               faults: str | None, as_json: bool, report_dir: str | None, workdir: str | None,
               tls: bool = False) -> None:
    """Every crash point x the side it hits x K seeds, and the fault scenarios x K
    seeds; exit 0 only if every cell passed."""
    from faults import POINTS
    from .errors import SimError
    from .matrix import FAULTS, NO_CRASH, plan_cells, run_matrix
    names = sorted(POINTS) if points == "all" else [p.strip() for p in points.split(",") if p.strip()]
    side_list = [s.strip() for s in sides.split(",") if s.strip()]
    if faults is None:
        faults = "all" if points == "all" and not scenario else "none"
    fault_list = list(FAULTS) if faults == "all" else [] if faults == "none" else \
        [f.strip() for f in faults.split(",") if f.strip()]
    try:
        cells = plan_cells(names, side_list, list(range(first_seed, first_seed + seeds)), scenario,
                           faults=fault_list, tls=tls)
    except (KeyError, SimError) as e:
        raise click.ClickException(str(e))
    say = (lambda m: None) if as_json else (lambda m: click.echo(m, err=True))

    def on_cell(c) -> None:
        what = c.scenario if c.point == NO_CRASH else c.point
        say(f"{'pass' if c.passed else 'FAIL'}  {what:<28} {c.side:<9} seed={c.seed:<4} {c.seconds:>6.1f}s")
        if not c.passed:
            bad = {k: v[:3] for k, v in c.result.problems.items() if v}
            say(f"      seed {c.seed}; replay: {c.replay}\n      {bad}")

    say(f"{len(cells)} cells")
    from .diskfull import SimSkipped
    try:
        res = run_matrix(cells, workdir=workdir, on_cell=on_cell)
    except SimSkipped as e:
        click.echo(f"SKIPPED: {e}", err=True)
        sys.exit(SKIPPED_EXIT)
    if report_dir:
        from .report import write_report
        say(f"report: {write_report(res, report_dir)}")
    if as_json:
        click.echo(json.dumps(res.to_json()))
    else:
        click.echo(f"{res.passed} passed, {res.failed} failed")
        for c in res.cells:
            if not c.passed:
                click.echo(f"FAILED {c.point} side={c.side} seed={c.seed}: {c.replay}")
    sys.exit(0 if res.failed == 0 else 1)
