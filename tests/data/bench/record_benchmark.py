"""Record the llama.cpp benchmark in this folder: a fit from two short runs, then the sweep it predicts (about 8 minutes).

Run from the repository root, with the ``real-server`` extra installed, on a machine that is
otherwise idle (other work on the cores shows up in the server's step times)::

    python -m tests.data.bench.record_benchmark [--out DIR]

One fresh llama.cpp server (``LlamaCppServer``: 4 slots of 2,048 tokens, 1 thread, prompt cache
off), loaded for a while first (as ``tests/data/calibration/record.py`` does), serves, one
after the other, ``simpy-llm bench run`` of synthetic prompts of 128 tokens asking 32 output
tokens (``--ignore-eos``), counted by the server's ``/tokenize``:

* ``llamacpp_bench/fit_synchronous/``: ``--profile synchronous``, 8 requests;
* ``llamacpp_bench/fit_rate/``: ``--profile constant`` at 1.5 times the synchronous run's
  request rate, 24 requests;
* ``llamacpp_bench/sweep/``: ``--profile sweep --rates 4``, 20 requests per run (the
  benchmark predicted).

Then it fits the synchronous run (``fit_synchronous/profile.yaml``) and the rate run with
those as priors (``llamacpp_bench/profile.yaml``), as ``simpy-llm calibrate fit --priors``
does. The tests read the committed files; they never record.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
LENGTHS = ["--dataset", "synthetic", "--input-len", "128", "--output-len", "32", "--ignore-eos"]


def main() -> None:
    from simpy_llm.calibrate.fit import fit, write_profile
    from simpy_llm.cli import main as cli
    from simpy_llm.observe.llamacpp import LlamaCppConfig, LlamaCppServer
    from tests.data.calibration.record import _prewarm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: this folder)")
    # named relative to the working directory (the repository root), as the headers record them
    out = Path(os.path.relpath(parser.parse_args().out / "llamacpp_bench"))
    config = LlamaCppConfig(port=0, parallel=4, threads=1, cache_prompt=False)
    server_config = out / "server.yaml"
    out.mkdir(parents=True, exist_ok=True)
    with LlamaCppServer(config) as server:
        import yaml

        server_config.write_text(yaml.safe_dump({"server": config.server_block()}, sort_keys=False))
        common = ["--url", server.url, *LENGTHS, "--percentiles", "50,99", "--server-type", "llamacpp",
                  "--server-config", str(server_config)]
        _prewarm(server)
        assert cli(["bench", "run", *common, "--profile", "synchronous", "--num-prompts", "8", "--out", str(out / "fit_synchronous")]) == 0
        sync_rate = json.loads((out / "fit_synchronous" / "bench.json").read_text())["runs"][0]["request_throughput"]
        assert cli(["bench", "run", *common, "--profile", "constant", "--request-rate", f"{1.5 * sync_rate:.4f}",
                    "--num-prompts", "24", "--out", str(out / "fit_rate")]) == 0
        assert cli(["bench", "run", *common, "--profile", "sweep", "--rates", "4", "--num-prompts", "20", "--out", str(out / "sweep")]) == 0
    sync = fit(out / "fit_synchronous" / "rate_0")
    write_profile(sync, out / "fit_synchronous" / "profile.yaml")
    both = fit(out / "fit_rate" / "rate_0", priors=out / "fit_synchronous" / "profile.yaml")
    print(f"wrote {write_profile(both, out / 'profile.yaml')}")


if __name__ == "__main__":
    main()
