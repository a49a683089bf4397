"""Models the consumer can train: Stoker's own ResNet v1.5 (torchvision does not import beside CPU torch here)."""
