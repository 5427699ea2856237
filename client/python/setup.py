"""Builds the chorus package.

The chorus.v1 modules (messages and gRPC stubs) are generated from the
repository's proto/chorus/v1/*.proto on every build, so they always match the
protos the servers are built from. They are never checked in.

protoc and the gRPC Python plugin are looked up in this order: $PROTOC and
$CHORUS_GRPC_PYTHON_PLUGIN, Debian's /usr/bin/protoc and
/usr/bin/grpc_python_plugin (packages protobuf-compiler and
protobuf-compiler-grpc), then the PATH. Without them, the grpc_tools module
(package grpcio-tools) is used when it is installed. $CHORUS_PROTO_DIR names
another proto root (the folder that holds chorus/v1/).

The extension chorus._frames (chorus/_frames.c) is compiled too, which needs
a C compiler and Python's headers (Debian: gcc and python3-dev).

The embedded worker, chorus._embedded, is the worker runtime built by Chorus'
CMake build (client/python/embedded): when $CHORUS_BUILD_DIR names a build
(relative paths from the repository's root) that holds
python-embedded/_embedded*.so for this interpreter, it is copied into the
package, without its debug sections when objcopy is there; without it the
package works through worker daemons only. $CHORUS_REQUIRE_EMBEDDED=1 makes
its absence an error: the CMake target python-wheel sets it, so the wheel
it makes (build/dist) always carries the embedded worker.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _proto_root() -> Path:
    """Returns the folder that holds chorus/v1/*.proto."""
    configured = os.environ.get("CHORUS_PROTO_DIR")
    return Path(configured) if configured else HERE.parent.parent / "proto"


def _find_tool(name: str, env: str) -> Optional[str]:
    """Returns the path of a code generator, or None when there is none."""
    configured = os.environ.get(env)
    if configured:
        return configured
    debian = Path("/usr/bin") / name
    if debian.is_file() and os.access(debian, os.X_OK):
        return str(debian)
    return shutil.which(name)


def _protoc_command() -> List[str]:
    """Returns the protoc command that writes Python messages and stubs."""
    protoc = _find_tool("protoc", "PROTOC")
    plugin = _find_tool("grpc_python_plugin", "CHORUS_GRPC_PYTHON_PLUGIN")
    if protoc and plugin:
        return [protoc, f"--plugin=protoc-gen-grpc_python={plugin}"]
    try:
        import grpc_tools  # noqa: F401  (only to learn that it is there)
    except ImportError:
        raise SystemExit(
            "chorus: generating the chorus.v1 stubs needs protoc and "
            "grpc_python_plugin (Debian: apt-get install protobuf-compiler "
            "protobuf-compiler-grpc) or the grpcio-tools package")
    return [sys.executable, "-m", "grpc_tools.protoc"]


def _embedded_module() -> Optional[Path]:
    """Returns the CMake-built chorus._embedded for this interpreter in
    $CHORUS_BUILD_DIR, or None when there is none.
    """
    configured = os.environ.get("CHORUS_BUILD_DIR")
    if not configured:
        return None
    build = Path(configured)
    if not build.is_absolute():
        build = HERE.parent.parent / build
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    module = build / "python-embedded" / f"_embedded{suffix}"
    return module if module.is_file() else None


def _copy_embedded(module: Path, package: Path) -> None:
    """Copies the embedded worker into the package, without the debug
    sections of a RelWithDebInfo build when objcopy is there (the symbol
    table stays).
    """
    target = package / module.name
    shutil.copy2(module, target)
    objcopy = shutil.which("objcopy")
    if objcopy:
        subprocess.run([objcopy, "--strip-debug", str(target)], check=True)


class BuildPyWithStubs(build_py):
    """build_py that also generates chorus/v1/*_pb2*.py into the build, and
    takes chorus._embedded from a Chorus build when there is one.
    """

    def run(self) -> None:
        """Builds the package, then generates the stubs into the build."""
        super().run()
        if not self.dry_run:
            self._generate(Path(self.build_lib))
            embedded = _embedded_module()
            if embedded is not None:
                _copy_embedded(embedded, Path(self.build_lib) / "chorus")
            elif os.environ.get("CHORUS_REQUIRE_EMBEDDED") == "1":
                raise SystemExit(
                    "chorus: CHORUS_REQUIRE_EMBEDDED=1 but $CHORUS_BUILD_DIR "
                    "holds no python-embedded/_embedded*.so for this "
                    "interpreter; build the target chorus_python_embedded")

    def _generate(self, out: Path) -> None:
        root = _proto_root()
        protos = sorted((root / "chorus" / "v1").glob("*.proto"))
        if not protos:
            raise SystemExit(
                f"chorus: no protos in {root / 'chorus' / 'v1'}; build from "
                "a Chorus checkout or set CHORUS_PROTO_DIR")
        package = out / "chorus" / "v1"
        # Start afresh so that a removed proto leaves no module behind.
        shutil.rmtree(package, ignore_errors=True)
        package.mkdir(parents=True)
        command = _protoc_command() + [
            f"-I{root}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
        ] + [str(p.relative_to(root)) for p in protos]
        subprocess.run(command, check=True)
        (package / "__init__.py").write_text(
            '"""Messages and gRPC stubs generated from proto/chorus/v1."""\n')


# The call socket's frames in C (chorus/_frames.c): a small collective's
# client-side CPU is mostly what Python would spend on them. Building it needs
# a C compiler and Python's headers (Debian: gcc and python3-dev).
FRAMES = Extension("chorus._frames", sources=["chorus/_frames.c"],
                   extra_compile_args=["-O2", "-std=c11", "-Wall",
                                       "-Wextra", "-Wno-missing-field-"
                                       "initializers"])

setup(cmdclass={"build_py": BuildPyWithStubs}, ext_modules=[FRAMES])
