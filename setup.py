"""Build script: compiles tokcy._core with Cython, or falls back to the pure-Python twin.

Environment switches (read at build time):
  TOKCY_NO_EXTENSIONS=1       do not compile; install the pure twin only.
  TOKCY_REQUIRE_EXTENSIONS=1  any failure to cythonize or compile is fatal (CI sets it).
  TOKCY_CYTHON_DEBUG=1        bounds checks, wraparound and initialized checks back on,
                              and the C asserts guarding the nogil loops' writes.
  TOKCY_SANITIZE=1            compile (and link) the release code with AddressSanitizer and
                              UndefinedBehaviorSanitizer, any report fatal (gcc/clang; run
                              Python with the sanitizer runtime preloaded: docs/invariants.md).
Without either of the first two, a failure (no Cython, no compiler, a Cython error)
prints a warning and the install goes on with the pure twin. pip shows a build's output
only with -v, so the warning also goes to the terminal (/dev/tty) when there is one, and
the wheel is then tagged py3-none-any (pip prints its file name); ``import tokcy`` warns
too, and ``python -m tokcy --version`` names the backend.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


def _flag(name):
    return os.environ.get(name, "") not in ("", "0")


NO_EXTENSIONS = _flag("TOKCY_NO_EXTENSIONS")
REQUIRE_EXTENSIONS = _flag("TOKCY_REQUIRE_EXTENSIONS")
DEBUG = _flag("TOKCY_CYTHON_DEBUG")
SANITIZE = _flag("TOKCY_SANITIZE")
SANITIZER_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
    # no pickling Cython would write itself: an object that shows memory (ArraySource) must
    # not be rebuilt from a pickle's fields; classes that pickle define __reduce__
    "auto_pickle": False,
}


try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

# Set when the extension could not be built: the wheel is then pure Python.
FELL_BACK = False


def _warn(message):
    global FELL_BACK
    FELL_BACK = True
    text = (f"WARNING: tokcy: {message}; installing the pure-Python backend only (several times slower). "
            "Check with: python -m tokcy --version\n")
    sys.stderr.write(text)
    if not sys.stderr.isatty():  # pip captures stderr: say it where the user looks
        try:
            with open("/dev/tty", "w") as terminal:
                terminal.write(text)
        except OSError:
            pass


class OptionalBuildExt(build_ext):
    """build_ext that turns a compile failure into a warning unless extensions are required."""

    def run(self):
        try:
            super().run()
        except Exception as error:  # no compiler, missing headers, ...
            if REQUIRE_EXTENSIONS:
                raise
            _warn(f"building the extension failed ({error})")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as error:
            if REQUIRE_EXTENSIONS:
                raise
            _warn(f"compiling {ext.name} failed ({error})")


class PureWhenFallenBackWheel(bdist_wheel):
    """A wheel whose extension failed to build holds pure Python only: tag it py3-none-any."""

    @property
    def root_is_pure(self):
        return self._root_is_pure or FELL_BACK

    @root_is_pure.setter
    def root_is_pure(self, value):
        self._root_is_pure = value


def _extensions():
    if NO_EXTENSIONS:
        if REQUIRE_EXTENSIONS:
            sys.exit("tokcy: TOKCY_NO_EXTENSIONS and TOKCY_REQUIRE_EXTENSIONS are both set")
        return []
    # Cython runs here, before build_ext, so its failures are caught here too.
    try:
        from Cython.Build import cythonize
        from setuptools import Extension

        flags = [] if os.name == "nt" else ["-O3"]
        if DEBUG and os.name != "nt":
            flags.append("-UNDEBUG")  # keeps the debug_assert() checks of the nogil loops
        link_flags = []
        if SANITIZE:
            flags = ["-O1", "-g"] + [flag for flag in flags if flag != "-O3"] + SANITIZER_FLAGS
            link_flags = list(SANITIZER_FLAGS)
        extension = Extension("tokcy._core", ["tokcy/_core.pyx"], extra_compile_args=flags, extra_link_args=link_flags)
        # forced when the directives (debug) or the code wanted (sanitized release) may differ
        # from a generated _core.c left by an earlier build
        return cythonize([extension], compiler_directives=DIRECTIVES, force=DEBUG or SANITIZE)
    except Exception as error:
        if REQUIRE_EXTENSIONS:
            raise
        _warn(f"cythonizing failed ({error})")
        return []


# --- the benchmark's floor (tokcy/bench/_floor*.c: the hot loops' work in plain C, timed in C).
# Private, optional, under the same switches: skipped with TOKCY_NO_EXTENSIONS, fatal on
# failure with TOKCY_REQUIRE_EXTENSIONS; otherwise a failure only drops the bench's floor column.
# When the core itself fell back, the floor is skipped too, so the wheel stays pure Python.
FLOOR = "tokcy.bench._floor"


def _floor_extension():
    from setuptools import Extension

    flags = [] if os.name == "nt" else ["-O3", "-std=gnu99"]
    return [Extension(FLOOR, ["tokcy/bench/_floor.c", "tokcy/bench/_floor_attention.c"], extra_compile_args=flags,
                      depends=["tokcy/bench/_floor.h"])]


class BuildExtWithFloor(OptionalBuildExt):
    def build_extension(self, ext):
        if ext.name != FLOOR:
            return super().build_extension(ext)
        if FELL_BACK:
            return None
        try:
            build_ext.build_extension(self, ext)
        except Exception as error:
            if REQUIRE_EXTENSIONS:
                raise
            print(f"WARNING: tokcy: compiling the benchmark floor {FLOOR} failed ({error}); "
                  "'tokcy bench' runs without its floor column.", file=sys.stderr)


setup(
    ext_modules=_extensions() + ([] if NO_EXTENSIONS else _floor_extension()),
    cmdclass={"build_ext": BuildExtWithFloor, "bdist_wheel": PureWhenFallenBackWheel},
)
