"""Model building blocks: tensor-parallel linears and embeddings, rotary, norm, attention."""
