"""The project's mechanics, below every stage: errors, registries, typed configs, device names."""
