"""Put this folder on PYTHONPATH and bitsandbytes behaves as on a CPU with AVX512-BF16 whose
machine lacks the `kernels` package: its CPU back end then logs, at import, the line
"Failed to load CPU gemm_4bit_forward from kernels-community". Tests use it to reproduce, on any
CPU, a library line that only some CPUs print. Only the flag check is changed: no kernel runs."""

import importlib.abc
import importlib.util
import sys

sys.modules["kernels"] = None  # the package the AVX512-BF16 path tries first; absent, as on a fresh machine


class _Avx512Bf16Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of bitsandbytes.functional so that its CPU flag check answers yes."""

    def find_spec(self, name, path, target=None):
        if name != "bitsandbytes.functional":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        exec_module = spec.loader.exec_module

        def exec_with_flag(module):
            exec_module(module)
            module.has_avx512bf16 = lambda: True

        spec.loader.exec_module = exec_with_flag
        return spec


sys.meta_path.insert(0, _Avx512Bf16Finder())
