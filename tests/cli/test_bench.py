"""`roicore bench`, run as a user would, and the arithmetic of its report."""
import csv
import datetime
import importlib.util
import json
import statistics

import pytest

from cli_run import check_skips, flat, report_of, roicore

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
# the native operators each framework's harness times, per operator
NATIVES = {"paddle": {"roi_pool", "roi_align", "psroi_pool"},
           "mxnet": {"roi_pool", "roi_align", "psroi_pool", "ps_roi_align"},
           "openvino": {"roi_pool", "roi_align", "psroi_pool", "roi_pool_bilinear"},
           "onnxruntime": {"roi_pool", "roi_align", "roi_pool_bilinear", "roi_pool_nearest"},
           "tensorflow": {"roi_pool", "roi_pool_bilinear", "roi_pool_nearest"},
           "torch": {"roi_pool", "roi_align", "psroi_pool", "ps_roi_align"}}
ADAPTERS = {"paddle": {"roi_pool", "roi_align", "psroi_pool"},
            "mxnet": {"roi_pool", "roi_align", "psroi_pool", "ps_roi_align"},
            "tensorflow": {"roi_pool", "roi_align", "psroi_pool", "roi_pool_bilinear",
                           "roi_pool_nearest"},
            "torch": {"roi_pool", "roi_align", "psroi_pool", "ps_roi_align"}}
