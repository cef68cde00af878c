"""`roicore bench --threads 1,2,...` (and --scaling): roicore.core alone at each thread count."""
import statistics

import pytest

from cli_run import flat, report_of, roicore

def _sweep_keys():
    """(workload, operator, direction) of every row a sweep of every workload gives: each
    operator of the table on the workloads of its kind."""
    from roicore.cli import workloads
    return {(wl, op, d) for wl, spec in workloads.WORKLOADS.items()
            for op in workloads.OPS_FOR[spec[6]] for d in ("forward", "fwd+bwd")}


SWEEP_KEYS = _sweep_keys()


def sweep_run(tmp_path, *args):
    out = tmp_path / "sweep.json"
    proc = roicore("bench", "--json", str(out), *args)
    return proc, report_of(proc, out)


def pooled_elements(shape, op):
    P = shape["P"]
    return (shape["R"] * (shape["C"] // (P * P) if op in ("psroi_pool", "ps_roi_align")
                          else shape["C"]) * P * P)


@pytest.fixture(scope="module")
def scaling_quick(tmp_path_factory):
    return sweep_run(tmp_path_factory.mktemp("scaling"), "--scaling", "--threads", "2", "--quick",
                     "--repeats", "2")


def test_bench_scaling_quick(scaling_quick):
    proc, report = scaling_quick
    assert report["command"] == "bench" and report["mode"] == "sweep"
    assert report["threads"] == 2 and report["thread_counts"] == [1, 2]
    assert list(report["frameworks"]) == ["roicore"]          # no framework worker started
    assert report["frameworks"]["roicore"]["peak_rss_mb"] > 0
    assert not report["errors"], report["errors"]
    rows = {(s["workload"], s["operator"], s["direction"]): s for s in report["scaling"]}
    assert set(rows) == SWEEP_KEYS and len(report["scaling"]) == len(SWEEP_KEYS)
    # timing rows: every contender at both thread counts, each timed in every round
    timed = {(r["workload"], r["operator"], r["direction"], r["threads"]): r
             for r in report["results"]}
    assert set(timed) == {k + (n,) for k in SWEEP_KEYS for n in (1, 2)}
    for r in timed.values():
        assert r["framework"] == "roicore" and r["kind"] == "core"
        assert len(r["times_ms"]) == 2 and all(t > 0 for t in r["times_ms"])
    for (wl, op, d), s in rows.items():
        one, two = timed[(wl, op, d, 1)], timed[(wl, op, d, 2)]
        assert s["threads"] == [1, 2]
        assert s["ms"] == [one["median_ms"], two["median_ms"]]
        assert s["min_ms"] == [one["min_ms"], two["min_ms"]]
        assert s["speedup"][0] == 1 and s["speedup"][1] == pytest.approx(s["ms"][0] / s["ms"][1])
        assert s["round_speedups"][1] == pytest.approx(
            [t1 / t2 for t1, t2 in zip(one["times_ms"], two["times_ms"])])
        elems = pooled_elements(report["workloads"][wl], op)
        assert s["output_elements"] == elems > 0
        assert s["ns_per_element"][1] == pytest.approx(s["ms"][1] * 1e6 / elems)
        assert "meets_target" not in s                        # scaled workloads: not judged
        mem = s["memory_bytes"][1]
        for v in s["extra_mb"]:
            assert isinstance(v, float) and 0 <= v < 1e4, s
        assert s["extra_mb"][1] == pytest.approx(mem["extra"] / 2**20)
        y_bytes = elems * 4                                    # float32 output
        shp = report["workloads"][wl]
        x_bytes = shp["N"] * shp["C"] * shp["H"] * shp["W"] * 4
        if d == "forward":
            assert mem["outputs"] == y_bytes, s
            assert mem["extra"] == mem["peak"] - mem["outputs"]
        else:
            # y (+ argmax for roi_pool) held through the backward, and dx
            assert mem["outputs"] >= y_bytes + x_bytes, s
            if op != "roi_pool":
                assert mem["outputs"] == y_bytes + x_bytes, s
            assert mem["extra"] == max(mem["forward_extra"], mem["backward_extra"])
            assert mem["peak"] >= mem["outputs"]
        # scratch, not a copy of the world: bounded by a few times what goes in and out
        assert mem["extra"] <= 8 * (x_bytes + mem["outputs"]) + 2**20, s
    out = flat(proc.stdout)
    assert "ms 1 thr ms 2 thr speedup ns/elem 2 thr extra MB" in out
    for s in report["scaling"]:
        lo, hi = min(s["round_speedups"][1]), max(s["round_speedups"][1])
        assert f"{s['speedup'][1]:.2f}x [{lo:.2f}x, {hi:.2f}x]" in out, s
    assert "not evaluated on this run (the workloads are scaled down)" in out
    assert "MISSED" not in out
    # the memory bandwidth the speedups are bounded by, at both thread counts
    bw = {b["kind"]: b for b in report["bandwidth"]}
    assert list(bw) == ["streaming stores", "plain stores", "reads"]
    for kind, b in bw.items():
        assert b["threads"] == [1, 2] and b["bytes"] == 256 << 20
        assert all(len(t) == 3 and all(v > 0 for v in t) for t in b["times_ms"])
        assert all(g == pytest.approx(b["bytes"] / statistics.median(t) / 1e6)
                   for g, t in zip(b["gb_per_s"], b["times_ms"]))
        assert b["speedup"][1] == pytest.approx(b["gb_per_s"][1] / b["gb_per_s"][0])
        assert f"{kind} {b['gb_per_s'][0]:.1f} {b['gb_per_s'][1]:.1f}" in out


