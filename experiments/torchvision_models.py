"""Real networks with random weights (seed 0) and their ONNX exports, as the benchmark and the real-models
check run them: the torchvision counterparts of zoo models (TORCHVISION), any classification network of
`torchvision.models` by its builder's name, and BERT-base (`bert_base`, transformers, sequence 128). The
exports can be written to files, to tune their kernels before a benchmark:

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
BERT = "bert_base"
SEQUENCE = 128  # BERT's input length


def classification_networks() -> list[str]:
    """Every classification network of torchvision.models, by builder name, and BERT-base."""
    import torchvision

    return [*torchvision.models.list_models(module=torchvision.models), BERT]


def torch_network(name: str, batch: int):
    """The network `name` (a TORCHVISION key, a torchvision.models builder or `bert_base`) in eval mode with
    random weights (seed 0; batch norms with the statistics of a trained one; no weight all zero, so that
    every output depends on the input), and an example input."""
    import torch

    torch.manual_seed(0)
    if name == BERT:
        import transformers

        bert = transformers.BertModel(transformers.BertConfig()).eval()
        return _BertOutputs(bert).eval(), torch.randint(0, bert.config.vocab_size, (batch, SEQUENCE))
    import torchvision

    builder, options, size = TORCHVISION.get(name, (name, {}, 299 if name == "inception_v3" else 224))
    if builder in ("googlenet", "inception_v3"):
        options = {"aux_logits": False, "init_weights": False, **options}
    module = torchvision.models.get_model(builder, weights=None, **options).eval()
    with torch.no_grad():  # batch norms as after training, not identities: outputs that tell errors apart
        for name, parameter in module.named_parameters():  # a weight set to zero (ViT's head) drawn anew
            if name.endswith("weight") and not parameter.any():
                parameter.normal_(0, 0.02)
        for layer in module.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                for tensor, low, high in ((layer.running_mean, -0.1, 0.1), (layer.running_var, 0.5, 1.5),
                                          (layer.weight, 0.5, 1.5), (layer.bias, -0.1, 0.1)):
                    tensor.uniform_(low, high)
    return module, torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _BertOutputs(bert):
    """BERT called with its token ids alone, returning (last hidden state, pooled output): transformers 5's
    forward does not trace with positional inputs (it is given `use_cache` twice)."""
    import torch

    class BertOutputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids):
            outputs = self.bert(input_ids=input_ids)
            return outputs.last_hidden_state, outputs.pooler_output

    return BertOutputs()


def export(module, example, destination) -> None:
    """Export `module` at `example`'s shape to ONNX (opset 17): to a file object, or to a path, where
    weights over protobuf's 2 GB go to one external data file beside it (`PATH.data`)."""
    import tempfile

    import torch

    names = (["input_ids"], ["last_hidden_state", "pooler_output"]) if example.dtype == torch.int64 \
        else (["input"], ["output"])
    arguments = {"input_names": names[0], "output_names": names[1], "opset_version": 17, "dynamo": False}
    if not isinstance(destination, str | Path):
        torch.onnx.export(module, (example,), destination, **arguments)
        return
    with tempfile.TemporaryDirectory() as scratch:  # torch writes one external file per weight there
        exported = Path(scratch) / "model.onnx"
        torch.onnx.export(module, (example,), str(exported), **arguments)
        large = len(list(Path(scratch).iterdir())) > 1  # torch wrote external data: over 2 GB
        onnx.save_model(onnx.load(str(exported)), str(destination), save_as_external_data=large,
                        all_tensors_to_one_file=True, location=f"{Path(destination).name}.data")


def network(name: str, batch: int):
    """A network with random weights (`torch_network`) and its ONNX export at `batch`."""
    module, example = torch_network(name, batch)
    buffer = io.BytesIO()
    export(module, example, buffer)
    return onnx.load_from_string(buffer.getvalue()), module


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--out-dir", required=True, type=Path, help="writes MODEL_bBATCH.onnx here")
    parser.add_argument("--models", nargs="+", default=list(TORCHVISION),
                        help="TORCHVISION keys, torchvision.models builder names or bert_base")
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
