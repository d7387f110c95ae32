"""The roofline's efficiencies calibrated against BLIS's measured rows (serving/roofline_fit.py)
and the ``roofline`` model's ``efficiency: calibrated`` (serving/roofline.py)."""

from __future__ import annotations

import math

import pytest

from simpy_llm.config.errors import FieldValueError
from simpy_llm.serving.hardware import gpu_spec
from simpy_llm.serving.roofline import RooflineLatency, calibrated_efficiencies
from simpy_llm.serving.roofline_fit import HELD_OUT_MODEL, fit_efficiencies, fit_rows, row_errors


@pytest.mark.parametrize("gpu", ["H100", "A100-80"])
def test_the_fit_reproduces_the_committed_efficiencies(gpu: str) -> None:
    """Fitting the committed BLIS rows again gives the values committed in profiles/gpus.yaml (to 3 places)."""
    fitted = fit_efficiencies(gpu)
    assert (fitted["mfu_prefill"], fitted["mfu_decode"], fitted["mbu"]) == calibrated_efficiencies()[gpu]


def test_the_held_out_model_is_not_fitted() -> None:
    """No row of the held-out model (Llama-3.1-8B) is among the rows the fit uses."""
    for gpu in ("H100", "A100-80"):
        assert all(r.model != HELD_OUT_MODEL for r in fit_rows(gpu))
        assert any(r.model == HELD_OUT_MODEL for r in fit_rows(gpu, include_held_out=True))


def _held_out_decode(gpu: str, tp: int, efficiencies: dict[str, float]) -> tuple[float, float]:
    (error,) = [e for e in row_errors(gpu, efficiencies) if e.row.model == HELD_OUT_MODEL and e.row.tp == tp]
    return error.decode


def test_calibrated_decode_lands_closer_to_blis_on_a_model_it_has_not_seen() -> None:
    """On Llama-3.1-8B, H100 tp2 (held out), the calibrated roofline's decode step is within
    0.45-1.6 of BLIS's over the grid (batches 1-256, 256 and 1024 context tokens), and its worst
    ratio is nearer 1 than the ideal roofline's (BLIS MFUs, full bandwidth: 0.33 of BLIS at batch 1)."""
    h100 = gpu_spec("H100")
    ideal = _held_out_decode("H100", 2, {"mfu_prefill": h100.mfu_prefill, "mfu_decode": h100.mfu_decode, "mbu": 1.0})
    mfu, mfu_decode, mbu = calibrated_efficiencies()["H100"]
    calibrated = _held_out_decode("H100", 2, {"mfu_prefill": mfu, "mfu_decode": mfu_decode, "mbu": mbu})
    assert 0.45 <= calibrated[0] and calibrated[1] <= 1.6
    worst = [max(abs(math.log(lo)), abs(math.log(hi))) for lo, hi in (ideal, calibrated)]
    assert worst[1] < worst[0]
    assert 0.32 < ideal[0] < 0.33


def test_efficiency_calibrated_takes_the_gpus_values() -> None:
    """``efficiency: calibrated`` builds the roofline with the GPU's calibrated mfu, mfu_decode and mbu."""
    m = RooflineLatency(model="llama-3.1-8b-instruct", gpu="H100-SXM", tp=2, efficiency="calibrated")
    assert (m.mfu, m.mfu_decode, m.mbu) == calibrated_efficiencies()["H100"]
    assert (m.roofline.mfu, m.roofline.mfu_decode, m.roofline.mbu) == calibrated_efficiencies()["H100"]


def test_the_default_efficiency_is_unchanged() -> None:
    """Without ``efficiency`` the roofline keeps BLIS's MFUs and full bandwidth."""
    m = RooflineLatency(model="llama-3.1-8b-instruct", gpu="H100")
    assert (m.efficiency, m.mfu, m.mfu_decode, m.mbu) == ("blis", 0.45, 0.3, 1.0)


@pytest.mark.parametrize(("extra", "field"), [({"mfu": 0.5}, "mfu"), ({"mfu_decode": 0.5}, "mfu_decode"), ({"mbu": 0.7}, "mbu")])
def test_calibrated_with_an_efficiency_given_is_refused(extra: dict[str, float], field: str) -> None:
    """``efficiency: calibrated`` with mfu, mfu_decode or mbu given is refused at that key."""
    with pytest.raises(FieldValueError) as info:
        RooflineLatency(model="llama-3.1-8b-instruct", gpu="H100", efficiency="calibrated", **extra)
    assert info.value.field == field


def test_calibrated_on_a_gpu_without_a_set_is_refused() -> None:
    """The L40S has no calibrated set (BLIS has no L40S rows): refused at ``efficiency``, naming the GPUs that have one."""
    with pytest.raises(FieldValueError, match="calibrated GPUs: A100-80, H100") as info:
        RooflineLatency(model="llama-3.1-8b-instruct", gpu="L40S", efficiency="calibrated")
    assert info.value.field == "efficiency"


def test_an_unknown_efficiency_is_refused() -> None:
    """``efficiency`` other than blis or calibrated is refused."""
    with pytest.raises(ValueError, match="efficiency"):
        RooflineLatency(model="llama-3.1-8b-instruct", gpu="H100", efficiency="measured")