# every operator of the table, on the workload of its kind
QUICK_WORKLOADS = {"train_b2": None, "rfcn_psroi": None}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick run of every framework, in every output format: (proc, report, paths)."""
    from roicore.cli import workloads
    for wl in QUICK_WORKLOADS:
        QUICK_WORKLOADS[wl] = workloads.OPS_FOR[workloads.WORKLOADS[wl][6]]
    d = tmp_path_factory.mktemp("bench")
    paths = {k: d / f"b.{k}" for k in ("json", "md", "csv", "png")}
    args = ["bench", "--quick", "--repeats", "2", "--workloads", ",".join(QUICK_WORKLOADS),
            "--json", str(paths["json"]), "--markdown", str(paths["md"]), "--csv", str(paths["csv"])]
    if HAS_MPL:
        args += ["--plot", str(paths["png"])]
    proc = roicore(*args)
    return proc, report_of(proc, paths["json"]), paths, args


def test_bench_quick_times_every_contender(quick):
    from roicore.cli import bench
    proc, report, _, _ = quick
    ran, _ = check_skips({k: v for k, v in report["frameworks"].items() if k != "roicore"})
    assert report["frameworks"]["roicore"]["status"] == "ran"
    assert report["mode"] == "compare" and report["quick"] and report["scale"] == 0.03
    assert report["repeats"] == 2 and report["min_run_seconds"] == bench.QUICK["min_seconds"]
    assert report["threads"] >= 1 and report["environment"]["cpu"]
    got = {(r["workload"], r["operator"], r["direction"], r["framework"], r["kind"],
            r["variant"]) for r in report["results"]}
    for wl, ops in QUICK_WORKLOADS.items():
        for op in ops:
            for d in ("forward", "fwd+bwd"):
                assert (wl, op, d, "roicore", "core", "") in got
            for fw in ran:
                if op in NATIVES[fw]:
                    assert (wl, op, "forward", fw, "native", "") in got, (fw, op)
                if op in ADAPTERS.get(fw, ()):
                    for d in ("forward", "fwd+bwd"):
                        assert (wl, op, d, fw, "adapter", "") in got, (fw, op, d)
                        assert (wl, op, d, fw, "core", "") in got, (fw, op, d)
                    assert (wl, op, "fwd+bwd", fw, "autograd", "") in got
                    # TensorFlow's adapter is also timed taking and returning NHWC
                    if fw == "tensorflow":
                        assert (wl, op, "forward", fw, "adapter", "NHWC") in got
    # nothing timed that the harnesses do not offer
    for wl, op, d, fw, kind, variant in got:
        if kind == "native":
            assert op in NATIVES[fw], (fw, op)
        if kind in ("adapter", "autograd") or (kind == "core" and fw != "roicore"):
            assert op in ADAPTERS[fw], (fw, op)
    for r in report["results"]:
        ts = r["times_ms"]
        assert len(ts) == 2 and all(t > 0 for t in ts)
        assert (r["median_ms"], r["min_ms"], r["max_ms"]) == (statistics.median(ts), min(ts),
                                                              max(ts))
        assert r["threads"] == report["threads"] and r["dtype"] == "float32"
        if r["kind"] == "native":
            assert r["ratio"] > 0
        # roicore.core in the roicore worker carries its peak memory beyond inputs and outputs
        assert ("extra_mb" in r) == (r["kind"] == "core" and r["framework"] == "roicore"), r
        if "extra_mb" in r:
            m = r["memory_bytes"]
            assert r["extra_mb"] >= 0 and m["peak"] >= m["outputs"] > 0, r
            assert r["extra_mb"] == pytest.approx(m["extra"] / 2**20)
    assert report["frameworks"]["roicore"]["peak_rss_mb"] > 0
    assert not report["errors"], report["errors"]
    assert "native time / roicore.core time" in proc.stdout
    assert "extra MB" in proc.stdout and "peak RSS per worker: roicore" in proc.stdout
    assert "workloads scaled down by 0.03" in proc.stdout


def test_bench_adapter_ratios_pair_rounds_in_the_adapters_process(quick):
    proc, report, _, _ = quick
    rows = {(r["workload"], r["operator"], r["direction"], r["framework"], r["kind"],
             r["variant"]): r for r in report["results"]}
    adapters = [k for k in rows if k[4] == "adapter"]
    if not adapters:
        pytest.skip("no framework with an adapter installed")
    for wl, op, d, fw, _, variant in adapters:
        a, c = rows[(wl, op, d, fw, "adapter", variant)], rows[(wl, op, d, fw, "core", "")]
        ratios = [x / y for x, y in zip(a["times_ms"], c["times_ms"])]
        assert a["core_ms"] == c["median_ms"] > 0
        assert a["overhead"] == pytest.approx(statistics.median(ratios))
        assert a["overhead_range"] == pytest.approx([min(ratios), max(ratios)])
        if d == "fwd+bwd":   # also net of the framework's own autograd cost (a null op's time)
            n = rows[(wl, op, d, fw, "autograd", "")]
            assert a["autograd_ms"] == n["median_ms"] > 0
            assert a["net_overhead"] == pytest.approx(statistics.median(
                (x - z) / y for x, y, z in zip(a["times_ms"], c["times_ms"], n["times_ms"])))
        else:
            assert "net_overhead" not in a
        native = rows.get((wl, op, d, fw, "native", ""))
        assert ("vs_native" in a) == (native is not None)
        if native:
            assert a["vs_native"] == pytest.approx(statistics.median(
                y / x for x, y in zip(a["times_ms"], native["times_ms"])))
    assert all("core_ms" not in r and "overhead" not in r for r in report["results"]
               if r["kind"] != "adapter")
    assert "same worker process, interleaved" in flat(proc.stdout)


def test_bench_table_shows_each_rounds_spread(quick):
    """Every time printed is the median, with the fastest and slowest round beside it; a
    --quick run (a smoke run) prints the median alone, in a table a terminal can hold."""
    from roicore.cli._bench_report import blocks, fmt_ms
    from roicore.cli._report import render_text
    proc, report, _, _ = quick
    measured = render_text(blocks(dict(report, quick=False))).splitlines()
    for lines, spread in ((proc.stdout.splitlines(), False), (measured, True)):
        for r in report["results"]:
            if r["kind"] == "core" and r["framework"] == "roicore" or r["kind"] == "native":
                cell = fmt_ms(r["median_ms"])
                if spread:
                    cell += f" [{fmt_ms(r['min_ms'])}, {fmt_ms(r['max_ms'])}]"
                if r["kind"] == "native":
                    cell = f"{r['ratio']:.1f}x " + cell
                assert any(ln.startswith(r["workload"]) and f" {r['operator']} " in ln and
                           f" {r['direction']} " in ln and f" {cell}" in ln
                           and (spread or f" {cell} [" not in ln) for ln in lines), (cell, r)
    tables = [ln for ln in proc.stdout.splitlines() if ln.startswith(("workload", "-----"))]
    assert tables and max(map(len, tables)) <= 160, max(map(len, tables))


def test_bench_markdown_is_stamped_and_holds_the_tables(quick):
    proc, report, paths, args = quick
    md = paths["md"].read_text()
    env = report["environment"]
    lines = md.splitlines()
    assert lines[0] == "# roicore bench"
    stamp = {ln.split(":", 1)[0][2:]: ln.split(":", 1)[1].strip() for ln in lines[1:10]
             if ln.startswith("- ")}
    when = datetime.datetime.fromisoformat(stamp["date"])
    assert abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) < 3600
    assert env["cpu"] in stamp["machine"] and f"{env['logical_cpus']} logical CPUs" in stamp["machine"]
    assert f"{env['physical_cores']} cores" in stamp["machine"]
    for name, info in report["frameworks"].items():
        if info.get("version"):
            assert f"{name} {info['version']}" in stamp["versions"], name
    assert f"numpy {env['numpy']}" in stamp["versions"]
    assert stamp["command"] == "`roicore " + " ".join(args) + "`"
    assert report["command_line"] == "roicore " + " ".join(args)
    # the tables, as Markdown tables with the printed cells
    assert "| workload | op | direction | roicore ms | extra MB |" in md
    assert "|---|---|---|---:|---:|" in md
    core = next(r for r in report["results"] if r["framework"] == "roicore")
    from roicore.cli._bench_report import row_ms
    row = next(ln for ln in lines if ln.startswith(f"| {core['workload']} | {core['operator']} | "
                                                     f"{core['direction']} |"))
    assert f"| {row_ms(core, spread=False)} |" in row   # --quick: the median alone
    assert "- peak RSS per worker: roicore" in md


def test_bench_csv_has_one_line_per_timed_contender(quick):
    _, report, paths, _ = quick
    with open(paths["csv"], newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(report["results"]) > 0
    for line, r in zip(lines, report["results"]):
        for k in ("workload", "operator", "dtype", "direction", "framework", "kind", "variant"):
            assert line[k] == r[k]
        assert int(line["threads"]) == r["threads"] and int(line["rounds"]) == 2
        for k in ("median_ms", "min_ms", "max_ms"):
            assert float(line[k]) == pytest.approx(r[k], rel=1e-12)
        for k in ("ratio", "overhead", "vs_native", "extra_mb"):
            assert (line[k] == "") == (k not in r)


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib (roicore[plot]) is not installed")
def test_bench_plot_file(quick):
    _, _, paths, _ = quick
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- more rows
@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Conventions, float64 and bilinear pooling, on one workload."""
    out = tmp_path_factory.mktemp("wide") / "w.json"
    proc = roicore("bench", "--quick", "--repeats", "2", "--workloads", "fastrcnn_vgg16",
                   "--frameworks", "tensorflow,openvino", "--dtypes", "float32,float64",
                   "--conventions", "all", "--json", str(out))
    return proc, report_of(proc, out)


