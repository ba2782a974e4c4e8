"""--memory-reserve-fraction / --memory-reserve-gb (and the API's memory_reserve_*): the memory
kept free on each device bounds the plans the search takes, is recorded in the plan and is kept
by what re-plans from it."""

import json
import os

import pytest

import planner
from planner.cli.main import main
from planner.errors import SpecError
from planner.export.replan import resolve_hint
from planner.options import SearchOptions

A100 = 81_920 * 2 ** 20  # dgx-a100-80g's device memory (NVML: 81,920 MiB)
GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "plans",
                      "uneven-llama3-8b.json")


def _solve(capsys, config, path, *extra):
    code = main(["solve", config, "--cluster", "dgx-a100-80g", "--nodes", "1", "--global-batch",
                 "64", "--seq-len", "128", "-o", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_larger_reserve_bounds_the_plan_and_the_plan_keeps_it(capsys, tmp_path,
                                                                 tiny_llama_config):
    code, _, err = _solve(capsys, tiny_llama_config, tmp_path / "default.json")
    assert code == 0, err
    default = planner.load_plan(str(tmp_path / "default.json"))
    assert "memory_reserve" not in default.search["options"]  # the defaults are not recorded
    assert default.memory_reserve() == {
        "memory_reserve_fraction": SearchOptions.memory_reserve_fraction,
        "memory_reserve_bytes": SearchOptions.memory_reserve_bytes}
    peak = default.predicted["peak_memory_bytes"]
    # keep free all but half of what the default plan needs at its peak
    usable = peak / 2
    gb = (A100 * (1 - 0.1) - usable) / 1e9
    code, _, err = _solve(capsys, tiny_llama_config, tmp_path / "lean.json",
                          "--memory-reserve-fraction", "0.1", "--memory-reserve-gb", f"{gb:.6f}")
    assert code == 0, err
    lean = planner.load_plan(str(tmp_path / "lean.json"))
    assert lean.predicted["peak_memory_bytes"] <= usable * 1.0001
    assert lean.parallel != default.parallel
    assert lean.search["options"]["memory_reserve"] == {"fraction": 0.1,
                                                        "bytes": pytest.approx(gb * 1e9)}
    assert lean.memory_reserve()["memory_reserve_fraction"] == 0.1
    from planner.report.compare import headline
    assert f"memory reserve 5% + 1 GB -> 10% + {gb:.3g} GB" in headline(default, lean)
    assert "memory reserve" not in headline(default, default)
    assert main(["show", str(tmp_path / "lean.json")]) == 0
    shown = capsys.readouterr().out
    assert "(10% and " in shown and " GB of each kept free: --memory-reserve-*)" in shown
    # the command that re-plans it for an engine keeps the reserve
    hint = resolve_hint(lean, "megatron")
    assert "--memory-reserve-fraction 0.1 --memory-reserve-gb " in hint
    assert "--memory-reserve" not in resolve_hint(default, "megatron")
    # a reserve leaving less than any plan needs: no plan, exit 2
    code, _, err = _solve(capsys, tiny_llama_config, tmp_path / "none.json",
                          "--memory-reserve-gb", f"{A100 * 0.95 / 1e9 - 0.001:.6f}")  # 1 MB left
    assert code == 3 and "no plan fits" in err.lower(), err  # (exit 3: valid input, no room)
    assert "or keep less of each device free (--memory-reserve-fraction 0.05, " \
           "--memory-reserve-gb 81.6 now)" in err, err
    assert not (tmp_path / "none.json").exists()


@pytest.mark.parametrize("extra", [["--memory-reserve-gb", "82"],
                                   ["--memory-reserve-gb", "1e300"],
                                   ["--memory-reserve-fraction", "0.99",
                                    "--memory-reserve-gb", "1"]])
def test_a_reserve_leaving_nothing_is_bad_input(capsys, extra):
    code = main(["solve", "gpt2", "--cluster", "dgx-a100-80g", "--global-batch", "8", *extra])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "leaves nothing of a100-80g's 85.9 GB; lower them" in err
    assert "memory_reserve_gb (--memory-reserve-gb)" in err and "Traceback" not in err


@pytest.mark.parametrize("flag,value,message", [
    ("--memory-reserve-fraction", "1", "expected a number from 0 up to (not including) 1, got '1'"),
    ("--memory-reserve-fraction", "-0.1", "expected a number from 0 up to (not including) 1"),
    ("--memory-reserve-gb", "-1", "expected a number >= 0, got '-1'"),
    ("--memory-reserve-gb", "lots", "expected a number >= 0, got 'lots'"),
])
@pytest.mark.parametrize("command", [["solve"], ["whatif", "--vary", "nodes=1,2"]])
def test_a_bad_reserve_is_one_line_naming_the_flag(capsys, command, flag, value, message):
    code = main([*command, "gpt2", "--cluster", "dgx-h100", "--global-batch", "8", flag, value])
    _, err = capsys.readouterr()
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("plan: error")]
    assert len(lines) == 1 and flag in lines[0] and message in lines[0], err


def test_the_api_checks_the_reserve_before_tracing():
    with pytest.raises(SpecError, match=r"^memory_reserve_gb: expected a number of GB >= 0"):
        planner.plan("gpt2", cluster="dgx-h100", global_batch=8, memory_reserve_gb="2")
    with pytest.raises(SpecError, match=r"^memory_reserve_fraction: expected a number in \[0, 1\)"):
        planner.plan("gpt2", cluster="dgx-h100", global_batch=8, memory_reserve_fraction=1.5)
    with pytest.raises(SpecError, match=r"^memory_reserve_gb \(--memory-reserve-gb\): applies "
                                        r"to the search of dense models"):
        planner.plan("dlrm-criteo-1tb", cluster="dgx-a100-40g", nodes=1, global_batch=65536,
                     memory_reserve_gb=2)


def test_the_plan_file_records_the_reserve_the_search_kept(capsys, tmp_path, tiny_llama_config):
    code, _, err = _solve(capsys, tiny_llama_config, tmp_path / "p.json",
                          "--memory-reserve-gb", "3.3333333333")
    assert code == 0, err
    kept = json.loads((tmp_path / "p.json").read_text())["search"]["options"]["memory_reserve"]
    assert kept == {"fraction": 0.05, "bytes": 3.33333e9}  # the plan file's precision, searched
    plan = planner.load_plan(str(tmp_path / "p.json"))
    assert "--memory-reserve-gb 3.33333 " in resolve_hint(plan, "megatron")


@pytest.mark.parametrize("kept,message", [
    (0.5, "search.options.memory_reserve: expected a mapping with fraction and bytes, got 0.5"),
    ({"fraction": 1.5}, "search.options.memory_reserve: memory_reserve_fraction: expected a "
                        "number in [0, 1), got 1.5"),
])
def test_a_hand_edited_reserve_is_named(tmp_path, kept, message):
    d = json.loads(open(GOLDEN).read())
    d["search"]["options"]["memory_reserve"] = kept
    plan = planner.Plan.from_dict(d)
    with pytest.raises(SpecError) as err:
        plan.memory_reserve()
    assert str(err.value).startswith(message) and "re-create the plan" in str(err.value)
    with pytest.raises(SpecError):
        resolve_hint(plan, "megatron")


def test_whatif_keeps_the_reserve_at_every_point(tiny_llama_config):
    from planner.explore.sweep import whatif
    common = dict(cluster="dgx-a100-80g", global_batch=64, seq_len=128, vary={"nodes": [1, 2]},
                  workers=1)
    default = whatif(tiny_llama_config, **common)
    usable = min(r["peak_memory_bytes"] for r in default) / 2
    gb = (A100 * (1 - 0.1) - usable) / 1e9
    lean = whatif(tiny_llama_config, memory_reserve_fraction=0.1, memory_reserve_gb=gb, **common)
    assert all(r["feasible"] for r in lean)
    assert all(r["peak_memory_bytes"] <= usable * 1.0001 for r in lean)
    assert [r["config"] for r in lean] != [r["config"] for r in default]
    with pytest.raises(SpecError, match=r"leaves nothing of a100-80g's 85.9 GB; lower them"):
        whatif(tiny_llama_config, memory_reserve_gb=82, **common)
    with pytest.raises(SpecError, match=r"^memory_reserve_fraction \(--memory-reserve-fraction\): "
                                        r"applies to the search of dense models"):
        whatif("dlrm-criteo-1tb", cluster="dgx-a100-40g", global_batch=65536,
               vary={"nodes": [1, 2]}, memory_reserve_fraction=0.2)


def test_whatif_refuses_a_reserve_leaving_nothing_with_exit_2(capsys):
    code = main(["whatif", "gpt2", "--cluster", "dgx-a100-80g", "--global-batch", "8", "--vary",
                 "nodes=1,2", "--memory-reserve-gb", "300"])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "leaves nothing of a100-80g's 85.9 GB; lower them" in err and "Traceback" not in err


def test_whatif_over_a_recommendation_model_keeps_no_reserve(tmp_path):
    """A review saw a sweep of two-tower on 1 GB devices refused for the default reserve, which
    the advice then offered to lower with flags refused for such models; plan solve checks no
    reserve there (its table sharding keeps none): each point's row says why it does not fit."""
    from planner.explore.sweep import whatif
    small = tmp_path / "small.yaml"
    small.write_text("name: small\nnodes: 1\ngpus_per_node: 8\ndevice: {name: small, memory_GB: "
                     "1.0, peak_TFLOPs: {bf16: 100, fp32: 10}, hbm_GBps: 1000}\nintra_node: "
                     "{bandwidth_GBps: 100, latency_us: 5}\ninter_node: {bandwidth_GBps: 10, "
                     "latency_us: 10}\n")
    try:
        rows = whatif("two-tower", cluster=str(small), global_batch=64, vary={"nodes": [1, 2]})
    except planner.InfeasibleError as err:  # nothing fits at any point: the rows' reasons
        assert "memory_reserve" not in str(err)
    else:
        assert all("memory_reserve" not in (r.get("reason") or "") for r in rows)
