"""The serial model — последовательная (однопроцессная) модель — 串行模型.

Every parallel strategy in minipar reproduces this package's numbers.
Layers are pairs of stateless functions ``forward -> (y, saved)`` and
``backward(saved, dy) -> (dx, dparams)``; models are built from them:

* ``layers``     Linear, Embedding, LayerNorm, GELU
* ``attention``  causal multi-head self-attention
* ``mlp``        the transformer feed-forward block (also one MoE expert)
* ``moe``        mixture of experts: router, top-k, capacity, aux loss
* ``loss``       softmax cross-entropy
* ``gpt``        ``GPTConfig`` / ``GPT`` and its pieces (embed, block, head)
* ``mlp_model``  ``MLPConfig`` / ``MLP``, a plain classifier for the simplest demos
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
from minipar.nn.gpt import (
    GPT,
    block_aux_loss,
    block_backward,
    block_forward,
    embed_backward,
    embed_forward,
    head_backward,
    head_forward,
    param_shapes,
    sub,
)
from minipar.nn.gpt_config import GPTConfig
from minipar.nn.layers import (
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
from minipar.nn.mlp_model import MLP, MLPConfig
from minipar.nn.moe import expert_capacity, moe_backward, moe_forward, route

__all__ = [
    "GPT",
    "MLP",
    "GPTConfig",
    "MLPConfig",
    "attention_backward",
    "attention_core_backward",
    "attention_core_forward",
    "attention_forward",
    "block_aux_loss",
    "block_backward",
    "block_forward",
    "causal_mask",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embed_backward",
    "embed_forward",
    "embedding_backward",
    "embedding_forward",
    "expert_capacity",
    "gelu_backward",
    "gelu_forward",
    "head_backward",
    "head_forward",
    "layernorm_backward",
    "layernorm_forward",
    "linear_backward",
    "linear_forward",
    "merge_heads",
    "mlp_backward",
    "mlp_forward",
    "moe_backward",
    "moe_forward",
    "param_shapes",
    "route",
    "split_heads",
    "sub",
]
