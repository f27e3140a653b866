"""One test per contract rule: the error type, the rule, a message naming expected and got, and
nothing modified (the pool bit for bit, every other input)."""

import re

import pytest
import torch

from helpers import expect_refusal
from kda_impls import Capabilities, ContractError, Unsupported, get, make_inputs
from kda_impls.impls.naive import NaiveTorch


class Strict(NaiveTorch):
    """The naive math behind restrictive capabilities, like a fixed-layout kernel's."""

    name = "strict"
    capabilities = Capabilities(devices=("cpu",), state_dtypes=(torch.bfloat16,), k_values=(16, 32),
                                v_values=(16, 32), k_equals_v=True, gva=False, slot_stride_multiple=16,
                                base_alignment=32)


def inputs(**kw):
    shape = dict(B=4, H=2, HV=2, K=16, V=16)
    shape.update({k: kw.pop(k) for k in list(kw) if k in shape})
    return make_inputs(**shape, slot_pad=kw.pop("slot_pad", 16), pad_rows=kw.pop("pad_rows", 1), seed=7, **kw)


def test_valid_inputs_pass():
    get("naive").check(inputs())
    Strict().check(inputs())


@pytest.mark.parametrize("name, want", [
    ("q", r"3-D \[B, H, K\]"), ("k", r"3-D \[B, H, K\]"), ("v", r"3-D \[B, HV, V\]"), ("a", r"3-D \[B, HV, K\]"),
    ("b", r"2-D \[B, HV\]"), ("state", r"4-D \[N, HV, V, K\]"),
])
def test_rank(name, want):
    x = inputs(slot_pad=0)
    t = getattr(x, name)
    setattr(x, name, t[0].contiguous())
    got = re.escape(str(tuple(t.shape[1:])))
    expect_refusal(get("naive"), x, "rank", rf"^naive {name} must be {want}; got shape {got}$")


@pytest.mark.parametrize("name, mutate, pattern", [
    ("k", lambda t: t[:, :1].contiguous(), r"k shape must be \(4, 2, 16\).*got \(4, 1, 16\)"),
    ("v", lambda t: t[:3].contiguous(), r"v shape must be \(4, 2, 16\).*got \(3, 2, 16\)"),
    ("a", lambda t: t[..., :8].contiguous(), r"a shape must be \(4, 2, 16\).*got \(4, 2, 8\)"),
    ("b", lambda t: t[:, :1].contiguous(), r"b shape must be \(4, 2\).*got \(4, 1\)"),
    ("A_log", lambda t: t[:1].contiguous(), r"A_log shape must be \(2,\).*got \(1,\)"),
    ("slots", lambda t: t[:3].contiguous(), r"slots shape must be \(4,\).*got \(3,\)"),
    ("dt_bias", lambda t: t[:, :8].contiguous(),
     r"dt_bias shape must be \[HV, K\]=\(2, 16\) or \[HV\*K\]=\(32,\); got \(2, 8\)"),
])
def test_shapes_must_agree(name, mutate, pattern):
    x = inputs()
    setattr(x, name, mutate(getattr(x, name)))
    expect_refusal(get("naive"), x, "shape", pattern)


def test_flat_dt_bias_accepted():
    """dt_bias may come as [HV*K], as models store it."""
    from kda_impls import verify

    x = inputs(K=16, HV=4)
    x.dt_bias = x.dt_bias.reshape(-1).contiguous()
    assert x.dt_bias.shape == (4 * 16,)
    verdict = verify(get("naive"), x)
    assert verdict.ok, verdict


def test_state_shape_must_agree():
    x = inputs(slot_pad=0)
    x.state = x.state[:, :, :8]
    expect_refusal(get("naive"), x, "shape", r"state shape must be \(8, 2, 16, 16\).*got \(8, 2, 8, 16\)")


def test_hv_multiple_of_h():
    x = make_inputs(2, 1, 3, 16, 16, seed=1)  # make_inputs refuses HV % H itself: two q/k heads put in after
    x.q, x.k = (torch.cat([t, t], dim=-2) for t in (x.q, x.k))
    expect_refusal(get("naive"), x, "gva", r"HV must be a multiple of H; got HV=3, H=2")


