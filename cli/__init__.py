"""roicore command line: ``roicore parity`` and ``roicore bench``.

``roicore parity`` runs every installed framework's own RoI operators next to roicore's
adapter for that framework, each framework in its own worker process, on a suite of
golden, adversarial and seeded random cases (or on a feature map and boxes saved from your
model, ``--inputs FILE.npz``), and reports where they differ, bit for bit.  It also
compares roicore's conventions with one another on the same inputs, which shows where the
frameworks disagree among themselves.

``roicore bench`` times roicore against the native operators on standard detection
workloads, interleaved, with the same thread count for every contender, and reports
roicore.core's peak memory beyond its inputs and outputs.  ``roicore bench --threads
1,2,4`` times roicore.core alone at each thread count (speedup, ns per output element,
memory).  Reports can be saved as JSON, Markdown and CSV, and compared with a saved
baseline (``--compare``).

Exit status, both commands: 0 ok, 1 a departure or a regression, 2 bad usage.

Importing this package imports no framework (nor NumPy).
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["main"]

PARITY_EPILOG = """\
exit status: 0 when at least one row compared and every adapter is bit-identical to its
native op (and the golden values hold); 1 when one departs, a framework's worker fails, a
framework asked for is not installed (the report gives the command that installs it;
--allow-missing accepts that), or nothing was compared; 2 on bad usage (bad arguments or an
unreadable --inputs file).

"""

BENCH_EPILOG = """\
ratio = native time / roicore.core time (> 1: roicore is faster); adapter overhead =
adapter time / roicore.core time, both timed in the adapter's worker process, interleaved;
extra MB = roicore.core's tracemalloc peak during one untimed call minus its outputs.
Times are the median over rounds, with the fastest and slowest round in brackets.

--compare BASELINE.json reads a report saved with --json and judges roicore's own rows
(roicore.core and the adapters) found in both runs: a row has regressed when even its
fastest round now is slower than the baseline's slowest round by more than --threshold.
Both runs' round-to-round noise is thereby allowed for; run both with --repeats 5 or
more, on the same machine and thread count.

