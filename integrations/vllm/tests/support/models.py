"""Tiny random-weight Llama models made locally (no download is possible here).

`tiny`: hidden 128, 2 layers, 2 heads, 1 KV head; `small`: hidden 512, 4 layers,
8 heads, 2 KV heads (prefill-dominated on the CPU engine). Both: head_dim 64,
vocab 4096, intermediate 2 x hidden, max_position_embeddings 32768, bf16,
torch.manual_seed(0).
The directory is reused when its config matches (a stamp file).
"""

from __future__ import annotations

import json
import os
import pathlib

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1},
    "small": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2},
}
VOCAB = 4096


def default_dir(size: str) -> pathlib.Path:
    root = os.environ.get("KVGATE_MODEL_DIR", os.path.expanduser("~/.cache/kvgate/models"))
    return pathlib.Path(root) / f"llama-{size}-random"


def make_model(size: str, path: pathlib.Path | None = None) -> pathlib.Path:
    """Writes (once) a random-weight Llama of the given size; returns its directory."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; one of {sorted(SIZES)}")
    path = path or default_dir(size)
    spec = dict(SIZES[size], vocab_size=VOCAB, head_dim=64, seed=0)
    stamp = path / "kvgate-model.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SIZES[size]
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=s["hidden_size"],
        intermediate_size=2 * s["hidden_size"],
        num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"],
        head_dim=64,
        max_position_embeddings=32768,
        torch_dtype="bfloat16",
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    stamp.write_text(json.dumps(spec))
    return path


def make_lora(size: str, path: pathlib.Path | None = None, rank: int = 8) -> pathlib.Path:
    """Writes (once) a random LoRA adapter (q_proj, v_proj) for the model of `size`,
    in the PEFT layout vLLM loads from a local directory."""
    base = make_model(size)
    path = path or base.parent / f"{base.name}-lora"
    if (path / "adapter_model.safetensors").exists():
        return path
    import torch
    from safetensors.torch import save_file

    s = SIZES[size]
    hidden, kv = s["hidden_size"], s["num_key_value_heads"] * 64
    torch.manual_seed(1)
    tensors = {}
    for layer in range(s["num_hidden_layers"]):
        for proj, out in (("q_proj", s["num_attention_heads"] * 64), ("v_proj", kv)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, hidden) * 0.01).to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(out, rank) * 0.01).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": rank,
                "lora_alpha": 2 * rank,
                "lora_dropout": 0.0,
                "bias": "none",
                "target_modules": ["q_proj", "v_proj"],
                "base_model_name_or_path": str(base),
                "fan_in_fan_out": False,
                "modules_to_save": None,
            }
        )
    )
    return path
