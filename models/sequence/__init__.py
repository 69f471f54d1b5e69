"""Sequence models over a time axis: recurrent networks (classifiers, taggers, language
models, encoder–decoders), attention over encoder states and causal convolutions."""
