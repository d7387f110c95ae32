"""What the observed server is: the ``server``, ``hardware`` and ``network`` blocks of a trace header.

``simpy-llm observe --server-type TYPE --server-config FILE`` describes the server it
measured, so that a calibration can rebuild it in the simulator. :func:`describe_server`
writes three blocks:

``server``
    ``type`` (:data:`SERVER_TYPES`), ``model``, the type's own settings
    (:data:`SERVER_KEYS`), then ``discovered`` (the keys whose value was read from the
    server itself) and ``defaulted`` (keys neither read nor given, filled with the
    server's documented default, :data:`LLAMACPP_DEFAULTS`). Values given in the server
    config override discovered ones; keys the config adds beyond the type's are written
    as given. A type's key that is neither given, discovered nor documented is null.

    * ``llamacpp``: ``GET /props`` (``total_slots``: ``n_parallel``;
      ``default_generation_settings.n_ctx``: ``ctx_per_slot``, the context of one slot;
      ``model_alias``, else ``model_path``'s stem: ``model``), then ``GET /slots`` (one
      entry per slot, each with its ``n_ctx``) for what ``/props`` did not say;
      ``n_ctx`` is ``n_parallel x ctx_per_slot`` unless given.
    * ``emulated`` (``simpy-llm serve``): ``GET /simpy_llm/server``, the whole description
      (vLLM-style engine keys, ``replicas``, the ``serving`` section, ``seed``,
      ``simulation_mode``).
    * ``vllm``, ``sglang``: ``max_model_len`` from the model's card in ``GET /v1/models``
      when the server lists it (vLLM does); the rest from the config.
    * ``tgi`` (Hugging Face text-generation-inference): ``GET /info``, the router's
      settings (:func:`tgi_settings`): ``model_id`` (``model``),
      ``max_concurrent_requests``, ``max_input_tokens`` (``max_input_length`` before TGI
      2.0), ``max_total_tokens``, ``version``, and where that version reports them
      ``max_batch_total_tokens``, ``max_batch_size``, ``max_waiting_tokens`` and
      ``waiting_served_ratio``.
    * ``other``: the config's keys and the model.

``hardware``
    The config's ``hardware`` mapping; for a ``llamacpp`` or ``emulated`` server on a
    loopback address, the local machine first: ``cpu`` (its model name) and ``cores``
    (:func:`os.cpu_count`).

``network``
    ``measured_rtt_ms``: the median of :data:`RTT_PROBES` round trips of ``GET /health``
    (``GET /v1/models`` when ``/health`` does not answer 200), each on a new connection
    as the load generator makes them, measured just before the run; ``rtt_probe`` names
    the path (both null when neither answers); then the config's ``network`` keys.

A server that does not answer a discovery request is simply not described by it: the
run goes on, and the keys it would have given are left to the config and the defaults.
"""

from __future__ import annotations

import ipaddress
import math
import os
import platform
import reprlib
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import attrs

from simpy_llm.config.errors import ScenarioError

if TYPE_CHECKING:
    from simpy_llm.observe.client import OpenAIClient

__all__ = [
    "LLAMACPP_DEFAULTS",
    "RTT_PROBES",
    "SERVER_CONFIG_KEYS",
    "SERVER_KEYS",
    "SERVER_TYPES",
    "ServerConfig",
    "describe_server",
    "is_loopback",
    "load_server_config",
    "local_machine",
    "measure_rtt_ms",
    "resolve_server_type",
    "tgi_settings",
]

SERVER_TYPES = ("vllm", "sglang", "llamacpp", "emulated", "tgi", "other")
"""The values of ``--server-type``."""

SERVER_CONFIG_KEYS = ("server", "hardware", "network")
"""The top-level keys of a server config file (each a mapping, each optional)."""

_VLLM_KEYS = (
    "max_num_seqs",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "tensor_parallel",
    "gpu_memory_utilization",
    "quantization",
)
_LLAMACPP_KEYS = (
    "n_parallel", "ctx_per_slot", "n_ctx", "n_batch", "n_ubatch", "cache_prompt", "kv_unified", "cache_ram_mib", "threads"
)
_EMULATED_KEYS = ("max_num_seqs", "block_size", "max_model_len", "max_num_batched_tokens", "enable_prefix_caching")
_TGI_KEYS = (
    "max_concurrent_requests",
    "max_input_tokens",
    "max_total_tokens",
    "max_batch_total_tokens",
    "max_batch_prefill_tokens",
    "max_batch_size",
    "max_waiting_tokens",
    "waiting_served_ratio",
    "version",
)

