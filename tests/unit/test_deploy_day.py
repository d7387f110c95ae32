"""The deployment search over a day-shaped load (simpy_llm.explore.deploy_day): static
peak-sized fleets against autoscaled ones, on a short day of four windows whose rate
doubles for the second half (12 then 24 requests/s of 400-token prompts, 200-token answers)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simpy_llm.explore.capacity import StabilityCriteria
from simpy_llm.explore.capacity.probing import _build
from simpy_llm.explore.deploy import REPLICAS_KEY, deploy
from simpy_llm.explore.deploy_day import (
    DAY_S,
    Day,
    ScalingSetting,
    day_costs,
    deploy_day,
    parse_autoscaler,
    servegen_rates,
)
from simpy_llm.simulation import Simulation

SCENARIO = str(Path(__file__).resolve().parents[1] / "data" / "deploy_day" / "step_day.yaml")
SLO = ["ttft_p99=2", "tpot_p99=0.05"]
DAY = Day(rates=(12, 12, 24, 24), window_s=60)
SEARCH = {"gpus": ["H100"], "tp": [1], "max_replicas": 8, "warmup_requests": 100, "measure_requests": 400}


@pytest.fixture(scope="module")
def peak():
    """The deployment search's one configuration at the day's peak and its static count."""
    result = deploy(SCENARIO, load=DAY.peak, slo=SLO, overrides={"autoscaler": None}, **SEARCH)
    outcome = result.outcomes[0]
    return outcome.configuration, int(outcome.min_replicas)


@pytest.fixture(scope="module")
def day(peak):
    """The day run static, under two autoscaler settings and under one that never scales."""
    config, static = peak
    settings = [*parse_autoscaler("target:running=20"), *parse_autoscaler("target:arrival_rate=8"),
                ScalingSetting(policy="target", metric="running", values=[20], min_replicas=static, max_replicas=static)]
    return day_costs(SCENARIO, DAY, [(config, static)], settings, StabilityCriteria(slo=SLO))


def test_static_count_is_the_peak_search():
    """Three replicas are the fewest meeting the SLOs at the peak (24 requests/s), two are too few."""
    result = deploy(SCENARIO, load=DAY.peak, slo=SLO, overrides={"autoscaler": None}, exhaustive=True, **SEARCH)
    outcome = result.outcomes[0]
    assert outcome.min_replicas == 3
    assert outcome.failing_replicas == 2


def test_static_cost_by_hand(day, peak):
    """The static row costs peak replicas x tp x price x 24, the price the catalogue's H100 one."""
    config, static = peak
    row = day.rows[0]
    assert (row.mode, row.static_replicas, row.mean_replicas) == ("static", static, 3.0)
    assert config.tp == 1
    assert row.cost_per_day == 3 * 1 * config.price_per_gpu_hour * 24
    assert row.replica_seconds == 3 * DAY.day_s


def test_autoscaled_cost_is_the_summary_replica_seconds(day, peak):
    """An autoscaled row's replica-seconds are the run's summary's, and its cost per day is
    replica-seconds x tp x price / 3600, scaled from the simulated day to 24 h."""
    config, static = peak
    row = day.rows[1]
    setting = parse_autoscaler("target:running=20")[0]
    loaded = _build(SCENARIO, {})
    from simpy_llm.config.plain import unstructure

    run = {**config.overrides(), **DAY.overrides(loaded), REPLICAS_KEY: static,
           "autoscaler": setting.section(unstructure(loaded.autoscaler), static)}
    summary = Simulation(_build(SCENARIO, run)).run().summary()["autoscaler"]
    assert row.replica_seconds == summary["replica_seconds"]
    expected = summary["replica_seconds"] * config.tp * config.price_per_gpu_hour / 3600 * (DAY_S / DAY.day_s)
    assert row.cost_per_day == pytest.approx(expected, rel=1e-12)


def test_never_scaling_costs_the_static_cost(day):
    """An autoscaler held at the static count (min = max = 3) costs exactly the static cost."""
    held = day.rows[3]
    assert held.setting == "target running=20, 3-3 replicas"
    assert held.mean_replicas == 3.0
    assert held.cost_per_day == day.rows[0].cost_per_day


def test_autoscaled_costs_less_and_meets_the_slo(day):
    """With the load at half for half the day, both autoscalers cost less than the static
    fleet and meet the SLOs in every window; the cheapest is ``target arrival_rate=8``."""
    static, running, rate = day.rows[:3]
    assert static.meets_slo and running.meets_slo and rate.meets_slo
    assert running.windows_met == rate.windows_met == 4
    assert running.cost_per_day < static.cost_per_day
    assert rate.cost_per_day < running.cost_per_day
    assert day.best is rate
    assert round(rate.mean_replicas, 3) == 2.417


