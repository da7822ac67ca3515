"""Which cells may touch the GPU (kiwi_jupyter/kernel/gpu_cells.py): read from a cell's code and
the namespace it runs in, as a kernel's ``user_ns``. NumPy stands in for a GPU library where a
test needs one installed; ``json`` for a library that is not one."""

from __future__ import annotations

import json
import sys
import types

import numpy
import pytest

from kiwi_jupyter.kernel.gpu_cells import GPU_LIBRARIES, may_use_gpu

STAND_IN = (*GPU_LIBRARIES, "numpy")


def notebook(source: str, **names: object) -> dict[str, object]:
    """A namespace as a kernel's: earlier cells' definitions, run as ``__main__``."""
    namespace: dict[str, object] = {"__name__": "__main__", **names}
    exec(source, namespace)  # noqa: S102 - the test's own cells
    return namespace


@pytest.mark.parametrize("cell", [
    "import torch",
    "import torch.nn as nn",
    "from cupy import asarray",
    "import os, jax.numpy as jnp",
    "if True:\n    import tensorflow as tf",
])
def test_a_cell_that_imports_a_gpu_library_may_use_the_gpu(cell):
    assert may_use_gpu(cell, {})


def test_a_cell_that_only_defines_functions_does_not():
    cell = "import time\n\ndef train(model):\n    import torch\n    return torch.ones(1)\n"
    assert not may_use_gpu(cell, {})


def test_a_cell_that_calls_a_function_it_defines_is_read_into():
    assert may_use_gpu("def pick():\n    import cupy\n    return cupy\n\nxp = pick()\n", {})


def test_a_call_reaches_the_gpu_library_through_earlier_cells_functions():
    namespace = notebook("def matrix(n):\n    return xp.ones((n, n))\n\n"
                         "def burst(n):\n    return matrix(n).sum()\n", xp=numpy)
    assert may_use_gpu("burst(4)", namespace, STAND_IN)
    assert not may_use_gpu("burst(4)", namespace)  # NumPy alone is the CPU


def test_an_object_of_a_gpu_library_may_use_the_gpu():
    assert may_use_gpu("total = weights.sum()", {"weights": numpy.ones(3)}, STAND_IN)
    assert may_use_gpu("print(layers[0])", {"layers": [numpy.ones(3)]}, STAND_IN)


def test_an_object_of_the_notebooks_own_class_is_read_through_its_methods_and_attributes():
    namespace = notebook("class Trainer:\n    def fit(self):\n        return xp.ones(2)\n\n"
                         "class Holder:\n    pass\n\ntrainer = Trainer()\nholder = Holder()\n",
                         xp=numpy)
    holder = namespace["holder"]
    assert isinstance(holder, object)
    holder.weights = numpy.ones(2)  # type: ignore[attr-defined]
    assert may_use_gpu("trainer.fit()", namespace, STAND_IN)
    assert may_use_gpu("print(holder)", namespace, STAND_IN)


def test_plain_python_and_other_libraries_do_not():
    namespace = notebook("import json\nrows = [1, 2, 3]\n", json=json)
    assert not may_use_gpu("text = json.dumps(rows)\nprint(text, len(rows))", namespace)
    assert not may_use_gpu("import time; time.sleep(0)", {})


@pytest.mark.parametrize("cell", [
    "get_ipython().run_cell_magic('time', '', 'f()')",
    "get_ipython().run_line_magic('timeit', 'f()')",
    "get_ipython().system('python train.py')",
    "exec(code)",
    "eval('1')",
])
def test_code_the_reading_cannot_see_into_may_use_the_gpu(cell):
    assert may_use_gpu(cell, {})


def test_housekeeping_magics_do_not():
    assert not may_use_gpu("get_ipython().run_line_magic('config', 'X.y = 1')", {})


def test_a_module_of_the_users_own_is_read_into(tmp_path, monkeypatch):
    mine = types.ModuleType("kiwi_test_mytraining")  # a file next to the notebook
    mine.__file__ = str(tmp_path / "kiwi_test_mytraining.py")
    exec("import numpy\n\ndef step():\n    return numpy.ones(1)\n", mine.__dict__)  # noqa: S102
    monkeypatch.setitem(sys.modules, mine.__name__, mine)
    assert may_use_gpu("mytraining.step()", {"mytraining": mine}, STAND_IN)


def test_a_cell_that_does_not_parse_never_runs_so_needs_no_gpu():
    assert not may_use_gpu("x = (", {})


def test_a_namespace_too_large_to_read_counts_as_using_the_gpu():
    count = 3000  # more objects than one cell's reading may look at
    namespace = notebook("".join(f"def f{i}():\n    return {i}\n" for i in range(count)))
    cell = "\n".join(f"f{i}()" for i in range(count))
    assert may_use_gpu(cell, namespace)
    assert not may_use_gpu("\n".join(f"f{i}()" for i in range(100)), namespace)
