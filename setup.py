"""Build of the C core `aioprof._core`; metadata lives in pyproject.toml.

Extra compiler flags (sanitizers) come from the environment variable AIOPROF_CFLAGS.
"""
import glob
import os

from setuptools import Extension, setup

cflags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
          "-Wcast-function-type"]
cflags += os.environ.get("AIOPROF_CFLAGS", "").split()
ldflags = os.environ.get("AIOPROF_LDFLAGS", "").split()

setup(
    ext_modules=[
        Extension(
            "aioprof._core",
            sources=sorted(glob.glob("src/aioprof/_core/*.c")),
            depends=sorted(glob.glob("src/aioprof/_core/*.h")),
            extra_compile_args=cflags,
            extra_link_args=ldflags,
        )
    ]
)
