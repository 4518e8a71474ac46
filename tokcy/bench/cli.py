"""``python -m tokcy bench`` (or ``tokcy bench``): tokcy against the patterns it replaces, timed on this machine.

Prints one table per scenario and backend: each configuration, the median time of each
implementation (median of round medians, see ``tokcy.bench.timing``) with its spread over
the rounds, tokcy's speed-up over each baseline and its ratio to the plain-C floor, figures
quoted from elsewhere in a section of their own, and each goal with its verdict, measured
in the same run. Progress goes to stderr, tables to stdout. torch, when installed, runs on
one intra-op thread during the run (``--torch-threads``; see ``machine.TORCH_THREADS``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from tokcy.bench import backends, floor, machine, report
from tokcy.bench.timing import PLANS

SCENARIOS = ("accessors", "executor", "executor_batch", "connector", "connector_batch", "memory", "attention",
             "device_feed")


ON_REQUEST = ("soak",)  # run only when named with --scenario


def load_scenario(name: str):
    """The scenario object, or a string saying why it cannot run here."""
    try:
        module = importlib.import_module(f"tokcy.bench.{name}")
    except ImportError as error:
        return f"{name}: skipped, it needs code that is not available ({error})"
    scenario = module.SCENARIO
    missing = scenario.missing()
    return f"{name}: skipped, {missing}" if missing else scenario


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parser(prog: str = "python -m tokcy bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Time tokcy against the patterns it replaces (TensorRT-LLM's 'before' and 'after' code of "
        "pull requests #16791 and #22092, "
        "a numpy-vectorised baseline, Python lists) on this machine, and print one table per scenario. "
        "Without --quick or --full: the default plan (10 warm-up iterations, 9 rounds of 15, at most 0.6 s per "
        "measurement), about 70 s per backend on 2 cores. The attention and device_feed scenarios need torch "
        "(skipped without it). The exit status is 0 whatever the goals' verdicts: they measure this machine.",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="level", action="store_const", const="quick",
                      help="fewer sizes, 3 rounds of 5 iterations (cheap steps' rounds about 2 ms, slow steps' fewer): "
                           "15-30 s (what CI runs)")
    size.add_argument("--full", dest="level", action="store_const", const="full",
                      help="more sizes, the full plan (10 warm-up, 9 rounds x 15) with no time cap: about 10 minutes "
                      "(the 'before' pattern at 131,072 tokens takes about a second per iteration)")
    size.add_argument("--smoke", dest="level", action="store_const", const="smoke", help=argparse.SUPPRESS)
    p.set_defaults(level="default")
    p.add_argument("--backend", choices=("cython", "python", "both"), default=None,
                   help="which tokcy backend to time (default: the live one, tokcy.BACKEND)")
    p.add_argument("--scenario", action="append", choices=SCENARIOS + ON_REQUEST, metavar="NAME",
                   help=f"run only this scenario (repeatable): {', '.join(SCENARIOS + ON_REQUEST)}; without it, "
                   f"every one but {', '.join(ON_REQUEST)}, which runs only when named (--scenario soak)")
    p.add_argument("--torch-threads", type=positive_int, default=machine.TORCH_THREADS, metavar="N",
                   help=f"torch's intra-op threads during the run (default: {machine.TORCH_THREADS}, as an engine's "
                   "host path runs small tensor ops; torch's own default is one per core)")
    p.add_argument("--json", metavar="PATH", help="write the raw figures (every round median) as JSON")
    p.add_argument("--plot", metavar="PATH",
                   help="draw host time per iteration against sequence length or batch size, one panel per "
                   "scenario and backend, log axes (needs matplotlib)")
    return p


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv=None, prog: str = "python -m tokcy bench") -> int:
    args = parser(prog).parse_args(sys.argv[1:] if argv is None else list(argv))
    with machine.torch_threads(args.torch_threads) as threads:
        return run(args, threads)


def run(args, torch_threads) -> int:
    """The run ``args`` asks for, torch (if installed) set to ``torch_threads`` threads."""
    import tokcy

    if args.backend is None:
        wanted = [tokcy.BACKEND]
    elif args.backend == "both":
        wanted = list(backends.NAMES)
    else:
        wanted = [args.backend]
    for name in wanted:
        reason = backends.why_unavailable(name)
        if reason is not None:
            print(f"tokcy bench: backend {name} is not available here: {reason} (or use --backend python)",
                  file=sys.stderr)
            return 2
    if args.plot:  # fail before the run, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError as error:
            print(f"tokcy bench: --plot needs matplotlib, which is not installed ({error}); "
                  "install it with: pip install 'tokcy[bench]'  (or: pip install matplotlib)", file=sys.stderr)
            return 2

    level = args.level
    plan = PLANS.get(level, PLANS["quick"])
    if level == "smoke":
        from tokcy.bench.timing import Plan

        plan = Plan(warmup=1, rounds=1, per_round=1, budget_s=0.01, min_rounds=1, min_sample_s=1e-6)
    info = machine.describe()
    info["torch_threads"] = torch_threads
    print(report.header(info, wanted, level, plan), flush=True)
    print(floor.describe(), flush=True)

    scenarios = []
    for name in args.scenario or SCENARIOS:
        loaded = load_scenario(name)
        if isinstance(loaded, str):
            print(f"\n== {loaded}")  # once, in the report (not again in the progress on stderr)
        else:
            scenarios.append(loaded)
    jobs = [(scenario, backend, config) for backend in wanted for scenario in scenarios for config in scenario.configs(level)]
    results, started, done = [], time.perf_counter(), 0
    for backend in wanted:
        with backends.use(backend) as module:
            for scenario in scenarios:
                rows = []
                for config in scenario.configs(level):
                    done += 1
                    progress(f"[{done:>3}/{len(jobs)}] {time.perf_counter() - started:6.1f} s  "
                             f"{scenario.name} [{backend}] {scenario.describe(config)}")
                    rows.append(scenario.run(config, module, plan))
                results.append((scenario, backend, rows))
                print("\n" + report.table(scenario, backend, rows), flush=True)
    summary = report.goal_summary(results)
    if summary:
        print("\n" + summary, flush=True)
    progress(f"tokcy bench: done in {time.perf_counter() - started:.1f} s")

    if args.json:
        report.write_json(args.json, report.to_json(info, level, results, plan))
        progress(f"tokcy bench: raw figures written to {args.json}")
    if args.plot:
        try:
            report.plot(args.plot, info, results)
        except report.PlotUnavailable as error:
            print(f"tokcy bench: {error}", file=sys.stderr)
            return 2
        progress(f"tokcy bench: plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