def test_activation_dtypes_must_match():
    x = inputs()
    x.k = x.k.float()
    expect_refusal(get("naive"), x, "dtype", r"k dtype must match q's bfloat16; got float32")


def test_activation_dtype_must_be_floating():
    x = inputs()
    for name in ("q", "k", "v", "a", "b"):
        setattr(x, name, getattr(x, name).to(torch.float64))
    expect_refusal(get("naive"), x, "dtype", r"q dtype must be one of bf16/fp16/fp32; got float64")


@pytest.mark.parametrize("name", ["A_log", "dt_bias"])
def test_gate_parameters_fp32(name):
    x = inputs()
    setattr(x, name, getattr(x, name).bfloat16())
    expect_refusal(get("naive"), x, "dtype", rf"{name} dtype must be float32; got bfloat16")


def test_slots_int32():
    x = inputs()
    x.slots = x.slots.long()
    expect_refusal(get("naive"), x, "slots", r"slots dtype must be int32; got int64")


def test_devices_must_match():
    x = inputs()
    x.b = torch.empty(x.b.shape, dtype=x.b.dtype, device="meta")
    expect_refusal(get("naive"), x, "device", r"b must be on the state's device cpu; got meta")


def test_inputs_contiguous():
    x = inputs()
    x.v = x.v.transpose(0, 1).contiguous().transpose(0, 1)
    expect_refusal(get("naive"), x, "contiguous", r"v must be contiguous; got strides")


def test_state_inner_strides_compact():
    x = make_inputs(2, 1, 2, 128, 128, slot_pad=0, seed=2)
    x.state = x.state.transpose(2, 3)  # V and K swapped: a [N, HV, K, V] pool passed as [N, HV, V, K]
    expect_refusal(get("naive"), x, "state-inner-strides",
                   r"^naive state inner strides must be compact \(V\*K, K, 1\)=\(16384, 128, 1\); "
                   r"got \(16384, 1, 128\) \(only the slot stride may be non-compact\)$")


def padded_pool(x, row_pad=0, head_pad=0):
    """``x``'s pool copied into a buffer whose V rows (``row_pad``) or heads (``head_pad``) carry
    padding, a layout some serving engines allocate: the last stride is still 1."""
    N, HV, V, K = x.state.shape
    row = K + row_pad
    head = V * row + head_pad
    strides = (HV * head, head, row, 1)
    buffer = torch.zeros(N * HV * head, dtype=x.state.dtype)
    state = buffer.as_strided((N, HV, V, K), strides)
    state.copy_(x.state)
    return state


@pytest.mark.parametrize("row_pad, head_pad, got", [
    (8, 0, r"\(6144, 24, 1\)"),  # padded V rows: (HV*V*(K+8), V*(K+8), K+8, 1), the layout
    (0, 8, r"\(4104, 16, 1\)"),  # padded heads
    (8, 8, r"\(6152, 24, 1\)"),
])
def test_state_inner_strides_padded(row_pad, head_pad, got):
    """Only the slot stride may carry padding: a rule weakened to "last stride is 1" accepts these,
    and the Triton kernel, which assumes compact [V, K] blocks, then decodes them wrong."""
    x = make_inputs(3, 2, 2, 16, 256, slot_pad=0, pad_rows=1, seed=2)
    x.state = padded_pool(x, row_pad, head_pad)
    assert x.state.stride(-1) == 1
    expect_refusal(get("naive"), x, "state-inner-strides",
                   r"^naive state inner strides must be compact \(V\*K, K, 1\)=\(4096, 16, 1\); got " + got)


@pytest.mark.parametrize("B", [1, 4])  # a pool of two slots (B = 1 and its pad row) overlaps as any other does
def test_slots_must_not_overlap(B):
    x = inputs(B=B, slot_pad=0)
    assert B > 1 or x.N == 2
    x.state = x.state.as_strided(x.state.shape, (100, *x.state.stride()[1:]))
    expect_refusal(get("naive"), x, "slot-overlap", r"slot stride must be >= HV\*V\*K=512 elements .*got 100")


