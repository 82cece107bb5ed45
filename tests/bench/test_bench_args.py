"""The benchmark's arguments, property-based: any argument list either measures and writes a real table
(exit 0) or is refused with one line (exit 1); never every row failed with exit 0, never an empty
table, never a traceback (issue item 7: --batch 0, --dtype int8, --repeats 0, a CUDA-graph row on a
CPU all used to "succeed")."""
from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

from depthpack.bench.ladder import ROWS, main, parse_args
from depthpack.core import cli

CUDA = torch.cuda.is_available()
CHOICES = {  # per flag: None (flag absent) and a mix of valid and invalid values
    "--preset": [None, "tiny", "tiny", "huge", "", "tiny,huge"],
    "--device": [None, "cpu", "cpu", "cuda", "cuda:9", "tpu"],
    "--dtype": [None, "float32", "float32", "int8", "", "float32,int8", "bfloat16"],
    "--batch": [None, "1", "1", "0", "-1", "x", "1,0", "1.5"],
    "--queries": [None, "8", "8", "0", "8,100", "x", "-5"],
    "--repeats": [None, "1", "1", "0", "-1", "1.5", "x"],
    "--seconds": [None, "0.01", "0.01", "0", "-1", "inf", "nan", "x"],
    "--sets": [None, "1", "0"],
    "--rows": [None, "packed-eager", "packed-eager", "packed-graph", "none", "nope", "dense-eager,packed-eager"],
}
argvs = st.fixed_dictionaries({flag: st.sampled_from(vals) for flag, vals in CHOICES.items()}).map(
    lambda d: [x for flag, v in d.items() if v is not None for x in (flag, v)])


def _run(fn, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = fn(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def _refused_with_one_line(rc, err) -> bool:
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("bench: error: "), (rc, err)
    return True


@settings(max_examples=300, deadline=None)
@given(argvs)
@example(["--preset", "tiny", "--device", "cpu", "--batch", "0"])
@example(["--preset", "tiny", "--device", "cpu", "--dtype", "int8"])
@example(["--preset", "tiny", "--device", "cpu", "--repeats", "0"])
@example(["--preset", "tiny", "--device", "cpu", "--rows", "packed-graph"])
@example(["--device", "cpu", "--rows", "none"])
@example(["--preset", "tiny", "--device", "cpu", "--seconds", "inf"])
def test_arguments_parse_to_a_sane_plan_or_one_line(argv):
    rc, _, err = _run(lambda a: parse_args(a), argv + ["--out", "/tmp/unused"])
    if not hasattr(rc, "rows"):
        _refused_with_one_line(rc, err)
        return
    args = rc  # the parsed plan: something to measure, every number and name sane
    assert args.rows or args.compile_time
    assert args.rows or "--rows" in argv
    assert all(r in ROWS for r in args.rows)
    assert min(args.batch) >= 1 and min(args.queries) >= 1 and args.repeats >= 1 and args.sets >= 1
    assert 0 < args.seconds and math.isfinite(args.seconds)
    assert set(args.dtype) <= {"float32", "bfloat16", "float16"}
    if args.device == "cpu":
        assert not any(ROWS[r].cuda_only for r in args.rows)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argvs.filter(lambda a: "bfloat16" not in a))  # bf16 on a CPU is valid but takes a minute
@example(["--preset", "tiny", "--device", "cpu", "--rows", "packed-eager", "--queries", "8", "--seconds", "0.01",
          "--repeats", "1", "--sets", "1"])
@example(["--preset", "tiny", "--device", "cpu", "--batch", "0"])
@example(["--preset", "tiny", "--device", "cpu", "--dtype", "int8"])
@example(["--preset", "tiny", "--device", "cpu", "--rows", "packed-graph"])
def test_bench_writes_a_real_table_or_refuses_in_one_line(argv):
    # cheap where the example leaves a flag out (the defaults are test_bench.py's smoke run): vits is
    # minutes a row on a CPU, and every row, query count and repeat is a measurement
    for flag, cheap in (("--preset", "tiny"), ("--seconds", "0.01"), ("--repeats", "1"), ("--sets", "1"),
                        ("--queries", "8"), ("--rows", "packed-eager")):
        if flag not in argv:
            argv = argv + [flag, cheap]
    out = Path(tempfile.mkdtemp(prefix="bench_prop_")) / "out"
    rc, stdout, err = _run(lambda a: cli.run("bench", main, a), argv + ["--out", str(out)])
    if rc != 0:
        _refused_with_one_line(rc, err)
        assert not (out / "bench.json").exists()
        return
    results = json.loads((out / "bench.json").read_text())["results"]
    assert results and not [r for r in results if "error" in r]
    md = (out / "bench.md").read_text()
    assert all(f"| {r['queries']} | {r['row']} |" in md for r in results)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["rows"] == len(results) and summary["failed"] == []
