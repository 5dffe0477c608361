"""What the user has, turned into a meta module and meta inputs: modules, classes,
factories, transformers configs, exported and compiled programs (``programs``), Hugging Face
Hub ids (``hub``, loaded with huggingface_hub when a string is analyzed), pipelines
(``pipelines``: refused, pointing to ``mw.analyze_pipeline``); inputs after
torchinfo's conventions; low-precision copies.
"""

from . import pipelines, programs  # register their sources

__all__ = ["pipelines", "programs"]
