"""Record the llama.cpp benchmark in this folder: a fit from two short runs, then the sweep it predicts (about 8 minutes).

Run from the repository root, with the ``real-server`` extra installed, on a machine that is
otherwise idle (other work on the cores shows up in the server's step times)::

    python -m tests.data.bench.record_benchmark [--out DIR]

One fresh llama.cpp server (``LlamaCppServer``: 8 slots of 2,048 tokens, 2 threads, prompt cache
off), loaded for a while first (as ``tests/data/calibration/record.py`` does), serves, one
after the other, ``simpy-llm bench run`` of synthetic prompts of 128 tokens asking 64 output
tokens (``--ignore-eos``), counted by the server's ``/tokenize``:

* ``llamacpp_bench/probe/``: ``simpy-llm calibrate probe`` (about a minute: each batch size of
  1 to 8 decoders on its own, which two short runs do not separate);
* ``llamacpp_bench/fit_synchronous/``: ``--profile synchronous``, 12 requests;
* ``llamacpp_bench/fit_rate/``: ``--profile constant`` at 1.5 times the synchronous run's
  request rate, 32 requests;
* ``llamacpp_bench/sweep/``: ``--profile sweep --rates 4``, 40 requests per run (the
  benchmark predicted).

Two threads and eight slots because a server gains from batching only so: on a 2-core AMD EPYC,
one thread decodes two or four sequences no faster than one after the other (13.5 ms a step
alone, 44.5 ms for two, 60 ms for four), which leaves a sweep no rate between the synchronous
one and saturation; two threads with eight slots decode eight sequences at 2.4 times the
synchronous token rate.

Then it fits the synchronous run with the probe's profile as priors
(``fit_synchronous/profile.yaml``) and the rate run with those as priors (``llamacpp_bench/profile.yaml``), as ``simpy-llm calibrate fit --priors``
does. The tests read the committed files; they never record.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
LENGTHS = ["--dataset", "synthetic", "--input-len", "128", "--output-len", "64", "--ignore-eos"]


def main() -> None:
    from simpy_llm.calibrate.fit import fit, write_profile
    from simpy_llm.cli import main as cli
    from simpy_llm.observe.llamacpp import LlamaCppConfig, LlamaCppServer
    from tests.data.calibration.record import _prewarm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: this folder)")
    # named relative to the working directory (the repository root), as the headers record them
    out = Path(os.path.relpath(parser.parse_args().out / "llamacpp_bench"))
    config = LlamaCppConfig(port=0, parallel=8, threads=2, cache_prompt=False)
    server_config = out / "server.yaml"
    out.mkdir(parents=True, exist_ok=True)
    with LlamaCppServer(config) as server:
        import yaml

        server_config.write_text(yaml.safe_dump({"server": config.server_block()}, sort_keys=False))
        common = ["--url", server.url, *LENGTHS, "--percentiles", "50,99", "--server-type", "llamacpp",
                  "--server-config", str(server_config)]
        _prewarm(server)
        assert cli(["calibrate", "probe", "--url", server.url, "--server-type", "llamacpp", "--server-config",
                    str(server_config), "--seed", "7", "--out", str(out / "probe")]) == 0
        assert cli(["bench", "run", *common, "--profile", "synchronous", "--num-prompts", "12", "--out", str(out / "fit_synchronous")]) == 0
        sync_rate = json.loads((out / "fit_synchronous" / "bench.json").read_text())["runs"][0]["request_throughput"]
        assert cli(["bench", "run", *common, "--profile", "constant", "--request-rate", f"{1.5 * sync_rate:.4f}",
                    "--num-prompts", "32", "--out", str(out / "fit_rate")]) == 0
        assert cli(["bench", "run", *common, "--profile", "sweep", "--rates", "4", "--num-prompts", "40", "--out", str(out / "sweep")]) == 0
    sync = fit(out / "fit_synchronous" / "rate_0", priors=out / "probe" / "profile.yaml")
    write_profile(sync, out / "fit_synchronous" / "profile.yaml")
    both = fit(out / "fit_rate" / "rate_0", priors=out / "fit_synchronous" / "profile.yaml")
    print(f"wrote {write_profile(both, out / 'profile.yaml')}")


if __name__ == "__main__":
    main()
