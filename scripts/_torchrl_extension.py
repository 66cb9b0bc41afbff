"""Builds TorchRL's C++ extension (its sum and min trees) against the torch installed beside it.

Run with the interpreter of the TorchRL environment, after `pip install -r scripts/torchrl-requirements.txt`
(`make torchrl-env` and `scripts/benchmark.py --torchrl-setup` do both). TorchRL's wheels link their
extension against one torch release's C++ API each: 0.12 to 0.13.3 against the autograd of a torch before
2.13, 0.14 against one after it, so none loads beside the CPU torch 2.13 pinned there, and the prioritized
sampler has no sum tree. The wheel ships the extension's sources (`torchrl/csrc`); this compiles them with
the flags of torch's own extensions into the module the wheel had, and checks that it loads. About a
minute and a half of one core.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import sysconfig

import torch
from torch.utils import cpp_extension

SOURCES = ("pybind.cpp", "utils.cpp")  # the CPU trees and safetanh; the CUDA ones need nvcc


def main() -> int:
    import torchrl

    package = pathlib.Path(torchrl.__file__).parent
    target = package / f"_torchrl{sysconfig.get_config_var('EXT_SUFFIX')}"
    abi = int(torch.compiled_with_cxx11_abi())
    command = ["c++", "-O2", "-DNDEBUG", "-shared", "-fPIC", "-std=c++20", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    command += ["-DTORCH_EXTENSION_NAME=_torchrl", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    command += [f"-I{path}" for path in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    command += [str(package / "csrc" / source) for source in SOURCES]
    command += [f"-L{path}" for path in cpp_extension.library_paths()]
    command += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", str(target)]
    print(f"Building TorchRL's extension against torch {torch.__version__} into {target} ...", flush=True)
    subprocess.run(command, check=True)
    checked = subprocess.run(
        [sys.executable, "-c", "import torch, torchrl._torchrl as ext; ext.SumSegmentTreeFp32(8)"],
        capture_output=True,
        text=True,
    )
    if checked.returncode:
        print(f"the rebuilt extension does not load:\n{checked.stderr[-2000:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
