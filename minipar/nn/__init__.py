"""The serial model — последовательная (однопроцессная) модель — 串行模型.

Every parallel strategy in minipar reproduces this package's numbers.
Layers are pairs of stateless functions ``forward -> (y, saved)`` and
``backward(params, saved, dy) -> (dx, dparams)``: ``saved`` holds
activations only, never a parameter; models are built from them:

* ``layers``     Linear, bias, Embedding, LayerNorm, GELU
* ``attention``  causal multi-head self-attention
* ``mlp``        the transformer feed-forward block (also one MoE expert)
* ``moe``        mixture of experts: router, top-k, capacity, aux loss
* ``loss``       softmax cross-entropy
* ``gpt``        ``GPTConfig`` / ``GPT`` and its pieces (embed, block, head)
* ``mlp_model``  ``MLPConfig`` / ``MLP``, a plain classifier for the simplest demos
* ``units``      the models as units (embed, block i, head; MLP layers)
* ``executor``   the one walk over the units, with hooks where strategies plug in
* ``decoding``   forward only: a key/value cache (prefill, decode_step), sampling, ``generate``
* ``init``       initialisation from ``(seed, name)``
"""

from minipar.nn.attention import (
    attention_backward,
    attention_core_backward,
    attention_core_forward,
    attention_forward,
    causal_mask,
    merge_heads,
    split_heads,
)
from minipar.nn.decoding import (
    KVCache,
    decode_step,
    dropless,
    generate,
    next_token_probs,
    prefill,
    sample_token,
)
from minipar.nn.executor import Hooks
from minipar.nn.gpt import (
    GPT,
    block_aux_loss,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    gpt_units,
    head_backward,
    head_forward,
    param_shapes,
    sub,
)
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import (
    bias_backward,
    bias_forward,
    embedding_backward,
    embedding_forward,
    gelu_backward,
    gelu_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
)
from minipar.nn.loss import cross_entropy_backward, cross_entropy_forward
from minipar.nn.mlp import mlp_backward, mlp_forward
from minipar.nn.mlp_model import MLP, MLPConfig, mlp_units
from minipar.nn.moe import expert_capacity, moe_backward, moe_forward, route
from minipar.nn.units import Unit

__all__ = [
    "GPT",
    "MLP",
    "GPTConfig",
    "Hooks",
    "KVCache",
    "MLPConfig",
    "Unit",
    "attention_backward",
    "attention_core_backward",
    "attention_core_forward",
    "attention_forward",
    "bias_backward",
    "bias_forward",
    "block_aux_loss",
    "block_backward",
    "block_forward",
    "causal_mask",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "decode_step",
    "dropless",
    "embed_backward",
    "embed_forward",
    "embedding_backward",
    "embedding_forward",
    "expert_capacity",
    "gelu_backward",
    "gelu_forward",
    "generate",
    "gpt_units",
    "head_backward",
    "head_forward",
    "layernorm_backward",
    "layernorm_forward",
    "linear_backward",
    "linear_forward",
    "merge_heads",
    "mlp_backward",
    "mlp_forward",
    "mlp_units",
    "moe_backward",
    "moe_forward",
    "next_token_probs",
    "param_shapes",
    "prefill",
    "route",
    "sample_token",
    "split_heads",
    "sub",
]