SERVER_KEYS: dict[str, tuple[str, ...]] = {
    "vllm": _VLLM_KEYS,
    "sglang": _VLLM_KEYS,
    "llamacpp": _LLAMACPP_KEYS,
    "emulated": _EMULATED_KEYS,
    "tgi": _TGI_KEYS,
    "other": (),
}
"""The settings each server type's block always has (null when unknown), in order."""

LLAMACPP_DEFAULTS: dict[str, Any] = {"n_batch": 2048, "n_ubatch": 512, "cache_prompt": True, "cache_ram_mib": 8192}
"""llama.cpp's documented defaults (``--batch-size``, ``--ubatch-size``, ``cache_prompt``,
``--cache-ram``) for the keys its server does not report."""

RTT_PROBES = 5
"""Round trips whose median is ``network.measured_rtt_ms``."""

_POSITIVE_INTS = frozenset(
    ("n_parallel", "ctx_per_slot", "n_ctx", "n_batch", "n_ubatch", "threads", "max_num_seqs", "block_size",
     "max_model_len", "max_num_batched_tokens", "tensor_parallel", "replicas", "max_concurrent_requests",
     "max_input_tokens", "max_total_tokens", "max_batch_total_tokens", "max_batch_prefill_tokens", "max_batch_size",
     "max_waiting_tokens")
)
_BOOLS = frozenset(("cache_prompt", "kv_unified", "enable_prefix_caching"))
_WRITTEN_BY_OBSERVER = ("discovered", "defaulted")
_DESCRIPTION_PATH = "/simpy_llm/server"  # simpy_llm.observe.emulate.server.DESCRIPTION_PATH, without importing the server


@attrs.frozen(kw_only=True)
class ServerConfig:
    """A server config (``--server-config``): what the user says about the server.

    Build it with :func:`load_server_config`, which checks it.
    """

    server: dict[str, Any] = attrs.field(factory=dict)
    """Server settings (``type``, ``model``, the type's keys of :data:`SERVER_KEYS`, and any other key, written as given)."""
    hardware: dict[str, Any] = attrs.field(factory=dict)
    """Written as the header's ``hardware`` block (e.g. ``gpu``, ``gpu_count``, ``cpu``, ``cores``)."""
    network: dict[str, Any] = attrs.field(factory=dict)
    """Written into the header's ``network`` block (over the measured round trip)."""
    source: str = "<server config>"
    """The file it came from, for error messages."""


def load_server_config(config: str | os.PathLike[str] | Mapping[str, Any] | ServerConfig | None) -> ServerConfig:
    """The server config in the YAML file (or mapping) *config*: optional ``server``,
    ``hardware`` and ``network`` mappings of plain data.

    In ``server``, ``type`` must be one of :data:`SERVER_TYPES`; ``model`` and
    ``quantization`` are strings; slot, context, batch, thread and parallelism counts
    (``n_parallel``, ``max_num_seqs``, ...) whole numbers >= 1; ``cache_ram_mib`` a whole
    number >= 0; ``cache_prompt``, ``kv_unified`` and ``enable_prefix_caching`` true or false;
    ``gpu_memory_utilization`` a number in (0, 1]; each may be null (unknown).
    ``discovered`` and ``defaulted`` are the observer's to write. In ``network``,
    ``bandwidth_mbps`` (the client's, each way) and ``bytes_per_token`` are numbers > 0 and
    ``measured_rtt_ms`` a number >= 0 (a calibration adds the round trip and each prompt's
    and answer's transfer time to the simulated latencies).

    Raises
    ------
    ScenarioError
        Naming the file, each problem's key path and what is allowed.

    Examples
    --------
    >>> load_server_config({"server": {"type": "vllm", "max_num_seqs": 64}, "hardware": {"gpu": "H100"}}).server
    {'type': 'vllm', 'max_num_seqs': 64}
    >>> load_server_config({"servers": {}})
    Traceback (most recent call last):
    ...
    simpy_llm.config.errors.ScenarioError: <server config>: 1 problem(s) in server config
      servers: unknown key; allowed: server, hardware, network
    """
    if config is None:
        return ServerConfig()
    if isinstance(config, ServerConfig):
        return config
    if isinstance(config, Mapping):
        source, data = "<server config>", config
    else:
        import yaml

        source = str(config)
        try:
            data = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ScenarioError(source, [("", f"cannot read file: {exc.strerror}")], "server config") from None
        except yaml.YAMLError as exc:
            raise ScenarioError(source, [("", f"not valid YAML: {getattr(exc, 'problem', exc)}")], "server config") from None
        if data is None:
            data = {}
    if not isinstance(data, Mapping):
        raise ScenarioError(
            source, [("", f"must be a mapping with keys {', '.join(SERVER_CONFIG_KEYS)}; got {type(data).__name__}")], "server config"
        )
    problems: list[tuple[str, str]] = []
    blocks: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key not in SERVER_CONFIG_KEYS:
            problems.append((str(key), f"unknown key; allowed: {', '.join(SERVER_CONFIG_KEYS)}"))
        elif value is None:
            blocks[key] = {}
        elif not isinstance(value, Mapping):
            problems.append((key, f"must be a mapping, got {reprlib.repr(value)}"))
        else:
            problems += _plain_problems(value, key)
            blocks[key] = dict(value)
    for key, value in blocks.get("server", {}).items():
        message = _server_value_problem(str(key), value)
        if message:
            problems.append((f"server.{key}", message))
    reported = {path for path, _ in problems}
    for key, value in blocks.get("network", {}).items():
        message = "" if f"network.{key}" in reported else _network_value_problem(str(key), value)
        if message:
            problems.append((f"network.{key}", message))
    if problems:
        raise ScenarioError(source, problems, "server config")
    return ServerConfig(source=source, **blocks)