def test_slot_stride_multiple():
    x = inputs(slot_pad=8)
    expect_refusal(Strict(), x, "pool-alignment",
                   r"^strict state slot stride 520 elements must be a multiple of 16 and the base byte "
                   r"offset 0 a multiple of 32 ")


def test_base_alignment():
    x = inputs(slot_pad=16)
    flat = x.pool_span()
    shifted = torch.empty(flat.numel() + 8, dtype=flat.dtype)
    assert shifted.data_ptr() % 32 == 0
    shifted[8:].copy_(flat)  # the same pool, starting 16 bytes into a 32-byte-aligned buffer
    x.state = shifted.as_strided(x.state.shape, x.state.stride(), 8)
    expect_refusal(Strict(), x, "pool-alignment", r"slot stride 528 elements must be a multiple of 16 and "
                                                  r"the base byte offset 16 a multiple of 32")


def test_state_dtype():
    x = inputs(state_dtype=torch.float32)
    expect_refusal(Strict(), x, "state-dtype", r"state dtype must be bfloat16; got float32")
    x.state = x.state.double()
    expect_refusal(get("naive"), x, "state-dtype", r"state dtype must be bfloat16/float16/float32; got float64$")


def test_k_equals_v():
    x = inputs(V=32)
    expect_refusal(Strict(), x, "head-dims", r"needs K == V; got K=16, V=32")


def test_head_dim_values():
    x = inputs(K=64, V=64)
    expect_refusal(Strict(), x, "head-dims", r"K must be one of \(16, 32\); got K=64")


def test_gva_capability():
    x = inputs(H=1)
    expect_refusal(Strict(), x, "gva", r"needs H == HV \(no grouped value heads\); got H=1, HV=2")


@pytest.mark.parametrize("bad, pattern", [
    (-2, r"slots values must be in \[-1, N=8\); got min -2"),
    (8, r"slots values must be in \[-1, N=8\); got min .*max 8"),
])
def test_slot_range(bad, pattern):
    x = inputs()
    x.slots[0] = bad
    expect_refusal(get("naive"), x, "slot-range", pattern)


def test_slot_duplicates():
    x = inputs(pad_rows=0)
    x.slots[1] = x.slots[0]
    expect_refusal(get("naive"), x, "slot-duplicate", rf"got repeated slots \[{int(x.slots[0])}\]")


def test_slot_duplicates_named_up_to_four():
    x = inputs(B=10, pad_rows=0)
    x.slots = torch.tensor([4, 0, 0, 1, 1, 2, 2, 3, 3, 4], dtype=torch.int32)
    expect_refusal(get("naive"), x, "slot-duplicate", r"got repeated slots \[0, 1, 2, 3\]$")


def test_repeated_padding_rows_are_fine():
    x = inputs(pad_rows=3)
    get("naive").check(x)


@pytest.mark.parametrize("name", ["state", "q", "A_log"])
def test_no_tensor_requires_grad(name):
    """One rule for all: before it, naive raised torch's own in-place error on a pool that requires
    grad while the Triton kernels updated it behind autograd's back."""
    x = inputs()
    setattr(x, name, getattr(x, name).detach().clone().requires_grad_(True))
    for impl in (get("naive"), get("triton")):
        expect_refusal(impl, x, "requires-grad",
                       rf"{name} must not require grad .*; pass {name}\.detach\(\) or run under torch\.no_grad\(\)$")


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_scale(scale):
    x = inputs()
    x.scale = scale
    expect_refusal(get("naive"), x, "scale", r"scale must be finite and > 0")


def test_out_buffer():
    x = inputs()
    with pytest.raises(ContractError, match=r"out must be a contiguous \(4, 2, 16\) bfloat16 tensor on cpu; "
                                            r"got \(4, 2, 16\) float32 on cpu$") as err:
        get("naive").bind(x, out=torch.empty(4, 2, 16, dtype=torch.float32))
    assert err.value.rule == "out"
    strided = torch.empty(2, 16, 4, dtype=torch.bfloat16).permute(2, 0, 1)  # the right shape, not contiguous
    with pytest.raises(ContractError, match=r"out must be a contiguous \(4, 2, 16\) bfloat16 tensor") as err:
        get("naive").bind(x, out=strided)
    assert err.value.rule == "out"