def test_compression_keeps_the_verdict(day, peak):
    """Each window simulated for 120 s instead of 60 s: the same verdicts and the same answer."""
    config, static = peak
    settings = [*parse_autoscaler("target:running=20"), *parse_autoscaler("target:arrival_rate=8")]
    longer = day_costs(SCENARIO, Day(rates=DAY.rates, window_s=120), [(config, static)], settings, StabilityCriteria(slo=SLO))
    assert [r.meets_slo for r in longer.rows] == [r.meets_slo for r in day.rows[:3]] == [True, True, True]
    assert longer.best is not None and day.best is not None
    assert longer.best.setting == day.best.setting == "target arrival_rate=8, 1-3 replicas"
    assert longer.rows[0].cost_per_day == day.rows[0].cost_per_day


def test_deploy_day_writes_its_files(tmp_path):
    """deploy_day runs the search at the peak and writes deploy_day.json, .csv and .md."""
    result = deploy_day(SCENARIO, Day(rates=(12, 24), window_s=30), slo=SLO, top=1, out=tmp_path, **SEARCH)
    assert result.search is not None and result.search.load == 24
    assert [r.mode for r in result.rows] == ["static"]
    assert {p.name for p in tmp_path.iterdir()} >= {"deploy.json", "deploy_day.json", "deploy_day.csv", "deploy_day.md"}


def test_servegen_day_shape():
    """ServeGen's m-large day is 144 windows whose rates sum the clients' trace rates."""
    rates = servegen_rates("data/servegen/language/m-large")
    assert len(rates) == 144
    assert servegen_rates("data/servegen/language/m-large", 0.5)[10] == rates[10] * 0.5
    assert Day(rates=rates, window_s=600).compression == 1.0


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Day(rates=(), window_s=60), "at least one window rate"),
    (lambda: Day(rates=(1, -1), window_s=60), "must be finite, >= 0 and not all 0"),
    (lambda: Day(rates=(1,), window_s=0), "window_s must be a number of seconds > 0"),
    (lambda: parse_autoscaler("target=4"), "write POLICY:METRIC=VALUE"),
    (lambda: parse_autoscaler("target:latency=4"), "metric 'latency' is not allowed; allowed: queue_depth"),
    (lambda: parse_autoscaler("scale:running=4"), "policy 'scale' is not allowed; allowed: target, threshold"),
    (lambda: parse_autoscaler("threshold:running=8-2"), "low must be below high"),
    (lambda: parse_autoscaler("target:running=x"), "'x' is not a number"),
    (lambda: parse_autoscaler("target:running=4", min_replicas=3, max_replicas=2), "need 1 <= min (3) <= max (2)"),
    (lambda: servegen_rates("data/servegen/nowhere"), "no ServeGen client"),
])
def test_bad_arguments_refused(make, message):
    """Each bad day or autoscaler setting is refused naming what is wrong and what is allowed."""
    with pytest.raises(ValueError, match=None) as caught:
        make()
    assert message in str(caught.value)


def test_windowed_client_refused(peak):
    """A client whose arrivals already change by window is refused: the day gives the rate."""
    config, static = peak
    windowed = {"workload.clients.0.arrival": {"process": "windows", "window_s": 10, "windows": [{"start_s": 0, "rate": 1}]}}
    with pytest.raises(ValueError, match=r"workload.clients.0.arrival: already changes its rate by window"):
        day_costs(SCENARIO, DAY, [(config, static)], [], StabilityCriteria(slo=SLO), overrides=windowed)


@pytest.mark.parametrize(("argv", "message"), [
    (["--load", "10", "--day", "1,2"], "--load and --day exclude each other"),
    (["--load", "10", "--autoscaler", "target:running=4"], "--autoscaler: need --day"),
    (["--load", "10", "--scale-max", "4"], "--scale-max: need --day"),
    ([], "--load is required (or --day)"),
    (["--day", "1,x"], "--day: 'x' is not allowed"),
    (["--day", "1,2", "--day-scale", "0"], "--day-scale must be > 0"),
])
def test_cli_refuses_bad_day_options(capsys, argv, message):
    """The command line refuses a bad combination of the day's options with exit status 2."""
    from simpy_llm.cli import main

    assert main(["deploy", SCENARIO, "--slo", "ttft_p99=1", "--gpus", "H100", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_runs_a_day(capsys, tmp_path):
    """``deploy --day`` prints the search at the peak and the day's table."""
    from simpy_llm.cli import main

    argv = ["deploy", SCENARIO, "--slo", ",".join(SLO), "--gpus", "H100", "--tp", "1", "--max-replicas", "8",
            "--warmup-requests", "100", "--measure-requests", "400", "--executor", "serial", "--quiet",
            "--day", "12,24", "--window-s", "30", "--day-top", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "## Over the day" in out and "| static |" in out
    assert not math.isnan(float(out.split("peak ")[1].split(" ")[0]))
