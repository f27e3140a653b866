"""`kda-survey` (`python -m kda_impls`): every registered implementation in each mode (in-place decode,
frozen verify, replay on a ring of RING records), whether it runs here or why not, and its error on a
small case against the float64 reference, through the harness's case runner (the statuses of a sweep)."""

from __future__ import annotations

import pandas as pd

from .bench.case import run_case
from .bench.config import MODES, Config
from .cli import Parser, devices, dtype
from .registry import extra_impls, get, interpret_triton_on, names

SHAPE = dict(B=4, H=2, HV=4, K=64, V=64, pad_rows=1)
SLOT_PAD = 16
RING = 4  # a replay row's records per slot


def survey(device: str, state_dtype: str) -> pd.DataFrame:
    rows = []
    for name in names():
        try:
            supports = get(name).capabilities.describe()
        except Exception as exc:  # an implementation that does not import: run_case said why
            supports = f"({type(exc).__name__})"
        for mode in MODES:
            row = run_case(Config(name, **SHAPE, state_dtype=state_dtype, slot_pad=SLOT_PAD, mode=mode,
                                  ring=RING if mode == "replay" else 0), device)
            rows.append({"impl": name, "mode": mode, "supports": supports, "status": row["status"],
                         "err_out": row["err_out"], "err_state": row["err_state"], "detail": row["reason"]})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = Parser(prog="kda-survey", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=devices, default="all", help="cpu, cuda or cuda:N (default: the first "
                        "GPU when one is visible, else cpu)")
    parser.add_argument("--state-dtype", type=dtype, default="bfloat16", metavar="DTYPE",
                        help="bf16, fp16, fp32 (or torch's names; default bf16)")
    args = parser.parse_args(argv)
    args.device = args.device[0]  # "all": the first of them
    try:
        extra_impls()
    except ValueError as exc:
        parser.error(f"{exc}; set it to name=module:Class[,name=module:Class] or unset it")
    interpret_triton_on(args.device)
    table = survey(args.device, args.state_dtype)
    print(f"KDA decode implementations on {args.device} (B={SHAPE['B']}, H={SHAPE['H']}, HV={SHAPE['HV']}, "
          f"K=V={SHAPE['K']}, slot_pad={SLOT_PAD}, one -1 row, {args.state_dtype} state; "
          f"error = ||x - ref|| / ||ref|| vs float64)")
    with pd.option_context("display.max_colwidth", 90, "display.width", 200, "display.float_format", "{:.1e}".format):
        print(table.to_string(index=False))


if __name__ == "__main__":
    main()