def _plain_problems(value: Any, path: str) -> list[tuple[str, str]]:
    """Problems of values that a YAML header cannot hold (only plain data may go in)."""
    if isinstance(value, Mapping):
        out = []
        for k, v in value.items():
            if not isinstance(k, str):
                out.append((f"{path}[{k!r}]", "keys must be strings"))
            else:
                out += _plain_problems(v, f"{path}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _plain_problems(v, f"{path}[{i}]")]
    if value is None or isinstance(value, (str, bool, int)):
        return []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(path, f"must be a finite number, got {value!r}")]
    return [(path, f"must be plain data (string, number, true/false, list or mapping), got {type(value).__name__}")]


def _server_value_problem(key: str, value: Any) -> str:
    """What is wrong with *value* for the server key *key* ('' when nothing is)."""
    if key in _WRITTEN_BY_OBSERVER:
        return "is written by the observer (the keys read from the server / filled with defaults), not given"
    if value is None:
        return ""
    if key == "type":
        return "" if value in SERVER_TYPES else f"must be one of {', '.join(SERVER_TYPES)}, got {reprlib.repr(value)}"
    if key in ("model", "quantization", "version"):
        return "" if isinstance(value, str) else f"must be a string, got {reprlib.repr(value)}"
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in _POSITIVE_INTS:
        return "" if is_int and value >= 1 else f"must be a whole number >= 1, got {reprlib.repr(value)}"
    if key == "cache_ram_mib":
        return "" if is_int and value >= 0 else f"must be a whole number >= 0, got {reprlib.repr(value)}"
    if key in _BOOLS:
        return "" if isinstance(value, bool) else f"must be true or false, got {reprlib.repr(value)}"
    if key == "waiting_served_ratio":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        return "" if ok else f"must be a number > 0, got {reprlib.repr(value)}"
    if key == "gpu_memory_utilization":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
        return "" if ok else f"must be a number in (0, 1], got {reprlib.repr(value)}"
    return ""


_NETWORK_NUMBERS = {
    "measured_rtt_ms": ("a number >= 0 (milliseconds)", True),
    "bandwidth_mbps": ("a number > 0 (megabits per second, each way)", False),
    "bytes_per_token": ("a number > 0 (bytes of a token on the wire)", False),
}
"""The network keys a calibration reads (each may be null): the round trip, and the client's
bandwidth and bytes per token, which add each prompt's and answer's transfer time."""