def test_bench_times_every_convention_of_roicore_core(wide):
    from roicore.cli.cases import CONVENTIONS
    proc, report = wide
    core = {(r["operator"], r["dtype"], r["direction"], r["convention"]): r
            for r in report["results"] if r["framework"] == "roicore"}
    default = {"roi_pool": "mxnet", "roi_align": "mxnet", "roi_pool_bilinear": "tensorflow",
               "roi_pool_nearest": "tensorflow"}
    for op in default:
        for dtype in ("float32", "float64"):
            for d in ("forward", "fwd+bwd"):
                for conv in CONVENTIONS[op]:
                    r = core[(op, dtype, d, conv)]
                    # the default convention is the native-ratio table's row (variant "")
                    assert r["variant"] == ("" if conv == default[op] else conv)
                    assert ("extra_mb" in r) == (conv == default[op])
    assert len(core) == sum(len(CONVENTIONS[op]) for op in default) * 2 * 2
    text = proc.stdout
    for op in default:
        title = f"roicore.core {op} by convention"
        assert title in text
        table = table_lines(text, title)
        assert table[0].split()[4:] == list(CONVENTIONS[op])
        assert len(table) == 1 + 2 * 2
        for ln in table[1:]:
            ratios = [float(c[1:-2]) for c in ln.split() if c.startswith("(") and c.endswith("x)")]
            assert len(ratios) == len(CONVENTIONS[op]) and min(ratios) == 1.0, ln


def table_lines(text, title):
    """The lines of the printed table whose title starts with ``title`` (header first)."""
    block = text[text.index(title):].split("\n\n")[0].splitlines()
    return block[1:2] + block[3:]


def test_bench_float64_rows_and_their_ratio_to_float32(wide):
    proc, report = wide
    rows = {(r["framework"], r["kind"], r["variant"], r["operator"], r["dtype"], r["direction"]): r
            for r in report["results"]}
    lines = table_lines(proc.stdout, "roicore.core in float64 against float32")
    ops = ("roi_pool", "roi_pool_bilinear", "roi_pool_nearest", "roi_align")
    assert len(lines) == 1 + len(ops) * 2
    for op in ops:
        for d in ("forward", "fwd+bwd"):
            a, b = (rows[("roicore", "core", "", op, dt, d)] for dt in ("float32", "float64"))
            ratios = [y / x for x, y in zip(a["times_ms"], b["times_ms"])]
            assert b["vs_float32"] == pytest.approx(statistics.median(ratios))
            assert "vs_float32" not in a
            line = next(ln.split() for ln in lines if ln.split()[1:3] == [op, d])
            assert line[-3:] == [f"{statistics.median(ratios):.2f}x",
                                 f"[{min(ratios):.2f}x,", f"{max(ratios):.2f}x]"], line
    # the native operators that compute in float32 only are not timed in float64
    assert not [k for k in rows if k[1] == "native" and k[4] == "float64"]
    if report["frameworks"]["tensorflow"]["status"] == "ran":
        for d in ("forward", "fwd+bwd"):   # TF's adapter runs float64 as such, in both layouts
            for variant in ("", "NHWC"):
                assert ("tensorflow", "adapter", variant, "roi_pool_bilinear", "float64", d) in rows
    # several dtypes: the tables get a dtype column
    assert table_lines(proc.stdout, "native time / roicore.core time")[0].split()[:4] == [
        "workload", "op", "dtype", "direction"]


