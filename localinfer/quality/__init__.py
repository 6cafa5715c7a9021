"""Quality of a quantized model against its unquantized reference: perplexity on the shipped
evaluation text, KL divergence and top-1 agreement of next-token distributions, weights memory
and decode speed (``localinfer quality``)."""
