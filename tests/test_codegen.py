"""Kernel schedules at build: dlight's defaults and tuned records, without touching the caller's kernels;
scratch memory in global memory hoisted into workspace parameters."""

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.script import tirx as T

import tvmsched
from tvmsched import frontend
from tvmsched.codegen import _check_no_pooled_workspace, default_schedules, hoist_workspace
from tvmsched.errors import GraphError
from tvmsched.lower import kernel_module, lower
from tvmsched.target import resolve_target
from tvmsched.windows import is_window_kernel


def test_default_schedules_leave_the_given_kernels_unscheduled(branchy_model):
    """dlight replaces functions in the module it is given; tuning once lost the unscheduled kernels (its
    workloads) that way, after measuring their defaults."""
    inputs = frontend.bind_input_shapes(branchy_model, 1)
    kernels = kernel_module(lower(frontend.to_relax(branchy_model, inputs)))
    scheduled = default_schedules(kernels, resolve_target("nvidia/nvidia-h100"))
    assert all(function.attrs.get("tirx.is_scheduled", False) for function in scheduled.functions.values())
    assert not any(function.attrs.get("tirx.is_scheduled", False) for function in kernels.functions.values())


def test_scratch_buffers_become_trailing_parameters_with_the_same_results():
    """An average pool without padded cells in its count keeps its padded input and its window sums in
    global memory: TVM would take them from the shared workspace pool at each call."""
    data = te.placeholder((1, 4, 9, 9), name="data")
    pool = topi.nn.pool2d(data, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "avg", count_include_pad=False)
    kernels = tvm.IRModule({"pool": te.create_prim_func([data, pool]).with_attr("global_symbol", "pool")})
    hoisted, workspace = hoist_workspace(kernels)
    assert workspace == {"pool": (((1, 4, 11, 11), "float32"), ((1, 4, 9, 9), "float32"))}
    assert len(hoisted["pool"].params) == 4
    x = np.random.default_rng(0).standard_normal((1, 4, 9, 9)).astype("float32")
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones_like(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
    window = lambda a: sum(a[:, :, i:i + 9, j:j + 9] for i in range(3) for j in range(3))  # noqa: E731
    expected = window(padded) / window(ones)
    device = tvm.cpu()
    library = tvm.compile(hoisted, target="llvm")
    arrays = [tvm.runtime.tensor(x, device), tvm.runtime.empty(x.shape, "float32", device),
              *(tvm.runtime.empty(shape, dtype, device) for shape, dtype in workspace["pool"])]
    library["pool"](*arrays)
    np.testing.assert_allclose(arrays[1].numpy(), expected, rtol=1e-5, atol=1e-6)


@T.prim_func(s_tir=True)
def _row_scratch(a: T.Buffer((4, 1024), "float32"), b: T.Buffer((4, 1024), "float32")):
    for i in range(4):
        with T.sblock("row"):
            vi = T.axis.spatial(4, i)
            row = T.sblock_alloc_buffer((1024,))  # 4 KiB: from the workspace pool, not the stack
            for j in range(1024):
                with T.sblock("scale"):
                    vj = T.axis.spatial(1024, j)
                    row[vj] = a[vi, vj] * T.float32(2)
            for j in range(1024):
                with T.sblock("shift"):
                    vj = T.axis.spatial(1024, j)
                    b[vi, vj] = row[vj] + T.float32(1)


def test_kernels_still_taking_the_workspace_pool_are_found_by_name():
    """Scratch in a nested block is not hoisted; the check of the compiled host code names its kernel
    (builds run it for CUDA, where streams would share the pool; the host code here is the CPU's)."""
    kernels, workspace = hoist_workspace(tvm.IRModule({"row_scratch": _row_scratch.with_attr(
        "global_symbol", "row_scratch")}))
    assert workspace == {}
    with pytest.raises(GraphError, match=r"kernels \['row_scratch'\] take scratch memory from TVM's shared"):
        _check_no_pooled_workspace(tvm.compile(kernels, target="llvm"), ["row_scratch"])


def test_hoisting_takes_a_kernel_off_the_workspace_pool():
    data = te.placeholder((1, 8, 16, 16), name="data")
    pool = topi.nn.pool2d(data, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "avg", count_include_pad=False)
    kernels = tvm.IRModule({"pool": te.create_prim_func([data, pool]).with_attr("global_symbol", "pool")})
    with pytest.raises(GraphError, match="pool"):
        _check_no_pooled_workspace(tvm.compile(kernels, target="llvm"), ["pool"])
    _check_no_pooled_workspace(tvm.compile(hoist_workspace(kernels)[0], target="llvm"), ["pool"])


def _squeeze_excite_model():
    """The squeeze-excite gate of mobilenet_v3 at batch 16 (1x1 conv, hard sigmoid, scale): dlight's Matmul
    rule raised on its fused kernel while the scale was the convolution's epilogue (seen on torchvision's
    mobilenet_v3_large and efficientnet_b0)."""
    from conftest import make_model, tensor
    from onnx import helper

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((16, 8, 1, 1)).astype("float32"),
               "b": rng.standard_normal(16).astype("float32")}
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
             helper.make_node("Conv", ["pooled", "w", "b"], ["conv"]),
             helper.make_node("HardSigmoid", ["conv"], ["gate"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["gate", "y"], ["out"])]
    return make_model(nodes, [tensor("x", [16, 8, 4, 4]), tensor("y", [16, 16, 4, 4])],
                      [tensor("out", [16, 16, 4, 4])], weights, opset=17)


