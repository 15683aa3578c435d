"""Training the small tri-mode models that ship with specframe (``specframe train``).

Everything runs on a CPU, offline, on the CPython standard-library source of the machine:

* :mod:`~specframe.training.corpus`: the corpus, its deterministic held-out split by file, and the BPE
  tokenizers (one per family, with the family's special-token layout);
* :mod:`~specframe.training.forward`: a batched, cache-free forward of the inference network under an
  arbitrary ``[B, T, T]`` attention mask, with autograd;
* :mod:`~specframe.training.objectives`: the Nemotron-Labs-Diffusion joint objective (next-token loss plus a
  block-diffusion loss) and SetDLM's any-order objective over staggered orders (duplicate masks);
* :mod:`~specframe.training.distill`: drafter self-distillation on the model's own greedy AR rollouts (a short
  stage after the Nemotron-style model's main steps);
* :mod:`~specframe.training.trainer`: the resumable training loop and the export to each family's Hub layout;
* :mod:`~specframe.training.evaluate`: held-out perplexity and speculative acceptance.
"""
