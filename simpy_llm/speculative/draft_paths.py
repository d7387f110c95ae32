"""A draft device's own links to particular targets (a draft group's ``rtt_ms_by_target``):
:class:`DraftPath`, and what a device whose verdicts cannot be delivered ahead answers
(:func:`no_verdict_ahead`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simpy_llm.network.link import Link

if TYPE_CHECKING:
    from collections.abc import Callable

    from simpy_llm.config.speculation import DraftGroupConfig
    from simpy_llm.network.link import Message
    from simpy_llm.speculative.draft import DraftDevice

__all__ = ["DraftPath", "no_verdict_ahead"]


def no_verdict_ahead(_payload: Any, _size_bytes: float) -> Message | None:
    """The ``verdict_ahead`` of a batching device: its downlink carries several requests'
    verdicts, so no delivery is known ahead (the verdict takes the ordinary path)."""
    return None


class DraftPath:
    """A draft device's links to particular targets: the round trip ``rtt_ms_by_target`` gives
    them, the other figures of its group's ``network`` (bandwidth, bytes, faults), an uplink
    and a downlink of their own, named ``draft/<group>/<i>/<target name>/up`` and ``/down``.
    Its requests routed to those targets send their bundles and receive their verdicts on it
    (the prompt goes up the device's own uplink: the target is chosen when it arrives).

    Parameters
    ----------
    device
        The device.
    group
        Its group's config (with a ``network``).
    target
        The target name the round trip is given for.
    rtt_ms
        The round trip, ms.
    """

    def __init__(self, device: DraftDevice, group: DraftGroupConfig, target: str, rtt_ms: float) -> None:
        net = group.network
        assert net is not None  # rtt_ms_by_target needs a network (checked when made)
        fleet = device.fleet
        self.rtt_s = rtt_ms / 1e3
        """Propagation round trip to these targets, s."""
        self._one_way_s = rtt_ms * 5e-4  # as NetworkConfig.one_way_s
        self._header_bytes, self._bandwidth, self._token_bytes = fleet.config.bundle_header_bytes, net.bandwidth_bytes_per_s, net.bytes_per_token
        name = f"draft/{group.name}/{device.index}/{target}"
        rng_up = fleet.streams(f"{name}/up") if net.random else None
        rng_down = fleet.streams(f"{name}/down") if net.random else None
        bw = net.bandwidth_bytes_per_s
        self.up: Link = Link(device.env, fleet.uploaded, name=f"{name}/up", rtt_s=self.rtt_s, bandwidth_bytes_per_s=bw,
                             rng=rng_up, dropped=fleet.lost, **net.link_faults())
        self.down: Link = Link(device.env, fleet.downloaded, name=f"{name}/down", rtt_s=self.rtt_s, bandwidth_bytes_per_s=bw,
                               rng=rng_down, dropped=fleet.lost, **net.link_faults())
        self.verdict_ahead: Callable[[Any, float], Message | None] = self.down.put_ahead if group.max_batch == 1 else no_verdict_ahead
        """As :attr:`DraftDevice.verdict_ahead`, on this downlink."""

    def download_s(self, tokens: int) -> float:
        """Nominal time for a verdict of *tokens* tokens to reach the device on this path, s."""
        return self._one_way_s + (self._header_bytes + tokens * self._token_bytes) / self._bandwidth
