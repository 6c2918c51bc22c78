"""Build hook for the optional C extensions; metadata is in setup.cfg.

`coordl.pipelines._jpegroi` decodes only a crop's region of a JPEG with libjpeg-turbo
(pipelines/_jpegroi.c). It needs a C compiler, Python's headers and
jpeglib.h (Debian: libjpeg62-turbo-dev). When any of them is missing the
build skips it (`optional=True`) and coordl decodes with Pillow alone.

`coordl.manifest._statnames` stats the files of one folder in C for the dataset scan
(coordl/manifest/_statnames.c); without it the scan calls libc's statx through
ctypes, or os.stat.

Listing `ext_modules` turns off setuptools' automatic package discovery, so
the packages are listed here: every package under each folder that
setup.cfg's package_dir maps (coordl/, cache/, pipelines/), found afresh on
each build so that a new subpackage cannot be silently left out of a wheel.
"""

from setuptools import Extension, find_packages, setup

FOLDERS = {"coordl": "coordl", "coordl.cache": "cache", "coordl.pipelines": "pipelines"}
packages = [name for name in FOLDERS]
for name, folder in FOLDERS.items():
    packages += [f"{name}.{sub}" for sub in find_packages(folder) if f"{name}.{sub}" not in FOLDERS]

setup(
    packages=sorted(set(packages)),
    ext_modules=[
        Extension(
            "coordl.pipelines._jpegroi",
            sources=["pipelines/_jpegroi.c"],
            libraries=["jpeg"],
            extra_compile_args=["-Wall"],
            optional=True,
        ),
        Extension(
            "coordl.manifest._statnames",
            sources=["coordl/manifest/_statnames.c"],
            extra_compile_args=["-Wall"],
            optional=True,
        ),
    ],
)
