"""ServeGen data: the windowed arrival process, the client loader and its errors.

Reads only the copies in ``data/servegen`` (see its NOTICE.md). Expected values
are recomputed here from the raw files with the standard library (``csv``,
``json``, ``ast.literal_eval``), independently of the module under test.
Every random draw uses a fixed seed; nothing is timed.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from simpy_llm.config import ScenarioError
from simpy_llm.config.errors import FieldValueError
from simpy_llm.config.schema import ServeGenConfig
from simpy_llm.workload import servegen
from simpy_llm.workload.arrivals import arrival_processes
from simpy_llm.workload.distributions import Empirical
from simpy_llm.workload.servegen import ServeGenWindows, load_servegen, read_trace
from tests.helpers import run, tiny_scenario

DATA = Path(__file__).resolve().parents[2] / "data" / "servegen"
M_LARGE = DATA / "language" / "m-large"
MM_IMAGE = DATA / "multimodal" / "mm-image"
R1 = DATA / "reason" / "deepseek-r1"
DAY = 86400.0
WINDOWS_PER_DAY = 144


# --------------------------------------------------------------------------- independent readers


def _raw_trace(path: Path) -> list[tuple[float, float, str]]:
    """(window_start_s, rate_rps, pattern) per row, read with csv."""
    with path.open(newline="") as fh:
        return [(float(r[0]), float(r[1]), r[3]) for r in csv.reader(fh)]


def _day_requests(path: Path) -> float:
    return sum(rate * 600 for _s, rate, _p in _raw_trace(path))


def _chunk_id(path: Path) -> int:
    return int(path.name.split("-")[1])


def _busiest(directory: Path, n: int, with_dataset: bool) -> list[int]:
    """Ids of the *n* clients with most requests over the day (ties by id)."""
    totals = {
        _chunk_id(p): _day_requests(p)
        for p in directory.glob("chunk-*-trace.csv")
        if not with_dataset or p.with_name(p.name.replace("trace.csv", "dataset.json")).exists()
    }
    return sorted(totals, key=lambda c: (-totals[c], c))[:n]


def _merged_pmf(directory: Path, cid: int, field: str) -> dict[float, float]:
    """The field's PMF merged over the day's 6 h blocks, weighted by the trace's requests per block
    (a block without data hands its requests to the next block with data, as for the first block
    of a client whose data start later)."""
    blocks = json.loads((directory / f"chunk-{cid}-dataset.json").read_text())
    pmfs = {float(k): ast.literal_eval(v[field]) for k, v in blocks.items()}
    starts = sorted(k for k, p in pmfs.items() if p)
    weight: dict[float, float] = defaultdict(float)
    for start, rate, _p in _raw_trace(directory / f"chunk-{cid}-trace.csv"):
        earlier = [k for k in starts if k <= start]
        weight[earlier[-1] if earlier else starts[0]] += rate * 600
    total = sum(weight.values())
    merged: dict[float, float] = defaultdict(float)
    for k, w in weight.items():
        for value, p in pmfs[k].items():
            merged[float(value)] += p * w / total
    return {v: p for v, p in merged.items() if p > 0}


def _pmf_quantile(pmf: dict[float, float], q: float) -> float:
    values = sorted(pmf)
    cdf = np.cumsum([pmf[v] for v in values])
    return values[min(int(np.searchsorted(cdf, q - 1e-12)), len(values) - 1)]


def _window_counts(process: ServeGenWindows, rate: float, seed: int, windows: int, width: float = 600.0) -> np.ndarray:
    """Arrivals per *width*-second window over the first *windows* windows."""
    horizon = windows * width
    counts = np.zeros(windows, dtype=np.int64)
    for t in process.times(np.random.default_rng(seed), rate, 1 << 20):
        inside = t[t < horizon]
        counts += np.bincount((inside // width).astype(np.int64), minlength=windows)
        if len(inside) < len(t):
            return counts


@pytest.fixture(scope="module")
def m_large():
    return load_servegen(ServeGenConfig(path=str(M_LARGE)))


@pytest.fixture(scope="module")
def mm_image():
    return load_servegen(ServeGenConfig(path=str(MM_IMAGE)))


@pytest.fixture(scope="module")
def r1():
    return load_servegen(ServeGenConfig(path=str(R1)))


# --------------------------------------------------------------------------- arrival process


def test_m_large_window_counts_match_the_trace():
    """Over a simulated day, each of the 10 busiest m-large clients (by trace requests, with or
    without a dataset; ~19.3M arrivals) gets rate x 600 arrivals in every one of the 144 windows,
    within 5% (the process runs at the client's own mean data rate, rate_scale 1)."""
    for cid in _busiest(M_LARGE, 10, with_dataset=False):
        path = M_LARGE / f"chunk-{cid}-trace.csv"
        process = ServeGenWindows.from_trace(read_trace(path))
        expected = np.array([rate * 600 for _s, rate, _p in _raw_trace(path)])
        assert len(expected) == WINDOWS_PER_DAY
        counts = _window_counts(process, process.mean_rate, seed=cid, windows=WINDOWS_PER_DAY)
        assert np.all(np.abs(counts - expected) <= 0.05 * expected), cid
        assert np.all(np.abs(counts - expected) < 1), cid  # in fact exact up to rounding


def test_idle_windows_produce_nothing():
    """Windows with an empty pattern get no arrivals, in every repetition of the span."""
    process = ServeGenWindows(
        rates=(2.0, 0.0, 0.0, 1.0, 0.0),
        patterns=("Gamma", "", "", "Weibull", ""),
        shapes=(0.3, 0.0, 0.0, 0.6, 0.0),
        scales=(2.0, 0.0, 0.0, 1.5, 0.0),
    )
    counts = _window_counts(process, rate=7.0, seed=3, windows=5 * 4).reshape(4, 5)
    assert np.all(counts[:, [1, 2, 4]] == 0)
    assert np.all(counts[:, [0, 3]] > 0)


def test_idle_m_large_windows_stay_empty():
    """An m-large client's idle windows (empty pattern in the CSV) get no arrivals over the day."""
    cid = _busiest(M_LARGE, 1, with_dataset=True)[0]
    path = M_LARGE / f"chunk-{cid}-trace.csv"
    idle = np.array([p == "" for _s, _r, p in _raw_trace(path)])
    process = ServeGenWindows.from_trace(read_trace(path))
    counts = _window_counts(process, process.mean_rate * 0.01, seed=5, windows=WINDOWS_PER_DAY)
    assert idle.any()
    assert np.all(counts[idle] == 0)


def test_rate_rescales_every_window_in_proportion():
    """Asked for k x the data's mean rate, each window gets k x its data count (within one request)."""
    process = ServeGenWindows(
        rates=(1.5, 0.25, 4.0), patterns=("Gamma", "Weibull", "Gamma"), shapes=(0.2, 0.5, 3.0), scales=(1.0, 2.0, 0.1)
    )
    for k in (0.37, 2.0):
        counts = _window_counts(process, process.mean_rate * k, seed=11, windows=3)
        assert np.all(np.abs(counts - k * np.array([900.0, 150.0, 2400.0])) < 1)


def test_long_run_mean_rate_is_the_requested_rate():
    """The number of arrivals in n periods is rate x n x period, to within one request."""
    process = ServeGenWindows(rates=(0.013, 0.0, 0.002), patterns=("Weibull", "", "Gamma"), shapes=(0.4, 0, 1.0), scales=(1, 0, 1))
    rate = 0.3
    counts = _window_counts(process, rate, seed=2, windows=3 * 50)
    assert abs(counts.sum() - rate * 1800 * 50) < 1


def test_pattern_repeats_after_the_span():
    """After the span the windows repeat: at the data rate, every period has the data's counts."""
    process = ServeGenWindows(rates=(1.0, 0.0, 2.0), patterns=("Gamma", "", "Weibull"), shapes=(0.5, 0, 2.0), scales=(1, 0, 1))
    counts = _window_counts(process, process.mean_rate, seed=4, windows=3 * 5).reshape(5, 3)
    assert (counts == [600, 0, 1200]).all()


def test_chunks_are_chunk_sized_and_times_never_decrease():
    """Every chunk holds exactly *chunk* times (windows split across chunks) and times never decrease."""
    process = ServeGenWindows(rates=(3.0, 0.5, 0.0, 2.0), patterns=("Gamma", "Weibull", "", "Gamma"), shapes=(0.05, 0.3, 0, 8.0), scales=(5, 1, 0, 1))
    gen = process.times(np.random.default_rng(9), rate=10.0, chunk=1000)
    chunks = [next(gen) for _ in range(60)]
    assert all(len(c) == 1000 for c in chunks)
    t = np.concatenate(chunks)
    assert t[0] >= 0
    assert np.all(np.diff(t) >= 0)
    assert t[-1] > process.period_s  # crossed into the repetition


def test_gaps_follow_the_named_pattern():
    """Inside a window the gaps have the coefficient of variation of the named distribution:
    Gamma(shape 0.25) -> CV 2, Weibull(shape 0.5) -> CV sqrt(5) (within 10%)."""
    for pattern, shape, cv in (("Gamma", 0.25, 2.0), ("Weibull", 0.5, math.sqrt(5.0))):
        process = ServeGenWindows(rates=(200.0,), patterns=(pattern,), shapes=(shape,), scales=(3.0,), durations_s=(1000.0,))
        t = next(process.times(np.random.default_rng(1), rate=200.0, chunk=200_000))
        gaps = np.diff(t)
        assert abs(gaps.std() / gaps.mean() / cv - 1) < 0.10, pattern


def test_same_seed_same_times():
    """The same seed gives the same arrival times."""
    process = ServeGenWindows.from_trace(read_trace(MM_IMAGE / "chunk-12-trace.csv"))
    a = next(process.times(np.random.default_rng(8), 2.0, 5000))
    b = next(process.times(np.random.default_rng(8), 2.0, 5000))
    assert np.array_equal(a, b)


class _CountingRng:
    """A numpy Generator recording the number of values of every draw (its bit generator shared)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.bit_generator = self._rng.bit_generator
        self.sizes: list[int] = []

    def __getattr__(self, name: str):
        method = getattr(self._rng, name)

        def counted(*args, **kwargs):
            out = method(*args, **kwargs)
            self.sizes.append(int(np.size(out)))
            return out

        return counted


def _whole_window(seed: int, n: int, shape: float, scale: float, lo: float, hi: float) -> np.ndarray:
    """The documented rule in one piece: n + 1 gamma gaps drawn at once, rescaled to span [lo, hi)."""
    cs = np.cumsum(np.random.default_rng(seed).gamma(shape, scale, n + 1))
    return np.minimum(lo + (hi - lo) * (cs[:-1] / cs[-1]), np.nextafter(hi, -np.inf))


@pytest.mark.parametrize("bound", [1000, servegen.MAX_DRAW])
def test_a_busy_window_is_drawn_in_bounded_pieces_with_the_times_of_one_draw(monkeypatch, bound):
    """A window of 3.5 x the draw bound arrivals (a 600 s window at 465/s x 100 holds 28 million)
    never draws more than the bound at once, never hands out more than a chunk, and its times are,
    to the bit, the n + 1 gaps drawn in one piece and rescaled to the window."""
    monkeypatch.setattr(servegen, "MAX_DRAW", bound)
    n = int(3.5 * bound)
    process = ServeGenWindows(rates=(n / 600.0,), patterns=("Gamma",), shapes=(0.4,), scales=(2.0,))
    rng = _CountingRng(21)
    gen = process.times(rng, rate=n / 600.0, chunk=700)
    chunks = [next(gen) for _ in range(-(-n // 700))]
    assert max(rng.sizes) <= bound
    assert all(len(c) == 700 for c in chunks)
    got = np.concatenate(chunks)[:n]
    assert np.array_equal(got, _whole_window(21, n, 0.4, 2.0, 0.0, 600.0))


def test_passes_without_an_arrival_are_skipped_at_once(monkeypatch):
    """At 1e-7 expected arrivals per 600 s pass, the k-th arrival falls in the pass where the
    rounded cumulative expectation first reaches k, ceil((k - 0.5) / 1e-7) - 1 (the counts'
    rounding rule), and finding five arrivals computes a handful of passes, not 45 million."""
    per_pass = 1e-7
    process = ServeGenWindows(rates=(1.0,), patterns=("Weibull",), shapes=(1.5,), scales=(1.0,))
    passes = []
    real_floor = np.floor

    class CountingNumpy:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def floor(x):
            passes.append(1)  # one rounding of the counts per pass computed
            assert len(passes) < 100, "every empty pass computed one by one"
            return real_floor(x)

    monkeypatch.setattr(servegen, "np", CountingNumpy())
    t = next(process.times(np.random.default_rng(3), rate=per_pass / 600.0, chunk=5))
    expected = [math.ceil((k - 0.5) / per_pass) - 1 for k in range(1, 6)]
    assert (t // 600.0).astype(int).tolist() == expected


def test_process_is_registered_and_validated():
    """``servegen_windows`` names the process; an unknown pattern or an all-idle trace is rejected."""
    assert arrival_processes.get("servegen_windows") is ServeGenWindows
    with pytest.raises(FieldValueError, match="patterns"):
        ServeGenWindows(rates=(1.0,), patterns=("Lognormal",), shapes=(1.0,), scales=(1.0,))
    with pytest.raises(FieldValueError, match="idle"):
        ServeGenWindows(rates=(0.0, 0.0), patterns=("", ""), shapes=(0, 0), scales=(0, 0))


# --------------------------------------------------------------------------- loader: lengths


def test_merged_pmf_weights_blocks_by_trace_requests(m_large):
    """A client's input/output PMFs are its 6 h dataset blocks merged, each weighted by the
    requests the trace gives that block."""
    clients = {c.id: c for c in m_large[0]}
    cid = _busiest(M_LARGE, 1, with_dataset=True)[0]
    for field, dist in (("input_tokens", clients[f"m-large/{cid}"].input_distribution),
                        ("output_tokens", clients[f"m-large/{cid}"].output_distribution)):
        expected = _merged_pmf(M_LARGE, cid, field)
        assert isinstance(dist, Empirical)
        assert list(dist.values) == sorted(expected)
        assert np.allclose(dist.probabilities, [expected[v] for v in sorted(expected)], rtol=1e-9, atol=1e-15)


def test_block_without_data_lends_its_requests_to_the_next_block(m_large):
    """m-large client 104 has no data in its first 6 h block: those requests weight the first block
    with data (the merged PMF still matches)."""
    blocks = json.loads((M_LARGE / "chunk-104-dataset.json").read_text())
    assert blocks["0"]["input_tokens"] == "{}"
    dist = {c.id: c for c in m_large[0]}["m-large/104"].input_distribution
    expected = _merged_pmf(M_LARGE, 104, "input_tokens")
    assert np.allclose(dist.probabilities, [expected[v] for v in sorted(expected)], rtol=1e-9, atol=1e-15)


def test_sampled_length_quantiles_match_the_merged_pmf(m_large):
    """p10/p50/p90/p99 of 200,000 sampled input and output lengths of the busiest m-large client
    lie between the merged PMF's quantiles at p - 0.005 and p + 0.005."""
    cid = _busiest(M_LARGE, 1, with_dataset=True)[0]
    client = {c.id: c for c in m_large[0]}[f"m-large/{cid}"]
    for field, dist in (("input_tokens", client.input_distribution), ("output_tokens", client.output_distribution)):
        pmf = _merged_pmf(M_LARGE, cid, field)
        x = dist.sample(np.random.default_rng(21), 200_000)
        for q in (0.10, 0.50, 0.90, 0.99):
            sample_q = float(np.quantile(x, q, method="inverted_cdf"))
            assert _pmf_quantile(pmf, q - 0.005) <= sample_q <= _pmf_quantile(pmf, q + 0.005), (field, q)


def test_language_clients_have_no_modality_or_reasoning(m_large):
    """m-large (input_tokens/output_tokens only) loads as plain language clients."""
    assert all(c.multimodal is None and c.reasoning is None for c in m_large[0])


def test_mm_image_clients_carry_modality_pmfs(mm_image):
    """mm-image clients get text, image-token and image-count PMFs (audio/video absent in this data),
    and the text PMF doubles as the input distribution."""
    clients, _ = mm_image
    assert len(clients) == 35
    with_images = [c for c in clients if c.multimodal.image_distribution is not None]
    assert len(with_images) == 34  # mm-image/33 never sends an image
    for c in clients:
        mm = c.multimodal
        assert c.reasoning is None
        assert isinstance(mm.text_distribution, Empirical) and mm.text_distribution is c.input_distribution
        assert mm.audio_distribution is None and mm.video_distribution is None
    for c in with_images:
        counts = c.multimodal.image_count_distribution
        assert isinstance(counts, Empirical) and max(counts.values) >= 1
        assert min(c.multimodal.image_distribution.values) >= 0


def test_mm_image_image_tokens_match_the_dataset(mm_image):
    """mm-image/0's per-image token PMF is the dataset's image_tokens merged over its blocks."""
    client = {c.id: c for c in mm_image[0]}["mm-image/0"]
    expected = _merged_pmf(MM_IMAGE, 0, "image_tokens")  # one image per request: request weights
    dist = client.multimodal.image_distribution
    assert np.allclose(dist.probabilities, [expected[v] for v in sorted(expected)], rtol=1e-9, atol=1e-15)


def _write_client(directory: Path, fields: dict[str, str], cid: int = 0) -> None:
    """A three-window client (10, 0 and 5 requests/s) with one dataset block of *fields*."""
    directory.mkdir(exist_ok=True)
    (directory / f"chunk-{cid}-trace.csv").write_text("0,10,1,Gamma,1,1\n600,0,0,,0,0\n1200,5,2,Weibull,0.5,1\n")
    (directory / f"chunk-{cid}-dataset.json").write_text(json.dumps({"0": fields}))


def test_category_is_detected_from_the_fields(tmp_path):
    """input/output fields load a language client, + reason_ratio a reasoning client, text/image
    fields a multimodal client whose absent modalities (audio, video) stay unset."""
    _write_client(tmp_path / "lang", {"input_tokens": "{10: 1.0}", "output_tokens": "{5: 1.0}"})
    _write_client(tmp_path / "reason", {"input_tokens": "{10: 1.0}", "output_tokens": "{5: 1.0}", "reason_ratio": "{0.0: 0.5, 0.75: 0.5}"})
    _write_client(
        tmp_path / "mm",
        {"text_tokens": "{7: 1.0}", "image_tokens": "{300: 0.5, 600: 0.5}", "image_count": "{0: 0.5, 2: 0.5}", "output_tokens": "{5: 1.0}"},
    )
    (lang,), _ = load_servegen(ServeGenConfig(path=str(tmp_path / "lang")))
    (reason,), _ = load_servegen(ServeGenConfig(path=str(tmp_path / "reason")))
    (mm,), _ = load_servegen(ServeGenConfig(path=str(tmp_path / "mm")))
    assert lang.multimodal is None and lang.reasoning is None and lang.input_distribution.values == (10.0,)
    assert reason.reasoning.reason_ratio_distribution.values == (0.0, 0.75) and reason.multimodal is None
    assert mm.reasoning is None
    assert mm.multimodal.image_distribution.values == (300.0, 600.0)
    assert mm.multimodal.image_count_distribution.values == (0.0, 2.0)
    assert mm.multimodal.audio_distribution is None and mm.multimodal.video_distribution is None
    assert mm.id == "mm/0" and mm.rate_fraction == pytest.approx((10 + 5) * 600 / 1800)


def test_deepseek_r1_clients_carry_reason_ratio(r1):
    """deepseek-r1 clients get a reason_ratio PMF on [0, 1] (and no modality mix)."""
    clients, _ = r1
    assert len(clients) == 10
    for c in clients:
        ratio = c.reasoning.reason_ratio_distribution
        assert c.multimodal is None
        assert isinstance(ratio, Empirical)
        assert 0.0 <= min(ratio.values) and max(ratio.values) <= 1.0
        assert 0.0 < ratio.mean < 1.0


# --------------------------------------------------------------------------- loader: selection and rates


def test_clients_without_dataset_or_requests_are_skipped(m_large):
    """Clients with no dataset file (15 in m-large) or idle all day are not loaded; the rest are."""
    ids = {c.id for c in m_large[0]}
    expected = {
        f"m-large/{_chunk_id(p)}"
        for p in M_LARGE.glob("chunk-*-trace.csv")
        if p.with_name(p.name.replace("trace.csv", "dataset.json")).exists() and _day_requests(p) > 0
    }
    assert ids == expected
    assert "m-large/142" not in ids  # the busiest client has no dataset in this snapshot


def test_aggregate_rate_is_the_sum_of_mean_data_rates(m_large):
    """The aggregate rate is the kept clients' trace requests per second over the day, and each
    client's rate_fraction is its own mean rate."""
    clients, rate = m_large
    per_client = {f"m-large/{_chunk_id(p)}": _day_requests(p) / DAY for p in M_LARGE.glob("chunk-*-trace.csv")}
    assert rate == pytest.approx(sum(per_client[c.id] for c in clients), rel=1e-12)
    assert rate == pytest.approx(13_027_366 / DAY, rel=1e-9)
    for c in clients:
        assert c.rate_fraction == pytest.approx(per_client[c.id], rel=1e-12)


def test_loaded_client_at_its_rate_fraction_gets_the_data_rate_per_window(r1):
    """Run at its rate_fraction (what the simulation gives it), a loaded client's arrival process
    reproduces its trace window by window."""
    client = {c.id: c for c in r1[0]}["deepseek-r1/28"]
    expected = np.array([rate * 600 for _s, rate, _p in _raw_trace(R1 / "chunk-28-trace.csv")])
    counts = _window_counts(client.arrival, client.rate_fraction, seed=6, windows=WINDOWS_PER_DAY)
    assert np.all(np.abs(counts - expected) < 1)


def test_rate_scale_multiplies_the_aggregate_rate(r1):
    """rate_scale multiplies the returned aggregate rate and leaves the clients unchanged."""
    clients, rate = r1
    scaled_clients, scaled = load_servegen(ServeGenConfig(path=str(R1), rate_scale=2.5))
    assert scaled == pytest.approx(2.5 * rate, rel=1e-12)
    assert [c.rate_fraction for c in scaled_clients] == [c.rate_fraction for c in clients]


def test_span_selects_the_windows_in_it():
    """span_s = [21600, 43200) keeps windows 36..71: the process has their rates, time 0 is 21600 s,
    and rates are averaged over the span."""
    clients, rate = load_servegen(ServeGenConfig(path=str(R1), span_s=(21600.0, 43200.0)))
    client = {c.id: c for c in clients}["deepseek-r1/35"]
    rows = _raw_trace(R1 / "chunk-35-trace.csv")[36:72]
    assert client.arrival.rates == tuple(r for _s, r, _p in rows)
    assert client.arrival.period_s == 21600.0
    assert client.rate_fraction == pytest.approx(sum(r * 600 for _s, r, _p in rows) / 21600.0, rel=1e-12)
    total = sum(
        sum(r * 600 for _s, r, _p in _raw_trace(p)[36:72]) for p in R1.glob("chunk-*-trace.csv")
    ) / 21600.0
    assert rate == pytest.approx(total, rel=1e-12)


def test_span_cuts_straddling_windows():
    """A span boundary inside a window cuts that window: [300, 1500) gives windows of 300, 600 and 300 s."""
    clients, _ = load_servegen(ServeGenConfig(path=str(R1), span_s=(300.0, 1500.0)))
    for c in clients:
        assert c.arrival.durations_s == (300.0, 600.0, 300.0)


def test_span_drops_clients_idle_in_it():
    """A client idle throughout the span is not loaded."""
    idle = [
        _chunk_id(p) for p in R1.glob("chunk-*-trace.csv") if all(r == 0 for _s, r, _p in _raw_trace(p)[:6])
    ]
    assert idle
    clients, _ = load_servegen(ServeGenConfig(path=str(R1), span_s=(0.0, 3600.0)))
    assert not {f"deepseek-r1/{i}" for i in idle} & {c.id for c in clients}


def test_max_clients_keeps_the_busiest():
    """max_clients = 3 keeps the three clients with most requests in the span."""
    clients, rate = load_servegen(ServeGenConfig(path=str(R1), max_clients=3))
    assert {c.id for c in clients} == {f"deepseek-r1/{i}" for i in _busiest(R1, 3, with_dataset=True)}
    assert rate == pytest.approx(sum(c.rate_fraction for c in clients), rel=1e-12)


def test_client_ids_and_slo_class():
    """Clients are named <model directory>/<chunk id>, in id order, with the configured SLO class."""
    clients, _ = load_servegen(ServeGenConfig(path=str(R1), slo_class="batch"))
    ids = [int(c.id.split("/")[1]) for c in clients]
    assert all(c.id.startswith("deepseek-r1/") for c in clients)
    assert ids == sorted(ids)
    assert {c.slo_class for c in clients} == {"batch"}


def test_scenario_with_servegen_data_runs():
    """A scenario with servegen_data simulates requests from the loaded clients, with image tokens."""
    data = tiny_scenario()
    data["workload"] = {"servegen_data": {"path": str(MM_IMAGE), "max_clients": 3}, "num_requests": 300}
    data["serving"]["engine"].update(max_num_seqs=64, max_num_batched_tokens=4096, kv_num_blocks=200_000)
    results = run(data)
    cols = results.columns
    assert len(cols["arrival_s"]) == 300
    busiest = {f"mm-image/{i}" for i in _busiest(MM_IMAGE, 3, with_dataset=True)}
    assert set(np.unique(cols["client_id"]).tolist()) <= busiest
    assert (cols["image_tokens"] > 0).any()


# --------------------------------------------------------------------------- errors


def _client_copy(tmp_path: Path, cid: int = 28, source: Path = R1) -> Path:
    """A directory holding a copy of one client's trace and dataset."""
    directory = tmp_path / "model"
    directory.mkdir()
    for kind in ("trace.csv", "dataset.json"):
        shutil.copy(source / f"chunk-{cid}-{kind}", directory / f"chunk-{cid}-{kind}")
    return directory


def _corrupt_trace(directory: Path, line: int, text: str) -> Path:
    path = directory / "chunk-28-trace.csv"
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return path


def _corrupt_dataset(directory: Path, window: str, field: str | None, value: object) -> Path:
    path = directory / "chunk-28-dataset.json"
    blocks = json.loads(path.read_text())
    if field is None:
        blocks[value] = blocks.pop(window)
    else:
        blocks[window][field] = value
    path.write_text(json.dumps(blocks, indent=2))
    return path


def test_missing_directory_is_reported(tmp_path):
    """A path that is not a directory raises ScenarioError naming it."""
    missing = tmp_path / "nope"
    with pytest.raises(ScenarioError) as err:
        load_servegen(ServeGenConfig(path=str(missing)))
    assert err.value.source == str(missing)
    assert "no such directory" in str(err.value)


def test_directory_without_datasets_is_reported(tmp_path):
    """A directory with traces but no dataset file raises ScenarioError naming it."""
    directory = _client_copy(tmp_path)
    (directory / "chunk-28-dataset.json").unlink()
    with pytest.raises(ScenarioError) as err:
        load_servegen(ServeGenConfig(path=str(directory)))
    assert err.value.source == str(directory)
    assert "no chunk-<id>-dataset.json" in str(err.value)


@pytest.mark.parametrize(
    ("line", "text", "message"),
    [
        (5, "2400,0.1,1.0,Gamma,0.5", "expected 6 comma-separated fields"),
        (5, "2400,0.1,1.0,Gamma,0.5,1.0,7", "expected 6 comma-separated fields"),
        (7, "3600,fast,1.0,Gamma,0.5,1.0", "rate_rps: not a finite number: 'fast'"),
        (9, "4800,0.1,1.0,Lognormal,0.5,1.0", "unknown pattern 'Lognormal'"),
    ],
    ids=["too-few-fields", "too-many-fields", "non-numeric", "unknown-pattern"],
)
def test_malformed_trace_row_is_reported_with_its_line(tmp_path, line, text, message):
    """A trace row with the wrong number of fields, a non-numeric value or an unknown pattern
    raises ScenarioError naming the file and the line."""
    path = _corrupt_trace(_client_copy(tmp_path), line, text)
    with pytest.raises(ScenarioError) as err:
        load_servegen(ServeGenConfig(path=str(path.parent)))
    assert err.value.source == str(path)
    assert err.value.problems[0][0] == f"line {line}"
    assert message in err.value.problems[0][1]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[1, 2, 3]", "not a dict literal"),
        ("{1: 0.5, 2: ", "not a Python dict literal"),
        ("__import__('os').system('true')", "not a Python dict literal"),
        ("{'long': 0.5, 2: 0.5}", "non-numeric key 'long'"),
        ("{1: 1.5, 2: -0.5}", "negative probability -0.5"),
        (12, "must be a string"),
    ],
    ids=["list", "truncated", "code", "non-numeric-key", "negative-probability", "not-a-string"],
)
def test_malformed_pmf_is_reported_with_window_and_field(tmp_path, value, message):
    """A PMF that is not a dict literal, has non-numeric keys or negative probabilities raises
    ScenarioError naming the file, the window and the field."""
    path = _corrupt_dataset(_client_copy(tmp_path), "21600", "output_tokens", value)
    with pytest.raises(ScenarioError) as err:
        load_servegen(ServeGenConfig(path=str(path.parent)))
    assert err.value.source == str(path)
    assert err.value.problems[0][0] == "window 21600, field output_tokens"
    assert message in err.value.problems[0][1]


