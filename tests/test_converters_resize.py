"""tvmsched.converters.resize: Resize and Upsample against onnxruntime."""

import numpy as np
import pytest
from onnx import helper
from single_node import check_node, node_model

import tvmsched
from tvmsched.errors import ConstantInputRequired, UnsupportedOperator

RNG = np.random.default_rng(0)
X = RNG.standard_normal((1, 2, 5, 7)).astype("float32")


@pytest.mark.parametrize("attributes, scales, sizes", [
    ({"mode": "nearest"}, [1, 1, 2, 1.5], None),
    ({"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "asymmetric"}, None,
     [1, 2, 8, 3]),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil",
      "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 9, 4]),
    ({"mode": "linear"}, [1, 1, 0.6, 1.7], None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [1, 2, 3, 1]),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 8, 5]),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.35], None),
    ({"mode": "cubic"}, [1, 1, 1.5, 0.8], None),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, None, [1, 2, 4, 11]),
    ({"mode": "cubic", "antialias": 1, "coordinate_transformation_mode": "half_pixel_symmetric"},
     [1, 1, 0.7, 0.4], None),
    ({"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"}, None, [4, 9]),
    ({"mode": "linear", "axes": [2], "keep_aspect_ratio_policy": "not_smaller"}, None, [3]),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 9.0},
     None, [1, 2, 6, 6])])
def test_resize(attributes, scales, sizes):
    constants = {"roi": np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], "float32")}
    if scales is not None:
        constants["scales"] = np.array(scales, "float32")
    else:
        constants["sizes"] = np.array(sizes, "int64")
    names = ["x", "roi", "scales" if scales is not None else "", "sizes" if sizes is not None else ""]
    node = helper.make_node("Resize", names, ["y"], **attributes)
    check_node(node, {"x": X}, opset=19, constants=constants, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("op, opset", [("Resize", 10), ("Upsample", 9), ("Upsample", 7)])
def test_legacy_resize_and_upsample(op, opset, mode):
    scales = np.array([1, 1, 2, 3.5], "float32")
    if opset == 7:
        node = helper.make_node(op, ["x"], ["y"], mode=mode, scales=scales.tolist())
        check_node(node, {"x": X}, opset=opset)
    else:
        check_node(helper.make_node(op, ["x", "scales"], ["y"], mode=mode), {"x": X}, opset=opset,
                   constants={"scales": scales})


def test_resize_nearest_of_integers_is_exact():
    x = RNG.integers(0, 255, (1, 1, 3, 4)).astype("uint8")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    check_node(node, {"x": x}, opset=19, constants={"scales": np.array([1, 1, 2.5, 1.5], "float32")})


def test_resize_refuses_align_corners_with_a_fractional_output_length():
    constants = {"scales": np.array([1, 1, 0.6, 1], "float32")}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="linear",
                            coordinate_transformation_mode="align_corners")
    model = node_model(node, {"x": X}, 19, constants)
    with pytest.raises(UnsupportedOperator, match=r"node 'resize' \(Resize\) \(opset 19\): align_corners "
                                                  r"with a scale whose output length is fractional"):
        tvmsched.compile(model, target="llvm")


def test_resize_scales_given_at_run_time_must_be_bound():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="linear")
    model = node_model(node, {"x": X, "scales": np.ones(4, "float32")}, 19)
    with pytest.raises(ConstantInputRequired, match=r"node 'resize' \(Resize\) needs the value of its "
                                                    r"input 'scales'.*--constant-input scales=FILE.npy"):
        tvmsched.compile(model, target="llvm")
