"""Clients' networks: between the workload and the router.

A client with a ``network`` (:class:`~simpy_llm.config.schema.NetworkConfig`) sends
each prompt over its own uplink, a :class:`~simpy_llm.network.link.Link` with the
client's round trip and bandwidth: the request reaches the router half a round trip
plus its bytes' transmission after the client sent it (``prompt_tokens x
bytes_per_token`` bytes, the client's uploads in flight sharing its bandwidth
equally). Each output token reaches the client ``download_s`` after the server emits
it: half a round trip plus one token's bytes over the bandwidth. The download is a
fixed delay: a stream of tokens needs far less than a client's bandwidth (at 4 bytes a
token, 1 Mbit/s carries 31,000 tokens a second), so the downlink never queues. Seed
000 §10 adds the whole response's bytes to the E2E instead; streamed tokens arrive as
they are made, so only the last one's bytes count here.

The records keep the server's view (``arrival_s`` is when the request reached the
router) and carry ``upload_s`` and ``download_s``; the client's TTFT is the server's
plus both, and so is its E2E (``docs/network.md``).

Requests of a client without a network (and replayed trace requests whose
``client_id`` names no client with one) pass straight through, in the same instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simpy_llm.network.link import Link
from simpy_llm.wire import Wire

if TYPE_CHECKING:
    import simpy

    from simpy_llm.config.schema import NetworkConfig
    from simpy_llm.entities import Request
    from simpy_llm.metrics.recorder import Recorder
    from simpy_llm.network.link import Message

__all__ = ["ClientNetwork"]


class ClientNetwork:
    """The uplinks of the clients that have a network, between *sent* and *arrivals*.

    Parameters
    ----------
    env
        The SimPy environment.
    sent
        Wire the workload generator and the session registry put requests into when
        their clients send them (this component becomes its handler).
    arrivals
        Wire the router reads: each request is put there when it reaches the server.
    recorder
        Told of each request's arrival at the server.
    networks
        Network of each client that has one, by client id.

    Examples
    --------
    >>> import simpy
    >>> from simpy_llm.config.schema import NetworkConfig
    >>> from simpy_llm.entities import Request
    >>> from simpy_llm.metrics.recorder import Recorder
    >>> env = simpy.Environment()
    >>> sent, arrivals = Wire(env), Wire(env)
    >>> reached = []
    >>> arrivals.connect(lambda r: reached.append((env.now, r.upload_s)))
    >>> net = ClientNetwork(env, sent, arrivals, Recorder(), {"far": NetworkConfig(rtt_ms=80.0)})
    >>> _ = sent.put(Request(id=0, client_id="far", prompt_tokens=100, output_tokens=5, arrival_s=0.0))
    >>> _ = sent.put(Request(id=1, client_id="near", prompt_tokens=100, output_tokens=5, arrival_s=0.0))
    >>> env.run()
    >>> reached
    [(0, 0.0), (0.04, 0.04)]
    """

    def __init__(
        self,
        env: simpy.Environment,
        sent: Wire,
        arrivals: Wire,
        recorder: Recorder,
        networks: dict[str, NetworkConfig],
    ) -> None:
        self.env = env
        self.arrivals = arrivals
        self.recorder = recorder
        self.networks = dict(networks)
        delivered = Wire(env)
        self.uplinks: dict[str, Link] = {
            cid: Link(env, delivered, name=f"client/{cid}/up", rtt_s=net.rtt_ms / 1e3,
                      bandwidth_bytes_per_s=net.bandwidth_bytes_per_s)
            for cid, net in sorted(self.networks.items())
        }
        """Each networked client's uplink, by client id."""
        self.uploading: dict[int, Request] = {}
        """Requests sent and not yet at the server, by id."""
        sent.connect(self._send)
        delivered.connect(self._deliver)

    def _send(self, req: Request) -> None:
        link = self.uplinks.get(req.client_id)
        if link is None:
            self.recorder.on_arrival(req, self.env.now)
            self.arrivals.put(req)
            return
        self.uploading[req.id] = req
        link.put(req, req.prompt_tokens * self.networks[req.client_id].bytes_per_token)

    def _deliver(self, message: Message) -> None:
        req: Request = message.payload
        now = self.env.now
        del self.uploading[req.id]
        req.upload_s = now - req.arrival_s
        req.arrival_s = now
        req.download_s = self.networks[req.client_id].download_s
        self.recorder.on_arrival(req, now)
        self.arrivals.put(req)