def test_bench_bilinear_pooling_against_crop_and_resize(wide):
    proc, report = wide
    ran, _ = check_skips({k: v for k, v in report["frameworks"].items() if k != "roicore"})
    rows = {(r["framework"], r["kind"], r["variant"], r["operator"], r["dtype"], r["direction"]): r
            for r in report["results"]}
    if "tensorflow" in ran:
        for d in ("forward", "fwd+bwd"):
            native = rows[("tensorflow", "native", "", "roi_pool_bilinear", "float32", d)]
            assert native["ratio"] > 0
            for variant in ("", "NHWC"):   # the adapter in NCHW and in NHWC, against it
                a = rows[("tensorflow", "adapter", variant, "roi_pool_bilinear", "float32", d)]
                assert a["vs_native"] == pytest.approx(statistics.median(
                    n / x for x, n in zip(a["times_ms"], native["times_ms"])))
        assert "tensorflow NHWC" in proc.stdout
    if "openvino" in ran:
        assert rows[("openvino", "native", "", "roi_pool_bilinear", "float32", "forward")]["ratio"] > 0


# ----------------------------------------------------------------------------- arithmetic
def timing(fw, kind, ms, op="roi_pool", direction="forward", variant="", dtype="float32",
           workload="train_b2", threads=2):
    """A timing row as the bench reports it (``ms``: one number or the rounds' times)."""
    ts = list(ms) if isinstance(ms, (list, tuple)) else [ms]
    return dict(workload=workload, operator=op, dtype=dtype, direction=direction, framework=fw,
                kind=kind, variant=variant, threads=threads, median_ms=statistics.median(ts),
                min_ms=min(ts), max_ms=max(ts), times_ms=ts)


def synthetic_report(rows, scale=1.0, frameworks=("paddle", "mxnet")):
    fws = {"roicore": dict(status="ran", version="0")}
    fws.update({n: dict(status="ran", version="1") for n in frameworks})
    return dict(mode="compare", environment=dict(roicore="0", cpu="cpu", numpy="1", python="3",
                                                 cpus=2, logical_cpus=2, openmp=True),
                threads=2, thread_counts=[2], repeats=1, scale=scale, quick=False,
                min_run_seconds=0.1, conventions=[], workloads={"train_b2": {}},
                default_conventions=dict(roi_pool="mxnet", roi_align="mxnet",
                                         psroi_pool="paddle", roi_pool_bilinear="tensorflow"),
                frameworks=fws, results=rows, errors=[], seconds=0.0)


def test_adapter_overhead_uses_the_in_process_core():
    """adapter / core of the adapter's own worker, not of the roicore worker; both printed."""
    from roicore.cli import _bench_report, bench
    from roicore.cli._report import render_text
    rows = [timing("roicore", "core", 2.0), timing("paddle", "native", 8.0),
            timing("paddle", "adapter", 3.0), timing("paddle", "core", 2.5),
            timing("mxnet", "adapter", 4.0),                      # no in-process core: no ratio
            timing("mxnet", "native", 5.0, "roi_align"), timing("mxnet", "core", 1.0, "roi_align")]
    fb = [timing(fw, kind, ms, direction="fwd+bwd") for fw, kind, ms in (
        ("paddle", "adapter", 9.0), ("paddle", "core", 4.0), ("paddle", "autograd", 4.5))]
    bench.add_ratios(rows + fb)
    assert fb[0]["overhead"] == pytest.approx(9.0 / 4.0)
    assert fb[0]["autograd_ms"] == 4.5 and fb[0]["net_overhead"] == pytest.approx((9.0 - 4.5) / 4.0)
    paddle_adapter, mxnet_adapter, mxnet_native = rows[2], rows[4], rows[5]
    assert rows[1]["ratio"] == pytest.approx(8.0 / 2.0)        # native: the roicore worker's core
    assert paddle_adapter["core_ms"] == 2.5
    assert paddle_adapter["overhead"] == pytest.approx(3.0 / 2.5)
    assert paddle_adapter["vs_native"] == pytest.approx(8.0 / 3.0)   # same worker's native
    assert "overhead" not in mxnet_adapter and "core_ms" not in mxnet_adapter
    assert "ratio" not in mxnet_native                          # no roicore-worker core for it
    # over several rounds, the median of each round's ratio, not the ratio of the medians
    drift = [timing("paddle", "adapter", [130.0, 106.0, 125.0, 133.0, 109.0], workload="c4_14x14"),
             timing("paddle", "core", [101.0, 132.0, 100.0, 131.0, 101.0], workload="c4_14x14")]
    bench.add_ratios(drift)
    per_round = [130 / 101, 106 / 132, 125 / 100, 133 / 131, 109 / 101]
    assert drift[0]["overhead"] == pytest.approx(statistics.median(per_round))  # not 125 / 101
    assert drift[0]["overhead_range"] == pytest.approx([min(per_round), max(per_round)])
    text = render_text(_bench_report.blocks(synthetic_report(rows)))
    table = text[text.index("adapters: overhead"):]
    line = next(ln for ln in table.splitlines() if ln.startswith("train_b2") and " paddle " in ln)
    assert line.split()[3:] == ["paddle", "3", "2.5", "1.20", "-", "-", "2.67x"], line
    assert not any(ln.startswith("train_b2") and " mxnet " in ln for ln in table.splitlines())
    assert "same worker process, interleaved" in flat(text)