def test_out_buffer_alignment():
    """An implementation compiled for aligned tensors refuses a misaligned out, as it does a pool."""
    x = inputs(B=4, H=2, HV=2, K=16, V=16)
    aligned = torch.empty(4 * 2 * 16 + 8, dtype=torch.bfloat16)
    assert aligned.data_ptr() % 32 == 0
    with pytest.raises(ContractError, match=r"out must start 32-byte aligned; its byte offset is 16") as err:
        Strict().bind(x, out=aligned[8:].view(4, 2, 16))
    assert err.value.rule == "out"
    Strict().bind(x, out=aligned[:-8].view(4, 2, 16))  # aligned: accepted


@pytest.mark.parametrize("alias", ["v", "q", "state", "state-tail", "a", "cache.kg"])
def test_out_aliasing_an_input_is_refused_before_anything_runs(alias):
    """The launcher writes out while it reads every input: out sharing memory with one (the pool, v, q,
    the replay cache, ...) would race. Each is refused in one line naming it, nothing modified."""
    # 64 elements of padding a slot: the pool's span reaches past its slots' N * HV * V * K elements
    x = inputs(H=2, HV=2, K=16, V=16, slot_pad=64, ring=2 if alias == "cache.kg" else None)
    n = 4 * 2 * 16
    out = {"v": lambda: x.v,  # the same tensor
           "q": lambda: x.q,  # q [B, H, K] has out's shape where H == HV and K == V
           "state": lambda: x.pool_span()[x.slot_stride + 3:x.slot_stride + 3 + n].view(4, 2, 16),  # inside a slot
           "state-tail": lambda: x.pool_span()[-n:].view(4, 2, 16),  # the last slot's end
           "a": lambda: x.a,  # a [B, HV, K] too
           "cache.kg": lambda: x.cache.kg.flatten()[:n].view(4, 2, 16)}[alias]()  # the records, in v's dtype
    assert alias != "state-tail" or out.data_ptr() >= x.state.data_ptr() + x.state.nbytes
    before = {name: t.clone() for name, t in x.tensors().items()}
    pool = x.pool_span().clone()
    with pytest.raises(ContractError) as err:
        get("naive").bind(x, out=out)
    what = "the state pool" if alias.startswith("state") else alias
    assert err.value.rule == "out-alias"
    assert re.fullmatch(rf"naive out must not overlap any input; got out \(bytes 0x[0-9a-f]+-0x[0-9a-f]+\) "
                        rf"overlapping {what} \(bytes 0x[0-9a-f]+-0x[0-9a-f]+\)", str(err.value)), str(err.value)
    assert all(torch.equal(t, before[name]) for name, t in x.tensors().items())
    assert torch.equal(x.pool_span().view(torch.int16), pool.view(torch.int16))


@pytest.mark.parametrize("out_first", [False, True])
def test_out_next_to_an_input_in_one_buffer_is_accepted(out_first):
    """Disjoint views of one allocation do not alias, in either order: only overlapping bytes are refused."""
    x = inputs(H=2, HV=2, K=16, V=16)
    n = 4 * 2 * 16
    buffer = torch.empty(2 * n, dtype=torch.bfloat16)
    v, out = (buffer[n:], buffer[:n]) if out_first else (buffer[:n], buffer[n:])
    v.copy_(x.v.flatten())
    x.v = v.view(4, 2, 16)
    assert get("naive").bind(x, out=out.view(4, 2, 16))().data_ptr() == out.data_ptr()
    assert not torch.isnan(out).any()


