"""``plan --trace``: our trace format and Mooncake's read from files or by name, the table and
the curve for a CR, and bad input refused with its line number (exit 2, never a traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hicache_operator.cli import main
from hicache_operator.planner.trace_model import TraceError, load_trace
from hicache_operator.planner.trace_model.trace import parse_lines
from shc_testlib import ROOT

pytestmark = pytest.mark.unit
DEEPSEEK = str(ROOT / "examples/deepseek-r1-mi355x.yaml")
SYSTEM = list(range(100, 300))  # a 200-token system prompt every request starts with


def _ours(path: Path, turns: int = 6) -> Path:
    """Two chat sessions in hicache-trace format: each turn repeats the session so far."""
    lines = [json.dumps({"hicache_trace": 1, "block_tokens": 64})]
    history = {s: list(SYSTEM) for s in range(2)}
    for turn in range(turns):
        for s in range(2):
            history[s] += [1000 * (s + 1) + 100 * turn + k for k in range(90)]
            lines.append(json.dumps({"timestamp": 1000 * (2 * turn + s),
                                     "tokens": history[s], "output_length": 20}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_our_format_shares_exactly_the_common_prefix_blocks(tmp_path: Path) -> None:
    trace = load_trace(str(_ours(tmp_path / "t.jsonl")))
    assert trace.block_tokens == 64 and len(trace.requests) == 12
    first, second, third = trace.requests[0], trace.requests[1], trace.requests[2]
    assert first.blocks[:3] == second.blocks[:3]  # the 200-token system prompt: 3 whole blocks
    assert first.blocks[3] != second.blocks[3]
    assert third.blocks[:len(first.blocks) - 1] == first.blocks[:-1]  # the session's history


def test_text_requests_count_four_bytes_a_token() -> None:
    trace = parse_lines([json.dumps({"timestamp": 0, "text": "x" * 1000})], "text.jsonl")
    assert trace.requests[0].input_length == 250
    assert len(trace.requests[0].blocks) == 4  # 64-token blocks by default


@pytest.mark.parametrize(("lines", "line", "reason"), [
    (['{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}',
      '{"timestamp": 1, "input_length": 600, "hash_ids": [1]}'], 2, "need 2"),
    (['{"timestamp": 0, "tokens": [1, 2]}', "not json"], 2, "not JSON"),
    (['{"timestamp": 5, "tokens": [1]}', '{"timestamp": 4, "tokens": [1]}'], 2, "arrival order"),
    (['{"timestamp": 0, "tokens": []}'], 1, "'tokens' must be"),
    (['{"timestamp": -1, "text": "a"}'], 1, "'timestamp' must be an integer >= 0"),
    (['{"timestamp": 0}'], 1, "needs 'hash_ids'"),
    (['[1, 2]'], 1, "JSON object"),
    (['{"timestamp": 0, "tokens": [1]}', '{"hicache_trace": 1}'], 2, "must be line 1"),
    (['{"hicache_trace": 2}'], 1, "unknown hicache_trace version"),
    (['{"timestamp": 0, "tokens": [1]}',
      '{"timestamp": 1, "input_length": 1, "hash_ids": [1]}'], 2, "do not mix"),
    ([""], 0, "holds no request"),
])
def test_bad_lines_name_the_line_and_the_reason(lines: list[str], line: int,
                                                reason: str) -> None:
    with pytest.raises(TraceError) as e:
        parse_lines(lines, "bad.jsonl")
    assert e.value.line == line and reason in e.value.reason
    assert str(e.value).startswith(f"bad.jsonl:{line}: " if line else "bad.jsonl: ")


def test_plan_trace_prints_the_table_the_curve_and_verdicts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _ours(tmp_path / "chat.jsonl")
    assert main(["plan", "-f", DEEPSEEK, "--trace", str(trace),
                 "--prefill-tokens-per-s", "40000"]) == 0
    out = capsys.readouterr().out
    assert "Trace chat.jsonl: 12 requests" in out
    for label in ("device KV pool", "host pool (L2)", "UMBP DRAM (L3)", "UMBP SSD (L3)",
                  "miss (prefill)", "all tiers"):
        assert label in out
    assert "Prefill: 40,000 tokens/s per pod\n" in out
    assert "0.5x" in out and "4x" in out
    # a tiny chat fits on the device: every tier below it buys nothing, and says why
    assert "host: buys nothing: the trace's working set" in out
    assert "l3_ssd: reads slower than recompute" in out


def test_plan_trace_by_name_with_pods_and_router(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", DEEPSEEK, "--trace", "mooncake-synthetic", "--pods", "2",
                 "--router", "round_robin", "--no-curve"]) == 0
    out = capsys.readouterr().out
    assert "3,993 requests" in out and "2 pod(s), router round_robin" in out
    assert "(assumed: LMSYS's DeepSeek-R1" in out
    assert "Curve" not in out


def test_plan_trace_bad_line_exits_2_with_the_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "tokens": [1, 2]}\n\n{"timestamp": 1, "tokens": "x"}\n')
    assert main(["plan", "-f", DEEPSEEK, "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --trace: {bad}:3: 'tokens' must be a non-empty list of token ids\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--trace", "no-such-trace"], "cannot read it"),
    (["--trace", "mooncake-synthetic", "--bandwidth", "l4=3"], "expected TIER=GBPS"),
    (["--trace", "mooncake-synthetic", "--bandwidth", "l3_ssd=0"], "must be > 0"),
])
def test_plan_trace_bad_options_exit_2(args: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", DEEPSEEK, *args]) == 2
    assert message in capsys.readouterr().err


def test_plan_trace_needs_the_models_geometry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cr = tmp_path / "cr.yaml"
    cr.write_text((ROOT / "examples/minimal-dram-only.yaml").read_text())
    assert main(["plan", "-f", str(cr), "--trace", str(_ours(tmp_path / "t.jsonl"))]) == 2
    assert "kvBytesPerToken" in capsys.readouterr().err


def test_module_entry_reports_a_bad_trace_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "hash_ids": [1, 2]}\n')
    run = subprocess.run([sys.executable, "-m", "hicache_operator", "plan", "-f", DEEPSEEK,
                          "--trace", str(bad)], capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert f"{bad}:1: 2 hash_ids for input_length 10" in run.stderr


def test_plan_trace_prefetch_threshold_reaches_the_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(_ours(tmp_path / "chat.jsonl"))
    assert main(["plan", "-f", DEEPSEEK, "--trace", trace, "--no-curve",
                 "--prefetch-threshold", "4096"]) == 0
    assert "prefetch threshold 4096 tokens" in capsys.readouterr().out
    # never below one page: SGLang raises it to the page size
    assert main(["plan", "-f", DEEPSEEK, "--trace", trace, "--no-curve",
                 "--prefetch-threshold", "1"]) == 0
    assert "prefetch threshold 64 tokens" in capsys.readouterr().out
