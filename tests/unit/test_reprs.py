"""Short reprs of Simulation and Results, and the HTML summary Jupyter shows."""

from __future__ import annotations

import math
import re

import pytest

from simpy_llm import Recorder, Request, Results, Simulation, load_scenario, scenario_from_dict
from simpy_llm.policies.routing import JoinShortestQueue
from tests.helpers import tiny_scenario

NAN = math.nan


def _quickstart(*overrides: str) -> Simulation:
    return Simulation(load_scenario("scenarios/quickstart.yaml", ["workload.num_requests=40", *overrides]))


# --- Simulation --------------------------------------------------------------------------
def test_simulation_repr_names_scenario_fleet_router_mode_and_state():
    """Before a run: name, one replica, its router, its mode and 'not run'; after: 'ran'
    with the requests that arrived."""
    sim = _quickstart("serving.router.kind=least_loaded", "simulation.mode=event_per_step")
    assert repr(sim) == "<Simulation 'quickstart': 1 replica, router least_loaded, mode event_per_step, not run>"
    sim.run()
    assert repr(sim).endswith(", ran (40 requests)>")


def test_simulation_repr_lists_replica_groups():
    """A heterogeneous fleet shows its replica count and each group's size."""
    sim = Simulation(load_scenario("scenarios/heterogeneous_fleet.yaml", ["workload.num_requests=10"]))
    text = repr(sim)
    counts = {p.group: sum(q.group == p.group for q in sim.plans) for p in sim.plans}
    assert text.startswith(f"<Simulation 'heterogeneous_fleet': {len(sim.plans)} replicas in groups ")
    for group, n in counts.items():
        assert f"{group} x{n}" in text


def test_simulation_repr_names_a_policy_object_by_its_class():
    """A routing policy given as an object (not from the scenario) is named by its class."""
    sim = Simulation(scenario_from_dict(tiny_scenario()), routing_policy=JoinShortestQueue())
    assert "router JoinShortestQueue," in repr(sim)
    assert "'" not in repr(sim).split(":")[0]  # an unnamed scenario shows no name


# --- Results -----------------------------------------------------------------------------
def _results(name: str = "demo", dropped_reason: str = "max_queue") -> Results:
    """Four requests: TTFTs 0.1, 0.2, 0.3 s (streaming, arrived at 0 and completed at 2, 3,
    4 s, 11 output tokens each), one arriving at 10 s and dropped; 10 s run."""
    rec = Recorder()
    for i, ttft in enumerate((0.1, 0.2, 0.3)):
        req = Request(id=i, client_id="c", prompt_tokens=10, output_tokens=11, arrival_s=0.0, enqueue_s=0.0,
                      first_scheduled_s=0.0, first_token_s=ttft, completion_s=2.0 + i, replica=0)
        rec.on_arrival(req, 0.0)
        req.generated_tokens = 11
        rec.on_complete(req)
    dropped = Request(id=3, client_id="c", prompt_tokens=10, output_tokens=5, arrival_s=10.0,
                      dropped_reason=dropped_reason)
    rec.on_arrival(dropped, 10.0)
    rec.on_drop(dropped)
    data = tiny_scenario()
    data["name"] = name
    return Results.from_recorder(rec, scenario=scenario_from_dict(data), end_s=10.0, wall_s=0.25, events=0, steps=0,
                                 kv_blocks=[64])


def test_results_repr_is_two_lines_of_headline_figures():
    """Outcomes, simulated time, TTFT p50/p99 (linear percentiles of 0.1, 0.2, 0.3 s:
    200 ms and 298 ms), 0.3 req/s and 3.3 output tokens/s (3 completions, 33 tokens) over
    the 10 s arrival window, and the wall time."""
    text = repr(_results())
    assert text == (
        "<Results 'demo': 4 arrived, 3 completed, 1 dropped, 0 in flight; 10.000 s simulated\n"
        " TTFT p50 200.0 ms, p99 298.0 ms; 0.30 req/s, 3.3 output tokens/s in the arrival window; 250.0 ms wall>"
    )


def test_results_repr_agrees_with_the_summary_on_a_run():
    """On a real run the repr's TTFT percentiles and request rate are the summary's."""
    res = _quickstart().run()
    s = res.summary()
    text = repr(res)
    assert text.count("\n") == 1
    assert f"{s['requests']['completed']:,} completed" in text
    assert f"p50 {s['latency_s']['ttft']['p50'] * 1e3:.1f} ms" in text
    assert f"{s['throughput']['requests_per_s']:,.2f} req/s" in text


def test_results_html_holds_latency_table_and_run_figures():
    """_repr_html_ gives a latency table (each metric's percentiles and count) and the run's
    figures, as plain HTML tables."""
    html = _results()._repr_html_()
    assert html.count("<table>") == 2
    for label in ("TTFT", "TPOT", "ITL", "E2E", "queue delay", "throughput", "goodput", "wall time"):
        assert f">{label}<" in html
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", html)
    ttft = cells[cells.index("TTFT") + 1: cells.index("TTFT") + 7]
    assert ttft == ["200.0 ms", "200.0 ms", "280.0 ms", "290.0 ms", "298.0 ms", "3"]
    assert "4 arrived, 3 completed, 1 dropped, 0 in flight" in html


def test_results_html_escapes_strings():
    """Scenario names and drop reasons are escaped, not injected as markup."""
    html = _results(name="<b>A&B</b>", dropped_reason="<script>")._repr_html_()
    assert "<b>A&B</b>" not in html and "<script>" not in html
    assert "&lt;b&gt;A&amp;B&lt;/b&gt;" in html
    assert "&lt;script&gt; 1" in html


@pytest.mark.parametrize("obj", ["simulation", "results"])
def test_reprs_are_short(obj):
    """Neither repr runs longer than two lines of about a terminal's width each."""
    target = _quickstart() if obj == "simulation" else _results()
    lines = repr(target).splitlines()
    assert len(lines) <= 2 and all(len(line) <= 120 for line in lines)
