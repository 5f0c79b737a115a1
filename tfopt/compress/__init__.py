"""tfopt.compress: the compression techniques every stage may apply to a model.

Pruning, clustering and quantization-aware training (tfmot wrappers), channel pruning and low-rank
factorization (model surgery), the per-layer weight statistics, and :mod:`~tfopt.compress.student`,
which compresses a model another stage trains. The ``optimize`` stage fine-tunes with them; the
``distill`` stage compresses its student with them; ``export`` strips their wrappers. They import
no stage.
"""