def test_a_failed_roicore_contender_fails_the_run_a_failed_native_does_not():
    from roicore.cli.bench import failed
    report = synthetic_report([])
    assert not failed(report)
    native = dict(framework="tensorflow", workload="c4_14x14", op="roi_pool", kind="native",
                  error="MemoryError: skipped")
    assert not failed(dict(report, errors=[native]))
    for kind in ("adapter", "core", "autograd", None):
        assert failed(dict(report, errors=[dict(native, kind=kind)])), kind
    report["frameworks"]["paddle"] = dict(status="failed", reason="worker died")
    assert failed(report)


def test_a_worker_that_dies_is_named_with_the_workload_it_died_on():
    from roicore.cli import _bench_report
    from roicore.cli._report import render_text
    report = synthetic_report([], frameworks=("paddle", "mxnet"))
    report.update(date="2026-01-01", command_line="roicore bench")
    report["environment"]["platform"] = "Linux"
    report["frameworks"]["paddle"].update(status="failed", workload="c4_14x14",
                                          reason="paddle worker died (exit code -9)")
    assert "- not run, or not to the end: paddle (failed at c4_14x14)" in \
        _bench_report.stamp(report)
    assert "paddle: FAILED at c4_14x14: paddle worker died (exit code -9)" in \
        render_text(_bench_report.blocks(report))


# ----------------------------------------------------------------------------- --compare
def test_compare_flags_only_rows_beyond_both_runs_noise_and_the_threshold():
    from roicore.cli import _compare
    base = [timing("roicore", "core", [10.0, 11.0, 12.0]),
            timing("roicore", "core", [10.0, 11.0, 12.0], direction="fwd+bwd"),
            timing("roicore", "core", [10.0, 11.0, 12.0], op="roi_align"),
            timing("roicore", "core", [10.0, 11.0, 12.0], op="psroi_pool"),
            timing("paddle", "adapter", [10.0, 12.0]),
            timing("paddle", "native", [1.0]),                  # not roicore's: never judged
            timing("paddle", "core", [1.0]),                    # the overhead's denominator
            timing("roicore", "core", [1.0], op="roi_pool_bilinear")]   # not in this run
    now = [timing("roicore", "core", [13.3, 14.0]),     # fastest 13.3 > 12 * 1.1: regressed
           timing("roicore", "core", [13.1, 20.0], direction="fwd+bwd"),   # 13.1 <= 13.2: same
           timing("roicore", "core", [8.0, 9.0], op="roi_align"),   # 9 * 1.1 < 10: faster
           timing("roicore", "core", [9.5, 9.6], op="psroi_pool"),  # 9.6 * 1.1 > 10: same
           timing("paddle", "adapter", [30.0, 31.0]),   # regressed
           timing("paddle", "native", [100.0]), timing("paddle", "core", [100.0]),
           timing("roicore", "core", [1.0], threads=4)]   # other thread count: no baseline
    baseline = dict(path="base.json", environment=dict(cpu="other cpu"), results=base,
                    date="2026-01-01T00:00:00+00:00", command_line="roicore bench")
    got = _compare.compare(synthetic_report(now), baseline, 10.0)
    verdicts = {(r["operator"], r["direction"], r["framework"]): r["verdict"] for r in got["rows"]}
    assert verdicts == {("roi_pool", "forward", "roicore"): "regressed",
                        ("roi_pool", "fwd+bwd", "roicore"): "same",
                        ("roi_align", "forward", "roicore"): "faster",
                        ("psroi_pool", "forward", "roicore"): "same",
                        ("roi_pool", "forward", "paddle"): "regressed"}
    assert got["regressions"] == 2 and got["faster"] == 1
    first = got["rows"][0]
    assert first["baseline_range_ms"] == [10.0, 12.0] and first["range_ms"] == [13.3, 14.0]
    assert first["change"] == pytest.approx(13.65 / 11.0 - 1)
    assert got["notes"] and "other cpu" in got["notes"][0]
    # a larger threshold forgives the smaller slowdown, not the larger one
    got = _compare.compare(synthetic_report(now), baseline, 20.0)
    assert {(r["operator"], r["framework"]) for r in got["rows"] if r["verdict"] == "regressed"} == {
        ("roi_pool", "paddle")}
    # baselines written before dtype and variant existed read as float32, default variant
    old = [{k: v for k, v in r.items() if k not in ("dtype", "variant", "min_ms", "max_ms")}
           for r in base]
    got_old = _compare.compare(synthetic_report(now), dict(baseline, results=old), 10.0)
    assert [r["verdict"] for r in got_old["rows"]] == [r["verdict"] for r in _compare.compare(
        synthetic_report(now), baseline, 10.0)["rows"]]
    for text, value in (("10%", 10.0), ("2.5", 2.5), (None, 10.0), ("0%", 0.0)):
        assert _compare.parse_threshold(text) == value


