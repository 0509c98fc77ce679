"""What each aten op is to the counters: work with a FLOP formula, elementwise work, or
bookkeeping (views, copies, new tensors, data moved into place), and the fused paths a count
must see through.

Every counter here reads the dispatcher, so an op that is none of these (a fused kernel torch
has no formula for, an FFT, a custom op) would count as nothing. ``uncounted`` names such ops
instead of letting them read as zero.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

Args = tuple[Any, ...]  # a dispatched op's positional arguments
Kw = dict[str, Any] | None  # and its keyword arguments


class TracingMode(TorchDispatchMode):
    """The base of the tool's dispatch-mode counters.

    torch wraps each mode's ``__torch_dispatch__`` in ``torch._dynamo.disable`` unless the mode
    says otherwise, and the wrapper's first call imports torch._dynamo: 1.3 s of a cold sweep.
    These modes only count and call through, and Dynamo skips every frame while a non-infra
    dispatch mode is on the stack (``torch._dynamo.convert_frame``), so a plugin layer that
    compiles itself runs eagerly under them either way: the wrapper buys nothing here.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's own __init__ is unannotated

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class ObservingMode(TracingMode):
    """A counter that runs each op and then observes it (``observe``): the counters of FLOPs,
    elementwise work, bytes and chains, each used alone or several at once by
    ``measure.counts.census``."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Args = (), kwargs: Kw = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.observe(func, args, kwargs, out)
        return out

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        raise NotImplementedError


COPIES = frozenset({"clone", "copy", "copy_", "_to_copy", "lift_fresh_copy"})
# Work along a dimension that carries neither the pointwise nor the reduction tag: counted as
# the elements read (softmaxes, cumulative ops, normalisations).
ALONG = frozenset({
    "_softmax", "_log_softmax", "_safe_softmax", "cumsum", "cumprod", "logcumsumexp",
    "native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_fused_rms_norm",
    # pooling: a reduction over each window
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d",
    "max_pool2d_with_indices", "max_pool3d_with_indices", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    # log-sigmoid, by what it reads: its second output is a buffer the CPU keeps for backward
    "log_sigmoid_forward",
})  # fmt: skip  # a catalogue of op names, grouped as torch groups them
# Ops that fold a source into a destination at given indices (a mixture of experts gathering
# its experts' outputs, a segment sum): counted as the source's elements, one combination each.
COMBINE = {
    "scatter_add": "src",
    "scatter_reduce": "src",
    "index_add": "source",
    "index_reduce": "source",
}
# Elementwise work without the pointwise tag: dropout, and the gradients of elementwise ops
# (met in a training call's backward pass): counted as the elements they produce.
UNTAGGED_POINTWISE = frozenset({
    "native_dropout", "native_dropout_backward", "bernoulli",
    # activations and interpolations torch does not tag pointwise
    "glu", "hardswish", "rrelu_with_noise", "_prelu_kernel",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
    "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
    "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm_backward",
    "native_group_norm_backward", "native_batch_norm_backward", "_fused_rms_norm_backward",
    "elu_backward", "softplus_backward", "tanh_backward", "sigmoid_backward",
    "threshold_backward", "gelu_backward", "silu_backward", "mish_backward", "hardtanh_backward",
    "leaky_relu_backward", "hardswish_backward", "hardsigmoid_backward", "logit_backward",
    "softshrink_backward", "hardshrink_backward", "glu_backward",
})  # fmt: skip  # a catalogue of op names, grouped as torch groups them
FUSED_ATTENTION = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
})  # fmt: skip  # a catalogue of op names, grouped as torch groups them
# Ops that make a tensor without computing on another one's values.
CREATION = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "arange", "linspace", "logspace", "eye", "scalar_tensor", "rand", "rand_like", "randn",
    "randn_like", "randint", "randperm", "normal", "uniform", "fill", "fill_", "zero_",
    "_local_scalar_dense", "detach", "alias", "lift_fresh", "resize_", "set_",
})  # fmt: skip  # a catalogue of op names, grouped as torch groups them
# Ops that move or gather values into place, computing nothing (their gradients included).
MOVEMENT = frozenset({
    "_unsafe_view", "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk", "stack", "cat",
    "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "replication_pad1d",
    "replication_pad2d", "index", "index_select", "gather", "scatter", "index_put",
    "index_put_", "index_copy", "masked_select", "masked_scatter", "take", "repeat", "flip",
    "roll", "tril", "triu", "embedding", "embedding_dense_backward", "select_backward",
    "slice_backward", "unfold_backward", "diagonal_backward", "as_strided_scatter",
    "select_scatter", "slice_scatter", "diagonal_scatter", "expand_copy", "permute_copy",
    "narrow_copy", "transpose_", "t_", "squeeze_", "unsqueeze_", "as_strided_", "split",
    "split_with_sizes", "chunk", "unbind", "col2im", "im2col", "reflection_pad1d_backward",
    "constant_pad_nd_backward", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
})  # fmt: skip  # a catalogue of op names, grouped as torch groups them
# Fused paths torch takes in the user's call that hide their matrix products in one op with no
# FLOP formula; the counts run with them switched off (``unfused``).
# The fused recurrent kernels among them: one op runs a whole recurrence (``fits.roofline``).
FUSED_RECURRENT = frozenset({"mkldnn_rnn_layer", "mkldnn_rnn", "_cudnn_rnn", "miopen_rnn"})
# The op each of nn.RNN, nn.GRU and nn.LSTM issues once a call, which runs the whole recurrence
# in torch's C++ (a fused kernel above, or each step's ops dispatched from its loop). They are
# CompositeImplicitAutograd: a dispatch mode sees only what they dispatch, never them.
RECURRENT_OPS = frozenset({"rnn_tanh", "rnn_relu", "gru", "lstm"})
_RECURRENT_MODES = {"RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu", "GRU": "gru", "LSTM": "lstm"}
FUSED_PATHS = {
    "_native_multi_head_attention": "nn.MultiheadAttention fast path",
    "_transformer_encoder_layer_fwd": "nn.TransformerEncoderLayer fast path",
    "mkldnn_rnn_layer": "oneDNN recurrent kernel",
    "mkldnn_rnn": "oneDNN recurrent kernel",
    "_cudnn_rnn": "cuDNN recurrent kernel",
    "miopen_rnn": "MIOpen recurrent kernel",
    "_thnn_fused_lstm_cell": "CUDA fused LSTM cell",
    "_thnn_fused_gru_cell": "CUDA fused GRU cell",
    **{
        op: "torch's recurrent op: one call from Python, its steps run in C++"
        for op in sorted(RECURRENT_OPS)
    },
}
# The fast paths of nn.MultiheadAttention and nn.TransformerEncoderLayer: on the CPU their
# kernel computes the scores explicitly (QK^T, a softmax over the n x n scores, the product
# with V), where the unfused path they are counted on calls scaled_dot_product_attention,
# which picks a flash kernel that never writes the scores (``explicit_attention``).
ATTENTION_FAST_PATHS = frozenset({"_native_multi_head_attention", "_transformer_encoder_layer_fwd"})
# The implementations torch chooses between for a CPU convolution, by its size: oneDNN's, or
# its own reference kernels (im2col and a GEMM, the dilated one adding the bias channel by
# channel). A Conv1d at batch 1 takes the reference kernel below about 32k input elements on
# this project's CPU build, so its rate jumps where its size crosses that (``backend``).
BACKENDS = {
    "mkldnn_convolution": "oneDNN convolution",
    "thnn_conv2d": "torch's reference convolution",
    "slow_conv_dilated2d": "torch's reference dilated convolution",
}


# Return an input's memory under another shape or name, or change only a tensor's shape in
# place, though their schemas do not say so: they move nothing.
ALIASES = frozenset({
    "_unsafe_view", "alias", "_reshape_alias", "lift_fresh", "detach", "unsafe_split",
    "unsafe_split_with_sizes", "unsafe_chunk", "transpose_", "t_", "squeeze_", "unsqueeze_",
    "as_strided_", "swapaxes_", "swapdims_",
})  # fmt: skip  # a catalogue of op names, grouped as torch groups them


def op_name(func: Any) -> str:
    return str(func._overloadpacket.__name__)


def tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in an op's arguments or outputs (nested tuples, lists, dicts' values).

    What torch's pytree flattening finds among aten arguments, at a fifth of its cost: the
    counters read every op's tensors, and pytree was 45% of a census's time.
    """
    found: list[torch.Tensor] = []
    _collect(tree, found)
    return found


