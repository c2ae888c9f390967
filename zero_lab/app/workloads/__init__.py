"""What is trained: the model and data protocols, the bundled models and data sources.

``protocols`` (what a model and a data source must offer, checked before start on meta
tensors), ``user_code`` (calling it, what it raises kept for the key that named it), ``models``
(MLP, TinyLM, ResNet), ``hf_models`` (``transformers`` LMs from config objects), ``data``
(synthetic and text batches, a pure function of ``(seed, step)``), ``torch_extras``
(torchvision beside torch). Imports nothing else of the app.
"""
