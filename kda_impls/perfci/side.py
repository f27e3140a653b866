"""One side's worker for ``kda-ab``: run with the side's tree first on sys.path (PYTHONPATH), it
imports that tree's harness and measures each case the driver sends through the tree's
``kda_impls.bench.run_case``, the one function that checks and times a case. Only stable public
pieces of the side's tree are used (``run_case``, ``Config``, ``PoolLayout``, ``Method``,
``Budget``, ``registry.names``), so that a revision's own harness measures it.

Protocol: JSON lines. The worker's first line is its hello (the tree it imported, the names it
registers, the fields its Config and Method take); then, per request line ``{"config", "method",
"copy_bw"}``, one line ``{"row", "describe"}``; an empty line or the end of input ends it. The lines
travel on the stdout the worker was started with; anything printed by a library goes to stderr.

Run as ``python path/to/side.py DEVICE`` (not as a module: the driver's package must not be the one
imported).
"""

import dataclasses
import json
import os
import signal
import sys
import time


def _plain(value):
    return value.item() if hasattr(value, "item") else str(value)


def _send(channel, message: dict) -> None:
    channel.write(json.dumps(message, default=_plain) + "\n")
    channel.flush()


def _context_lost(torch, device) -> bool:
    """Whether the CUDA context is unusable (after an illegal memory access every call fails)."""
    if device.type != "cuda":
        return False
    try:
        torch.ones(1, device=device).item()
    except RuntimeError:
        return True
    return False


def _describe(registry, impl: str) -> dict:
    """What the tree says of ``impl``: its versions, and the fingerprint the tree's sweeps record."""
    try:
        from kda_impls.bench.driver import fingerprint

        described = {"fingerprint": fingerprint(impl)}
    except Exception as exc:  # a tree without it, or a library that does not import: the rows say why
        described = {"fingerprint": None, "error": f"{type(exc).__name__}: {exc}"}
    try:
        described["versions"] = registry.get(impl).versions()
    except Exception as exc:
        described["error"] = f"{type(exc).__name__}: {exc}"
    return described


def serve(device_name: str, channel) -> None:
    import torch

    from kda_impls import registry
    from kda_impls.bench import Budget, Config, Method, PoolLayout, run_case

    device = torch.device(device_name)
    if device.type == "cpu":
        torch.set_num_threads(1)  # CPU timings only smoke-test; spare threads spin against each other
    else:
        torch.cuda.set_device(device)
    torch.empty(0, device=device)  # the CUDA context, before anything is timed
    import kda_impls

    _send(channel, {"tree": os.path.dirname(os.path.dirname(kda_impls.__file__)), "impls": registry.names(),
                    "config_fields": [f.name for f in dataclasses.fields(Config)],
                    "method_fields": [f.name for f in dataclasses.fields(Method)]})
    described = set()
    while (line := sys.stdin.readline()).strip():
        request = json.loads(line)
        fields = dict(request["config"])
        cfg = Config(**{k: v for k, v in fields.items() if k != "layout"}, layout=PoolLayout(**fields["layout"]))
        settings = dict(request["method"])
        kernel, call = Budget(**settings.pop("kernel")), settings.pop("call")
        method = Method(kernel=kernel, call=call and Budget(**call), **settings)
        row = run_case(cfg, device, method, copy_bw=request["copy_bw"]) | {"device": str(device)}
        describe = None if cfg.impl in described else _describe(registry, cfg.impl)
        described.add(cfg.impl)
        if row["status"] == "error" and _context_lost(torch, device):
            _send(channel, {"row": row | {"status": "crashed", "reason": f"CUDA context lost: {row['reason']}"},
                            "describe": describe})
            return
        if device.type == "cuda":  # what the row left cached, handed back: the other side's rows get the memory
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            time.sleep(method.settle_s)
        _send(channel, {"row": row, "describe": describe})


if __name__ == "__main__":
    # Ctrl-C and a time limit's SIGTERM reach the whole process group: the driver stops this worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.path.pop(0)  # this file's directory: the side's tree alone supplies kda_impls
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what libraries print joins stderr, off the protocol's channel
    serve(sys.argv[1], protocol)
