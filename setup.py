"""The optional compiled kernels (``hexagent_gym/planning/_kernels.c``); the rest of the build is in
pyproject.toml.

The kernels are compiled twins of the core's scalar placement rules and of the env's
observation assembly (``hexagent_gym.planning.kernels``). They use numpy's C API to create the
observation's arrays, so numpy's headers are a build requirement (pyproject.toml lists numpy
there). ``optional=True``: without a C compiler (or without numpy at build time) the build skips
them and the package runs the pure-Python versions, with the same results.
-ffp-contract=off keeps the compiler from fusing a multiply and an add, so the floats stay
bit-identical to Python's.
"""

from setuptools import Extension, setup


def _kernels() -> list[Extension]:
    try:
        import numpy
    except ImportError:  # a build without numpy: the pure-Python rules run
        return []
    return [Extension("hexagent_gym.planning._kernels", ["hexagent_gym/planning/_kernels.c"],
                      include_dirs=[numpy.get_include()],
                      define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                      extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"],
                      optional=True)]


setup(ext_modules=_kernels())