def test_compare_end_to_end_exit_status(quick, tmp_path):
    """Against a baseline 100x faster every judged row regressed (exit 1); 100x slower, none
    did (exit 0).  The baselines are the quick run's own report, rescaled."""
    _, report, _, _ = quick

    def rescaled(factor):
        rows = [dict(r, median_ms=r["median_ms"] * factor, min_ms=r["min_ms"] * factor,
                     max_ms=r["max_ms"] * factor, times_ms=[t * factor for t in r["times_ms"]])
                for r in report["results"]]
        f = tmp_path / f"base{factor}.json"
        f.write_text(json.dumps(dict(report, results=rows)))
        return f

    args = ["bench", "--quick", "--repeats", "2", "--workloads", "rfcn_psroi", "--frameworks",
            "paddle"]
    for factor, status, verdict in ((0.01, 1, "regressed"), (100, 0, "faster")):
        out = tmp_path / "now.json"
        proc = roicore(*args, "--compare", str(rescaled(factor)), "--threshold", "5%",
                       "--json", str(out))
        assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
        c = json.loads(out.read_text())["compare"]
        assert c["rows"] and all(r["verdict"] == verdict for r in c["rows"])
        assert {(r["framework"], r["kind"]) for r in c["rows"]} <= {
            ("roicore", "core"), ("paddle", "adapter")}
        assert c["threshold_percent"] == 5.0
        assert ("REGRESSED" in proc.stdout) == (status == 1)
        assert f"against the baseline {tmp_path}" in proc.stdout


# ----------------------------------------------------------------------------- --plot
def test_plot_labels_every_bar_and_marks_missing_contenders():
    pytest.importorskip("matplotlib", reason="matplotlib (roicore[plot]) is not installed")
    from roicore.cli import _plot, bench
    rows = [timing("roicore", "core", 2.0), timing("paddle", "native", 5.0),
            timing("mxnet", "native", 1.0),
            timing("roicore", "core", 2.0, op="psroi_pool"), timing("paddle", "native", 0.5,
                                                                     op="psroi_pool"),
            timing("roicore", "core", 3.0, direction="fwd+bwd"),
            timing("mxnet", "native", 9.0, direction="fwd+bwd")]
    bench.add_ratios(rows)
    report = synthetic_report(rows, scale=0.03)
    report["quick"] = True
    fig = _plot.figure(report)
    try:
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert sorted(t for t in texts if t.endswith("x")) == ["0.25x", "0.5x", "2.5x", "3x"]
        # psroi_pool has no mxnet native, fwd+bwd no paddle one, and no fwd+bwd psroi_pool row
        assert sorted(t for t in texts if t.startswith("n/a")) == [
            "n/a (mxnet)", "n/a (mxnet)", "n/a (paddle)", "n/a (paddle)"]
        title = " ".join(t.get_text() for t in fig.texts)   # the suptitle
        assert "2 thread(s) for every contender" in title and "scaled down by 0.03" in title
        assert "not a measurement" in title
        assert [ax.get_title() for ax in fig.axes] == ["forward", "fwd+bwd"]
        assert all(ax.get_xscale() == "log" for ax in fig.axes)
        full = _plot.figure(synthetic_report(rows))
        assert "full-size workloads" in " ".join(t.get_text() for t in full.texts)
    finally:
        import matplotlib.pyplot as plt
        plt.close("all")


