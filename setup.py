"""The one C extension; everything else is in pyproject.toml.

`gateway.telemetry._spanwire` makes the request path's spans and writes
their OTLP bytes (gateway/telemetry/_lean.py, _encode.py). It is optional:
where no C compiler (or no Python headers) is found, the install goes on and
the Python code makes and writes every span. It lives here, not in pyproject.toml, so that the image's
dependency layer (built from pyproject.toml alone) is not rebuilt for it.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("gateway.telemetry._spanwire", ["gateway/telemetry/_spanwire.c"], optional=True)])
