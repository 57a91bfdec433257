"""The performance report (benchmarks/report.py) turns the benchmarks' figure records into its table and plots."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
report = pytest.importorskip("report")
from _results import Results, short_by  # noqa: E402

MACHINE = {"cpu": "Test CPU", "arch": "x86_64", "logical_cpus": 2, "torch_threads": 2, "isa": ["avx2", "fma"],
           "caches": [{"level": "3", "type": "Unified", "size": "32M", "shared": "0-1"}], "llc_bytes": 32 << 20,
           "read_bw_gbs": 20.0, "read_probe_mib": 128, "copy_bw_gbs": 30.0, "copy_probe_mib": 64,
           "fp32_peak_gflops": 400.0, "bf16_peak_gflops": 800.0, "bf16_peak_method": "avx512_bf16",
           "gemm_isa": "avx2", "torch": "2.13.0"}


def records():
    gemm = Results("gemm")
    gemm.meta.update(fp32_peak=400.0, bf16_peak=800.0)
    for dt, peak in (("float32", 400.0), ("bfloat16", 800.0)):
        gemm.add(dt, "M=512 K=768 N=768", 0.9 * peak, "GFLOP/s", ref=0.8 * peak, ref_name="PyTorch CPU eager",
                 spread=(0.8 * peak, 0.95 * peak), bound=peak, bound_name=f"{dt} peak", target=">= 85% of peak",
                 met=True, m=512, k=768, n=768, dtype=dt)
    gen = Results("generate")
    for b in (1, 4, 16):
        bound = 10.0 * b
        gen.add("large bfloat16", f"decode batch {b}", 6.0 * b, "tok/s", ref=5.0 * b, ref_name="PyTorch CPU eager",
                bound=bound, bound_name="weights / read bandwidth", target=">= 75% of bound",
                met=False, miss=short_by(0.6, 0.75), phase="decode", batch=b, model="large", dtype="bfloat16")
    coll = Results("collectives")
    for size in (4096, 1 << 20, 64 << 20):
        coll.add("2 ranks", f"all_reduce {size}", 5.0, "GB/s busbw", ref=0.5, ref_name="Gloo", op="all_reduce",
                 bytes=size, ranks=2, memory_bound=6.0)
    lat = Results("collectives")
    lat.add("2 ranks", "all_reduce 4 KiB latency", 5.0, "us", ref=200.0, ref_name="Gloo", higher=False,
            target="<= 10 us", met=True)
    return [{"bench": r.bench, "meta": r.meta, "figures": r.figures} for r in (gemm, gen, coll, lat)]


def test_table_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "img").mkdir()
    md = report.render(MACHINE, records(), [("GEMM", ["bench_gemm.py"], True, ["raw line"], 1.0),
                                            ("Broken", ["bench_x.py"], False, ["Traceback", "Boom"], 2.0)],
                       False, "abc1234", str(tmp_path / "img"), str(tmp_path))
    text = "\n".join(md)
    assert "Test CPU" in text and "Read bandwidth" in text and "20.0 GB/s" in text
    assert "9 figures; 3 targets met, 3 missed." in text
    # ratio > 1 when neuron is better, whatever the unit: latency 200 us on Gloo vs 5 us is 40x.
    row = next(ln for ln in md if "all_reduce 4 KiB latency" in ln)
    assert "40.00x" in row and "| met |" in row
    row = next(ln for ln in md if "decode batch 16" in ln)
    assert "96.0 tok/s" in row and "60% of weights / read bandwidth" in row and "**missed**: short by 1.25x" in row
    row = next(ln for ln in md if "float32 M=512" in ln)
    assert "360 GFLOP/s (320-380)" in row and "90% of float32 peak" in row and "1.12x" in row
    assert "FAILED in 2 s" in text and "Boom" in text and "raw line" in text
    for key in ("decode", "gemm", "collectives"):
        png = tmp_path / "img" / f"perf_{key}.png"
        assert png.stat().st_size > 10_000
        assert f"](img/perf_{key}.png)" in text


def test_no_records_no_plots(tmp_path):
    md = report.render(MACHINE, [], [], True, "abc", str(tmp_path), str(tmp_path))
    text = "\n".join(md)
    assert "## Figures" not in text and "## Plots" not in text and "make bench-quick" in text
    assert not list(tmp_path.iterdir())


def test_second_report_names_its_plots_after_itself(tmp_path):
    """A report for a second CPU (--out docs/performance-avx2.md) must not overwrite the first one's plots."""
    pytest.importorskip("matplotlib")
    (tmp_path / "img").mkdir()
    md = report.render(MACHINE, records(), [], True, "abc", str(tmp_path / "img"), str(tmp_path),
                       img_prefix="performance-avx2", out_arg=" --out docs/performance-avx2.md")
    text = "\n".join(md)
    assert "report.py --quick --out docs/performance-avx2.md" in text and "make bench" not in text
    assert (tmp_path / "img" / "performance-avx2_gemm.png").exists()
    assert not (tmp_path / "img" / "perf_gemm.png").exists()