def test_capabilities_describe_themselves():
    """The one-line summary `python -m kda_impls` and the sweep workers print."""
    assert Capabilities().describe() == "devices cpu/cuda, state bfloat16/float32, K any, V any, GVA, T = 1 only"
    assert Strict().capabilities.describe() == ("devices cpu, state bfloat16, K 16/32, V 16/32 (K == V), "
                                                "H == HV only, T = 1 only, slot stride % 16, base % 32 B")
    gpu = Capabilities(devices=("cuda",), k_values=(64, 128), min_compute_capability=(9, 0))
    assert gpu.describe() == "devices cuda, state bfloat16/float32, K 64/128, V any, GVA, T = 1 only, sm_90+"
    pairs = Capabilities(slot_stride_multiple=2, base_alignment=2)
    assert pairs.describe().endswith(", GVA, T = 1 only, slot stride % 2, base % 2 B")
    assert repr(Strict()) == f"<kda implementation 'strict': {Strict().capabilities.describe()}>"
    # the tokens a step takes, and the decode modes besides in-place
    assert Capabilities(max_tokens=None, frozen=True).describe().endswith(", GVA, any T, frozen verify")
    assert Capabilities(max_tokens=16, replay=True).describe().endswith(", GVA, T <= 16, replay")
    assert Capabilities(max_tokens=8, frozen=True, replay=True).describe().endswith(", T <= 8, frozen verify, replay")


def test_package_version(tmp_path, monkeypatch):
    from importlib import metadata

    from kda_impls.contract import package_version

    assert package_version("torch") == metadata.version("torch")
    assert package_version("surely-not-installed-kda-dist") == "not installed"
    assert package_version("surely-not-installed-kda-dist", "surely_not_installed_kda_module") == "not installed"
    # a source tree without package metadata (as FlashInfer can be deployed): its __version__, else "unknown"
    (tmp_path / "kda_source_tree_pkg.py").write_text("__version__ = '1.2.3'\n")
    (tmp_path / "kda_source_tree_bare.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_version("surely-not-installed-kda-dist", "kda_source_tree_pkg") == "1.2.3"
    assert package_version("surely-not-installed-kda-dist", "kda_source_tree_bare") == "unknown"


def test_unsupported_reasons_and_bind():
    x = inputs(state_dtype=torch.float32)
    assert "state dtype float32 not supported (supports bfloat16)" == Strict().unsupported(x)

    class GpuOnly(NaiveTorch):
        name = "gpu-only"
        capabilities = Capabilities(devices=("cuda",))

    reason = "runs on cuda; inputs are on cpu" if torch.cuda.is_available() else "needs a CUDA GPU; none is available"
    assert GpuOnly().unsupported(inputs()) == reason
    with pytest.raises(Unsupported, match=f"gpu-only: {reason}"):
        GpuOnly().bind(inputs())

    class CpuOnly(NaiveTorch):
        name = "cpu-only"
        capabilities = Capabilities(devices=("cpu",), min_compute_capability=(9, 0))  # a GPU minimum: moot here

    assert CpuOnly().unsupported(inputs()) is None
    elsewhere = inputs()
    elsewhere.state = elsewhere.state.to("meta")
    assert CpuOnly().unsupported(elsewhere) == "runs on cpu; inputs are on meta"

    class TwoDevices(NaiveTorch):
        name = "two-devices"
        capabilities = Capabilities(devices=("cpu", "mps"))

    assert TwoDevices().unsupported(elsewhere) == "runs on cpu/mps; inputs are on meta"

    class NeedsPackage(NaiveTorch):
        name = "needs-package"
        capabilities = Capabilities(packages=("surely_not_installed_kda_pkg",))

    assert NeedsPackage().unsupported(inputs()).startswith("package not installed: surely_not_installed_kda_pkg")


def test_decode_allocates_the_output():
    """Without an out buffer, bind allocates one: [B, HV, V] in v's dtype on the inputs' device."""
    from kda_impls import reference, rel_err

    x = inputs(state_dtype=torch.float32)
    ref_out, _ = reference(x)
    out = get("naive").decode(x)
    assert out.shape == (4, 2, 16) and out.dtype == torch.bfloat16 and out.device == x.device
    assert rel_err(out, ref_out) < 1e-2


def test_a_gpu_under_the_minimum_compute_capability_is_named_with_both(monkeypatch):
    """On the CPU too: the GPU's capability (here a stand-in's, per device) against the minimum."""
    seen = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: seen.append(device) or (8, 6))

    class Needs(NaiveTorch):
        name = "needs-cc"

        def __init__(self, minimum):
            self.capabilities = Capabilities(min_compute_capability=minimum)

    gpu = torch.device("cuda", 1)
    assert Needs((9, 0)).unsupported_on(gpu) == "needs compute capability >= 9.0; this GPU is 8.6"
    assert Needs((8, 6)).unsupported_on(gpu) is None and Needs((8, 0)).unsupported_on(gpu) is None
    assert seen == [gpu] * 3
    assert Needs((9, 0)).unsupported_on(torch.device("cpu")) is None and len(seen) == 3  # no GPU asked


