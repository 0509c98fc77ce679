"""What ``--compile`` asks for: torch.compile's mode and its dynamic and fullgraph choices, as
one value a case carries (its text, in case ids and results.csv) and reads back once.

``--compile default`` compiles each case's layer with inductor's defaults; a mode
(``reduce-overhead``: CUDA graphs on a GPU; ``max-autotune``...) and the words ``dynamic``,
``static`` and ``fullgraph`` follow it, comma-separated: ``--compile max-autotune,fullgraph``.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.devices import device_kind
from attnbench.errors import AttnbenchError

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
GRAPH_MODES = ("reduce-overhead", "max-autotune")  # inductor replays CUDA graphs on a GPU
EAGER = ("", "none", "eager")  # what asks for no compile
_SHAPES = {"dynamic": True, "static": False}


@dataclass(frozen=True)
class CompileSpec:
    """torch.compile's arguments for a case's layer (inductor, the default backend)."""

    mode: str = "default"
    dynamic: bool | None = None  # None: torch's choice (static, then dynamic on a recompile)
    fullgraph: bool = False  # a graph break is an error rather than a split graph

    @property
    def text(self) -> str:
        """As a case carries it: "default", "max-autotune,dynamic,fullgraph"."""
        words = [self.mode]
        words += [] if self.dynamic is None else ["dynamic" if self.dynamic else "static"]
        words += ["fullgraph"] if self.fullgraph else []
        return ",".join(words)

    def replays_graphs(self, device: str) -> bool:
        """Whether the compiled call replays CUDA graphs (cudagraph trees): each call then
        writes its output over the previous call's, which must not be read after it."""
        return self.mode in GRAPH_MODES and device_kind(device) == "cuda"

    @classmethod
    def parse(cls, text: str) -> CompileSpec | None:
        """The spec a ``--compile`` value (or a case's text) names; None for eager."""
        words = [w.strip() for w in str(text).split(",") if w.strip()]
        if not words or (len(words) == 1 and words[0] in EAGER):
            return None
        mode, *flags = words
        if mode not in MODES:
            raise AttnbenchError(
                f"--compile {text!r}: the mode must come first, one of {', '.join(MODES)} "
                "(or none), then dynamic, static or fullgraph"
            )
        unknown = [f for f in flags if f not in (*_SHAPES, "fullgraph")]
        if unknown or len(set(flags)) < len(flags) or {"dynamic", "static"} <= set(flags):
            raise AttnbenchError(
                f"--compile {text!r}: after the mode come dynamic or static, and fullgraph, "
                "each at most once"
            )
        dynamic = next((_SHAPES[f] for f in flags if f in _SHAPES), None)
        return cls(mode, dynamic, "fullgraph" in flags)


def compile_text(value: object) -> str:
    """A ``--compile`` value in its canonical words ("" for eager): what a grid and its cases
    hold."""
    found = CompileSpec.parse(str(value))
    return "" if found is None else found.text
