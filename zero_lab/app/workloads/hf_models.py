"""``transformers`` causal LMs built from config objects: real architectures, no download.

The ``[models]`` extra. ``GPT2(...)`` and ``Llama(...)`` build ``GPT2LMHeadModel`` and
``LlamaForCausalLM`` from a config made of typed arguments, so those arguments are the ``model.``
keys; the forward's ``logits`` are what the data's next-token loss reads. Embeddings are tied, as
in GPT-2 and small Llamas; weights come from torch's RNG (the app seeds it), nothing from a hub.
``transformers`` is imported on the first build, not with this module: the app derives every
option's schema from its class at start, and the import costs about 2 s of CPU.

    model = GPT2(vocab_size=256, n_positions=128, n_embd=128, n_layer=4, n_head=4)
    logits = model(tokens)["logits"]
"""

from __future__ import annotations

from typing import Any

from torch import nn

from zero_lab.app.workloads.torch_extras import explain_import_error

__all__ = ["GPT2", "Llama"]

#: What both models set alike: no special tokens, the LM head tied to the token embedding.
_TIED_LM = {"bos_token_id": None, "eos_token_id": None, "tie_word_embeddings": True}


def _tied_lm(model_class: str, config_class: str, **config: Any) -> nn.Module:
    """``transformers.<model_class>`` built from ``transformers.<config_class>(**config)`` with
    the head tied (:data:`_TIED_LM`); transformers is imported here, on the first build."""
    try:
        import transformers

        model_type, config_type = getattr(transformers, model_class), getattr(transformers, config_class)
    except (ImportError, RuntimeError, AttributeError) as error:  # a broken torchvision breaks them all: say so
        explained = explain_import_error(error, f"transformers.{model_class}")
        if explained is None:
            raise
        raise explained from error
    return model_type(config_type(**config, **_TIED_LM))


class GPT2(nn.Module):
    """GPT-2 (learned positions, GELU MLP, LayerNorm), LM head tied to the token embedding.

    A factory with a class's face: ``GPT2(...)`` returns a ``transformers.GPT2LMHeadModel``."""

    task = "lm"

    def __new__(
        cls,
        vocab_size: int = 256,
        n_positions: int = 128,
        n_embd: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        dropout: float = 0.0,
    ) -> Any:
        return _tied_lm(
            "GPT2LMHeadModel",
            "GPT2Config",
            vocab_size=vocab_size,
            n_positions=n_positions,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            resid_pdrop=dropout,
            embd_pdrop=dropout,
            attn_pdrop=dropout,
        )


class Llama(nn.Module):
    """Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention), LM head tied to the token embedding.

    A factory with a class's face: ``Llama(...)`` returns a ``transformers.LlamaForCausalLM``."""

    task = "lm"

    def __new__(
        cls,
        vocab_size: int = 256,
        hidden_size: int = 128,
        intermediate_size: int = 344,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        max_position_embeddings: int = 128,
    ) -> Any:
        return _tied_lm(
            "LlamaForCausalLM",
            "LlamaConfig",
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            max_position_embeddings=max_position_embeddings,
        )