@pytest.mark.gpu
def test_minimum_compute_capability_on_gpu():
    x = make_inputs(2, 1, 1, 16, 16, device="cuda", seed=1)
    cc = torch.cuda.get_device_capability()

    class Needs(NaiveTorch):
        name = "needs-cc"

        def __init__(self, minimum):
            self.capabilities = Capabilities(min_compute_capability=minimum)

    assert Needs(cc).unsupported(x) is None
    assert Needs((cc[0] + 1, 0)).unsupported(x) == \
        "needs compute capability >= %d.0; this GPU is %d.%d" % (cc[0] + 1, *cc)


def _resized(x, **shapes):
    """``x`` with each named tensor replaced by zeros of the given shape (its dtype, device)."""
    for name, shape in shapes.items():
        setattr(x, name, torch.zeros(shape, dtype=getattr(x, name).dtype))
    return x


@pytest.mark.parametrize("dim, shapes, blamed", [
    # HV: v and a say 4, b 6; A_log, the state and dt_bias say 2: dt_bias's vote makes 2 the most common
    ("HV", dict(v=(4, 4, 16), a=(4, 4, 16), b=(4, 6)), "v shape must be (4, 2, 16)"),
    # K: q and k say 8; a, the state and dt_bias say 16: without dt_bias a tie, which q (listed first) would win
    ("K", dict(q=(4, 2, 8), k=(4, 2, 8)), "q shape must be (4, 2, 16)"),
])
def test_dt_bias_votes_on_hv_and_k_as_every_tensor_of_its_rank_does(dim, shapes, blamed):
    x = _resized(inputs(slot_pad=0), **shapes)
    with pytest.raises(ContractError, match=re.escape(blamed)) as err:
        get("naive").check(x)
    assert f"{dim}={2 if dim == 'HV' else 16}," in str(err.value)


def test_the_token_spelling_is_the_one_most_inputs_use_and_a_tie_is_one_token():
    """Frozen verify's slots ([B] in both spellings) cast no vote: q, k and v with a token axis outvote a and
    b without it, and a is blamed. With slots [B, T] voting (update_state=True), three against three is a
    tie, which goes to one token per row: q is blamed for its token axis."""
    frozen = make_inputs(4, 2, 2, 16, 16, T=2, update_state=False, seed=7)
    frozen.a, frozen.b = frozen.a[:, 0].contiguous(), frozen.b[:, 0].contiguous()
    expect_refusal(get("naive"), frozen, "rank", r"^naive a must be 4-D \[B, T, HV, K\]")
    tied = inputs(T=2)
    tied.a, tied.b, tied.slots = tied.a[:, 0].contiguous(), tied.b[:, 0].contiguous(), tied.slots[:, 0].contiguous()
    expect_refusal(get("naive"), tied, "rank", r"^naive q must be 3-D \[B, H, K\]; got shape \(4, 2, 2, 16\)$")


def test_a_shape_refusal_names_the_dimensions_most_inputs_agree_on():
    """The whole line: the tensor blamed, the shape it must have and each agreed dimension by name."""
    x = inputs(T=2)
    x.q = x.q[..., :8]
    with pytest.raises(ContractError) as err:
        get("naive").check(x)
    assert err.value.rule == "shape"
    assert str(err.value) == ("naive q shape must be (4, 2, 2, 16) ([B, T, H, K] with B=4, T=2, H=2, HV=2, K=16, "
                              "V=16, as most inputs agree); got (4, 2, 2, 8)")
