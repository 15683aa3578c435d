"""``specframe convert``: turn an AR checkpoint (GGUF, or transformers Llama/Mistral/Qwen2/Qwen3) into a model folder.

Examples::

    specframe convert SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2
    specframe convert HuggingFaceTB/SmolLM2-360M-Instruct --out models/smollm2-360m --dtype float32
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specframe.cli import folder_path


def add_parser(subparsers: Any) -> None:
    """Add ``specframe convert`` to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "convert",
        help="convert an AR checkpoint (GGUF or transformers Llama/Mistral/Qwen2/Qwen3) into a specframe model folder",
        description="Convert an autoregressive checkpoint into a specframe model folder. Llama, Mistral, Qwen2 "
        "(Qwen2.5) and Qwen3 all become Nemotron-Labs-Diffusion-layout models (Qwen3 with qk_norm, Qwen2 with its "
        "query/key/value biases); Qwen3 is not written as SetDLM, whose MASK-row verification an AR model never "
        "learned. The AR output is the source model's exactly; the diffusion mode (the drafter) needs "
        "`specframe train-drafter` before speculation pays.",
    )
    parser.add_argument("source", help="a .gguf file, a transformers checkpoint folder, or a Hub repo id")
    parser.add_argument("--out", required=True, type=folder_path, help="the model folder to write")
    parser.add_argument("--dtype", default="bfloat16", help="weights dtype: bfloat16 (default), float32 or float16")
    parser.add_argument(
        "--mask-token", help="vocabulary entry to use as the mask token (default: an unused control token)"
    )
    parser.add_argument(
        "--quant",
        choices=("q8_0", "q4_0", "q4_1", "keep"),
        help="store the attention, MLP and output matrices block-quantized, run as stored by specframe's CPU "
        "kernels: q8_0, q4_0 or q4_1 (a GGUF matrix already in that format is kept byte for byte), or keep "
        "(the GGUF's own Q8_0/Q4_0/Q4_1 blocks as they are); default: every tensor in --dtype",
    )
    parser.add_argument("--revision", help="Hub revision, for a Hub repo id")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``specframe convert``."""
    from specframe.convert.writer import convert
    from specframe.errors import ConfigError

    source = Path(args.source).expanduser()
    if source.suffix.lower() == ".gguf" or (source.is_file() and _is_gguf(source)):
        if args.revision is not None:
            raise ConfigError("--revision applies to Hub repo ids, not to a .gguf file")
        from specframe.convert.gguf_source import read_gguf

        if not source.is_file():
            raise ConfigError(f"{source}: no such GGUF file")
        model = read_gguf(source)
    else:
        from specframe.convert.hf_source import read_transformers

        model = read_transformers(args.source, revision=args.revision)
    print(f"{model.description}: {model.architecture} -> {model.family}", flush=True)
    convert(
        model,
        args.out,
        dtype=args.dtype,
        mask_token=args.mask_token,
        overwrite=args.overwrite,
        quant=args.quant,
        log=lambda line: print(line, flush=True),
    )
    return 0


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"GGUF"
