"""Developer tools (run with ``python -m torch_neuronx.tools.<name>``)."""
