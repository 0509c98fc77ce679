"""attnbench: measure the complexity table of self-attention against conv and RNN layers."""

__version__ = "0.1.0"

from attnbench.errors import AttnbenchError
from attnbench.layers import build_layer, layer_names
from attnbench.positional import SinusoidalPositionalEncoding, sinusoidal_table
from attnbench.results import RunResults, load_results
from attnbench.runner import measure_case, run_sweep
from attnbench.spec import Case, Grid, build_grid

__all__ = [
    "AttnbenchError",
    "Case",
    "Grid",
    "RunResults",
    "SinusoidalPositionalEncoding",
    "__version__",
    "build_grid",
    "build_layer",
    "layer_names",
    "load_results",
    "measure_case",
    "run_sweep",
    "sinusoidal_table",
]
