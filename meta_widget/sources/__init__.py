"""What the user has, turned into a meta module and meta inputs: modules, classes,
factories, transformers configs; inputs after torchinfo's conventions; low-precision copies.
"""
