"""The package version, in a module of its own so that every layer of the package can read it
without importing the package's public API (which imports everything)."""

__version__ = "0.1.0"