exit status: 0 when the run completed (and, with --compare, nothing regressed); 1 when a
worker or one of roicore's own contenders failed, or --compare found a regression; 2 on
bad usage (bad arguments, an unusable baseline, --plot without matplotlib).  Frameworks
that are not installed are skipped and named with their import error; a native operator
that cannot run on a workload is reported and skipped.
"""


def _version():
    from importlib import metadata
    try:
        return metadata.version("roicore")
    except metadata.PackageNotFoundError:   # run from a source tree that was never installed
        return "unknown"


def _parser():
    from .cases import INPUT_KEYS, PARITY_OPS
    p = argparse.ArgumentParser(prog="roicore", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"roicore {_version()}")
    sub = p.add_subparsers(dest="command", metavar="{parity,bench}")
    sub.required = True

    pp = sub.add_parser(
        "parity", help="compare roicore's adapters with each framework's own RoI operators",
        description="Run each installed framework's native RoI operators and roicore's adapter on "
                    "the same inputs (one worker process per framework) and report max abs "
                    "difference, mismatching elements and gradient agreement; then compare "
                    "roicore's conventions with one another on the same inputs.",
        epilog=PARITY_EPILOG + INPUT_KEYS, formatter_class=argparse.RawDescriptionHelpFormatter)
    from .parity import FRAMEWORKS as PARITY_FRAMEWORKS
    pp.add_argument("--frameworks", metavar="LIST",
                    help=f"comma-separated, from: {', '.join(PARITY_FRAMEWORKS)} (default: all)")
    pp.add_argument("--ops", metavar="LIST",
                    help=f"comma-separated, from: {', '.join(PARITY_OPS)} (default: all)")
    pp.add_argument("--dtypes", metavar="LIST", help="float32,float64 (default: both)")
    pp.add_argument("--cases", type=int, default=12, metavar="N",
                    help="seeded random cases per operator (default: 12)")
    pp.add_argument("--seed", type=int, default=0, help="seed of the random cases (default: 0)")
    pp.add_argument("--inputs", metavar="FILE.npz",
                    help="compare on your own feature map and boxes instead of the case suite")
    pp.add_argument("--json", metavar="FILE", help="also write a machine-readable report ('-': stdout)")
    pp.add_argument("--no-conventions", action="store_true",
                    help="skip the table comparing roicore's conventions with one another")
    pp.add_argument("--allow-missing", action="store_true",
                    help="a framework that is not installed is not a failure (for CI matrices "
                         "that install some frameworks); at least one row must still compare")
    pp.add_argument("--no-training", action="store_true",
                    help="skip the training runs (a convolution trained through each op, native "
                         "and roicore's, compared step by step)")

    from .bench import DIRECTIONS, DTYPES, FRAMEWORKS, OPS as BENCH_OPS, QUICK, REPEATS
    from .workloads import PYRAMID_WORKLOADS, WORKLOADS
    pb = sub.add_parser(
        "bench", help="time roicore against the native RoI operators",
        description="Time roicore.core, roicore's adapters and every available native operator on "
                    "the standard workloads, interleaved in rounds (each contender once per round), "
                    "median of --repeats rounds, the same thread count for every contender.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=BENCH_EPILOG)
    pb.add_argument("--workloads", metavar="LIST",
                    help=f"comma-separated, from: {', '.join(WORKLOADS)} (default: all of "
                         f"these), {', '.join(PYRAMID_WORKLOADS)} (the feature-pyramid rows, "
                         "run only when named)")
    pb.add_argument("--ops", metavar="LIST",
                    help=f"comma-separated, from: {', '.join(BENCH_OPS)} (default: all that fit "
                         "each workload)")
    pb.add_argument("--frameworks", metavar="LIST",
                    help=f"comma-separated, from: {', '.join(FRAMEWORKS)} (default: all)")
    pb.add_argument("--directions", metavar="LIST", default=",".join(DIRECTIONS),
                    help="forward,fwd+bwd (default: both)")
    pb.add_argument("--dtypes", metavar="LIST", default=DTYPES[0],
                    help=f"comma-separated, from: {', '.join(DTYPES)} (default: {DTYPES[0]}); each "
                         "contender runs in those of them it supports")
    pb.add_argument("--conventions", metavar="all|LIST",
                    help="also time roicore.core under each of these conventions of each "
                         "operator ('all': every one), in a table of its own")
    pb.add_argument("--repeats", type=int, default=None, metavar="N",
                    help=f"rounds; the median is reported (default: {REPEATS}; --quick: "
                         f"{QUICK['repeats']})")
    pb.add_argument("--threads", metavar="N|LIST",
                    help="threads for every contender (default: the CPUs available); a list "
                         "such as 1,2,4,8,16 times roicore.core alone at each count (a thread "
                         "sweep: speedup, ns per output element, memory; no framework needed)")
    pb.add_argument("--scale", type=float, default=None, metavar="F",
                    help="multiply the workloads' boxes and channels by F (0 < F <= 1; "
                         "default: 1)")
    pb.add_argument("--quick", action="store_true",
                    help=f"a smoke run of every contender: workloads scaled by {QUICK['scale']:g}, "
                         f"{QUICK['repeats']} rounds, each contender's run at least "
                         f"{QUICK['min_seconds']:g} s")
    pb.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    pb.add_argument("--scaling", action="store_true",
                    help="time roicore.core alone at 1 thread and at --threads N (default: the "
                         "CPUs available): the thread sweep 1,N")
    pb.add_argument("--json", metavar="FILE", help="also write a machine-readable report ('-': stdout)")
    pb.add_argument("--markdown", metavar="FILE",
                    help="also write the report as Markdown, stamped with the date, machine, "
                         "versions and this command")
    pb.add_argument("--csv", metavar="FILE", help="also write one CSV line per timed contender")
    pb.add_argument("--plot", metavar="FILE.png",
                    help="draw the ratios to roicore.core (needs matplotlib: roicore[plot])")
    pb.add_argument("--compare", metavar="BASELINE.json",
                    help="compare roicore's rows with a report saved by --json; exit 1 on a "
                         "regression")
    pb.add_argument("--threshold", metavar="PCT",
                    help="how much slower a row must be to count as a regression (default: 10%%)")
    return p, {"parity": pp, "bench": pb}


def main(argv=None):
    """Run ``roicore ARGS``; returns the exit status (0 ok, 1 departure or regression, 2 bad
    usage)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, commands = _parser()
    args = parser.parse_args(argv)   # exits 2 on a bad argument
    args.argv = argv
    from ._report import UsageError
    try:
        if args.command == "parity":
            from . import parity
            return parity.run(args)
        from . import bench
        return bench.run(args)
    except UsageError as e:
        commands[args.command].error(str(e))   # usage, the message, exit status 2
