"""Register this GPU box with asv and print its machine name (the only line on stdout).

asv has no GPU field, yet the GPU is what the timings depend on, so the GPU goes into the machine
name (``nvidia-h200``, plus ``--suffix`` to tell apart pools of one GPU model with different
clocks or power limits) and into ``arch`` with its compute capability, memory, CUDA runtime and
driver (on the H200: ``x86_64 NVIDIA H200 sm_90 140GiB CUDA 13.0 driver 580.159.04``). With
``KDA_ASV_IMPLS`` set, the implementation set joins the name (``nvidia-h200-fla+triton``): asv files
results per machine, so the results of one set never replace another's. ``asv machine --yes``
fills in the CPU, OS and RAM fields and writes ``~/.asv-machine.json``.

    MACHINE=$(python3 -m kda_impls.asv_machine)
    asv run -E existing --machine "$MACHINE" --set-commit-hash HEAD --record-samples
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys

import torch

from .bench.results import device_info


def gpu_description(index: int = 0) -> tuple[str, str]:
    """(machine name, arch field) for CUDA device ``index``, from the device record sweeps keep."""
    info = device_info(torch.device("cuda", index))
    name = re.sub(r"[^a-z0-9]+", "-", info["name"].lower()).strip("-")
    arch = [platform.machine(), info["name"], "sm_" + info["compute_capability"].replace(".", ""),
            f"{info['memory_bytes'] / 2**30:.0f}GiB", f"CUDA {info['cuda']}"]
    if info["driver"]:
        arch.append(f"driver {info['driver']}")
    return name, " ".join(arch)


def machine_name(gpu: str, suffix: str = "", impls: str = "") -> str:
    """The asv machine name: the GPU, the suffix, and the implementation set when KDA_ASV_IMPLS
    chooses one. asv files a commit's results per machine and replaces a benchmark's results
    whole, so a run of another set under the same name would drop the first set's numbers."""
    name = f"{gpu}-{suffix}" if suffix else gpu
    chosen = sorted({impl.strip() for impl in impls.split(",") if impl.strip()})
    return f"{name}-{'+'.join(chosen)}" if chosen else name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suffix", default="", help="appended to the GPU name: nvidia-h200-SUFFIX")
    parser.add_argument("--device", type=int, default=0, help="CUDA device the benchmarks run on")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("asv_machine: no CUDA GPU here; name a CPU box with `asv machine --machine NAME --yes`",
              file=sys.stderr)
        return 2
    gpu, arch = gpu_description(args.device)
    name = machine_name(gpu, args.suffix, os.environ.get("KDA_ASV_IMPLS", ""))
    # asv's own writer, so the file matches the installed asv; its chatter goes to stderr
    done = subprocess.run([sys.executable, "-m", "asv", "machine", "--machine", name, "--arch", arch, "--yes"],
                          capture_output=True, text=True)
    sys.stderr.write(done.stdout + done.stderr)
    if done.returncode:
        return done.returncode
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