# ----------------------------------------------------------------------------- pyramids
PYRAMID_WORKLOADS = ("fpn_box", "fpn_mask")
# (framework, kind, variant) of each pyramid contender -> its directions
PYRAMID_CONTENDERS = {("torch", "adapter", ""): ("forward", "fwd+bwd"),       # fused
                      ("torch", "native", ""): ("forward", "fwd+bwd"),        # torchvision
                      ("torch", "adapter", "loop"): ("forward", "fwd+bwd"),   # per-level loop
                      ("openvino", "native", ""): ("forward",)}


@pytest.fixture(scope="module")
def pyramid(tmp_path_factory):
    """The pyramid rows alone, scaled down, at 1 and 2 threads: (proc, report, paths)."""
    d = tmp_path_factory.mktemp("pyramid")
    paths = {k: d / f"p.{k}" for k in ("json", "md", "csv")}
    proc = roicore("bench", "--quick", "--repeats", "2", "--workloads", ",".join(PYRAMID_WORKLOADS),
                   "--threads", "1,2", "--json", str(paths["json"]), "--markdown",
                   str(paths["md"]), "--csv", str(paths["csv"]))
    return proc, report_of(proc, paths["json"]), paths


def test_bench_pyramid_rows_time_every_contender_at_each_thread_count(pyramid):
    proc, report, _ = pyramid
    ran, _ = check_skips(report["frameworks"])
    # no single-map worker: only the pyramid contenders' frameworks were started
    assert set(report["frameworks"]) <= {"torch", "openvino"}
    assert report["thread_counts"] == [1, 2] and not report["errors"], report["errors"]
    for wl in PYRAMID_WORKLOADS:
        shape = report["workloads"][wl]
        assert shape["kind"] == "pyramid" and shape["strides"] == [4, 8, 16, 32]
        assert [m[2:] for m in shape["maps"]] == [[200, 304], [100, 152], [50, 76], [25, 38]]
    got = {(r["workload"], r["direction"], r["threads"], r["framework"], r["kind"],
            r["variant"]): r for r in report["results"]}
    want = {(wl, d, n) + c for wl in PYRAMID_WORKLOADS for n in (1, 2)
            for c, ds in PYRAMID_CONTENDERS.items() if c[0] in ran for d in ds}
    assert set(got) == want and len(report["results"]) == len(want)
    for (wl, d, n, fw, kind, variant), r in got.items():
        assert r["operator"] == "pyramid_roi_align" and r["dtype"] == "float32"
        assert len(r["times_ms"]) == 2 and all(t > 0 for t in r["times_ms"])
        fused = got.get((wl, d, n, "torch", "adapter", ""))
        if (fw, kind, variant) == ("torch", "adapter", "") or fused is None:
            assert "vs_fused" not in r
        elif fw == "torch":   # same worker, same rounds: the median of the rounds' ratios
            ratios = [a / b for a, b in zip(r["times_ms"], fused["times_ms"])]
            assert r["vs_fused"] == pytest.approx(statistics.median(ratios))
            assert r["vs_fused_range"] == pytest.approx([min(ratios), max(ratios)])
        else:
            assert r["vs_fused"] == pytest.approx(r["median_ms"] / fused["median_ms"])
    if "torch" in ran:
        lines = table_lines(proc.stdout, "pyramid_roi_align, feature pyramids")
        head = lines[0].split()
        assert head[:4] == ["workload", "direction", "threads", "fused"] and "torchvision" in head
        assert len(lines) == 1 + len(PYRAMID_WORKLOADS) * 2 * 2
        r = got[("fpn_box", "fwd+bwd", 2, "torch", "native", "")]
        from roicore.cli._bench_report import fmt_ms
        line = next(ln for ln in lines if ln.split()[:3] == ["fpn_box", "fwd+bwd", "2"])
        assert f"{r['vs_fused']:.2f}x {fmt_ms(r['median_ms'])}" in line, line
    assert "roicore.core" not in proc.stdout.split("\n\n")[0]   # no single-map table