def _collect(tree: Any, found: list[torch.Tensor]) -> None:
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, (tuple, list)):  # a structseq (torch.return_types) is a tuple
        for item in tree:
            _collect(item, found)
    elif isinstance(tree, dict):
        for item in tree.values():
            _collect(item, found)


def floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


@functools.cache  # a property of the op: read once per op, not per call
def is_view(func: Any) -> bool:
    """An op whose every output aliases an input without writing it: a view, not a computation."""
    returns = func._schema.returns
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


@functools.cache
def moves_data(func: Any) -> bool:
    """Whether an op is a real operation: not a view, nor a rename of an input's memory."""
    return not (is_view(func) or op_name(func) in ALIASES)


@functools.cache
def elementwise_kind(func: Any) -> str | None:
    """How an op's elementwise work is counted: "attention" (a fused attention kernel), "along"
    (elements read: reductions, softmaxes, normalisations), "pointwise" (elements produced),
    "combine" (a source's elements folded in at indices: ``COMBINE``), or None for an op that
    does no elementwise work."""
    name = op_name(func)
    if name in FUSED_ATTENTION:
        return "attention"
    if name in COPIES:
        return None
    base = name.rstrip("_")  # an in-place variant (bernoulli_, dropout's draw) counts as its op
    if base in COMBINE:
        return "combine"
    if torch.Tag.reduction in func.tags or base in ALONG:
        return "along"
    if torch.Tag.pointwise in func.tags or base in UNTAGGED_POINTWISE:
        return "pointwise"
    return None


