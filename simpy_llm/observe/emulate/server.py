"""The emulated server: an OpenAI-compatible HTTP server whose timing is the simulator's.

:class:`EmulatedServer` runs a scenario's serving section (router, replicas,
engine, latency model) in wall-clock time (:class:`~simpy_llm.observe.emulate.clock.RealtimeDriver`)
and feeds it the HTTP requests it receives; the scenario's own workload is
not run. Each request becomes a :class:`~simpy_llm.entities.Request` that
arrives now; the replicas report every output token through their
``token_listener`` (one event per engine step: the server runs the
``event_per_step`` mode, whose records equal the fast mode's), and the
handler sends each token when the wall clock reaches its simulated time. A
non-streamed answer is sent whole at the simulated completion time.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text with
vLLM's metric names) and ``GET /simpy_llm/server`` (the server's description,
:meth:`EmulatedServer.description`: what the observer writes as a trace's
``server`` block). See docs/emulate.md for the token-counting rules and the
timing accuracy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs
from aiohttp import web

from simpy_llm.config.errors import ScenarioError
from simpy_llm.config.schema import TraceSource, WorkloadConfig
from simpy_llm.entities import Request
from simpy_llm.observe.emulate.clock import RealtimeDriver
from simpy_llm.observe.emulate.protocol import (
    ParsedRequest,
    RequestError,
    chunk_bytes,
    completion_body,
    error_body,
    output_text,
    parse_request,
    stream_chunk,
    usage_chunk,
)
from simpy_llm.simulation import Simulation
from simpy_llm.workload.distributions import LengthDistribution, SamplingError, draw_tokens
from simpy_llm.workload.generator import sampling_scenario_error
from simpy_llm.workload.traces import TraceV2Writer, emulated_server_block, us_from_s

if TYPE_CHECKING:
    from simpy_llm.config.schema import Scenario
    from simpy_llm.serving.engine import Replica

__all__ = [
    "DESCRIPTION_PATH",
    "TRACE_COLUMNS",
    "EmulatedServer",
    "ServedRequest",
    "default_model_name",
    "replay_scenario",
    "serve_until_signalled",
]

_log = logging.getLogger(__name__)

TRACE_COLUMNS = ("endpoint", "replica")
"""Columns the served trace has after the trace v2 ones."""

SHUTDOWN_TIMEOUT_S = 0.5

DESCRIPTION_PATH = "/simpy_llm/server"
"""Where the server answers with its description (:meth:`EmulatedServer.description`)."""
"""How long stopping waits for responses in progress before closing their connections."""


@attrs.frozen(kw_only=True)
class ServedRequest:
    """One request the server took in, as the simulation served it. Times are simulated
    seconds since the server started (wall-clock seconds, as the simulation runs in real time)."""

    request_id: int
    """The simulation's request number (in arrival order)."""
    endpoint: str
    """``"chat"`` or ``"completions"``."""
    client_id: str
    """The request's ``user`` field, else the endpoint name."""
    streaming: bool
    """Whether the answer was streamed."""
    prompt_tokens: int
    """Prompt length, tokens (words)."""
    output_tokens: int
    """Output length, tokens."""
    arrival_s: float
    """When the request arrived, s (a whole microsecond)."""
    first_token_s: float
    """When the first token was due, s (``nan`` unless completed)."""
    completion_s: float
    """When the last token was due, s (``nan`` unless completed)."""
    replica: int
    """Replica it was routed to."""
    status: str
    """``"completed"``, ``"dropped"`` (over ``max_model_len``) or ``"in_flight"`` (the server stopped first)."""
    error_message: str = ""
    """Why it was dropped or not completed."""


def default_model_name(scenario: Scenario) -> str:
    """The model name served: the latency model's ``model`` parameter, else the scenario's
    name, else ``"simpy-llm"``.

    >>> from simpy_llm import load_scenario
    >>> default_model_name(load_scenario("scenarios/quickstart.yaml"))
    'llama-3.1-8b-instruct'
    """
    latency = scenario.serving.groups()[0].latency_model
    model = latency.params.get("model") if latency is not None else None
    if isinstance(model, str) and model:
        return model
    return scenario.name or "simpy-llm"


