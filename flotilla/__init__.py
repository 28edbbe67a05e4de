"""flotilla: serve fleets of small models through a shared queue and pulling workers."""

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]),
# so the installed package's metadata says the same (tests/flotilla/test_version.py).
__version__ = "0.1.0"