@pytest.mark.parametrize("key", ["21601", "morning"])
def test_dataset_key_that_is_not_a_window_start_is_reported(tmp_path, key):
    """A dataset key that is not one of the trace's window starts raises ScenarioError naming the
    file and the key."""
    path = _corrupt_dataset(_client_copy(tmp_path), "21600", None, key)
    with pytest.raises(ScenarioError) as err:
        load_servegen(ServeGenConfig(path=str(path.parent)))
    assert err.value.source == str(path)
    assert err.value.problems[0][0] == f"window {key}"


def test_invalid_json_is_reported_with_its_line(tmp_path):
    """A dataset file that is not JSON raises ScenarioError naming the file and the line."""
    directory = _client_copy(tmp_path)
    path = directory / "chunk-28-dataset.json"
    path.write_text('{\n  "0": {\n    "input_tokens": "{1: 1.0}",,\n  }\n}\n')
    with pytest.raises(ScenarioError) as err:
        load_servegen(ServeGenConfig(path=str(directory)))
    assert err.value.source == str(path)
    assert err.value.problems[0][0] == "line 3"


def test_missing_field_is_reported(tmp_path):
    """A window missing a field its category needs raises ScenarioError naming window and field."""
    path = _client_copy(tmp_path) / "chunk-28-dataset.json"
    blocks = json.loads(path.read_text())
    del blocks["43200"]["reason_ratio"]
    path.write_text(json.dumps(blocks))
    with pytest.raises(ScenarioError) as err:
        load_servegen(ServeGenConfig(path=str(path.parent)))
    assert err.value.source == str(path)
    assert err.value.problems[0][0] == "window 43200, field reason_ratio"
    assert "missing" in err.value.problems[0][1]
