"""Developer tools: ``python -m torch_neuronx.tools.<name>``."""
