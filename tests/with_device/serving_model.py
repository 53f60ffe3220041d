"""A decoder-only transformer served with a slot KV cache: the GPU, not Python, sets the pace.

Transformers' GPT-2 under a per-cohort loop left the lent H200 Python-paced (a decode step of
a 5 B model 65 ms alone, 0.52 s between tokens shared: every cohort ran its own forward, so
batching stretched each request unequally, BENCHMARKS.md). Here every request in flight has a
slot of one preallocated cache, and one forward per step decodes all of them, as continuous-
batching servers (vLLM, TGI) do; each prefill is its own forward over its prompt. Nothing
on the host waits for the GPU inside a step: positions live on the GPU and the next tokens
never leave it, so the host queues work ahead and the steps run back to back.

Weights are random (the energy of a forward does not depend on their values) and there is no
position encoding (attention's cost does not either).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# cuDNN's attention builds a plan for every new shape (~50 ms each on the lent H200): with a
# new context length every step, that, not the GPU's work, set the first requests' pace
if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
    torch.backends.cuda.enable_cudnn_sdp(False)


class SlotModel:
    """Weights, the slot cache, and one prefill or decode step at a time."""

    def __init__(self, *, layers: int, width: int, heads: int, vocab: int, slots: int,
                 context: int, device: str, dtype: torch.dtype) -> None:
        self.heads, self.head_dim, self.context = heads, width // heads, context
        make = dict(device=device, dtype=dtype)
        scale = width ** -0.5
        self.embed = torch.randn(vocab, width, **make) * scale
        self.blocks = [{"qkv": torch.randn(width, 3 * width, **make) * scale,
                        "out": torch.randn(width, width, **make) * scale,
                        "up": torch.randn(width, 4 * width, **make) * scale,
                        "down": torch.randn(4 * width, width, **make) * scale / 2}
                       for _ in range(layers)]
        self.head = torch.randn(width, vocab, **make) * scale
        cache = (layers, slots, heads, context, self.head_dim)
        self.keys, self.values = torch.zeros(cache, **make), torch.zeros(cache, **make)
        self.length = torch.zeros(slots, dtype=torch.long, device=device)  # tokens cached
        self.next_token = torch.zeros(slots, dtype=torch.long, device=device)
        self.vocab = vocab

    @property
    def parameters(self) -> int:
        return sum(w.numel() for b in self.blocks for w in b.values()) + 2 * self.embed.numel()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, tokens, width) -> (batch, heads, tokens, head_dim)."""
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def _mlp(self, x: torch.Tensor, block: dict[str, torch.Tensor]) -> torch.Tensor:
        h = F.layer_norm(x, x.shape[-1:])
        return x + F.gelu(h @ block["up"]) @ block["down"]

    @torch.no_grad()
    def prefill(self, slot: int, prompt_tokens: int) -> None:
        """The prompt's forward: its keys and values into ``slot``, its first token chosen."""
        ids = torch.randint(0, self.vocab, (1, prompt_tokens), device=self.length.device)
        x = self.embed[ids]
        for layer, block in enumerate(self.blocks):
            q, k, v = (F.layer_norm(x, x.shape[-1:]) @ block["qkv"]).chunk(3, dim=-1)
            q, k, v = self._heads(q), self._heads(k), self._heads(v)
            self.keys[layer, slot, :, :prompt_tokens] = k[0]
            self.values[layer, slot, :, :prompt_tokens] = v[0]
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + att.transpose(1, 2).reshape(x.shape) @ block["out"]
            x = self._mlp(x, block)
        self.next_token[slot] = (F.layer_norm(x[0, -1], x.shape[-1:]) @ self.head).argmax()
        self.length[slot] = prompt_tokens

    @torch.no_grad()
    def decode(self, batch: int, longest: int) -> None:
        """One token for each of slots 0..batch-1 (a free slot among them computes garbage
        that nothing reads); ``longest``: the most tokens any of them holds after the step."""
        at = self.length[:batch].clamp(max=self.context - 1)
        rows = torch.arange(batch, device=at.device)
        seen = torch.arange(longest, device=at.device)[None, :] <= at[:, None]
        mask = seen[:, None, None, :]
        x = self.embed[self.next_token[:batch]][:, None, :]
        for layer, block in enumerate(self.blocks):
            q, k, v = (F.layer_norm(x, x.shape[-1:]) @ block["qkv"]).chunk(3, dim=-1)
            q, k, v = self._heads(q), self._heads(k), self._heads(v)
            self.keys[layer, rows, :, at] = k[:, :, 0]
            self.values[layer, rows, :, at] = v[:, :, 0]
            keys = self.keys[layer, :batch, :, :longest]
            values = self.values[layer, :batch, :, :longest]
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + att.transpose(1, 2).reshape(x.shape) @ block["out"]
            x = self._mlp(x, block)
        logits = F.layer_norm(x[:, 0], x.shape[-1:]) @ self.head
        self.next_token[:batch] = logits.argmax(-1)
        self.length[:batch] += 1