def replay_scenario(scenario: Scenario, trace: str | Path) -> Scenario:
    """*scenario* with its workload replaced by a served trace (``EmulatedServer(trace=...)``):
    simulating it offline predicts every request the server answered.

    >>> from simpy_llm import load_scenario
    >>> s = replay_scenario(load_scenario("scenarios/quickstart.yaml"), "/runs/served")
    >>> s.workload.traces[0].path, s.workload.clients
    ('/runs/served', ())
    """
    return attrs.evolve(scenario, workload=WorkloadConfig(traces=(TraceSource(path=str(trace)),)))


@attrs.define(eq=False)
class _Pending:
    """A request in flight: the client-visible time of each token produced so far."""

    request: Request
    parsed: ParsedRequest
    finish_reason: str
    """``"length"`` when max_tokens set the output length, ``"stop"`` when it was drawn."""
    times_s: list[float] = attrs.field(factory=list)
    """Simulated time of token *i* (0-based), appended as the engine produces them."""
    changed: asyncio.Event = attrs.field(factory=asyncio.Event)
    """Set when a token is appended."""


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class EmulatedServer:
    """An OpenAI-compatible server answering with the simulator's timing.

    Parameters
    ----------
    scenario
        Its serving section is simulated (in ``event_per_step`` mode); its first client's
        ``output_distribution`` gives the output length of requests without ``max_tokens``.
    model
        Model name served (default: :func:`default_model_name`).
    host, port
        Where to listen (port 0: a free port, see :attr:`url` after :meth:`start`).
    trace
        Write every request as a trace v2 row (``<trace>.yaml`` + ``<trace>.csv``) when it
        completes, is dropped, or is still in flight at :meth:`stop`; replaying it with
        :func:`replay_scenario` predicts the served times.

    Use as ``async with EmulatedServer(scenario) as server: ... server.url ...``.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        model: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        trace: str | Path | None = None,
    ) -> None:
        batch_groups = [g.name for g in scenario.serving.groups() if g.batch_server is not None]
        if batch_groups:

            raise ScenarioError(
                scenario.name or "<scenario>",
                [("serving", f"the emulated server streams tokens from continuous-batching replicas; "
                             f"request-level batch servers ({', '.join(batch_groups)}) return whole responses")],
            )
        if scenario.serving.disaggregation is not None:

            raise ScenarioError(
                scenario.name or "<scenario>",
                [("serving.disaggregation", "the emulated server streams each request's tokens from one replica; "
                                            "serve the co-located fleet (remove serving.disaggregation)")],
            )
        self.scenario = attrs.evolve(scenario, simulation=attrs.evolve(scenario.simulation, mode="event_per_step"))
        self.model = model or default_model_name(scenario)
        self.host = host
        self.port = port
        self.trace_path = trace
        self.url = ""
        """``http://host:port`` once started."""
        self.served: list[ServedRequest] = []
        """Every request that completed, was dropped or was in flight at stop, in that order."""
        self.simulation: Simulation | None = None
        """The simulation being served (built by :meth:`start`)."""
        self.driver: RealtimeDriver | None = None
        self.max_model_len = 0
        """Longest prompt + output accepted, tokens (the replicas' limit; set by :meth:`start`)."""
        self._replicas: list[Replica] = []
        self._output: LengthDistribution | None = None
        self._pending: dict[int, _Pending] = {}
        self._runner: web.AppRunner | None = None
        self._writer: TraceV2Writer | None = None
        self._created = int(time.time())
        n = scenario.serving.num_replicas
        self.prompt_tokens_total = [0] * n
        self.generation_tokens_total = [0] * n
        self.finished_total: dict[str, int] = {"length": 0, "stop": 0}

    # --- lifecycle -------------------------------------------------------
    async def __aenter__(self) -> EmulatedServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> str:
        """Build the simulation, start its clock (simulated time 0 is now) and listen; returns :attr:`url`."""
        sim = self.simulation = Simulation(self.scenario, external_arrivals=True, token_listener=self._on_token)
        clients = self.scenario.workload.clients
        # The loader structures an output_distribution into a registered length distribution.
        self._output = cast("LengthDistribution", clients[0].output_distribution) if clients else None
        self._output_rng = sim.workload_streams.stream("emulate/output")
        # A token_listener makes Simulation build continuous-batching replicas alone (it
        # raises for batch servers, verify servers and a disaggregated fleet).
        self._replicas = cast("list[Replica]", sim.replicas)
        self.max_model_len = self._replicas[0].max_model_len
        if self.trace_path is not None:
            header = {"mode": "real", "server": self.description()}
            self._writer = TraceV2Writer(self.trace_path, header, extra_columns=TRACE_COLUMNS).open()
        self.driver = RealtimeDriver(sim.env, on_error=self._wake_all)
        self.driver.start()
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.port = port
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop listening (responses in progress are cut after :data:`SHUTDOWN_TIMEOUT_S`), stop
        the clock, and record the requests still in flight."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.driver is not None:
            self.driver.close()
        for p in sorted(self._pending.values(), key=lambda p: p.request.id):
            self._record(p, "in_flight", "server stopped before the request completed")
        self._pending.clear()
        if self._writer is not None:
            if self.driver is not None:
                self._writer.update_header({"emulator_timing": self.driver.timing()})
            self._writer.close()
            self._writer = None

    def app(self) -> web.Application:
        """The aiohttp application (routes and the error middleware)."""
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get(DESCRIPTION_PATH, self._description)
        return app

    def description(self) -> dict[str, Any]:
        """What this server is, as plain data (``GET /simpy_llm/server``; the ``server`` block of
        an observed trace and of the served trace):

        * ``type: emulated``, ``model`` (the name served), ``scenario`` (its name);
        * the engine settings a vLLM server would report, under vLLM's names
          (``max_num_seqs``, ``block_size``, ``max_model_len``, ``max_num_batched_tokens``,
          ``enable_prefix_caching``), each given when every replica group has the same
          value (``max_model_len`` as configured: null means the KV capacity);
        * ``replicas``, the whole ``serving`` section (as ``scenario_to_dict`` writes it),
          ``seed`` (the scenario's root seed) and ``simulation_mode`` (the mode the
          server runs, ``event_per_step``, whose records equal the fast mode's): with
          them a scenario rebuilds the serving system exactly.

        Examples
        --------
        >>> from simpy_llm import load_scenario
        >>> d = EmulatedServer(load_scenario("scenarios/quickstart.yaml")).description()
        >>> d["type"], d["model"], d["max_num_seqs"], d["block_size"], d["replicas"], d["simulation_mode"]
        ('emulated', 'llama-3.1-8b-instruct', 256, 16, 1, 'event_per_step')
        """
        return emulated_server_block(self.scenario, self.model)

    # --- the simulation side ------------------------------------------------
    def _wake_all(self, _exc: BaseException) -> None:
        """The simulation failed: wake every handler so it can answer with the error."""
        for p in self._pending.values():
            p.changed.set()

    def _failure(self) -> str:
        """Why the simulation stopped: a scenario distribution's bad draw as the command line
        reports it (:func:`~simpy_llm.workload.generator.sampling_scenario_error`), else the error."""
        error = self.driver.error if self.driver is not None else None
        if isinstance(error, SamplingError):
            return f"the simulation failed: {sampling_scenario_error(error, self.scenario)}"
        return f"the simulation failed: {error}"

    async def _next_token(self, p: _Pending, have: int) -> None:
        """Wait until *p* has more than *have* tokens; raises if the simulation failed."""
        driver = self.driver
        assert driver is not None
        while len(p.times_s) <= have:
            if driver.error is not None:
                raise RuntimeError(self._failure())
            p.changed.clear()
            await p.changed.wait()

    def _on_token(self, req: Request, tokens: int, visible_s: float) -> None:
        """The replicas' token listener (runs inside a simulation step)."""
        self.generation_tokens_total[req.replica] += 1
        p = self._pending.get(req.id)
        if p is None:
            return
        p.times_s.append(visible_s)
        p.changed.set()
        if tokens >= req.output_tokens:
            del self._pending[req.id]
            self.finished_total[p.finish_reason] += 1
            self._record(p, "completed")

    def _admit(self, parsed: ParsedRequest) -> _Pending:
        """Inject *parsed* into the simulation as a request arriving now; raises
        :class:`RequestError` if the simulation drops it."""
        sim = self.simulation
        driver = self.driver
        assert sim is not None and driver is not None
        if parsed.max_tokens is not None:
            output, finish = parsed.max_tokens, "length"
        elif self._output is not None:
            drawn = int(draw_tokens(self._output, self._output_rng, 1)[0])  # SamplingError: see _errors
            # A real server stops at the context limit when no max_tokens is given.
            output, finish = max(min(drawn, self.max_model_len - parsed.prompt_tokens), 1), "stop"
        else:
            raise RequestError(
                "max_tokens is required: the scenario has no client whose output distribution could be drawn from",
                param="max_tokens",
            )
        t = driver.arrival_time_s()
        req = Request(
            id=next(sim.ids),
            client_id=parsed.user or parsed.endpoint,
            prompt_tokens=parsed.prompt_tokens,
            output_tokens=output,
            arrival_s=t,
            streaming=parsed.stream,
        )
        p = self._pending[req.id] = _Pending(req, parsed, finish)
        sim.recorder.on_arrival(req, t)
        sim.arrivals.put(req)
        # Routing and the replica's length check happen at the arrival instant.
        driver.settle()
        if req.dropped_reason:
            del self._pending[req.id]
            self._record(p, "dropped", req.dropped_reason)
            total = req.prompt_tokens + req.output_tokens
            where = "messages" if parsed.endpoint == "chat" else "prompt"
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{total} tokens ({req.prompt_tokens} in the {where}, {req.output_tokens} in the completion). "
                f"Please reduce the length of the {where} or completion.",
                param=where,
                code="context_length_exceeded",
            )
        self.prompt_tokens_total[req.replica] += req.prompt_tokens
        return p

    def _record(self, p: _Pending, status: str, message: str = "") -> None:
        req = p.request
        done = status == "completed"
        first = p.times_s[0] if done else math.nan
        last = p.times_s[-1] if done else math.nan
        self.served.append(
            ServedRequest(
                request_id=req.id,
                endpoint=p.parsed.endpoint,
                client_id=req.client_id,
                streaming=req.streaming,
                prompt_tokens=req.prompt_tokens,
                output_tokens=req.output_tokens,
                arrival_s=req.arrival_s,
                first_token_s=first,
                completion_s=last,
                replica=req.replica,
                status=status,
                error_message=message,
            )
        )
        if self._writer is not None:
            self._writer.write_row(
                {
                    "request_id": req.id,
                    "client_id": req.client_id,
                    "streaming": req.streaming,
                    "input_tokens": req.prompt_tokens,
                    "output_tokens": req.output_tokens,
                    "arrival_time_us": us_from_s(req.arrival_s),
                    "first_chunk_time_us": us_from_s(first) if done else None,
                    "last_chunk_time_us": us_from_s(last) if done else None,
                    "status": "ok" if done else "error",
                    "error_message": message,
                    "endpoint": p.parsed.endpoint,
                    "replica": req.replica,
                }
            )

    # --- HTTP ------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """OpenAI-style JSON bodies for every error."""
        try:
            return await handler(request)
        except RequestError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except SamplingError as exc:
            # The scenario's distribution drew NaN or an infinity: the scenario is at fault, not
            # the request. Answer as the command line reports it, and go on serving.
            message = str(sampling_scenario_error(exc, self.scenario))
            _log.warning("%s %s: %s", request.method, request.path, message)
            return web.json_response(error_body(message, type="server_error", code="scenario_error"), status=500)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            what = "Invalid URL" if exc.status == 404 else exc.reason
            return web.json_response(error_body(f"{what} ({request.method} {request.path})"), status=exc.status)
        except Exception as exc:  # noqa: BLE001 - a JSON body for every failure
            _log.exception("error handling %s %s", request.method, request.path)
            return web.json_response(error_body(f"internal error: {exc}", type="internal_server_error"), status=500)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completions")

    async def _complete(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        driver = self.driver
        assert driver is not None
        if driver.error is not None:
            raise RuntimeError(self._failure())
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise RequestError(f"the request body is not valid JSON: {exc}") from None
        parsed = parse_request(body, endpoint)
        if parsed.model is not None and parsed.model != self.model:
            raise RequestError(f"The model `{parsed.model}` does not exist.", param="model", code="model_not_found", status=404)
        p = self._admit(parsed)
        if parsed.stream:
            return await self._stream(request, p)
        return await self._whole(p)

    async def _stream(self, request: web.Request, p: _Pending) -> web.StreamResponse:
        """Send each token when the wall clock reaches its time (tokens already due go in one write)."""
        driver = self.driver
        assert driver is not None
        req, parsed = p.request, p.parsed
        endpoint = parsed.endpoint
        n = req.output_tokens
        times = p.times_s
        rid = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{req.id}"
        created = int(time.time())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        sent = 0
        try:
            # Headers at once, as vLLM's server sends them when it accepts a stream.
            await resp.prepare(request)
            while sent < n:
                await self._next_token(p, sent)
                await driver.sleep_until(times[sent])
                now = driver.now_s()
                k = sent + 1
                while k < len(times) and times[k] <= now:
                    k += 1
                parts = []
                if sent == 0 and endpoint == "chat":
                    parts.append(chunk_bytes(stream_chunk(endpoint, rid, created, self.model, None, role=True)))
                for i in range(sent, k):
                    finish = p.finish_reason if i == n - 1 else None
                    chunk = stream_chunk(endpoint, rid, created, self.model, output_text(i, i + 1), finish_reason=finish)
                    parts.append(chunk_bytes(chunk))
                if k == n:
                    if parsed.include_usage:
                        parts.append(chunk_bytes(usage_chunk(endpoint, rid, created, self.model, req.prompt_tokens, n)))
                    parts.append(chunk_bytes("[DONE]"))
                await resp.write(b"".join(parts))
                sent = k
            await resp.write_eof()
        except ConnectionResetError:
            # The client left; the simulated request still runs to completion (no abort is modelled).
            pass
        except RuntimeError as exc:
            if not resp.prepared:
                raise
            err = error_body(str(exc), type="internal_server_error")
            await resp.write(chunk_bytes(err) + chunk_bytes("[DONE]"))
        return resp

    async def _whole(self, p: _Pending) -> web.Response:
        """The whole answer, sent at the simulated completion time."""
        driver = self.driver
        assert driver is not None
        req = p.request
        await self._next_token(p, req.output_tokens - 1)
        await driver.sleep_until(p.times_s[-1])
        endpoint = p.parsed.endpoint
        rid = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{req.id}"
        body = completion_body(
            endpoint, rid, int(time.time()), self.model, req.prompt_tokens, req.output_tokens, p.finish_reason
        )
        return web.json_response(body)

    async def _models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": self._created,
            "owned_by": "simpy-llm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _description(self, request: web.Request) -> web.Response:
        return web.json_response(self.description())

    async def _health(self, request: web.Request) -> web.Response:
        driver = self.driver
        if driver is None or driver.error is not None:
            return web.json_response(error_body("the simulation failed", type="internal_server_error"), status=500)
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        driver = self.driver
        if driver is not None and driver.error is None:
            driver.advance()  # the state as of now, not as of the last event
        return web.Response(text=self.metrics_text(), content_type="text/plain", charset="utf-8")

    def metrics_text(self) -> str:
        """The Prometheus text exposition: vLLM's metric names, one series per replica
        (label ``engine``, as vLLM labels data-parallel engines)."""
        sim = self.simulation
        assert sim is not None
        model = _label(self.model)
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, values: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in values:
                out.append(f'{name}{{model_name="{model}"{labels}}} {value}')

        per = [(f',engine="{r.index}"', r) for r in self._replicas]
        views = sim.views
        family("vllm:num_requests_running", "gauge", "Requests in the running batch.",
               [(lab, float(r.running_requests)) for lab, r in per])
        family("vllm:num_requests_waiting", "gauge", "Requests routed to the replica and not running yet.",
               [(lab, float(views[r.index].outstanding_requests - r.running_requests)) for lab, r in per])
        family("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = full).",
               [(lab, r.kv.used_blocks / r.kv.num_blocks) for lab, r in per])
        family("vllm:num_preemptions_total", "counter", "Preemptions so far.",
               [(lab, float(r.num_preemptions)) for lab, r in per])
        family("vllm:prompt_tokens_total", "counter", "Prompt tokens of the requests accepted.",
               [(lab, float(self.prompt_tokens_total[r.index])) for lab, r in per])
        family("vllm:generation_tokens_total", "counter", "Output tokens generated.",
               [(lab, float(self.generation_tokens_total[r.index])) for lab, r in per])
        family("vllm:request_success_total", "counter", "Requests completed, by finish reason.",
               [(f',finished_reason="{k}"', float(v)) for k, v in self.finished_total.items()])
        return "\n".join(out) + "\n"


async def serve_until_signalled(server: EmulatedServer, ready: Any = None) -> None:
    """Start *server*, call ``ready(url)``, serve until SIGINT or SIGTERM, then stop it cleanly."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        url = await server.start()
        if ready is not None:
            ready(url)
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await server.stop()
