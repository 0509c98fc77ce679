"""The layers: one module per architecture, each declaring its entries (``LayerEntry``).

Every layer maps (batch, n, d) to (batch, n, d). ``build_layer`` builds one by name; a plugin
layer joins with ``register`` (from Python), ``--layers module:factory`` or
``--layers path/to/file.py:factory``, or an installed package's ``attnbench.layers`` entry point.
The families and options below are the built-in ones, for plugin entries to reuse.
"""

from attnbench.layers.attention import CAUSAL, HEADS, SELF_ATTENTION
from attnbench.layers.conv import CONVOLUTIONAL, K
from attnbench.layers.dilated import DILATED
from attnbench.layers.entry import CUSTOM, Family, LayerEntry, LayerOption, LayerSource
from attnbench.layers.linear import LINEAR
from attnbench.layers.local import RESTRICTED, WINDOW
from attnbench.layers.plugins import resolve
from attnbench.layers.recurrent import RECURRENT
from attnbench.layers.registry import (
    BUILTIN,
    REGISTRY,
    build_layer,
    entry,
    known_options,
    layer_names,
    register,
)
from attnbench.layers.ssm import STATE, STATE_SPACE

__all__ = [
    "BUILTIN",
    "CAUSAL",
    "CONVOLUTIONAL",
    "CUSTOM",
    "DILATED",
    "HEADS",
    "LINEAR",
    "RECURRENT",
    "REGISTRY",
    "RESTRICTED",
    "SELF_ATTENTION",
    "STATE",
    "STATE_SPACE",
    "WINDOW",
    "Family",
    "K",
    "LayerEntry",
    "LayerOption",
    "LayerSource",
    "build_layer",
    "entry",
    "known_options",
    "layer_names",
    "register",
    "resolve",
]
