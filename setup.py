"""The compiled read path (loadgen/transport/_readpath.c): everything else is in pyproject.toml.

One build against CPython's limited API (abi3) loads on 3.10 and later. Linux only (it reads
SO_TIMESTAMPNS stamps), and optional: without a C compiler the install goes on and loadgen
reads with its Python path (loadgen/transport/wire.py).
"""

import sys

from setuptools import Extension, setup

READ_PATH = Extension(
    "loadgen.transport._readpath",
    ["loadgen/transport/_readpath.c"],
    py_limited_api=True,  # the source defines Py_LIMITED_API (3.10)
    optional=True,
)

setup(ext_modules=[READ_PATH] if sys.platform.startswith("linux") else [],
      options={"bdist_wheel": {"py_limited_api": "cp310"}})
