"""`python -m torch_neuronx [ls|top|check]`: see torch_neuronx/cli."""
from torch_neuronx.cli import cli

cli()
