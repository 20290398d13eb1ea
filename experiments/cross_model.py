"""Several models in one process beside PyTorch's own CUDA graphs (the scenario that once lost the CUDA
context): PyTorch captures vit_b_16 (random weights, batch 1) into a CUDA graph; tvmsched compiles vit's
ONNX export for cuda, runs it, reschedules it with dp (measured costs), benchmarks and closes it; then a
4-layer BERT (int64 token ids, 1x128) is compiled and run; PyTorch's graph is replayed at the end. Every
output is compared with PyTorch's. Needs a GPU, torch, torchvision and transformers.

    python -m experiments.cross_model
"""

from __future__ import annotations

import io
import time

import numpy as np
import onnx
import torch

import tvmsched
from experiments.torch_onnx import cuda_graph, fp32_settings


class _Bert(torch.nn.Module):
    """BERT called with its token ids alone (transformers 5 does not trace positional inputs)."""

    def __init__(self, layers: int):
        super().__init__()
        import transformers

        self.bert = transformers.BertModel(transformers.BertConfig(num_hidden_layers=layers)).eval()

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids).last_hidden_state


def _onnx(module, example, name: str) -> onnx.ModelProto:
    buffer = io.BytesIO()
    torch.onnx.export(module, (example,), buffer, opset_version=17, dynamo=False, input_names=[name])
    return onnx.load_from_string(buffer.getvalue())


def _max_diff(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max())


def main() -> None:
    import torchvision

    started = time.perf_counter()

    def log(*message) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s]", *message, flush=True)

    fp32_settings()
    torch.manual_seed(0)
    vit = torchvision.models.vit_b_16(weights=None).eval()
    torch.nn.init.normal_(vit.heads.head.weight, std=0.02)  # torchvision leaves the head zero
    bert = _Bert(layers=4).eval()
    image, ids = torch.randn(1, 3, 224, 224), torch.randint(0, 30522, (1, 128))
    vit_onnx, bert_onnx = _onnx(vit, image, "input"), _onnx(bert, ids, "input_ids")
    vit, bert = vit.cuda(), bert.cuda()
    replay, _, vit_output = cuda_graph(vit, image.cuda())
    replay()
    vit_expected = vit_output.cpu().numpy()
    with torch.no_grad():
        bert_expected = bert(ids.cuda()).cpu().numpy()
    log("PyTorch's CUDA graph of vit_b_16 captured and replayed")

    model = tvmsched.compile(vit_onnx, target="cuda")
    difference = _max_diff(model(image.numpy()), vit_expected)
    log(f"vit: {len(model.graph.kernels)} kernels, max diff {difference:.2e}")
    scheduled = model.reschedule("dp")
    difference = _max_diff(scheduled(image.numpy()), vit_expected)
    log(f"vit dp: {scheduled.plan.num_streams} streams, max diff {difference:.2e}, "
        f"{scheduled.benchmark()['median_ms']:.3f} ms")
    scheduled.close()
    model.close()
    with tvmsched.compile(bert_onnx, target="cuda") as model:
        log(f"BERT: {len(model.graph.kernels)} kernels, first run max diff "
            f"{_max_diff(model(ids.numpy()), bert_expected):.2e}")
    replay()
    torch.cuda.synchronize()
    log(f"PyTorch's graph replayed after: max diff {_max_diff(vit_output.cpu().numpy(), vit_expected):.2e}")


if __name__ == "__main__":
    main()