def is_bookkeeping(func: Any, out: Any) -> bool:
    """An op that computes on no floating value: integer or boolean results, a view, a copy,
    a new tensor, or values moved into place."""
    if not any(floating(t) for t in tensors(out)):
        return True
    name = op_name(func)
    return is_view(func) or name in COPIES or name in CREATION or name in MOVEMENT


def elements_touched(args: Any, out: Any) -> int:
    """Floating elements an op read and wrote (the size of an uncounted op, for its report)."""
    return sum(t.numel() for t in tensors((args, out)) if floating(t))


@dataclass
class Uncounted:
    """Ops of a traced call that no counter could read: name -> [calls, elements touched]."""

    ops: dict[str, list[int]]

    def add(self, name: str, elements: int) -> None:
        calls_elements = self.ops.setdefault(name, [0, 0])
        calls_elements[0] += 1
        calls_elements[1] += elements

    def describe(self) -> str:
        """``name xCALLS (ELEMENTS elements)``, joined with "; " (empty when none)."""
        return "; ".join(
            f"{name} x{calls} ({elements:,} elements)"
            for name, (calls, elements) in sorted(self.ops.items())
        )


# The fused paths after which an accelerator's case is counted on the CPU
# (``measure.case.trace_counts``): a fused recurrence, whose unfused stand-in on CUDA differs from
# the CPU's (it projects the input step by step), and CUDA's LSTM and GRU cells, which torch runs
# where cuDNN is off and which hide the gate arithmetic the CPU runs as its ops.
COUNTED_ON_CPU = FUSED_RECURRENT | {"_thnn_fused_lstm_cell", "_thnn_fused_gru_cell"}


@contextmanager
def _mha_fastpath_off() -> Iterator[None]:
    mha = getattr(torch.backends, "mha", None)
    if mha is None:  # a torch without the switch has no fast path to turn off either
        yield
        return
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(before)


def scores_explicit(device_kind: str | None, head_width: int) -> bool:
    """Whether MultiheadAttention's fast path on a device of ``device_kind`` ("cpu", "cuda")
    writes the scores, as torch's kernels choose: always on the CPU
    (native_multi_head_attention_cpu); on CUDA only at a head width that is not a multiple of
    8, where it cannot hand the attention to a fused kernel (native_multi_head_attention_cuda:
    self-attention, no weights asked and ``dim_per_head % 8 == 0`` go to flash or
    memory-efficient attention); elsewhere (None: no fast path taken; another device) the
    unfused path's count stands."""
    if device_kind == "cpu":
        return True
    return device_kind == "cuda" and head_width % 8 != 0