def _network_value_problem(key: str, value: Any) -> str:
    """What is wrong with *value* for the network key *key* ('' when nothing is)."""
    if key not in _NETWORK_NUMBERS or value is None:
        return ""
    allowed, zero_ok = _NETWORK_NUMBERS[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if number and (value >= 0 if zero_ok else value > 0):
        return ""
    return f"must be {allowed} or null, got {reprlib.repr(value)}"


def resolve_server_type(server_type: str | None, config: ServerConfig) -> str:
    """The server type: *server_type* (``--server-type``), else the config's ``server.type``,
    else ``other``; the two must agree when both are given.

    >>> resolve_server_type(None, ServerConfig(server={"type": "vllm"})), resolve_server_type(None, ServerConfig())
    ('vllm', 'other')
    """
    if server_type is not None and server_type not in SERVER_TYPES:
        raise ValueError(f"server_type must be one of {', '.join(SERVER_TYPES)}, got {server_type!r}")
    given = config.server.get("type")
    if server_type is not None and given is not None and given != server_type:
        raise ScenarioError(config.source, [("server.type", f"is {given!r}, but the server type given is {server_type!r}")], "server config")
    return server_type or given or "other"


def is_loopback(url: str) -> bool:
    """Whether *url*'s host is this machine (a loopback address or ``localhost``).

    >>> is_loopback("http://127.0.0.1:8080"), is_loopback("http://[::1]:80"), is_loopback("http://10.0.0.2")
    (True, True, False)
    """
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_machine() -> dict[str, Any]:
    """The local machine as a ``hardware`` block: ``cpu`` (the processor's model name) and
    ``cores`` (logical CPUs, :func:`os.cpu_count`)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu or platform.processor() or platform.machine(), "cores": os.cpu_count()}


async def _get_json(client: OpenAIClient, path: str) -> Any:
    """The JSON body of ``GET path`` when it answers 200, else None (a server that does not
    answer a discovery request is not described by it)."""
    try:
        async with client.session.get(client.base_url + path, timeout=aiohttp.ClientTimeout(total=10.0)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


async def _discover_llamacpp(client: OpenAIClient) -> dict[str, Any]:
    """What llama.cpp's ``/props`` and ``/slots`` say (see the module docstring)."""
    found: dict[str, Any] = {}
    props = await _get_json(client, "/props")
    if isinstance(props, Mapping):
        if (slots := _positive_int(props.get("total_slots"))) is not None:
            found["n_parallel"] = slots
        settings = props.get("default_generation_settings")
        if isinstance(settings, Mapping):
            if (n_ctx := _positive_int(settings.get("n_ctx"))) is not None:
                found["ctx_per_slot"] = n_ctx
            params = settings.get("params")
            if isinstance(params, Mapping) and isinstance(params.get("cache_prompt"), bool):
                found["cache_prompt"] = params["cache_prompt"]
        alias = props.get("model_alias")
        if isinstance(alias, list) and alias and isinstance(alias[0], str):
            alias = alias[0]
        if isinstance(alias, str) and alias:
            found["model"] = alias
        elif isinstance(props.get("model_path"), str) and props["model_path"]:
            found["model"] = Path(props["model_path"]).stem
    slots_list = await _get_json(client, "/slots")
    if isinstance(slots_list, list) and slots_list and all(isinstance(s, Mapping) for s in slots_list):
        found.setdefault("n_parallel", len(slots_list))
        if (n_ctx := _positive_int(slots_list[0].get("n_ctx"))) is not None:
            found.setdefault("ctx_per_slot", n_ctx)
    if "n_parallel" in found and "ctx_per_slot" in found:
        found["n_ctx"] = found["n_parallel"] * found["ctx_per_slot"]
    return found


async def _discover_emulated(client: OpenAIClient) -> dict[str, Any]:
    """The emulated server's own description (``GET /simpy_llm/server``)."""
    desc = await _get_json(client, _DESCRIPTION_PATH)
    if not isinstance(desc, Mapping) or desc.get("type") != "emulated":
        return {}
    return {str(k): v for k, v in desc.items() if k != "type"}


_TGI_INFO_KEYS = {
    "max_concurrent_requests": "max_concurrent_requests",
    "max_input_tokens": "max_input_tokens",
    "max_input_length": "max_input_tokens",  # its name before TGI 2.0
    "max_total_tokens": "max_total_tokens",
    "max_batch_total_tokens": "max_batch_total_tokens",
    "max_batch_size": "max_batch_size",
    "max_waiting_tokens": "max_waiting_tokens",
}
"""``/info`` fields (whole numbers >= 1) and the ``server`` key each gives."""


def tgi_settings(info: Any) -> dict[str, Any]:
    """The ``server`` keys that a TGI router's ``GET /info`` body *info* gives (see the module
    docstring); fields it lacks, or of the wrong kind, give nothing.

    >>> tgi_settings({"model_id": "org/tiny", "max_concurrent_requests": 128, "max_input_tokens": 1024,
    ...               "max_total_tokens": 2048, "max_batch_size": None, "version": "3.0.1"})
    {'model': 'org/tiny', 'max_concurrent_requests': 128, 'max_input_tokens': 1024, 'max_total_tokens': 2048, 'version': '3.0.1'}
    """
    if not isinstance(info, Mapping):
        return {}
    found: dict[str, Any] = {}
    if isinstance(info.get("model_id"), str) and info["model_id"]:
        found["model"] = info["model_id"]
    for field, key in _TGI_INFO_KEYS.items():
        if key not in found and (value := _positive_int(info.get(field))) is not None:
            found[key] = value
    ratio = info.get("waiting_served_ratio")
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio) and ratio > 0:
        found["waiting_served_ratio"] = float(ratio)
    if isinstance(info.get("version"), str) and info["version"]:
        found["version"] = info["version"]
    return found