def test_bench_pyramid_rows_in_the_markdown_and_csv(pyramid):
    _, report, paths = pyramid
    md = paths["md"].read_text()
    assert md.startswith("# roicore bench\n") and "- threads: 1, 2;" in md
    assert "- fpn_box: image 800x1216, x 1x8 at strides 4, 8, 16, 32" in md
    if report["frameworks"].get("torch", {}).get("status") == "ran":
        assert "| workload | direction | threads | fused ms | torchvision |" in md
    with open(paths["csv"], newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(report["results"])
    for line, r in zip(lines, report["results"]):
        assert (line["vs_fused"] == "") == ("vs_fused" not in r)
        if "vs_fused" in r:
            assert float(line["vs_fused"]) == pytest.approx(r["vs_fused"], rel=1e-12)


def _plan(*args):
    from roicore.cli import _parser, bench
    parser, _ = _parser()
    return bench.plan(parser.parse_args(["bench", *args]), 2)


def test_bench_pyramid_workloads_run_when_asked_for():
    from roicore.cli._report import UsageError
    single = ["fastrcnn_vgg16", "train_b2", "rfcn_psroi", "c4_14x14"]
    p = _plan()
    assert p.workloads == single and "pyramid_roi_align" in p.ops   # not in the default run
    assert _plan("--ops", "pyramid_roi_align").workloads == list(PYRAMID_WORKLOADS)
    p = _plan("--ops", "multi_scale_roi_align,roi_align")
    assert p.ops == ["pyramid_roi_align", "roi_align"]
    assert p.workloads == single + list(PYRAMID_WORKLOADS)
    p = _plan("--workloads", "fpn_mask", "--frameworks", "torch")
    assert p.workloads == ["fpn_mask"] and p.pyramid_frameworks == ["torch"]
    # a thread list: the pyramid rows keep their frameworks; single-map rows are a sweep
    p = _plan("--workloads", "fpn_box", "--threads", "1,2", "--frameworks", "ov")
    assert p.sweep and p.thread_counts == [1, 2] and p.pyramid_frameworks == ["openvino"]
    assert _plan("--threads", "1,2").pyramid_frameworks == ["torch", "openvino"]
    with pytest.raises(UsageError, match="drop --frameworks"):
        _plan("--workloads", "train_b2,fpn_box", "--threads", "1,2", "--frameworks", "torch")
    with pytest.raises(UsageError, match="pyramid workloads have none"):
        _plan("--workloads", "fpn_box", "--plot", "x.png")
    with pytest.raises(UsageError, match="unknown workload 'fpn'"):
        _plan("--workloads", "fpn")


def test_pyramid_ratios_and_table_beside_single_map_rows():
    """vs_fused pairs rounds within the torch worker, divides medians across workers; the
    pyramid rows get a table of their own and stay out of the single-map tables."""
    from roicore.cli import _bench_report, _pyramid_bench, bench
    from roicore.cli._report import render_text

    def row(fw, kind, ms, variant="", direction="forward", threads=1):
        return timing(fw, kind, ms, op="pyramid_roi_align", direction=direction,
                      variant=variant, workload="fpn_box", threads=threads)
    fused = row("torch", "adapter", [10.0, 20.0, 12.0])
    stock = row("torch", "native", [30.0, 40.0, 60.0])
    loop = row("torch", "adapter", [20.0, 20.0, 30.0], variant="loop")
    ov = row("openvino", "native", [50.0, 25.0, 40.0])
    other = row("torch", "native", [5.0, 5.0, 5.0], threads=2)   # no fused row at 2 threads
    pyr = [fused, stock, loop, ov, other]
    _pyramid_bench.add_ratios(pyr)
    assert stock["vs_fused"] == pytest.approx(3.0)             # rounds: 3, 2, 5
    assert stock["vs_fused_range"] == pytest.approx([2.0, 5.0])
    assert loop["vs_fused"] == pytest.approx(2.0)              # rounds: 2, 1, 2.5
    assert ov["vs_fused"] == pytest.approx(40.0 / 12.0)        # medians: another worker
    assert "vs_fused_range" not in ov
    assert "vs_fused" not in fused and "vs_fused" not in other
    single = [timing("roicore", "core", 2.0), timing("paddle", "native", 8.0)]
    bench.add_ratios(single)
    report = synthetic_report(single + pyr)
    report["workloads"]["fpn_box"] = {}
    report["frameworks"].update(torch=dict(status="ran", version="2"),
                                openvino=dict(status="ran", version="3"))
    text = render_text(_bench_report.blocks(report))
    main = table_lines(text, "native time / roicore.core time")
    assert len(main) == 2 and not any("fpn_box" in ln for ln in main)
    lines = table_lines(text, "pyramid_roi_align, feature pyramids")
    assert lines[0].split() == ["workload", "direction", "threads", "fused", "ms", "torchvision",
                                "per-level", "loop", "openvino"]
    assert lines[1].split()[:3] == ["fpn_box", "forward", "1"]
    assert "3.00x 40 [30, 60]" in lines[1] and "2.00x 20 [20, 30]" in lines[1]
    assert "3.33x 40 [25, 50]" in lines[1] and " 12 [10, 20]" in lines[1]
    assert lines[2].split()[:5] == ["fpn_box", "forward", "2", "-", "5"]