class _ExplicitAttention(TorchFunctionMode):
    """Runs each ``F.multi_head_attention_forward`` (the unfused MultiheadAttention) whose fast
    path on the timed device writes the scores (``scores_explicit``) on its explicit branch,
    as torch's own code: QK^T by ``bmm``, ``softmax``, the product with V by ``bmm`` (asked for
    the weights, unaveraged, which the caller does not get); every other call as it is, so a
    layer's own scaled_dot_product_attention keeps the kernel it runs."""

    def __init__(self, device_kind: str) -> None:
        super().__init__()
        self.device_kind = device_kind

    def __torch_function__(self, func: Any, types: Any, args: Args = (), kwargs: Kw = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.multi_head_attention_forward:
            return func(*args, **kwargs)
        call = inspect.signature(func).bind(*args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        width = given["embed_dim_to_check"] // given["num_heads"]
        # The explicit branch refuses a causal call without a mask; that one is counted as is.
        if (
            not scores_explicit(self.device_kind, width)
            or given["need_weights"]
            or (given["is_causal"] and given["attn_mask"] is None)
        ):
            return func(*args, **kwargs)
        given["need_weights"], given["average_attn_weights"] = True, False
        out, _ = func(*call.args, **call.kwargs)
        return out, None


_EXPLICIT: ContextVar[str | None] = ContextVar("attnbench_explicit_attention", default=None)


@contextmanager
def explicit_attention(device_kind: str | None = "cpu") -> Iterator[None]:
    """Within it, ``unfused`` counts nn.MultiheadAttention's attention as the fast path computes
    it on ``device_kind``, the device the timed call took that path on (None: it took none,
    and nothing changes). On the CPU that kernel runs QK^T, a softmax over the scores and
    their product with V (torch's native_multi_head_attention_cpu; torch's profiler lists
    bmm, _softmax, bmm inside it), so 4 heads at n = 1024, d = 64 move 72 MB a call, not the
    4.3 MB a flash kernel would."""
    token = _EXPLICIT.set(device_kind)
    try:
        yield
    finally:
        _EXPLICIT.reset(token)


def unfused() -> ExitStack:
    """A context in which torch's fused paths are off: oneDNN and cuDNN (recurrent layers run
    their loop as aten ops) and the MultiheadAttention / TransformerEncoderLayer fast paths
    (their projections and scores run as visible matrix products; within
    ``explicit_attention``, their scores as the CPU's fast path computes them)."""
    stack = ExitStack()
    # The mkldnn flags context re-applies a TF32 setting that warns on CPU-only builds.
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore", UserWarning)
    stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
    stack.enter_context(torch.backends.cudnn.flags(enabled=False))
    stack.enter_context(_mha_fastpath_off())
    timed_on = _EXPLICIT.get()
    if timed_on is not None:
        stack.enter_context(_ExplicitAttention(timed_on))
    return stack


class _OpNames(TracingMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Args = (), kwargs: Kw = None) -> Any:
        self.names.add(op_name(func))
        self.ops += moves_data(func)
        return func(*args, **(kwargs or {}))

    def module_called(self, module: nn.Module, args: object) -> None:
        """Names the op a torch recurrent module issues (``RECURRENT_OPS``), which the
        dispatcher never shows."""
        if isinstance(module, nn.RNNBase):
            self.names.add(_RECURRENT_MODES[module.mode])


def recording_fused(
    fn: Callable[[], object], seen: set[str], ops: list[int] | None = None
) -> Callable[[], object]:
    """``fn``, which adds to ``seen`` the fused paths (``FUSED_PATHS``) its real call takes,
    and appends to ``ops`` how many operations that call dispatched (``moves_data``): what it
    pays the per-op latency for, a fused kernel counting once."""

    def call() -> object:
        recorder = _OpNames()
        hook = register_module_forward_pre_hook(recorder.module_called)
        try:
            with recorder:
                out = fn()
        finally:
            hook.remove()
        seen.update(name for name in recorder.names if name in FUSED_PATHS)
        if ops is not None:
            ops.append(recorder.ops)
        return out

    return call


def describe_fused(names: set[str]) -> str:
    """The results' ``fused_path`` text: each fused op the timed call ran, and what it is."""
    return "; ".join(f"{name} ({FUSED_PATHS[name]})" for name in sorted(names))


def describe_backend(names: Iterable[str]) -> str:
    """The results' ``backend`` text: each implementation of ``BACKENDS`` the call ran."""
    return "; ".join(f"{name} ({BACKENDS[name]})" for name in sorted(set(names) & set(BACKENDS)))


def fused_names(text: str) -> set[str]:
    """The op names a ``fused_path`` or ``backend`` text (``describe_fused``,
    ``describe_backend``) lists, read back."""
    return {part.split(" (")[0].strip() for part in text.split(";") if part.strip()}


def storage_of(t: torch.Tensor) -> int:
    """The storage a tensor's views share, as a key."""
    return int(t.untyped_storage().data_ptr())


def writes_in_place(func: Any) -> bool:
    """Whether the op writes into one of its arguments (in place, or an out= tensor)."""
    schema = getattr(func, "_schema", None)
    return schema is not None and any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments
    )
