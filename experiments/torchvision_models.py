"""The torchvision counterparts of zoo models (random weights, seed 0) and their ONNX exports, as the
benchmark runs them; the exports can be written to files, to tune their kernels before a benchmark:

    python -m experiments.torchvision_models --out-dir /tmp/tv --batch 1 16
    tvmsched tune /tmp/tv/*_b16.onnx --batch 16 --target cuda --trials 16 --time-budget 8m --log tuning_logs

torchvision's export folds each batch norm into its convolution, so these kernels are not the zoo's and
the zoo's tuning records do not apply to them.
"""

from __future__ import annotations

import io
from pathlib import Path

import onnx

from experiments.common import argument_parser

TORCHVISION = {"inception_v3": ("inception_v3", {"aux_logits": False, "init_weights": False}, 299),
               "googlenet": ("googlenet", {"aux_logits": False, "init_weights": False}, 224),
               "squeezenet": ("squeezenet1_0", {}, 224), "resnet50": ("resnet50", {}, 224)}


def network(name: str, batch: int):
    """A torchvision network with random weights (seed 0) in eval mode, and its ONNX export at `batch`."""
    import torch
    import torchvision

    builder, options, size = TORCHVISION[name]
    torch.manual_seed(0)
    module = getattr(torchvision.models, builder)(weights=None, **options).eval()
    with torch.no_grad():  # batch norms as after training, not identities: outputs that tell errors apart
        for layer in module.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                for tensor, low, high in ((layer.running_mean, -0.1, 0.1), (layer.running_var, 0.5, 1.5),
                                          (layer.weight, 0.5, 1.5), (layer.bias, -0.1, 0.1)):
                    tensor.uniform_(low, high)
    buffer = io.BytesIO()
    torch.onnx.export(module, torch.zeros(batch, 3, size, size), buffer, input_names=["input"],
                      output_names=["output"], opset_version=17, dynamo=False)
    return onnx.load_from_string(buffer.getvalue()), module


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--out-dir", required=True, type=Path, help="writes MODEL_bBATCH.onnx here")
    parser.add_argument("--models", nargs="+", default=list(TORCHVISION), choices=list(TORCHVISION))
    parser.add_argument("--batch", nargs="+", type=int, default=[1])
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        for batch in args.batch:
            path = args.out_dir / f"{name}_b{batch}.onnx"
            onnx.save(network(name, batch)[0], path)
            print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
