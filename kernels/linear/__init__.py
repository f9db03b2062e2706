"""The forward's weight GEMMs at decode's few rows: the skinny Triton kernel (skinny_linear)."""