class _Raising:
    """A stand-in dlight rule that raises on every kernel."""

    def apply(self, function, target, tunable):
        raise AssertionError("a rule's own check")


def test_a_failing_dlight_rule_falls_back_to_the_next_and_is_named(monkeypatch):
    from tvm.s_tir import dlight

    from tvmsched import codegen

    built = tvmsched.compile(_squeeze_excite_model(), target="nvidia/nvidia-h100", tuned=False)
    assert built.meta.fallbacks == ()
    monkeypatch.setattr(dlight.gpu, "Raising", _Raising, raising=False)
    monkeypatch.setattr(codegen, "GPU_RULES", ("Raising", "Fallback"))
    model = tvmsched.compile(_squeeze_excite_model(), target="nvidia/nvidia-h100", tuned=False)
    conv = [why for symbol, why in model.meta.fallbacks if symbol.startswith("fused_conv2d")]
    assert conv == ["Raising failed (AssertionError: a rule's own check); runs the Fallback schedule"]


class _Broken:
    """A stand-in dlight rule whose schedule applies and then fails to compile (see `_failing_compile`)."""

    def apply(self, function, target, tunable):
        return tvm.s_tir.Schedule(function.with_attr("test.broken", True))


def _failing_compile(monkeypatch, rules: tuple[str, ...]):
    """Make `rules` the GPU rules, where the stand-in "Broken" rule's kernels fail to compile."""
    from tvm.s_tir import dlight

    from tvmsched import codegen

    compile_module = tvm.compile

    def compile_or_fail(module, target):
        if any(function.attrs.get("test.broken", False) for function in module.functions.values()):
            raise tvm.error.InternalError("a broken schedule")
        return compile_module(module, target=target)

    monkeypatch.setattr(dlight.gpu, "Broken", _Broken, raising=False)
    monkeypatch.setattr(codegen, "GPU_RULES", rules)
    monkeypatch.setattr(tvm, "compile", compile_or_fail)


def test_a_schedule_that_does_not_compile_falls_back_to_the_next_rule(monkeypatch, branchy_model):
    from tvmsched import codegen

    inputs = frontend.bind_input_shapes(branchy_model, 1)
    kernels = kernel_module(lower(frontend.to_relax(branchy_model, inputs)))
    _failing_compile(monkeypatch, ("Broken", "Fallback"))
    library = codegen.build_library(kernels, resolve_target("nvidia/nvidia-h100"))
    broken = {global_var.name_hint for global_var, function in kernels.functions.items()
              if not is_window_kernel(function)}  # a window kernel (the max pool) tries Fallback first
    assert set(library.fallbacks) == broken and len(broken) < len(kernels.functions)
    assert all(why == "Broken did not compile (InternalError: a broken schedule); runs the Fallback schedule"
               for why in library.fallbacks.values())


def test_a_kernel_without_a_schedule_that_compiles_fails_the_build_naming_it(monkeypatch, branchy_model):
    from tvmsched import codegen

    inputs = frontend.bind_input_shapes(branchy_model, 1)
    kernels = kernel_module(lower(frontend.to_relax(branchy_model, inputs)))
    _failing_compile(monkeypatch, ("Broken",))
    with pytest.raises(GraphError, match=r"kernel '\w+' cannot be compiled with any schedule: Broken did"):
        codegen.build_library(kernels, resolve_target("nvidia/nvidia-h100"))


def test_cpu_kernels_compile_in_parts_into_one_library_that_saves_and_loads(monkeypatch, branchy_model,
                                                                             tmp_path):
    """On the CPU the kernels compile on one thread per core; the parts' modules form one library whose
    every kernel is callable, which computes what one part computes and saves and loads as one file."""
    from conftest import onnxruntime_outputs

    from tvmsched import codegen

    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    [expected] = onnxruntime_outputs(branchy_model, {"input": x})
    monkeypatch.setattr(codegen, "KERNELS_PER_PART", 1)
    monkeypatch.setattr(codegen, "host_cores", lambda physical=True: 3)
    model = tvmsched.compile(branchy_model, target="llvm", batch=1)
    assert len(model.library.mod.imports) == 2  # three parts
    assert all(model.library[kernel.symbol] is not None for kernel in model.graph.kernels)
    np.testing.assert_allclose(model(x), expected, rtol=1e-5, atol=1e-5)
    model.save(tmp_path / "build")
    np.testing.assert_allclose(tvmsched.load(tmp_path / "build")(x), expected, rtol=1e-5, atol=1e-5)


def test_a_second_build_of_the_same_kernels_reuses_the_compiled_library(branchy_model):
    first = tvmsched.compile(branchy_model, target="llvm", batch=3)
    again = tvmsched.compile(branchy_model, target="llvm", batch=3)
    other = tvmsched.compile(branchy_model, target="llvm", batch=5)  # other shapes: other kernels
    assert again.library is first.library and other.library is not first.library
    assert again.meta.kernels_hash == first.meta.kernels_hash
    x = np.random.default_rng(4).standard_normal((3, 3, 8, 8)).astype("float32")
    np.testing.assert_array_equal(again(x), first(x))


def test_a_build_under_other_compile_options_compiles_again(branchy_model):
    first = tvmsched.compile(branchy_model, target="llvm", batch=2)
    with tvm.transform.PassContext(config={"tirx.disable_vectorize": True}):
        other = tvmsched.compile(branchy_model, target="llvm", batch=2)
    assert other.library is not first.library
