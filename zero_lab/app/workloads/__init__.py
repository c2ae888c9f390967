"""What is trained: the model and data protocols, the bundled models and data sources.

Imports nothing else of the app (the README's "Developing" map names each module).
"""
