"""The real workloads (no processes): transformers' GPT-2 and Llama from config objects (a
ModelOutput read at ``logits``, tied embeddings, the meta-tensor check), the ResNet with
BatchNorm, byte-level text with a held-out split (their presets are checked with every experiment in
test_config.py)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from zero_lab.app.workloads.data import ImageData, TextData, stdlib_source
from zero_lab.app.workloads.hf_models import GPT2, Llama
from zero_lab.app.workloads.models import ResNet
from zero_lab.app.workloads.protocols import call_model, forward_problems, loss_of, probe_on_meta


@pytest.mark.parametrize("cls", [GPT2, Llama])
def test_transformers_models_return_a_model_output_read_at_logits(cls, tmp_path):
    (tmp_path / "a.txt").write_text("hello zero_lab " * 200)
    data = TextData(global_batch=4, seq_len=16, seed=0, path=str(tmp_path / "a.txt"))
    torch.manual_seed(0)
    small = {"vocab_size": 256, "n_positions": 16, "n_embd": 32, "n_layer": 1, "n_head": 2} if cls is GPT2 else {
        "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16}  # fmt: skip
    model = cls(**small)
    x, y = data.shard(0, 0, 1)
    output = call_model(model, x)
    assert type(output).__name__.startswith("CausalLMOutput")
    assert torch.equal(loss_of(output, y, data), F.cross_entropy(output.logits.flatten(0, 1).float(), y.flatten()))
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    with torch.device("meta"):
        meta = cls(**small)
    assert forward_problems(probe_on_meta(meta, data, 1, "logits")) == []
    assert "output_key=hidden" in forward_problems(probe_on_meta(meta, data, 1, "hidden"))[0]


def test_text_holds_out_its_tail_and_reads_the_standard_library_by_default(tmp_path):
    text = bytes(range(256)) * 40
    (tmp_path / "t.bin").write_bytes(text)
    data = TextData(global_batch=4, seq_len=8, seed=1, path=str(tmp_path / "t.bin"), val_fraction=0.25)
    assert len(data.val_tokens) == len(text) // 4 and data.val_tokens.tolist() == list(text[-len(text) // 4 :])
    x, y = data.shard(3, 1, 2)
    assert x.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])  # next-byte targets
    assert torch.equal(data.val_shard(0, 0, 1)[0], data.val_shard(0, 0, 1)[0])
    default = TextData(global_batch=2, seq_len=8, seed=0, max_bytes=4096)
    assert default.path == stdlib_source() and len(default.train_tokens) + len(default.val_tokens) == 4096
    with pytest.raises(FileNotFoundError, match=r"data\.path=.*no such file or folder"):
        TextData(global_batch=2, seq_len=8, seed=0, path=str(tmp_path / "missing"))


def test_resnet_with_batchnorm_learns_the_image_classes():
    data = ImageData(global_batch=32, seed=0, size=16, noise=0.5)
    torch.manual_seed(0)
    model = ResNet(classes=10, width=8, blocks=[1, 1])
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(15):
        x, y = data.shard(step, 0, 1)
        loss = data.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.65 * losses[0]  # 2.41 -> 1.44 in 15 steps
