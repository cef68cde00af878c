"""roicore command line: ``roicore parity`` and ``roicore bench``.

``roicore parity`` runs every installed framework's own RoI operators next to roicore's
adapter for that framework, each framework in its own worker process, on a suite of
golden, adversarial and seeded random cases (or on a feature map and boxes saved from your
model, ``--inputs FILE.npz``), and reports where they differ, bit for bit.  It also
compares roicore's conventions with one another on the same inputs, which shows where the
frameworks disagree among themselves.

``roicore bench`` times roicore against the native operators on standard detection
workloads, interleaved, with the same thread count for every contender, and reports
roicore.core's peak memory beyond its inputs and outputs.  ``roicore bench --scaling``
times roicore.core alone at 1 and N threads (speedup, ns per output element, memory).

Importing this package imports no framework (nor NumPy).
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["main"]

PARITY_EPILOG = """\
exit status: 0 when every adapter is bit-identical to its native op (and the golden values
hold), 1 when one departs or a framework's worker fails, 2 on bad arguments.
Frameworks that are not installed are skipped and named with their import error.

""" 


def _parser():
    from .cases import INPUT_KEYS, OPS
    p = argparse.ArgumentParser(prog="roicore", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", metavar="{parity,bench}")
    sub.required = True

    pp = sub.add_parser(
        "parity", help="compare roicore's adapters with each framework's own RoI operators",
        description="Run each installed framework's native RoI operators and roicore's adapter on "
                    "the same inputs (one worker process per framework) and report max abs "
                    "difference, mismatching elements and gradient agreement; then compare "
                    "roicore's conventions with one another on the same inputs.",
        epilog=PARITY_EPILOG + INPUT_KEYS, formatter_class=argparse.RawDescriptionHelpFormatter)
    pp.add_argument("--frameworks", metavar="LIST",
                    help="comma-separated: paddle,mxnet,tensorflow,openvino (default: all)")
    pp.add_argument("--ops", metavar="LIST",
                    help=f"comma-separated: {','.join(OPS)} (default: all)")
    pp.add_argument("--dtypes", metavar="LIST", help="float32,float64 (default: both)")
    pp.add_argument("--cases", type=int, default=12, metavar="N",
                    help="seeded random cases per operator (default: 12)")
    pp.add_argument("--seed", type=int, default=0, help="seed of the random cases (default: 0)")
    pp.add_argument("--inputs", metavar="FILE.npz",
                    help="compare on your own feature map and boxes instead of the case suite")
    pp.add_argument("--json", metavar="FILE", help="also write a machine-readable report ('-': stdout)")
    pp.add_argument("--no-conventions", action="store_true",
                    help="skip the table comparing roicore's conventions with one another")

    pb = sub.add_parser(
        "bench", help="time roicore against the native RoI operators",
        description="Time roicore.core, roicore's adapters and every available native operator on "
                    "the standard workloads, interleaved in rounds (each contender once per round), "
                    "median of --repeats rounds, the same thread count for every contender.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="ratio = native time / roicore.core time (> 1: roicore is faster); "
               "adapter overhead = adapter time / roicore.core time, both timed in the adapter's "
               "worker process, interleaved; extra MB = roicore.core's "
               "tracemalloc peak during one untimed call minus its outputs.")
    pb.add_argument("--workloads", metavar="LIST",
                    help="comma-separated: fastrcnn_vgg16,train_b2,rfcn_psroi,c4_14x14 (default: all)")
    pb.add_argument("--ops", metavar="LIST",
                    help="comma-separated: roi_pool,roi_align,psroi_pool (default: all that fit "
                         "each workload)")
    pb.add_argument("--frameworks", metavar="LIST",
                    help="comma-separated: paddle,mxnet,tensorflow,openvino,onnxruntime (default: all)")
    pb.add_argument("--directions", metavar="LIST", default="forward,fwd+bwd",
                    help="forward,fwd+bwd (default: both)")
    pb.add_argument("--repeats", type=int, default=5, metavar="N",
                    help="rounds; the median is reported (default: 5)")
    pb.add_argument("--threads", type=int, default=None, metavar="N",
                    help="threads for every contender (default: the CPUs available)")
    pb.add_argument("--scale", type=float, default=1.0, metavar="F",
                    help="multiply the workloads' boxes and channels by F (0 < F <= 1)")
    pb.add_argument("--quick", action="store_true",
                    help="tiny workloads (--scale 0.03, forward and fwd+bwd) for CI smoke runs")
    pb.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    pb.add_argument("--json", metavar="FILE", help="also write a machine-readable report ('-': stdout)")
    pb.add_argument("--plot", metavar="FILE.png", help="draw the ratios (needs matplotlib)")
    pb.add_argument("--scaling", action="store_true",
                    help="time roicore.core alone at 1 thread and at --threads N (default: the "
                         "CPUs available), interleaved; print speedup, ns per output element and "
                         "peak memory beyond inputs and outputs (no framework needed)")
    return p


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "parity":
        from . import parity
        return parity.run(args)
    from . import bench
    return bench.run(args)