def test_bench_thread_sweep_of_several_counts(tmp_path):
    """--threads 1,2,3: every count timed, speedups over 1 thread per count."""
    proc, report = sweep_run(tmp_path, "--threads", "3,1,2", "--quick", "--repeats", "2",
                             "--workloads", "rfcn_psroi")
    assert report["mode"] == "sweep" and report["thread_counts"] == [1, 2, 3]
    assert {(r["threads"], r["direction"]) for r in report["results"]} == {
        (n, d) for n in (1, 2, 3) for d in ("forward", "fwd+bwd")}
    for s in report["scaling"]:
        assert s["threads"] == [1, 2, 3] and len(s["ms"]) == len(s["speedup"]) == 3
        assert s["speedup"] == pytest.approx([s["ms"][0] / m for m in s["ms"]])
    out = flat(proc.stdout)
    assert "ms 1 thr ms 2 thr ms 3 thr speedup 2 speedup 3 ns/elem 3 thr" in out
    if report["environment"]["cpus"] < 3:
        assert f"3 threads on {report['environment']['cpus']} available CPU(s)" in out


def test_bench_scaling_memory_grows_with_the_workload(scaling_quick, tmp_path):
    _, small = scaling_quick
    _, big = sweep_run(tmp_path, "--scaling", "--threads", "2", "--scale", "0.2", "--repeats", "1",
                       "--workloads", "train_b2,rfcn_psroi")
    assert big["scale"] == 0.2 and small["scale"] < 0.2
    small_rows = {(s["workload"], s["operator"], s["direction"]): s for s in small["scaling"]}
    big_rows = {(s["workload"], s["operator"], s["direction"]): s for s in big["scaling"]}
    assert set(big_rows) == {k for k in SWEEP_KEYS if k[0] in ("train_b2", "rfcn_psroi")}
    for key, b in big_rows.items():
        a = small_rows[key]
        assert b["output_elements"] > a["output_elements"]
        for n in (0, 1):
            assert b["memory_bytes"][n]["extra"] > a["memory_bytes"][n]["extra"], (key, a, b)
            assert b["memory_bytes"][n]["outputs"] > a["memory_bytes"][n]["outputs"], key


def test_scaling_target_and_normalisation():
    """The scaling target's verdict and the per-element figure, on made-up timings."""
    from roicore.cli import _bench_report, bench
    from roicore.cli._report import render_text

    def row(wl, op, n, ms):
        return dict(workload=wl, operator=op, dtype="float32", direction="forward",
                    framework="roicore", kind="core", variant="", threads=n, median_ms=ms,
                    min_ms=ms, max_ms=ms, times_ms=[ms], extra_mb=1.5,
                    memory_bytes=dict(peak=3, outputs=1, extra=2))
    rows = [row("fastrcnn_vgg16", "roi_pool", 1, 10.0), row("fastrcnn_vgg16", "roi_pool", 2, 6.0),
            row("c4_14x14", "roi_align", 1, 10.0), row("c4_14x14", "roi_align", 2, 5.0),
            row("train_b2", "roi_pool", 1, 4.0), row("train_b2", "roi_pool", 2, 1.0)]
    got = {s["workload"]: s for s in bench.sweep_rows(rows, [1, 2], 1.0)}
    assert got["fastrcnn_vgg16"]["speedup"][1] == pytest.approx(10 / 6)
    assert got["fastrcnn_vgg16"]["meets_target"] is False      # 1.67x < 1.7x
    assert got["c4_14x14"]["meets_target"] is True
    assert "meets_target" not in got["train_b2"]               # not a large workload
    assert got["fastrcnn_vgg16"]["ns_per_element"][1] == pytest.approx(6e6 / (2000 * 512 * 49))
    assert got["c4_14x14"]["ns_per_element"][1] == pytest.approx(5e6 / (1000 * 1024 * 196))
    # no verdict without 1 and 2 threads, or on scaled workloads
    assert all("meets_target" not in s for s in bench.sweep_rows(rows, [1, 2], 0.5))
    rows4 = [dict(r, threads=4) if r["threads"] == 2 else r for r in rows]
    assert all("meets_target" not in s for s in bench.sweep_rows(rows4, [1, 4], 1.0))
    # a sweep up to 16 threads is judged against the 16-thread target, not the 2-thread one
    rows16 = rows + [row("fastrcnn_vgg16", "roi_pool", 16, 0.9), row("c4_14x14", "roi_align", 16, 1.1)]
    got16 = {s["workload"]: s for s in bench.sweep_rows(rows16, [1, 2, 16], 1.0)}
    assert bench.scaling_target_threads([1, 2, 4, 8, 16]) == 16
    assert got16["fastrcnn_vgg16"]["meets_target"] is True      # 11.1x >= 10x
    assert got16["c4_14x14"]["meets_target"] is False           # 9.1x < 10x
    # the printed verdict
    report = dict(mode="sweep", environment=dict(roicore="0", cpu="cpu", numpy="1", python="3",
                                                 openmp=True, cpus=2, logical_cpus=2),
                  threads=2, thread_counts=[1, 2], repeats=1, scale=1.0,
                  workloads={k: {} for k in got}, results=rows,
                  target=dict(speedup=bench.SCALING_TARGETS[2], threads=2,
                              workloads=list(bench.LARGE_WORKLOADS)),
                  scaling=list(got.values()), errors=[], seconds=0.0,
                  frameworks={"roicore": dict(status="ran", version="0")})
    text = render_text(_bench_report.blocks(report))
    lines = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.strip()}
    assert lines["fastrcnn_vgg16"][-1] == "MISSED" and lines["c4_14x14"][-1] == "met"
    assert lines["train_b2"][-1] == "-"
    assert "met by 1 of 2 (lowest 1.67x)" in flat(text)
