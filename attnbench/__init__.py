"""attnbench: measure the complexity table of self-attention against conv and RNN layers."""

__version__ = "0.1.0"

from attnbench.errors import AttnbenchError, SweepInterrupted
from attnbench.layers import build_layer, layer_names
from attnbench.positional import SinusoidalPositionalEncoding, sinusoidal_table
from attnbench.results import RunResults, load_results
from attnbench.runner import measure_case, resume_sweep, run_sweep
from attnbench.spec import Case, Grid, build_grid

__all__ = [
    "AttnbenchError",
    "Case",
    "Grid",
    "RunResults",
    "SinusoidalPositionalEncoding",
    "SweepInterrupted",
    "__version__",
    "build_grid",
    "build_layer",
    "layer_names",
    "load_results",
    "measure_case",
    "resume_sweep",
    "run_sweep",
    "sinusoidal_table",
]