async def _discover_max_model_len(client: OpenAIClient, model: str) -> dict[str, Any]:
    """``max_model_len`` of *model*'s card in ``/v1/models`` (vLLM lists it)."""
    listing = await _get_json(client, "/v1/models")
    cards = listing.get("data") if isinstance(listing, Mapping) else None
    if not isinstance(cards, list):
        return {}
    cards = [c for c in cards if isinstance(c, Mapping)]
    card = next((c for c in cards if c.get("id") == model), cards[0] if cards else None)
    if card is not None and (length := _positive_int(card.get("max_model_len"))) is not None:
        return {"max_model_len": length}
    return {}


async def measure_rtt_ms(client: OpenAIClient, probes: int = RTT_PROBES) -> tuple[float | None, str | None]:
    """Median round trip in milliseconds of *probes* ``GET /health`` requests (``GET /v1/models``
    when ``/health`` does not answer 200), each on a new connection (the client's session
    opens one per request), and the path used; ``(None, None)`` when neither answers.

    A round trip is from sending the request (connecting included) to the end of the
    answer's body: what a request of the run pays before the server sees it and after it
    answers, plus the server's handling of a trivial request.
    """
    for path in ("/health", "/v1/models"):
        times: list[float] = []
        for _ in range(probes):
            t0 = time.perf_counter()
            try:
                async with client.session.get(client.base_url + path, timeout=aiohttp.ClientTimeout(total=10.0)) as resp:
                    await resp.read()
                    if resp.status != 200:
                        break
            except (TimeoutError, aiohttp.ClientError):
                break
            times.append(time.perf_counter() - t0)
        if times and len(times) == probes:
            return statistics.median(times) * 1e3, path
    return None, None


async def describe_server(
    client: OpenAIClient,
    *,
    server_type: str,
    config: ServerConfig,
    model: str,
    model_discovered: bool,
    rtt_probes: int = RTT_PROBES,
) -> dict[str, dict[str, Any]]:
    """The header's ``server``, ``hardware`` and ``network`` blocks for the server *client*
    talks to (see the module docstring).

    Parameters
    ----------
    client
        An open client of the server.
    server_type
        One of :data:`SERVER_TYPES`.
    config
        What the user says (:func:`load_server_config`); its values win.
    model
        The model the run requests.
    model_discovered
        Whether *model* was read from the server (``/v1/models``) rather than given.
    rtt_probes
        Round trips for ``network.measured_rtt_ms``.
    """
    if server_type not in SERVER_TYPES:
        raise ValueError(f"server_type must be one of {', '.join(SERVER_TYPES)}, got {server_type!r}")
    found: dict[str, Any] = {}
    if server_type == "llamacpp":
        found = await _discover_llamacpp(client)
    elif server_type == "emulated":
        found = await _discover_emulated(client)
    elif server_type in ("vllm", "sglang"):
        found = await _discover_max_model_len(client, model)
    elif server_type == "tgi":
        found = tgi_settings(await _get_json(client, "/info"))
    if "model" not in found and model_discovered:
        found["model"] = model
    given = {k: v for k, v in config.server.items() if k != "type"}
    keys = ["model", *SERVER_KEYS[server_type]]
    keys += [k for k in found if k not in keys] + [k for k in given if k not in keys and k not in found]
    server: dict[str, Any] = {"type": server_type}
    discovered: list[str] = []
    defaulted: list[str] = []
    for key in keys:
        if key in given:
            server[key] = given[key]
        elif key in found:
            server[key] = found[key]
            discovered.append(key)
        elif key == "model":
            server[key] = model
        elif server_type == "llamacpp" and key in LLAMACPP_DEFAULTS:
            server[key] = LLAMACPP_DEFAULTS[key]
            defaulted.append(key)
        else:
            server[key] = None
    if server_type == "llamacpp" and server.get("n_ctx") is None and server["n_parallel"] and server["ctx_per_slot"]:
        server["n_ctx"] = server["n_parallel"] * server["ctx_per_slot"]
    server["discovered"] = discovered
    server["defaulted"] = defaulted
    hardware: dict[str, Any] = local_machine() if server_type in ("llamacpp", "emulated") and is_loopback(client.base_url) else {}
    hardware.update(config.hardware)
    rtt_ms, probe = await measure_rtt_ms(client, rtt_probes)
    network: dict[str, Any] = {"measured_rtt_ms": None if rtt_ms is None else round(rtt_ms, 4), "rtt_probe": probe}
    network.update(config.network)
    return {"server": server, "hardware": hardware, "network": network}
