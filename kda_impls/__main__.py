"""`python -m kda_impls`: every registered implementation, whether it runs here, and its error on a
small case against the float64 reference."""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from . import ContractError, Unsupported, get, make_inputs, names, verify


def survey(device: str, state_dtype: torch.dtype) -> pd.DataFrame:
    shape = dict(B=4, H=2, HV=4, K=64, V=64)
    rows = []
    for name in names():
        row = {"impl": name}
        try:
            impl = get(name)
            row["supports"] = impl.capabilities.describe()
            inputs = make_inputs(**shape, state_dtype=state_dtype, slot_pad=16, pad_rows=1, device=device, seed=1)
            reason = impl.unsupported(inputs)
            if reason:
                row.update(status="unsupported", detail=reason)
            else:
                verdict = verify(impl, inputs)
                row.update(status="ok" if verdict.ok else "wrong", err_out=verdict.err_out,
                           err_state=verdict.err_state, detail="; ".join(verdict.problems))
        except (ContractError, Unsupported, ImportError, RuntimeError) as exc:
            row.update(status="error", detail=f"{type(exc).__name__}: {exc}")
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kda_impls", description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--state-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    table = survey(args.device, getattr(torch, args.state_dtype))
    print(f"KDA decode implementations on {args.device} (B=4, H=2, HV=4, K=V=64, slot_pad=16, one -1 row, "
          f"{args.state_dtype} state; error = ||x - ref|| / ||ref|| vs float64)")
    with pd.option_context("display.max_colwidth", 90, "display.width", 200, "display.float_format", "{:.1e}".format):
        print(table.to_string(index=False))


if __name__ == "__main__":
    main()
