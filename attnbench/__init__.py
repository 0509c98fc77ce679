"""attnbench: measure the complexity table of self-attention against conv and RNN layers.

The public Python API. Importing it loads the whole core (not the command line, not Ray).
"""

from attnbench._version import __version__
from attnbench.errors import AttnbenchError, SweepFailed, SweepInterrupted
from attnbench.layers import LayerEntry, build_layer, layer_names
from attnbench.layers import register as register_layer
from attnbench.measure.case import measure_case
from attnbench.options import build_grid
from attnbench.positional import SinusoidalPositionalEncoding, sinusoidal_table
from attnbench.results.loader import load_results
from attnbench.results.run import RunResults
from attnbench.run.events import Listeners
from attnbench.run.queue import Measuring
from attnbench.run.sweep import resume_sweep, run_sweep
from attnbench.spec import Case, Grid

__all__ = [
    "AttnbenchError",
    "Case",
    "Grid",
    "LayerEntry",
    "Listeners",
    "Measuring",
    "RunResults",
    "SinusoidalPositionalEncoding",
    "SweepFailed",
    "SweepInterrupted",
    "__version__",
    "build_grid",
    "build_layer",
    "layer_names",
    "load_results",
    "measure_case",
    "register_layer",
    "resume_sweep",
    "run_sweep",
    "sinusoidal_table",
]
