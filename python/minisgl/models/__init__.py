"""Model configs, definitions and the weight loader."""
